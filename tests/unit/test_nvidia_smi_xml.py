"""Parsers of the collector over recorded real output (tests/fixtures/nvidia-smi, xid-logs).

Expected values are those stated in each fixture's .md sidecar."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuwarden.shared.models import EventKind
from gpuwarden.shared.nvidia import smi_xml as parsers
from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id
from gpuwarden.shared.nvidia.smi_xml import parse_nvidia_smi_xml

FIX = Path(__file__).resolve().parents[1] / "fixtures"

# From the .md sidecars.
SMI_EXPECTED = {
    "a100-40gb-mig2-xml-v11": dict(
        dtd="11",
        driver="510.47.03",
        cuda="11.6",
        gpu=dict(
            pci_bus_id="0000:00:04.0",
            name="NVIDIA A100-SXM4-40GB",
            temperature_c=36.0,
            memory_temperature_c=44.0,
            power_w=66.92,
            power_limit_w=400.0,
            utilization_gpu_pct=None,
            ecc_sbe_volatile=None,
            ecc_dbe_volatile=None,
            remapped_rows_pending=None,
            throttle_reasons=[],
        ),
        mig=[(0, 1, 42, 19.0, 19968.0), (1, 2, 42, 19.0, 19968.0)],
    ),
    "rtx3080-xml-v13-595": dict(
        dtd="13",
        driver="595.58.03",
        cuda="13.2",
        gpu=dict(
            pci_bus_id="0000:0c:00.0",
            name="NVIDIA GeForce RTX 3080",
            temperature_c=27.0,
            power_w=139.62,
            power_limit_w=320.0,
            utilization_gpu_pct=65.0,
            memory_used_mib=9184.0,
            memory_total_mib=10240.0,
            ecc_dbe_volatile=None,
            memory_temperature_c=None,
            throttle_reasons=[],
        ),
        mig=[],
    ),
    "tesla-t4-xml-v11-processes": dict(
        dtd="11",
        driver="515.105.01",
        cuda="11.7",
        gpu=dict(
            pci_bus_id="0000:00:1e.0",
            name="Tesla T4",
            temperature_c=40.0,
            power_w=26.78,
            power_limit_w=70.0,
            memory_used_mib=1032.0,
            memory_total_mib=15360.0,
            utilization_gpu_pct=0.0,
            retired_pages=0,
            remapped_rows_pending=None,
            throttle_reasons=[],
        ),
        mig=[],
    ),
}

SMI_FILES = sorted((FIX / "nvidia-smi").glob("*.xml"))


def test_every_xml_fixture_has_expectations() -> None:
    assert {f.stem for f in SMI_FILES} == set(SMI_EXPECTED)
    for f in SMI_FILES:
        assert f.with_suffix(".md").exists(), f"{f.name} has no .md sidecar"


@pytest.mark.parametrize("path", SMI_FILES, ids=lambda p: p.stem)
def test_parse_nvidia_smi_xml_fixture(path: Path) -> None:
    exp = SMI_EXPECTED[path.stem]
    rep = parse_nvidia_smi_xml(path.read_text())
    assert (rep.dtd_version, rep.driver_version, rep.cuda_version) == (exp["dtd"], exp["driver"], exp["cuda"])
    assert len(rep.gpus) == 1
    g = rep.gpus[0]
    assert g.index == 0
    assert g.uuid == "GPU-00000000-0000-0000-0000-000000000001"
    for field, value in exp["gpu"].items():
        assert getattr(g, field) == value, field
    got_mig = [
        (d.index, d.gpu_instance_id, d.multiprocessor_count, d.memory_used_mib, d.memory_total_mib)
        for d in rep.mig.get(0, [])
    ]
    assert got_mig == exp["mig"]


def _h100_8gpu_xml(active: dict[int, list[str]]) -> str:
    """An 8-GPU v12 document built from the real T4 capture's <gpu> block (index via minor_number)."""
    src = (FIX / "nvidia-smi" / "tesla-t4-xml-v11-processes.xml").read_text()
    head, rest = src.split("<gpu id=", 1)
    gpu_block = "<gpu id=" + rest.rsplit("</nvidia_smi_log>", 1)[0]
    blocks = []
    for i in range(8):
        b = gpu_block.replace("00000000:00:1E.0", f"00000000:{0x18 + i:02X}:00.0")
        b = b.replace("<minor_number>0</minor_number>", f"<minor_number>{i}</minor_number>")
        for reason in active.get(i, []):
            tag = f"clocks_throttle_reason_{reason}"
            b = b.replace(f"<{tag}>Not Active</{tag}>", f"<{tag}>Active</{tag}>")
        blocks.append(b)
    return head.replace("nvsmi_device_v11", "nvsmi_device_v12") + "".join(blocks) + "</nvidia_smi_log>\n"


def test_throttle_reasons_only_active_ones_and_minor_number_order() -> None:
    xml = _h100_8gpu_xml({3: ["sw_power_cap", "hw_power_brake_slowdown", "sw_thermal_slowdown"], 5: ["gpu_idle"]})
    rep = parse_nvidia_smi_xml(xml)
    assert [g.index for g in rep.gpus] == list(range(8))
    assert rep.gpus[3].throttle_reasons == ["sw_power_cap", "hw_power_brake_slowdown", "sw_thermal_slowdown"]
    assert rep.gpus[5].throttle_reasons == ["gpu_idle"]
    assert rep.gpus[0].throttle_reasons == []
    assert rep.gpus[7].pci_bus_id == "0000:1f:00.0"


def test_multiline_not_active_value_is_stripped() -> None:
    # a100 fixture: "<clocks_throttle_reason_applications_clocks_setting>Not Active\n   </...>"
    rep = parse_nvidia_smi_xml((FIX / "nvidia-smi" / "a100-40gb-mig2-xml-v11.xml").read_text())
    assert "applications_clocks_setting" not in rep.gpus[0].throttle_reasons


def test_unknown_dtd_warns_once_and_parses(caplog: pytest.LogCaptureFixture) -> None:
    text = (FIX / "nvidia-smi" / "rtx3080-xml-v13-595.xml").read_text().replace("nvsmi_device_v13", "nvsmi_device_v99")
    parsers._warned_dtd.discard("99")
    with caplog.at_level(logging.WARNING, logger=parsers.__name__):
        a = parse_nvidia_smi_xml(text)
        b = parse_nvidia_smi_xml(text)
    assert a.dtd_version == b.dtd_version == "99"
    assert a.gpus[0].power_w == 139.62
    assert sum("DTD v99" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("bad", ["", "not xml", "<other/>", "<nvidia_smi_log><gpu>"])
def test_parse_nvidia_smi_xml_bad_input(bad: str) -> None:
    with pytest.raises(ValueError, match="nvidia-smi XML"):
        parse_nvidia_smi_xml(bad)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("00000000:0C:00.0", "0000:0c:00.0"),
        ("0000:44:00", "0000:44:00.0"),
        ("PCI:0000:9B:00", "0000:9b:00.0"),
        ("0000:0B:00.0", "0000:0b:00.0"),
        ("0001:18:00.1", "0001:18:00.1"),
    ],
)
def test_normalize_pci_bus_id(raw: str, want: str) -> None:
    assert normalize_pci_bus_id(raw) == want


def test_normalize_pci_bus_id_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_pci_bus_id("GPU4")


def _ts(s: str) -> float:
    return datetime.fromisoformat(s).replace(tzinfo=UTC).timestamp()


DEFAULT_TS = 1_700_000_000.0

# From the .md sidecars: (number of XID lines, codes in order of first appearance, pci, first event fields)
XID_EXPECTED = {
    "xid79-fallen-off-bus-short": dict(
        n=1,
        codes=[79],
        pci="0000:44:00.0",
        first=dict(code=79, pid=None, process_name=None, message="GPU has fallen off the bus", ts=DEFAULT_TS),
    ),
    "xid119-gsp-rpc-timeout-h100": dict(
        n=5,
        codes=[119],
        pci="0000:9b:00.0",
        first=dict(
            code=119,
            pid=2024380,
            process_name="nvidia-smi",
            ts=_ts("2025-02-23T16:24:18"),
            message="Timeout after 6s of waiting for RPC response from GPU4 GSP! "
            "Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
        ),
    ),
    "xid13-43-sm-warp-exception-burst": dict(
        n=29,
        codes=[13, 43],
        pci="0000:38:00.0",
        first=dict(
            code=13,
            pid=None,
            process_name=None,
            ts=_ts("2025-01-21T02:21:33.498559"),
            message="Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address",
        ),
    ),
    "xid31-mmu-fault-open-595-pid-channel": dict(
        n=1, codes=[31], pci="0000:01:00.0", first=dict(code=31, pid=13705, process_name="UnrealEditor", ts=DEFAULT_TS)
    ),
    "xid48-63-94-dbe-row-remap-sequence": dict(
        n=11,
        codes=[48, 63, 94],
        pci="0000:19:00.0",
        first=dict(code=48, pid=None, process_name=None, ts=_ts("2024-11-15T12:02:03.470068")),
    ),
}
XID_FILES = sorted((FIX / "xid-logs").glob("*.txt"))


def test_every_xid_fixture_has_expectations() -> None:
    assert {f.stem for f in XID_FILES} == set(XID_EXPECTED)


@pytest.mark.parametrize("path", XID_FILES, ids=lambda p: p.stem)
def test_parse_kernel_log_fixture(path: Path) -> None:
    exp = XID_EXPECTED[path.stem]
    events = [e for line in path.read_text().splitlines() if (e := parse_kernel_log_line(line, "n1", DEFAULT_TS))]
    assert len(events) == exp["n"]
    assert list(dict.fromkeys(e.code for e in events)) == exp["codes"]
    assert {e.pci_bus_id for e in events} == {exp["pci"]}
    assert all(e.kind is EventKind.XID and e.node == "n1" and e.gpu_index is None for e in events)
    for field, value in exp["first"].items():
        assert (
            getattr(events[0], field) == pytest.approx(value) if field == "ts" else getattr(events[0], field) == value
        )
    assert "NVRM: Xid" in events[0].raw
    assert len({e.event_id for e in events}) == len(events)  # distinct lines, distinct ids


def test_xid_pid_channel_variants() -> None:
    line48 = (FIX / "xid-logs" / "xid48-63-94-dbe-row-remap-sequence.txt").read_text().splitlines()
    ev = [e for x in line48 if (e := parse_kernel_log_line(x, "n", 0.0)) and e.pid is not None]
    assert ev and all(e.pid == 1248209 and e.process_name == "python3.10" for e in ev)
    assert ev[0].message == "Ch 00000008"


def test_non_xid_lines_are_none() -> None:
    for line in [
        "2024-11-15T05:39:15,491363+00:00 nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
        "[  365.969680] NVRM: GPU Board Serial Number: 0",
        "",
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU4 RPC history (CPU -> GSP):",
    ]:
        assert parse_kernel_log_line(line, "n", 0.0) is None


def test_sxid_line() -> None:
    line = "[ 1234.567890] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 47 egress error (First)"
    ev = parse_kernel_log_line(line, "n", 42.0)
    assert ev is not None
    assert (ev.kind, ev.code, ev.pci_bus_id, ev.ts) == (EventKind.SXID, 12028, "0000:05:00.0", 42.0)
    assert ev.message == "Non-fatal, Link 47 egress error (First)"


def test_syslog_timestamp_uses_year() -> None:
    line = "Nov 15 05:39:15 gpu-node-001 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus."
    ev = parse_kernel_log_line(line, "gpu-node-001", 0.0, year=2024)
    assert ev is not None and ev.ts == _ts("2024-11-15T05:39:15")


def test_same_line_same_event_id() -> None:
    line = (FIX / "xid-logs" / "xid79-fallen-off-bus-short.txt").read_text().strip()
    a = parse_kernel_log_line(line, "n", 5.0)
    b = parse_kernel_log_line(line, "n", 5.0)
    assert a is not None and b is not None and a.event_id == b.event_id


def test_syslog_line_of_december_read_on_new_years_day_is_last_year() -> None:
    from datetime import UTC, datetime

    now = datetime(2027, 1, 1, 0, 5, tzinfo=UTC).timestamp()
    line = "Dec 31 23:59:00 node kernel: NVRM: Xid (PCI:0000:ab:00): 48, pid=1, name=x, DBE (0x00000000)"
    ev = parse_kernel_log_line(line, "node", now)
    assert ev is not None and datetime.fromtimestamp(ev.ts, UTC) == datetime(2026, 12, 31, 23, 59, tzinfo=UTC)
