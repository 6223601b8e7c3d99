"""Parser fixes found with recorded public outputs (issue 15): dcgm-exporter counters and 1.x names,
failed-probe kernel messages, and the values each new recorded fixture must give."""

from __future__ import annotations

import json
from pathlib import Path

from gpuwarden.shared.nvidia.dcgm_exporter import parse_dcgm_exporter_scrape
from gpuwarden.shared.nvidia.kernel_log import parse_kmsg

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_dcgm_counter_without_total_suffix_keeps_its_value() -> None:
    # prometheus_client renames the samples of "# TYPE X counter" to X_total; they must still map
    text = (
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-a"} 3\n'
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a"} 5000\n'
    )
    doc = parse_dcgm_exporter_scrape(text)
    assert [s["name"] for s in doc["series"]] == [
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ]
    (gpu,) = doc["gpus"]
    assert gpu["ecc_dbe_volatile"] == 3
    assert gpu["energy_j"] == 5.0


def test_dcgm_exporter_1x_names() -> None:
    doc = parse_dcgm_exporter_scrape((FIX / "dcgm/dcgm-exporter-1x-gpu-monitoring-tools-counter.txt").read_text())
    (gpu,) = doc["gpus"]
    assert gpu["index"] == 0
    assert gpu["temperature_c"] == 34.0
    assert gpu["power_w"] == 31.737
    assert gpu["sm_clock_mhz"] == 135.0
    assert abs(gpu["energy_j"] - 7824.041) < 1e-6
    assert gpu["xid_last"] == 0
    assert "dcgm_gpu_temp" not in {s["name"] for s in doc["series"]}


def test_probe_failed_bar0_names_the_gpu() -> None:
    evs = parse_kmsg((FIX / "kmsg/nvrm-probe-failed-bar0-invalid.txt").read_text())
    assert [(e.kind.value, e.pci_bus_id) for e in evs] == [("gpu-lost", "0000:01:00.0")] * 2
    assert all("BAR0" in e.message for e in evs)


def test_probe_failed_after_fallen_off_bus_is_not_a_second_unnamed_loss() -> None:
    text = (
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n"
    )
    evs = parse_kmsg(text)
    assert [(e.kind.value, e.code, e.pci_bus_id) for e in evs] == [("xid", 79, "0000:b3:00.0")]


def test_probe_failed_unnamed_device() -> None:
    evs = parse_kmsg("[    6.5] NVRM: The NVIDIA probe routine failed for 2 device(s).\n")
    assert [(e.kind.value, e.pci_bus_id) for e in evs] == [("gpu-lost", None)]
    assert "2 not named" in evs[0].message


def test_legacy_fallen_off_bus_is_one_xid79() -> None:
    evs = parse_kmsg((FIX / "kmsg/nvrm-gpu-at-fallen-off-bus-legacy.txt").read_text())
    assert [(e.kind.value, e.code, e.pci_bus_id) for e in evs] == [("xid", 79, "0000:01:00.0")]


def test_table_550_h100_golden_values() -> None:
    doc = json.loads((FIX / "nvidia-smi/table-550-h100-8gpu-no-procs.expected.json").read_text())
    (table,) = doc
    assert table["driver_version"] == "550.90.07"
    gpus = table["gpus"]
    assert [g["pci_bus_id"] for g in gpus][:2] == ["0000:19:00.0", "0000:3b:00.0"]
    assert len(gpus) == 8
    assert (gpus[0]["temperature_c"], gpus[0]["power_w"], gpus[0]["power_limit_w"]) == (27.0, 72.0, 700.0)
    assert gpus[0]["memory_total_mib"] == 81559.0
