"""Parsers of gpuwarden.health_check on recorded real output (tests/fixtures/{infiniband,dcgm,nvlink}).

Expected values follow each fixture's .md sidecar ("Correct interpretation")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.health_check.parsers import (
    parse_dcgmi_diag,
    parse_ib_rate,
    parse_ibstat,
    parse_ibstatus,
    parse_nvidia_smi_nvlink,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
IBSTAT = FIX / "infiniband" / "ibstat-h100-ndr-8ib-1eth-all-active.txt"
IBSTATUS = FIX / "infiniband" / "ibstatus-a100-hdr-all-active.txt"
DIAG = FIX / "dcgm" / "diag-r2-go-dcgm-gpu1-pass-excerpt.txt"
NVLINK = FIX / "nvlink" / "nvlink-status-a100-8gpu.txt"


def test_every_fixture_has_its_sidecar() -> None:
    for d in ("infiniband", "dcgm", "nvlink"):
        for f in (FIX / d).glob("*.txt"):
            assert f.with_suffix(".md").read_text().count("Correct interpretation") == 1, f


def test_ibstat_h100_ndr_space_indented() -> None:
    ports = parse_ibstat(IBSTAT.read_text())
    assert len(ports) == 9
    ib = [p for p in ports if p.link_layer == "InfiniBand"]
    eth = [p for p in ports if p.link_layer == "Ethernet"]
    assert len(ib) == 8 and len(eth) == 1
    assert {p.rate_gbps for p in ib} == {400.0} and eth[0].rate_gbps == 200.0
    assert all(p.state == "ACTIVE" and p.phys_state == "LinkUp" for p in ports)
    assert ports[0].device == "mlx5_0" and ports[0].base_lid == 128 and ports[0].ca_type == "MT4129"
    assert eth[0].device == "mlx5_bond_0" and eth[0].firmware == "32.38.3056"


def test_ibstat_accepts_tabs_and_reads_down_port() -> None:
    text = (
        "CA 'mlx5_3'\n\tCA type: MT4123\n\tPort 1:\n\t\tState: Down\n"
        "\t\tPhysical state: Disabled\n\t\tRate: 10\n\t\tLink layer: InfiniBand\n"
    )
    (p,) = parse_ibstat(text)
    assert (p.device, p.state, p.phys_state, p.rate_gbps) == ("mlx5_3", "DOWN", "Disabled", 10.0)


def test_ibstatus_a100_hdr_hex_lids() -> None:
    ports = parse_ibstatus(IBSTATUS.read_text())
    assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(9)]
    ib = ports[:8]
    assert all(p.state == "ACTIVE" and p.phys_state == "LinkUp" and p.rate_gbps == 200.0 for p in ib)
    assert all(p.width == "4X" and p.speed == "HDR" and p.link_layer == "InfiniBand" for p in ib)
    assert ports[0].base_lid == 13247  # 0x33bf, matching ibstat's decimal "Base lid"
    assert ports[8].link_layer == "Ethernet" and ports[8].rate_gbps == 40.0 and ports[8].speed == "QDR"


def test_ib_rate_forms() -> None:
    assert parse_ib_rate("400 Gb/sec (4X NDR)") == (400.0, "4X", "NDR")
    assert parse_ib_rate("400") == (400.0, None, None)
    assert parse_ib_rate("unknown") == (None, None, None)


def test_dcgmi_diag_cut_off_excerpt_is_incomplete() -> None:
    d = parse_dcgmi_diag(DIAG.read_text())
    assert (d.dcgm_version, d.driver_version, d.device_ids, d.group) == ("3.3.1", "535.129.03", ["1eb8"], 8)
    assert [t.name for t in d.tests][-1] == "Page Retirement/Row Remap"
    assert len(d.tests) == 7 and all(t.result == "pass" and t.section == "Deployment" for t in d.tests)
    assert d.complete is False


DIAG_FULL = """Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.1                                          |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| Persistence Mode          | Skip                                           |
|-----  Hardware  ----------+------------------------------------------------|
| GPU Memory                | Fail - GPU: 0                                  |
|                           | Warning: GPU 0 Thermal violations totaling 13 s|
| Diagnostic                | Warn - GPUs: 0, 1                              |
+---------------------------+------------------------------------------------+
"""


def test_dcgmi_diag_results_sections_and_gpus() -> None:
    d = parse_dcgmi_diag(DIAG_FULL)
    assert d.complete is True and d.group is None
    res = {t.name: (t.section, t.result, t.gpus) for t in d.tests}
    assert res["Denylist"] == ("Deployment", "pass", [])
    assert res["Persistence Mode"] == ("Deployment", "skip", [])
    assert res["GPU Memory"] == ("Hardware", "fail", [0])
    assert res["Diagnostic"] == ("Hardware", "warn", [0, 1])
    assert len(d.tests) == 4  # the continuation row is no test of its own
    assert next(t for t in d.tests if t.name == "GPU Memory").detail.endswith("Thermal violations totaling 13 s")


def test_nvlink_status_a100_all_96_links_up() -> None:
    gpus = parse_nvidia_smi_nvlink(NVLINK.read_text())
    assert [g.index for g in gpus] == list(range(8))
    assert all(len(g.links) == 12 and all(lk.active and lk.gbps == 25.0 for lk in g.links) for g in gpus)
    assert sum(lk.gbps or 0 for lk in gpus[0].links) == 300.0
    assert gpus[0].name == "NVIDIA A100-SXM4-80GB" and gpus[7].uuid == "GPU-00000000-0000-0000-0000-000000000008"


def test_nvlink_inactive_link() -> None:
    (g,) = parse_nvidia_smi_nvlink("GPU 0: NVIDIA H100 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n")
    assert [(lk.link, lk.active) for lk in g.links] == [(0, True), (1, False)]


@pytest.mark.parametrize(
    ("fn", "foreign"),
    [
        (parse_ibstat, IBSTATUS),
        (parse_ibstatus, IBSTAT),
        (parse_dcgmi_diag, NVLINK),
        (parse_nvidia_smi_nvlink, IBSTAT),
    ],
)
def test_foreign_input_raises(fn: object, foreign: Path) -> None:
    with pytest.raises(ValueError, match="not "):
        fn(foreign.read_text())  # type: ignore[operator]


def test_nvlink_unreadable_link_line_raises() -> None:
    with pytest.raises(ValueError, match="unreadable link"):
        parse_nvidia_smi_nvlink("GPU 0: X\n Link 0: ???\n")


@pytest.mark.parametrize(("name", "path"), [("ibstat", IBSTAT), ("nvidia-smi-nvlink", NVLINK)])
def test_gpuwarden_parse_command(name: str, path: Path) -> None:
    exe = Path(sys.executable).with_name("gpuwarden")
    out = subprocess.run([str(exe), "parse", name, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert len(data) in (8, 9)
