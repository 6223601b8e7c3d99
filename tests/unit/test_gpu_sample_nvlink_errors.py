"""``GpuSample.nvlink_errors``: the NVLink error counters of a reading, summed once (the
detector's ``nvlink-rate`` rule reads it for the reading and for the GPU's previous one)."""

from __future__ import annotations

from gpuwarden.shared.models import NVLINK_ERROR_KEYS, GpuSample


def _links(n: int, **errors: int) -> list[dict[str, int | bool]]:
    return [{"link": k, "active": True, **{key: v * (k + 1) for key, v in errors.items()}} for k in range(n)]


def test_the_sum_is_every_error_counter_over_every_link() -> None:
    g = GpuSample(index=0, nvlinks=_links(18, crc_flit_errors=1, crc_data_errors=2, replay_errors=3, recovery_errors=4))
    assert g.nvlink_errors == float(sum(range(1, 19)) * (1 + 2 + 3 + 4))
    assert set(NVLINK_ERROR_KEYS) == {"crc_flit_errors", "crc_data_errors", "replay_errors", "recovery_errors"}


def test_absent_counters_count_nothing_and_no_links_is_none() -> None:
    assert GpuSample(index=0, nvlinks=_links(4, replay_errors=1)).nvlink_errors == 10.0
    assert GpuSample(index=0, nvlinks=[{"link": 0, "active": False}]).nvlink_errors == 0.0
    assert GpuSample(index=0).nvlink_errors is None
    assert GpuSample(index=0, nvlinks=[]).nvlink_errors is None


def test_computed_once_and_not_part_of_the_reading() -> None:
    g = GpuSample(index=0, nvlinks=_links(2, crc_flit_errors=1))
    assert g.nvlink_errors == 3.0
    assert "nvlink_errors" in vars(g)  # cached on the reading
    again = GpuSample.model_validate_json(g.model_dump_json())
    assert again == g and "nvlink_errors" not in again.model_dump()
