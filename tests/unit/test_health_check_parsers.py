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
    parse_dcgmi_discovery,
    parse_ib_rate,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
    parse_nvidia_smi_nvlink,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
IBSTAT = FIX / "infiniband" / "ibstat-h100-ndr-8ib-1eth-all-active.txt"
IBSTATUS = FIX / "infiniband" / "ibstatus-a100-hdr-all-active.txt"
DIAG = FIX / "dcgm" / "diag-r2-go-dcgm-gpu1-pass-excerpt.txt"
NVLINK = FIX / "nvlink" / "nvlink-status-a100-8gpu.txt"
DISCOVERY = FIX / "dcgm" / "discovery-l-h100-4gpu-null-names-dcgm317.txt"
IBV_CX3 = FIX / "infiniband" / "ibv-devinfo-cx3-2hca-port2-down.txt"
IBV_V = FIX / "infiniband" / "ibv-devinfo-v-cx3-port2-down-polling.txt"
IBV_TABS = FIX / "infiniband" / "ibv-devinfo-cx7-roce-tabs-excerpt.txt"
IBV_HBV2 = FIX / "infiniband" / "ibv-devinfo-hbv2-roce-eth-excerpt.txt"
IBV_IB = FIX / "infiniband" / "ibv-devinfo-ib-sm-lid-active-excerpt.txt"


def test_every_fixture_has_its_sidecar() -> None:
    for d in ("infiniband", "dcgm", "nvlink"):
        files = sorted((FIX / d).glob("*.txt"))
        assert files, f"no fixtures in {FIX / d}"
        for f in files:
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


# -- ibv_devinfo ----------------------------------------------------------------------------


def test_ibv_devinfo_two_dual_port_hcas_port2_down() -> None:
    ports = parse_ibv_devinfo(IBV_CX3.read_text())
    assert [(p.device, p.port, p.state, p.base_lid, p.sm_lid) for p in ports] == [
        ("mlx4_1", 1, "ACTIVE", 22, 1),
        ("mlx4_1", 2, "DOWN", 0, 0),
        ("mlx4_0", 1, "ACTIVE", 32, 18),
        ("mlx4_0", 2, "DOWN", 0, 0),
    ]
    assert {(p.link_layer, p.ca_type, p.firmware, p.phys_state, p.rate_gbps) for p in ports} == {
        ("InfiniBand", "MT4099", "2.42.5000", None, None)  # non-verbose: no physical state, no rate
    }


def test_ibv_devinfo_verbose_port_down_polling_has_no_rate() -> None:
    (p,) = parse_ibv_devinfo(IBV_V.read_text())  # flag lists, "key = value" and GID lines skipped
    assert (p.device, p.port, p.state, p.phys_state, p.link_layer) == ("mlx4_1", 2, "DOWN", "Polling", "InfiniBand")
    assert (p.width, p.speed, p.rate_gbps) == ("4X", "SDR", None)  # reset defaults of a down port, not a rate


def test_ibv_devinfo_verbose_active_port_rate_from_width_and_speed() -> None:
    # the recorded -v port with its state and physical state switched to up (same field layout)
    text = IBV_V.read_text().replace("PORT_DOWN (1)", "PORT_ACTIVE (4)").replace("POLLING (2)", "LINK_UP (5)")
    (p,) = parse_ibv_devinfo(text.replace("2.5 Gbps (1)", "25.0 Gbps (32)"))
    assert (p.state, p.phys_state, p.rate_gbps, p.speed) == ("ACTIVE", "LinkUp", 100.0, "EDR")


@pytest.mark.parametrize(
    ("path", "devices", "layer", "lids"),
    [
        (IBV_TABS, ["mlx5_0", "mlx5_1", "mlx5_2"], "Ethernet", (0, 0)),
        (IBV_HBV2, ["rdmaP23800p0s2"], "Ethernet", (0, 0)),
        (IBV_IB, ["mlx5_3"], "InfiniBand", (1690, 1)),
    ],
)
def test_ibv_devinfo_tab_and_space_layouts(path: Path, devices: list[str], layer: str, lids: tuple[int, int]) -> None:
    ports = parse_ibv_devinfo(path.read_text())
    assert [p.device for p in ports] == devices
    assert all(p.state == "ACTIVE" and p.link_layer == layer and (p.base_lid, p.sm_lid) == lids for p in ports)


def test_ibv_devinfo_port_without_state_raises() -> None:
    text = "".join(ln for ln in IBV_IB.read_text().splitlines(keepends=True) if "state:" not in ln)
    with pytest.raises(ValueError, match="mlx5_3 port 1 has no state"):
        parse_ibv_devinfo(text)


# -- dcgmi discovery -l ------------------------------------------------------------------------


def test_dcgmi_discovery_h100_null_names_no_nvswitch() -> None:
    d = parse_dcgmi_discovery(DISCOVERY.read_text())  # prompt line and right padding ignored
    assert d.gpus_found == 4 and not d.active_only and d.nvswitches == [] and d.others == {}
    assert [(g.gpu_id, g.name, g.pci_bus_id) for g in d.gpus] == [
        (0, None, "00000000:4C:00.0"),  # "<<<NULL>>>": name unknown, not a GPU named so
        (1, None, "00000000:5D:00.0"),
        (2, None, "00000000:CC:00.0"),
        (3, None, "00000000:DC:00.0"),
    ]
    assert d.by_uuid()["gpu-5ea04b20-4cc3-4d84-0bb2-e4143be8e874"].gpu_id == 3


def test_dcgmi_discovery_dcgm4_active_header_all_status_and_other_entities() -> None:
    # DCGM 4 forms per the dcgmi-discovery reference: "(Active)" in the count line; with --all an
    # inactive GPU gets "Status:" and "(last known)" name/bus id; ConnectX devices counted. Built from
    # the recorded table (its rows and widths) with those documented changes applied.
    text = DISCOVERY.read_text().replace("4 GPUs found.", "4 GPUs found (Active).")
    text = text.replace(
        "| 3      | Name: <<<NULL>>>                                           ",
        "| 3      | Name: NVIDIA H100 80GB HBM3 (last known)                    ",
    )
    text = text.replace(
        "|        | Device UUID: GPU-5ea04b20-4cc3-4d84-0bb2-e4143be8e874                |",
        "|        | Device UUID: GPU-5ea04b20-4cc3-4d84-0bb2-e4143be8e874                |\n"
        "|        | Status: Detached                                                     |",
    )
    text += "8 CX devices found.\n+-----------+\n| CX ID     |\n+-----------+\n"
    d = parse_dcgmi_discovery(text)
    assert d.active_only and d.others == {"cx devices": 8}
    g3 = d.gpus[3]
    assert (g3.name, g3.status, g3.last_known) == ("NVIDIA H100 80GB HBM3", "Detached", True)
    assert all(g.status is None and not g.last_known for g in d.gpus[:3])


def test_dcgmi_discovery_host_engine_down_is_not_output() -> None:
    # real dcgmi text when nv-hostengine is not running (NVIDIA/dcgm-exporter#193)
    err = (
        "Error: unable to establish a connection to the specified host: localhost\n"
        "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
    )
    with pytest.raises(ValueError, match="no 'N GPUs found'"):
        parse_dcgmi_discovery(err)


@pytest.mark.parametrize(
    ("fn", "foreign"),
    [
        (parse_ibstat, IBSTATUS),
        (parse_ibstatus, IBSTAT),
        (parse_ibv_devinfo, IBSTAT),
        (parse_dcgmi_diag, NVLINK),
        (parse_dcgmi_discovery, DIAG),
        (parse_nvidia_smi_nvlink, IBSTAT),
    ],
)
def test_foreign_input_raises(fn: object, foreign: Path) -> None:
    with pytest.raises(ValueError, match="not "):
        fn(foreign.read_text())  # type: ignore[operator]


def test_nvlink_unreadable_link_line_raises() -> None:
    with pytest.raises(ValueError, match="unreadable link"):
        parse_nvidia_smi_nvlink("GPU 0: X\n Link 0: ???\n")


@pytest.mark.parametrize(
    ("name", "path", "n"),
    [("ibstat", IBSTAT, 9), ("nvidia-smi-nvlink", NVLINK, 8), ("ibv-devinfo", IBV_CX3, 4), ("ibstatus", IBSTATUS, 9)],
)
def test_gpuwarden_parse_command(name: str, path: Path, n: int) -> None:
    exe = Path(sys.executable).with_name("gpuwarden")
    out = subprocess.run([str(exe), "parse", name, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    if name == "ibstat":  # an IbstatReport: the ports and whether ibstat finished
        assert (doc["complete"], doc["error"]) == (True, None)
        doc = doc["ports"]
    assert len(doc) == n


def test_gpuwarden_parse_dcgmi_discovery_and_diag() -> None:
    exe = Path(sys.executable).with_name("gpuwarden")
    out = subprocess.run(
        [str(exe), "parse", "dcgmi-discovery", str(DISCOVERY)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["gpus_found"] == 4 and data["gpus"][2]["uuid"] == "GPU-879a110e-54dc-22fe-9699-5babde1d450e"
    bad = subprocess.run(
        [str(exe), "parse", "dcgmi-discovery", str(NVLINK)], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1 and "not dcgmi discovery -l output" in bad.stdout + bad.stderr


# -- dcgmi diag: recorded DCGM 2.x / 3.x / 4.x layouts (tests/fixtures/dcgm/diag-*.md) ---------------

DIAG_DCGM441 = FIX / "dcgm" / "diag-r2-dcgm441-b200-8gpu-pcie-fail.txt"
DIAG_DCGM338 = FIX / "dcgm" / "diag-r3-dcgm338-h100-8gpu-cuinit-fail.txt"
DIAG_DCGM2X = FIX / "dcgm" / "diag-r4-dcgm2x-blacklist-all-pass.txt"
DIAG_DCGM423 = FIX / "dcgm" / "diag-dcgm423-4gpu-pcie-fail-excerpt.txt"


def test_dcgmi_diag_dcgm441_per_gpu_rows_and_test_level_fail() -> None:
    d = parse_dcgmi_diag(DIAG_DCGM441.read_text())
    assert (d.dcgm_version, d.driver_version, d.device_ids) == ("4.4.1", "570.172.08", ["2901"] * 8)
    assert d.complete is True and d.group is None
    got = [(t.section, t.name, t.result, t.gpus, t.all_gpus) for t in d.tests]
    assert got == [
        ("Deployment", "software", "pass", list(range(8)), False),
        ("Hardware", "memory", "pass", list(range(8)), False),
        ("Integration", "pcie", "fail", [], False),  # the test failed, no GPU did
    ]
    pcie = d.tests[2]
    assert pcie.gpu_results == dict.fromkeys(range(8), "pass")
    assert pcie.warnings == [
        "There was an internal error during the test: 'Output of child process (11167) couldn't be "
        "parsed: '* Line 1, Column 1   Syntax error: value, object or array expected. '' Check DCGM "
        "and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
    ]
    assert pcie.info == [] and pcie.detail.startswith("Fail Warning: There was an internal error")
    assert [t.name for t in d.by_result("fail")] == ["pcie"]


def test_dcgmi_diag_dcgm338_all_fail_skip_and_message_rows() -> None:
    d = parse_dcgmi_diag(DIAG_DCGM338.read_text())
    assert (d.dcgm_version, d.driver_version, d.device_ids) == ("3.3.8", "560.35.03", ["2330"] * 8)
    assert d.complete is True and d.group is None
    got = [(t.section, t.name, t.result, t.gpus, t.all_gpus) for t in d.tests]
    deployment = [
        "Denylist",
        "NVML Library",
        "CUDA Main Library",
        "Permissions and OS Blocks",
        "Persistence Mode",
        "Environment Variables",
        "Page Retirement/Row Remap",
        "Graphics Processes",
        "Inforom",
    ]
    assert got == [("Deployment", n, "pass", [], False) for n in deployment] + [
        ("Integration", "PCIe", "skip", [], True),
        ("Hardware", "GPU Memory", "fail", [], True),
        ("Stress", "Memory Bandwidth", "skip", [], True),
        ("Stress", "EUD Test", "skip", [], True),
    ]
    assert not any(t.name in ("Info", "Warning") for t in d.tests)
    pm = d.tests[4]
    assert pm.warnings == [] and len(pm.info) == 1
    assert pm.info[0].startswith('Persistence mode for GPU 0 is disabled. Enable persistence mode by running "nvidia')
    assert pm.info[0].endswith("Persistence mode for GPU 4 is disabled. Enable pers")
    mem = d.tests[10]
    assert [w[:6] for w in mem.warnings] == [f"GPU {g} " for g in range(8)]
    assert mem.warnings[7] == (
        "GPU 7 Error using CUDA API cuInit Check DCGM and system logs for errors. Reset GPU. Restart "
        "DCGM. Rerun diagnostics. Unable to initialize CUDA library: 'system not yet initialized'. . "
        "Please check if a CUDA sample program can be run successfully on this host. Refer to "
        "https://github.com/nvidia/cuda-samples"
    )
    assert mem.detail.startswith("Fail - All Warning: GPU 0 Error using CUDA API cuInit")


def test_dcgmi_diag_dcgm2x_plus_section_headers_without_metadata() -> None:
    d = parse_dcgmi_diag(DIAG_DCGM2X.read_text())
    assert (d.dcgm_version, d.driver_version, d.device_ids, d.group) == (None, None, [], None)
    assert d.complete is True and len(d.tests) == 18 and all(t.result == "pass" for t in d.tests)
    sections: dict[str, list[str]] = {}
    for t in d.tests:
        sections.setdefault(str(t.section), []).append(t.name)
    assert sections == {
        "Deployment": [
            "Blacklist",
            "NVML Library",
            "CUDA Main Library",
            "Permissions and OS Blocks",
            "Persistence Mode",
            "Environment Variables",
            "Page Retirement/Row Remap",
            "Graphics Processes",
            "Inforom",
        ],
        "Integration": ["PCIe"],
        "Hardware": ["GPU Memory", "Diagnostic", "Pulse Test"],
        "Stress": ["SM Stress", "Targeted Stress", "Targeted Power", "Memory Bandwidth", "Memtest"],
    }
    assert all(t.all_gpus and t.gpus == [] for t in d.tests if t.section != "Deployment")


def test_dcgmi_diag_dcgm423_cut_off_after_warnings_and_gpu_rows() -> None:
    d = parse_dcgmi_diag(DIAG_DCGM423.read_text())
    assert (d.dcgm_version, d.driver_version, d.device_ids, d.group) == ("4.2.3", "570.148.08", ["26b9"] * 4, None)
    assert d.complete is False  # no bottom border after the last GPU row
    got = [(t.section, t.name, t.result, t.gpus) for t in d.tests]
    assert got == [
        ("Deployment", "software", "pass", [0, 1, 2, 3]),
        ("Hardware", "memory", "pass", [0, 1, 2, 3]),
        ("Integration", "pcie", "fail", []),
    ]
    pcie = d.tests[2]
    assert pcie.gpu_results == dict.fromkeys(range(4), "pass")
    assert pcie.warnings[0] == (
        "There was an internal error during the test: 'A child process (152) exited with non-zero "
        "status 1' Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
    )
    assert [w.split("'")[1][:28] for w in pcie.warnings] == [
        "A child process (152) exited",
        "A child process (153) exited",
        "Output of child process (152",
        "Output of child process (153",
    ]


def test_dcgmi_diag_mixed_gpu_result_rows_take_the_worst() -> None:
    # the DCGM 2.x/3.x "Pass - GPUs: ... / Fail - GPU: n" rows (dcgmi/Diag.cpp HelperDisplayGpuResults)
    text = DIAG_DCGM2X.read_text().replace(
        "| Targeted Power            | Pass - All                                     |",
        "| Targeted Power            | Pass - GPUs: 0, 2, 3                           |\n"
        "|                           | Fail - GPU: 1                                  |\n"
        "| Warning                   | GPU 1 Max power of 224.1 did not reach desire  |\n"
        "|                           | d power minimum target_power_min_ratio of 224  |",
    )
    d = parse_dcgmi_diag(text)
    tp = next(t for t in d.tests if t.name == "Targeted Power")
    assert (tp.section, tp.result, tp.gpus, tp.all_gpus) == ("Stress", "fail", [1], False)
    assert tp.gpu_results == {0: "pass", 2: "pass", 3: "pass", 1: "fail"}
    assert tp.warnings == ["GPU 1 Max power of 224.1 did not reach desired power minimum target_power_min_ratio of 224"]
    assert len(d.tests) == 18 and d.complete is True
