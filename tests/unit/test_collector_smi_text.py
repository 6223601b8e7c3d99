"""nvidia-smi -q text and --query-gpu CSV parsers over recorded real output (tests/fixtures/nvidia-smi);
expected values from each fixture's .md sidecar."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.shared.nvidia.smi_text import (
    SmiError,
    detect_smi_error,
    parse_nvidia_smi_csv,
    parse_nvidia_smi_csv_samples,
    parse_nvidia_smi_q,
)
from gpuwarden.shared.nvidia.smi_xml import SmiReport

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def _q(name: str) -> SmiReport:
    rep = parse_nvidia_smi_q((FIX / f"{name}.txt").read_text())
    assert isinstance(rep, SmiReport)
    return rep


def test_h100_q_one_gpu_throttled_nested_reasons() -> None:
    rep = _q("h100-8gpu-q-sw-thermal-one-gpu")
    assert (rep.driver_version, rep.cuda_version, len(rep.gpus)) == ("535.183.01", "12.2", 8)
    odd = [g for g in rep.gpus if g.throttle_reasons != ["gpu_idle"]]
    assert [g.pci_bus_id for g in odd] == ["0000:75:00.0"]
    g = odd[0]
    # nested HW Power Brake is read although its parent HW Slowdown line is Not Active
    assert g.throttle_reasons == ["sw_power_cap", "hw_power_brake_slowdown", "sw_thermal_slowdown"]
    assert (g.sm_clock_mhz, g.power_w, g.temperature_c, g.utilization_gpu_pct) == (1980.0, 118.01, 39.0, 0.0)
    assert g.processes == [{"pid": 1002127, "used_memory_mib": 9212.0}]
    others = [x for x in rep.gpus if x is not g]
    assert all(x.sm_clock_mhz == 345.0 for x in others)
    g0 = rep.gpus[0]
    assert g0.index == 0 and g0.uuid == "GPU-00000000-0000-0000-0000-000000000001"
    assert (g0.memory_total_mib, g0.memory_reserved_mib, g0.memory_free_mib) == (81559.0, 551.0, 81007.0)
    assert (g0.pcie_link_gen, g0.pcie_link_gen_max, g0.pcie_link_width, g0.pcie_replay_count) == (5, 5, 16, 120)
    assert (g0.pcie_tx_kbps, g0.pcie_rx_kbps) == (632.0, 531.0)
    assert g0.performance_state == 0 and g0.mig_mode is False and g0.processes == []
    assert (g0.remapped_rows_pending, g0.remapped_rows_correctable) == (False, 0)
    # Hopper prints T.Limit offsets (-2 C, -8 C), not thresholds: absent, never those values
    assert g0.temperature_slowdown_c is None and g0.temperature_shutdown_c is None
    assert g0.fan_speed_pct is None and g0.retired_pages_sbe is None


def test_titanv_q_na_is_absent_not_zero() -> None:
    rep = _q("titanv-q-560")
    assert (rep.driver_version, len(rep.gpus)) == ("560.35.03", 1)
    g = rep.gpus[0]
    assert (g.pci_bus_id, g.temperature_c, g.power_w, g.power_limit_w) == ("0000:01:00.0", 44.0, 29.02, 250.0)
    assert g.throttle_reasons == ["gpu_idle"]
    assert g.remapped_rows_pending is None and g.remapped_rows_correctable is None
    assert g.retired_pages_sbe is None and g.retired_pages_dbe is None and g.retired_pages_pending is None
    assert g.ecc_sbe_volatile is None and g.ecc_dbe_aggregate is None
    assert (g.temperature_slowdown_c, g.temperature_shutdown_c, g.fan_speed_pct) == (97.0, 100.0, 30.0)
    assert g.performance_state == 8 and g.mig_mode is None
    assert [p["pid"] for p in g.processes or []] == [100607, 100838, 101815]


def test_p100_csv_bracket_na() -> None:
    text = (FIX / "p100-query-gpu-csv-bracket-na.txt").read_text()
    rows = parse_nvidia_smi_csv(text)
    assert not isinstance(rows, SmiError) and len(rows) == 1
    v = rows[0].values
    assert v["fan.speed"] is None
    assert (v["pstate"], v["memory.reserved"], v["memory.used"], v["memory.free"]) == ("P0", 103.0, 0.0, 16280.0)
    assert (v["power.draw"], v["clocks.current.video"], v["name"]) == (28.16, 835.0, "Tesla P100-PCIE-16GB")
    samples = parse_nvidia_smi_csv_samples(text)
    assert not isinstance(samples, SmiError)
    s = samples[0]
    assert s.fan_speed_pct is None and s.performance_state == 0 and s.temperature_c == 37.0
    assert (s.graphics_clock_mhz, s.sm_clock_mhz, s.memory_clock_mhz) == (405.0, 405.0, 715.0)


def test_csv_with_units_and_without_header() -> None:
    with_units = (
        "index, temperature.gpu, power.draw [W], memory.used [MiB]\n"
        "0, 41, 71.97 W, 1024 MiB\n1, 40, [N/A], [Not Supported]\n"
    )
    rows = parse_nvidia_smi_csv(with_units)
    assert not isinstance(rows, SmiError)
    assert rows[0].values == {"index": 0.0, "temperature.gpu": 41.0, "power.draw": 71.97, "memory.used": 1024.0}
    assert rows[1].values["power.draw"] is None and rows[1].values["memory.used"] is None
    nohdr = parse_nvidia_smi_csv("0, 41, 71.97\n", fields=["index", "temperature.gpu", "power.draw"])
    assert not isinstance(nohdr, SmiError) and nohdr[0].values["power.draw"] == 71.97
    with pytest.raises(ValueError, match="no header"):
        parse_nvidia_smi_csv("0, 41, 71.97\n")
    with pytest.raises(ValueError, match="values"):
        parse_nvidia_smi_csv("index, power.draw\n0\n")
    with pytest.raises(ValueError, match="empty"):
        parse_nvidia_smi_csv("\n")


def test_device_handle_error_is_a_typed_result() -> None:
    text = (FIX / "nvidia-smi-device-handle-unknown-error.txt").read_text()
    for fn in (parse_nvidia_smi_q, parse_nvidia_smi_csv_samples):
        err = fn(text)
        assert isinstance(err, SmiError)
        assert (err.kind, err.pci_bus_id, err.reason) == ("device-handle", "0000:0b:00.0", "Unknown Error")


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("No devices were found\n", "no-devices"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
            "latest NVIDIA driver is installed and running.\n",
            "driver-communication",
        ),
        ("Failed to initialize NVML: Driver/library version mismatch\n", "not-supported-driver"),
        ("Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system\n", "gpu-lost"),
    ],
)
def test_other_error_outputs(text: str, kind: str) -> None:
    err = detect_smi_error(text)
    assert err is not None and err.kind == kind


def test_q_rejects_other_text() -> None:
    with pytest.raises(ValueError, match="NVSMI LOG"):
        parse_nvidia_smi_q("hello\n")
