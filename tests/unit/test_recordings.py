"""Recording readers (gpuwarden.recordings) on hand-written files in tests/fixtures/recordings
and on the real recordings of ../shared/realdata (SOURCE.md facts)."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest

from gpuwarden.recordings import gpu_spec, infer_gpu_count, load_recording
from gpuwarden.shared.nvidia.dcgm_exporter import parse_dcgm_exporter_scrape
from gpuwarden.shared.nvidia.smi_table import parse_nvidia_smi_table
from gpuwarden.shared.nvidia.smi_text import parse_nvidia_smi_csv_records
from prerequisites import give_up, needs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "realdata"
PLATO_COLS = [
    "timestamp",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.free",
    "temperature.gpu",
    "power.draw",
]


def _gpu(rec, tick: int, idx: int):
    s = rec.samples[tick]
    return next(g for g in s.gpus if g.index == idx)


def test_header_units_nounits_index_pstate_driver() -> None:
    r = load_recording([FIX / "smi-csv-header-units-nounits.csv"])
    assert r.formats == {str(FIX / "smi-csv-header-units-nounits.csv"): "nvidia-smi-csv"}
    assert r.gpu_indices == [0, 1] and len(r.samples) == 6 and r.rows == 12
    g = _gpu(r, 0, 0)
    assert (g.name, g.performance_state, g.power_w, g.sm_clock_mhz, g.memory_used_mib) == (
        "NVIDIA RTX A6000",
        2,
        250.5,
        1800.0,
        25073.0,
    )
    assert r.samples[0].driver_version == "550.54.15"
    assert r.interval_s == pytest.approx(1.0)
    assert g.memory_total_mib is None and g.temperature_c == 60.0 and "memory_total_mib" not in r.fields


def test_units_in_values_pci_ids_numbered_in_order_of_appearance() -> None:
    r = load_recording([FIX / "smi-csv-units-in-values-pci.csv"])
    assert r.gpu_indices == [0, 1]
    g0, g1 = _gpu(r, 1, 0), _gpu(r, 1, 1)
    assert (g0.pci_bus_id, g1.pci_bus_id) == ("0000:3b:00.0", "0000:18:00.0")
    assert (g0.power_w, g0.utilization_gpu_pct, g0.memory_used_mib) == (72.25, 10.0, 131.0)
    assert g0.fan_speed_pct is None and "fan_speed_pct" not in r.fields  # [N/A] is absent, not 0


def test_eight_gpus_cycling_without_index_inferred_and_truncated_last_line() -> None:
    r = load_recording([FIX / "smi-csv-8gpu-noindex.csv"])
    assert r.gpu_indices == list(range(8))
    assert any("inferred 8 GPUs" in n for n in r.notes)
    assert any("last line 202" in n and "skipped" in n for n in r.notes)
    assert r.rows == 201
    # GPU 0 is the ~124 MiB one at 0 %, the others 17 MiB at 100 %
    g0, g5 = _gpu(r, 1, 0), _gpu(r, 1, 5)
    assert (g0.memory_used_mib, g0.utilization_gpu_pct, g5.memory_used_mib, g5.utilization_gpu_pct) == (
        124.0,
        0.0,
        17.0,
        100.0,
    )
    assert r.interval_s == pytest.approx(0.1, abs=0.002)
    forced = load_recording([FIX / "smi-csv-8gpu-noindex.csv"], gpus=4)
    assert forced.gpu_indices == [0, 1, 2, 3] and not any("inferred" in n for n in forced.notes)


def test_malformed_middle_line_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    text = (FIX / "smi-csv-8gpu-noindex.csv").read_text().splitlines()
    text[5] = "2025/07/27 00:22:27.868, 70.00 W, lots %, 17 MiB"
    p = tmp_path / "bad.csv"
    p.write_text("\n".join(text) + "\n")
    with pytest.raises(ValueError, match=r"bad\.csv: line 6: utilization\.gpu"):
        load_recording([p])
    text[5] = "2025/07/27 00:22:27.868, 70.00 W"
    p.write_text("\n".join(text) + "\n")
    with pytest.raises(ValueError, match=r"bad\.csv: line 6: 2 values, header has 4"):
        load_recording([p])


def test_headerless_needs_columns() -> None:
    with pytest.raises(ValueError, match="no CSV header"):
        load_recording([FIX / "smi-csv-noheader-5s.csv"])
    r = load_recording([FIX / "smi-csv-noheader-5s.csv"], columns=PLATO_COLS)
    assert len(r.samples) == 8 and r.interval_s == pytest.approx(5.0)
    g = _gpu(r, 4, 0)
    assert (g.utilization_gpu_pct, g.memory_used_mib, g.memory_free_mib, g.temperature_c) == (
        50.0,
        1900.0,
        18248.0,
        27.0,
    )
    # 5 s readings on a 1 s tick: one sample at its own tick, nothing invented between
    assert [s.ts for s in r.samples[:2]] == [r.samples[0].ts, r.samples[0].ts + 5.0]
    assert r.gaps == []  # a 5 s interval is no gap


def test_custom_iso_logger_aliases() -> None:
    r = load_recording([FIX / "custom-iso-logger-8gpu.csv"])
    assert r.fields == {"temperature_c", "utilization_gpu_pct", "power_w"}
    assert r.gpu_indices == list(range(8))
    assert r.samples[0].ts == 1758685713.0  # 2025-09-24T03:48:33Z
    g1 = _gpu(r, 0, 1)
    assert g1.temperature_c == 54.0 and g1.power_w == pytest.approx(388.26)
    assert g1.memory_used_mib is None and g1.sm_clock_mhz is None


def test_one_ms_readings_summarised_per_tick() -> None:
    r = load_recording([FIX / "smi-csv-1ms-1gpu.csv"])
    assert r.gpu_indices == [0] and len(r.samples) == 2 and r.rows == 40
    first, second = r.samples[0].gpus[0], r.samples[1].gpus[0]
    # tick 06:10:28: 20 rows (k = 0..19): util 0/100 alternating -> mean 50; power 300..319 -> mean 309.5
    assert first.utilization_gpu_pct == 50.0 and first.power_w == pytest.approx(309.5)
    assert first.sm_clock_mhz == 825.0  # min clock in the tick (one 825 MHz reading)
    assert first.temperature_c == 74.0  # max
    assert second.sm_clock_mhz == 1485.0 and second.power_w == pytest.approx(329.5)
    assert r.interval_s == pytest.approx(0.001, abs=2e-4)


def test_tick_of_ten_seconds_and_gap_is_not_filled(tmp_path: Path) -> None:
    lines = ["timestamp, index, power.draw [W]"]
    lines += [f"2025/01/01 00:00:{s:02d}.000, 0, {100 + s} W" for s in range(0, 10)]
    lines += [f"2025/01/01 00:00:{s:02d}.000, 0, {100 + s} W" for s in range(40, 45)]
    p = tmp_path / "gap.csv"
    p.write_text("\n".join(lines) + "\n")
    r = load_recording([p])
    assert len(r.samples) == 15 and r.gaps == [(1735689609.0, 1735689640.0)]
    r10 = load_recording([p], tick_s=10.0)
    assert [s.ts - 1735689600.0 for s in r10.samples] == [0.0, 40.0]
    assert r10.samples[0].gpus[0].power_w == pytest.approx(104.5)


def test_gzip_read_transparently(tmp_path: Path) -> None:
    p = tmp_path / "x.csv.gz"
    p.write_bytes(gzip.compress((FIX / "smi-csv-header-units-nounits.csv").read_bytes()))
    assert len(load_recording([p]).samples) == 6


def test_infer_gpu_count() -> None:
    one_7ms = [i * 0.007 + (0.001 if i % 3 == 0 else 0.0) for i in range(300)]
    assert infer_gpu_count(one_7ms) == 1
    three = [k * 0.1 + g * 0.006 for k in range(50) for g in range(3)]
    assert infer_gpu_count(three) == 3
    assert infer_gpu_count([0.0, 1.0]) is None


def test_dmon_with_date_time_and_repeated_header() -> None:
    r = load_recording([FIX / "dmon-o-DT.txt"])
    assert list(r.formats.values()) == ["nvidia-smi-dmon"] and len(r.samples) == 3 and r.rows == 6
    g0, g1 = _gpu(r, 2, 0), _gpu(r, 2, 1)
    assert (g0.power_w, g0.temperature_c, g0.memory_temperature_c, g0.utilization_gpu_pct) == (320.0, 62.0, 71.0, 99.0)
    assert (g0.memory_clock_mhz, g0.graphics_clock_mhz) == (2619.0, 1950.0)
    assert g1.memory_temperature_c is None  # "-"
    assert r.samples[0].ts == 1737426093.0


def test_dmon_without_time_is_relative_with_a_note() -> None:
    r = load_recording([FIX / "dmon-plain.txt"])
    assert [s.ts for s in r.samples] == [0.0, 1.0]
    assert _gpu(r, 1, 0).graphics_clock_mhz == 1530.0
    assert any("without -o DT" in n for n in r.notes)


def test_dcgm_scrapes_mig_domain_xid() -> None:
    r = load_recording([FIX / "dcgm-scrapes-mig-domain.prom"])
    assert list(r.formats.values()) == ["dcgm-exporter"]
    assert [s.ts for s in r.samples] == [1737426090.0, 1737426105.0]
    a30, h100 = _gpu(r, 0, 0), _gpu(r, 0, 1)
    assert (a30.mig_mode, a30.mig_instances, a30.memory_used_mib, a30.temperature_c) == (True, 2, 3844.0, 50.0)
    assert h100.pci_bus_id == "0001:3b:00.0"  # non-zero domain kept
    assert (h100.power_w, h100.utilization_gpu_pct, h100.tensor_activity_pct) == (650.5, 99.0, pytest.approx(45.3))
    assert h100.throttle_reasons == ["sw_power_cap"] and a30.power_w is None
    assert _gpu(r, 1, 1).throttle_reasons == ["sw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert [(e.code, e.gpu_index, e.ts) for e in r.events] == [(79, 1, 1737426105.0)]


def test_dcgm_parse_kind_keeps_mig_series_distinct() -> None:
    text = (FIX / "dcgm-scrapes-mig-domain.prom").read_text().split("# scrape at 2025-01-21T02:21:45Z")[0]
    out = parse_dcgm_exporter_scrape(text)
    temps = [(s["gpu"], s["gpu_instance"], s["value"]) for s in out["series"] if s["name"] == "DCGM_FI_DEV_GPU_TEMP"]
    assert temps == [(0, 6, 50.0), (0, 3, 50.0), (1, None, 44.0)]
    assert {g["index"] for g in out["gpus"]} == {0, 1}
    with pytest.raises(ValueError, match="no DCGM_FI_"):
        parse_dcgm_exporter_scrape("up 1\n")


def test_shared_dcgm_fixture_mig() -> None:
    p = (
        Path(__file__).resolve().parents[2]
        / ".."
        / "shared"
        / "fixtures"
        / "dcgm"
        / "dcgm-exporter-metrics-mixed-model-mig.txt"
    )
    if not p.exists():
        give_up(f"{p} absent (../shared/fixtures not beside this checkout)")
    out = parse_dcgm_exporter_scrape(p.read_text())
    fb = [s for s in out["series"] if s["name"] == "DCGM_FI_DEV_FB_USED"]
    assert (fb[0]["gpu"], fb[0]["gpu_instance"], fb[0]["value"]) == (0, 6, 3744.0)
    temps = {(s["gpu"], s["gpu_instance"]): s["value"] for s in out["series"] if s["name"] == "DCGM_FI_DEV_GPU_TEMP"}
    assert temps == {(1, None): 44.0, (2, 3): 45.0, (0, 3): 50.0}


def test_plain_table_two_driver_generations() -> None:
    old = parse_nvidia_smi_table((FIX / "smi-table-470.txt").read_text())
    assert len(old) == 1 and old[0].driver_version == "470.57.02" and old[0].cuda_version == "11.4"
    g0, g1 = old[0].gpus
    assert (g0.name, g0.pci_bus_id, g0.temperature_c, g0.power_w, g0.power_limit_w) == (
        "Tesla V100-SXM2...",
        "0000:00:1e.0",
        34.0,
        23.0,
        300.0,
    )
    assert g0.fan_speed_pct is None and g1.utilization_gpu_pct == 98.0 and g1.memory_used_mib == 15000.0
    assert g1.processes == [{"pid": 12345, "name": "python", "used_memory_mib": 14997.0}]
    r = load_recording([FIX / "smi-table-535-series.txt"])
    assert [s.ts for s in r.samples] == [1796131264.0, 1796131269.0]
    assert r.samples[0].driver_version == "535.104.05" and r.samples[0].cuda_version == "12.2"
    assert (_gpu(r, 0, 1).power_w, _gpu(r, 1, 1).power_w, _gpu(r, 1, 0).temperature_c) == (650.0, 690.0, 35.0)
    assert _gpu(r, 0, 1).memory_total_mib == 81559.0 and _gpu(r, 0, 0).mig_mode is False


def test_table_without_date_line_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text((FIX / "smi-table-470.txt").read_text().split("\n", 1)[1])
    with pytest.raises(ValueError, match="no date line"):
        load_recording([p])


def test_kernel_logs_all_time_formats() -> None:
    iso = load_recording([FIX / "dmesg-iso.log"])
    assert [(e.code, e.ts) for e in iso.events] == [(13, 1737426093.498559), (43, pytest.approx(1737426094.1))]
    assert iso.events[1].pid == 1234 and iso.events[0].gpu_index is None
    t = load_recording([FIX / "dmesg-T.log"])
    assert [(e.code, e.ts) for e in t.events] == [(119, 1740327858.0), (119, 1740328213.0)]
    rel = load_recording([FIX / "dmesg-relative.log"])
    assert [(e.code, e.ts) for e in rel.events] == [(48, 365.969681), (63, 366.0)]
    assert any("no boot_ts" in n for n in rel.notes)
    booted = load_recording([FIX / "dmesg-relative.log"], boot_ts=1_700_000_000.0)
    assert booted.events[0].ts == pytest.approx(1_700_000_365.969681) and not booted.notes
    jp = load_recording([FIX / "journalctl-short-precise.log"])
    assert [e.code for e in jp.events] == [79] and jp.events[0].ts % 86400 == pytest.approx(5 * 3600 + 222.118734)
    js = load_recording([FIX / "journalctl-short.log"])
    assert [(e.code, e.pid) for e in js.events] == [(31, 4242)]


def test_journalctl_json_shared_fixture() -> None:
    p = Path(__file__).resolve().parents[1] / "fixtures" / "journalctl" / "kernel-json.txt"
    r = load_recording([p])
    assert list(r.formats.values()) == ["journalctl-json"]
    assert [e.code for e in r.events] == [149, 48, 20034, 79]
    assert r.events[0].ts == pytest.approx(1739509422.118734)


def test_events_attributed_by_pci_when_the_recording_knows_the_gpus() -> None:
    r = load_recording([FIX / "smi-table-535-series.txt", FIX / "dmesg-iso.log"])
    assert [(e.code, e.gpu_index) for e in r.events] == [(13, 0), (43, 1)]
    assert r.samples and r.fields >= {"power_w", "temperature_c"}


def test_format_errors() -> None:
    with pytest.raises(ValueError, match="no such file"):
        load_recording([FIX / "nope.csv"])
    with pytest.raises(ValueError, match="unknown format"):
        load_recording([FIX / "dmesg-iso.log"], fmt="excel")


def test_parse_kind_csv_records_keep_every_column() -> None:
    text = "name, clocks.current.video [MHz], power.draw [W]\nTesla T4, 835, 28.16\n"
    out = parse_nvidia_smi_csv_records(text)
    assert not isinstance(out, Exception) and isinstance(out, list)
    assert out[0]["columns"]["clocks.current.video"] == 835.0 and out[0]["gpu"].power_w == 28.16


@pytest.mark.parametrize(
    ("name", "power", "clock", "mem_gib"),
    [
        ("H100 80GB HBM3", 700, 1980, 80),
        ("NVIDIA H100 80GB HBM3", 700, 1980, 80),
        ("H100-SXM5-80GB", 700, 1980, 80),
        ("NVIDIA H100 PCIe", 350, 1755, 80),
        ("A100-SXM4-40GB", 400, 1410, 40),
        ("A100 80GB PCIe", 300, 1410, 80),
        ("NVIDIA GeForce RTX 4090", 450, 2520, 24),
        ("RTX 4090", 450, 2520, 24),
        ("NVIDIA RTX A6000", 300, 1800, 48),
        ("TITAN X (Pascal)", 250, 1531, 12),
        ("Tesla T4", 70, 1590, 16),
        ("V100", 300, 1530, 16),
        ("L40S", 350, 2520, 48),
        ("NVIDIA B200", 1000, 1965, 180),
    ],
)
def test_gpu_spec(name: str, power: float, clock: float, mem_gib: float) -> None:
    s = gpu_spec(name)
    assert s is not None, name
    assert (s.power_limit_w, s.max_sm_clock_mhz, s.memory_total_mib) == (power, clock, mem_gib * 1024)


def test_gpu_spec_unknown() -> None:
    assert gpu_spec("Matrox G200") is None


# -- real recordings (../shared/realdata, SOURCE.md facts) -----------------------------------

needs_real = needs(REAL)


def _no_zero_filled(rec, absent: set[str]) -> None:
    for s in rec.samples[:: max(1, len(rec.samples) // 50)]:
        for g in s.gpus:
            for f in absent:
                assert getattr(g, f) is None, (f, s.ts)


@needs_real
@pytest.mark.parametrize(
    ("rel", "gpus", "duration", "fields", "kw"),
    [
        ("h100x8-llama3-8b-ckpt/ckpt1.csv.gz", 8, 697, {"power_w", "utilization_gpu_pct", "memory_used_mib"}, {}),
        ("h100x8-llama3-8b-ckpt/ckpt1000.csv.gz", 8, 698, {"power_w", "utilization_gpu_pct", "memory_used_mib"}, {}),
        (
            "h100x8-colocated-nanogpt-pr643/gpu_metrics_b443a1c3.csv.gz",
            8,
            1348,
            {"power_w", "utilization_gpu_pct", "temperature_c"},
            {},
        ),
        (
            "a100-swing-llm-inference/llama2-70b_4gpu_2024-04-05_06-17-19.nvidia-smi.csv.gz",
            4,
            1301,
            {"power_w", "utilization_gpu_pct", "utilization_memory_pct"},
            {},
        ),
        (
            "a100-swing-llm-inference/mixtral-8x7b_3gpu_2024-04-04_10-54-15.nvidia-smi.csv.gz",
            3,
            714,
            {"power_w", "utilization_gpu_pct", "utilization_memory_pct"},
            {},
        ),
        (
            "a100-swing-llm-inference/falcon-7b_1gpu_2024-04-03_11-36-01.nvidia-smi.csv.gz",
            1,
            5346,
            {"power_w", "utilization_gpu_pct", "utilization_memory_pct"},
            {},
        ),
        (
            "h100pcie-gemm-powercap/fp16_half_maxpower.csv.gz",
            1,
            208,
            {
                "utilization_gpu_pct",
                "temperature_c",
                "memory_temperature_c",
                "power_w",
                "sm_clock_mhz",
                "memory_clock_mhz",
            },
            {},
        ),
        (
            "titanx2-gpt-ddp/power-trace_2gpu_2025-12-05-02-37-06_gloo.csv.gz",
            2,
            433,
            {"power_w", "utilization_gpu_pct", "memory_used_mib"},
            {},
        ),
        (
            "rtx4090-vlm-1gpu/gpu_log.csv.gz",
            1,
            2880,
            {"name", "utilization_gpu_pct", "utilization_memory_pct", "memory_used_mib", "power_w"},
            {},
        ),
        (
            "1gpu-idle-allocation-plato/gpu_log.csv.gz",
            1,
            9637,
            {
                "utilization_gpu_pct",
                "utilization_memory_pct",
                "memory_used_mib",
                "memory_free_mib",
                "temperature_c",
                "power_w",
            },
            {"columns": PLATO_COLS},
        ),
        (
            "a6000x2-one-idle-openad/gpu_usage.csv.gz",
            2,
            479,
            {
                "name",
                "utilization_gpu_pct",
                "utilization_memory_pct",
                "memory_total_mib",
                "memory_used_mib",
                "memory_free_mib",
            },
            {},
        ),
    ],
)
def test_real_recording(rel: str, gpus: int, duration: float, fields: set[str], kw: dict) -> None:  # type: ignore[type-arg]
    r = load_recording([REAL / rel], **kw)
    assert r.gpu_indices == list(range(gpus))
    assert r.start_ts is not None and r.end_ts is not None
    assert r.end_ts - r.start_ts == pytest.approx(duration, abs=2)
    assert r.fields == fields
    absent = {"temperature_c", "power_w", "memory_used_mib", "sm_clock_mhz", "utilization_memory_pct"} - fields
    _no_zero_filled(r, absent)
    assert all(len(s.gpus) <= gpus for s in r.samples)
    assert [s.ts for s in r.samples] == sorted({s.ts for s in r.samples})


@needs_real
def test_real_rtx4090_gaps() -> None:
    r = load_recording([REAL / "rtx4090-vlm-1gpu/gpu_log.csv.gz"])
    assert r.interval_s == pytest.approx(1.0, abs=0.01)
    ts = [t for s in r.samples for t in [s.ts]]
    over2 = sum(1 for a, b in itertools.pairwise(ts) if b - a > 2)
    assert 80 <= over2 <= 92  # SOURCE.md: 86 gaps > 2 s
    assert 70 <= len(r.gaps) <= 86  # > max(3 x 1 s, 2 x tick)
    assert max(b - a for a, b in r.gaps) == pytest.approx(7.3, abs=0.2)


@needs_real
def test_real_ckpt_rank0_is_the_124mib_gpu_and_last_line_note() -> None:
    r = load_recording([REAL / "h100x8-llama3-8b-ckpt/ckpt1.csv.gz"])
    first = r.samples[0]
    assert next(g for g in first.gpus if g.index == 0).memory_used_mib == pytest.approx(120.0, abs=20)
    assert all(g.memory_used_mib == 17.0 for g in first.gpus if g.index)
    assert any("inferred 8 GPUs" in n for n in r.notes)


@needs_real
def test_real_a100_truncated_last_line() -> None:
    r = load_recording([REAL / "a100-swing-llm-inference/falcon-40b_3gpu_2024-04-10_09-01-30.nvidia-smi.csv.gz"])
    assert r.gpu_indices == [0, 1, 2] and any("truncated" in n for n in r.notes)


@needs_real
@pytest.mark.parametrize(
    ("name", "codes", "pci", "span"),
    [
        ("dmesg.decode.iso.log.0", {13: 629, 43: 7}, "0000:38:00.0", 8410.8),
        ("dmesg.0.log", {48: 1, 63: 1, 94: 9}, "0000:19:00.0", 0.17),
        ("dmesg-with-xid-119.log", {119: 5}, "0000:9b:00.0", 355.0),
    ],
)
def test_real_kernel_logs(name: str, codes: dict[int, int], pci: str, span: float) -> None:
    r = load_recording([REAL / "xid-kernel-logs-gpud" / name])
    got: dict[int, int] = {}
    for e in r.events:
        got[e.code or 0] = got.get(e.code or 0, 0) + 1
    assert got == codes
    assert {e.pci_bus_id for e in r.events} == {pci}
    assert r.events[-1].ts - r.events[0].ts == pytest.approx(span, abs=0.1)
    assert [e.ts for e in r.events] == sorted(e.ts for e in r.events)


def test_a_bad_input_names_the_file(tmp_path: Path) -> None:
    """A new user's ``analyze /tmp`` or an empty file said only "unknown recording format"."""
    from gpuwarden.recordings import load_recording

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: no recording files"):
        load_recording([tmp_path / "empty"])
    (tmp_path / "zero.csv").write_text("")
    with pytest.raises(ValueError, match=r"zero\.csv: empty file"):
        load_recording([tmp_path / "zero.csv"])
    (tmp_path / "notes.txt").write_text("hello\nworld\n")
    with pytest.raises(ValueError, match=r"notes\.txt: unknown recording format"):
        load_recording([tmp_path / "notes.txt"])
