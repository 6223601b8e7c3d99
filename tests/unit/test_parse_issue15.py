"""Unit tests of the tool-output readings of issue 15 (one or more per class), on the fixtures in
tests/fixtures and ../shared/fixtures; each asserts values, so a wrong reading fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.health_check.checks import evaluate_dcgm
from gpuwarden.health_check.parsers import (
    parse_dcgmi_diag,
    parse_dcgmi_discovery,
    parse_ibstat,
    parse_ibv_devinfo,
    read_ibstat,
)
from gpuwarden.shared.models import EventKind, Severity
from gpuwarden.shared.nvidia.kernel_log import KernelLogParser, parse_kmsg
from gpuwarden.shared.nvidia.smi_xml import parse_nvidia_smi_xml
from gpuwarden.shared.nvidia.xids import xid_severities
from gpuwarden.shared.slurm.fields import reason_nodes
from gpuwarden.shared.slurm.jsonparse import parse_sinfo_json
from gpuwarden.shared.slurm.parsers import hostlist
from gpuwarden.shared.slurm.textparse import parse_scontrol_nodes
from prerequisites import needs

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
SHARED = ROOT.parent / "shared" / "fixtures"
needs_shared = needs(SHARED)


@needs_shared
def test_xml_v13_average_and_instant_power() -> None:
    (g,) = parse_nvidia_smi_xml((SHARED / "nvidia-smi/rtx3080-xml-v13-595.txt").read_text()).gpus
    assert (g.power_w, g.power_instant_w, g.power_limit_w) == (139.62, 142.33, 320.0)
    assert g.serial == "REDACTED"


@needs_shared
def test_xml_v11_processes_and_retired_pages() -> None:
    (g,) = parse_nvidia_smi_xml((SHARED / "nvidia-smi/tesla-t4-xml-v11-processes.txt").read_text()).gpus
    assert g.processes == [
        {"pid": 675, "type": "G", "process_name": "/usr/lib/xorg/Xorg", "used_memory_mib": 22.0},
        {"pid": 5762, "type": "C", "process_name": "python", "used_memory_mib": 1005.0},
    ]
    assert (g.power_w, g.power_instant_w, g.retired_pages_sbe, g.retired_pages_dbe) == (26.78, None, 0, 0)


def test_xid_severity_from_catalog() -> None:
    sev = xid_severities()
    assert (sev[79], sev[119], sev[13]) == (Severity.FATAL, Severity.CRITICAL, Severity.WARNING)
    (ev,) = parse_kmsg("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n")
    assert ev.severity is Severity.FATAL


@needs_shared
def test_xid119_gets_uuid_of_its_bus() -> None:
    evs = parse_kmsg((SHARED / "xid-logs/xid119-gsp-rpc-timeout-h100.txt").read_text())
    assert {e.code for e in evs} == {119}
    assert {e.gpu_uuid for e in evs} == {"GPU-00000000-0000-0000-0000-000000000001"}
    assert {e.severity for e in evs} == {Severity.CRITICAL}


def test_probe_routine_names_every_unbound_device() -> None:
    evs = parse_kmsg((FIX / "kmsg/probe-unbound-vfio-2gpu.txt").read_text())
    assert [(e.kind, e.pci_bus_id) for e in evs] == [
        (EventKind.GPU_LOST, "0000:01:00.0"),
        (EventKind.GPU_LOST, "0000:41:00.0"),
    ]
    assert all("vfio-pci" in e.message for e in evs)


def test_probe_summary_without_device_lines_still_an_event() -> None:
    p = KernelLogParser("n1")
    evs = p.feed("NVRM: The NVIDIA probe routine was not called for 1 device(s).", 5.0)
    assert [(e.kind, e.pci_bus_id, e.ts) for e in evs] == [(EventKind.GPU_LOST, None, 5.0)]


def test_rm_init_adapter_failed_is_a_lost_gpu() -> None:
    (ev,) = KernelLogParser("n1").feed("NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x22:0x56:742)", 1.0)
    assert (ev.kind, ev.pci_bus_id) == (EventKind.GPU_LOST, "0000:3b:00.0")


def test_sxid_keeps_switch_and_nvlink5_subcodes() -> None:
    evs = parse_kmsg((FIX / "kmsg/sxid-nvlink5-legacy-xid.txt").read_text())
    sx = [(e.code, e.pci_bus_id, e.nvswitch_index, e.link, e.fatal) for e in evs if e.kind is EventKind.SXID]
    assert sx == [(12028, "0000:c6:00.0", 3, 61, False), (20034, "0000:e8:00.0", 5, 12, True)]
    nv = [(e.code, e.sub_code, e.link) for e in evs if e.code in (145, 149)]
    assert nv == [(145, 0, 3), (145, 5, 3), (149, 28, 5)]
    assert len({e.event_id for e in evs if e.code == 145}) == 2  # different register words: two events


def test_legacy_xid_31_32_channel_no_pid() -> None:
    evs = {e.code: e for e in parse_kmsg((FIX / "kmsg/sxid-nvlink5-legacy-xid.txt").read_text())}
    assert (evs[32].channel, evs[32].pid, evs[32].pci_bus_id) == (9, None, "0000:01:00.0")
    assert (evs[31].channel, evs[31].pid, evs[31].pci_bus_id) == (4, None, "0000:02:00.0")


def test_dcgm_diag_no_header_wrapped_overall_fail() -> None:
    d = parse_dcgmi_diag((FIX / "dcgm/diag-r3-dcgm1x-no-header-wrapped-fail.txt").read_text())
    names = [t.name for t in d.tests]
    assert "Page Retirement/Row Remap" in names and "Remap" not in names
    diag = next(t for t in d.tests if t.name == "Diagnostic")
    assert (diag.result, diag.gpus) == ("fail", [0, 1, 2, 3])
    assert (d.complete, d.overall, d.error) == (True, "fail", None)
    assert evaluate_dcgm(d).status.name == "CRITICAL"


def test_dcgm_diag_cut_off_is_unknown_not_pass() -> None:
    text = (FIX / "dcgm/diag-r4-dcgm2x-blacklist-all-pass.txt").read_text().splitlines()
    d = parse_dcgmi_diag("\n".join(text[:12]))
    assert (d.complete, d.overall) == (False, "unknown")
    assert d.error and "cut off" in d.error
    assert evaluate_dcgm(d).status.name == "UNKNOWN"


def test_dcgm_discovery_cut_off_marked_incomplete() -> None:
    d = parse_dcgmi_discovery((FIX / "dcgm/discovery-l-dcgm317-cut-off.txt").read_text())
    assert (d.gpus_found, len(d.gpus), d.complete) == (4, 3, False)
    assert d.error == "dcgmi discovery output cut off: 3 of 4 GPUs listed"
    full = parse_dcgmi_discovery((FIX / "dcgm/discovery-l-h100-4gpu-null-names-dcgm317.txt").read_text())
    assert (full.complete, full.error, len(full.gpus)) == (True, None, 4)


def test_ibstat_ibpanic_keeps_ports_and_error() -> None:
    text = (FIX / "infiniband/ibstat-ibpanic-partial.txt").read_text()
    rep = read_ibstat(text)
    assert [(p.device, p.port, p.state, p.rate_gbps) for p in rep.ports] == [("mlx5_0", 1, "ACTIVE", 400.0)]
    assert rep.complete is False and rep.error and rep.error.startswith("ibpanic:")
    with pytest.raises(ValueError, match="ibstat died after 1 port"):
        parse_ibstat(text)


def test_ibv_devinfo_active_mtu_and_link_layer() -> None:
    ports = parse_ibv_devinfo((FIX / "infiniband/ibv-devinfo-v-cx3-port2-down-polling.txt").read_text())
    assert [(p.device, p.port, p.active_mtu, p.link_layer) for p in ports] == [("mlx4_1", 2, 4096, "InfiniBand")]
    (eth,) = parse_ibv_devinfo(
        "hca_id: mlx5_2\n\tport:\t1\n\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\tactive_mtu:\t\t1024 (3)\n"
        "\t\tlink_layer:\t\tEthernet\n"
    )
    assert (eth.state, eth.active_mtu, eth.link_layer) == ("ACTIVE", 1024, "Ethernet")


def test_scontrol_oneline_values_with_spaces_cpus_and_idx() -> None:
    (a, b) = parse_scontrol_nodes((FIX / "slurm/scontrol-show-node-oneline-os-spaces.txt").read_text(), 1.0)
    assert (a.node, a.state, a.cpus, a.alloc_cpus, a.gpus_used_idx) == ("gpu-a-017", "MIXED", 128, 48, [0, 1, 4, 6])
    assert (a.reason, a.reason_user, a.partitions) == ("xid 79 gpu 3", "root", ["gpu", "gpu-long"])
    assert (b.node, b.state, b.cpus, b.gpus_used_idx, b.reason) == ("gpu-a-018", "IDLE", 128, [], None)


@needs_shared
def test_slurmrestd_v0042_cpus() -> None:
    text = (SHARED / "slurm/slurmrestd-v0042-node-idle-drain-ecc.txt").read_text()
    (n,) = parse_sinfo_json(text[text.index("{") :], 1.0)
    assert (n.node, n.cpus, n.alloc_cpus, n.gpus_used_idx) == ("cn3", 64, 0, None)


def test_hostlist_scontrol_semantics_and_reason() -> None:
    got = {
        d["expr"]: d["nodes"]
        for d in hostlist((FIX / "hostlist/hostnames-overlap-multi-bracket-reason.txt").read_text())
    }
    assert got["n[1-3,2-4]"] == ["n1", "n2", "n3", "n2", "n3", "n4"]
    assert got["rack[0-1]node[0-1]"] == ["rack0node0", "rack0node1", "rack1node0", "rack1node1"]
    assert got["b-[3,1,1]"] == ["b-3", "b-1", "b-1"]
    assert got["a+b:c_d[1-2]"] == ["a+b:c_d1", "a+b:c_d2"]
    assert got["d[001-003,010]"] == ["d001", "d002", "d003", "d010"]
    assert reason_nodes("ReqNodeNotAvail, UnavailableNodes:d[001-002]") == ["d001", "d002"]
    assert reason_nodes("Resources") == []
