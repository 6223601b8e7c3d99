"""Kernel-log parsing: every NVRM/NVSwitch format (tests/fixtures/kmsg, xid-logs), multi-line
"fallen off the bus", Fatal vs Nonfatal, secondary XIDs, /dev/kmsg records, and a property test
that no text makes the parser raise."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.shared.models import EventKind
from gpuwarden.shared.nvidia.kernel_log import (
    KernelLogParser,
    parse_kernel_log_line,
    parse_kmsg,
    split_kmsg_record,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_mixed_formats_fixture_matches_sidecar() -> None:
    evs = parse_kmsg((FIX / "kmsg" / "nvrm-formats-mixed.txt").read_text())
    got = [(e.kind, e.code, e.pci_bus_id, e.pid, e.process_name, e.channel, e.fatal, e.caused_by_xid) for e in evs]
    X, S = EventKind.XID, EventKind.SXID
    assert got == [
        (X, 79, "0000:b3:00.0", None, None, None, None, None),
        (X, 79, "0000:44:00.0", None, None, None, None, None),
        (X, 48, "0001:19:00.0", None, None, None, None, None),
        (X, 31, "0000:01:00.0", 13705, "UnrealEditor", 12, None, None),
        (X, 43, "0000:38:00.0", 2815167, "pt_main_thread", 8, None, None),
        (X, 149, "0000:1b:00.0", None, None, None, False, None),
        (X, 149, "0000:1b:00.0", None, None, None, True, None),
        (X, 45, "0000:19:00.0", 1248209, "python3.10", 16, None, 48),
        (S, 12028, "0000:07:00.0", None, None, None, False, None),
        (S, 20034, "0000:07:00.0", None, None, None, True, None),
        (X, 119, "0000:9b:00.0", 2024380, "nvidia-smi", None, None, None),
        (X, 13, "0000:02:00.0", None, None, None, None, None),
    ]
    first = evs[0]
    assert first.raw.count("\n") == 2 and "fallen off the bus" in first.raw
    assert "no XID number" in first.message
    assert evs[2].ts == 1731672123.470068


def test_off_bus_message_and_xid79_same_gpu_are_one_event() -> None:
    p = KernelLogParser("n1")
    a = p.feed("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", 100.0)
    b = p.feed("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", 101.0)
    c = p.feed("NVRM: Xid (PCI:0000:3c:00): 79, GPU has fallen off the bus.", 101.0)
    assert [e.code for e in a] == [79] and a[0].pci_bus_id == "0000:3b:00.0"
    assert b == []
    assert [e.pci_bus_id for e in c] == ["0000:3c:00.0"]
    # much later the same GPU falling again is a new event
    assert len(p.feed("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 1000.0)) == 1


def test_split_message_abandoned_when_other_lines_follow() -> None:
    p = KernelLogParser("n1")
    assert p.feed("[ 1.0] NVRM: The NVIDIA GPU 0000:b3:00.0", 5.0) == []
    out = p.feed("[ 1.1] NVRM: Xid (PCI:0000:19:00): 48, DBE", 5.0)
    assert [e.code for e in out] == [48]
    assert p.feed("NVRM: fallen off the bus and is not responding to commands.", 5.0) == []


def test_nonfatal_is_not_fatal_and_fatal_inside_words_is_ignored() -> None:
    def fatal(text: str) -> bool | None:
        ev = parse_kernel_log_line(f"NVRM: Xid (PCI:0000:1b:00): 149, {text}", "n", 1.0)
        assert ev is not None
        return ev.fatal

    assert fatal("NETIR_LINK_EVT Nonfatal XC0 i0 Link 16") is False
    assert fatal("NETIR_LINK_EVT Non-fatal XC0") is False
    assert fatal("NETIR_LINK_EVT Fatal XC0") is True
    assert fatal("NETIR_LINK_EVT FATAL XC0") is True
    assert fatal("Ch 00000008") is None
    assert fatal("prefatalish text") is None


def test_kmsg_record_split() -> None:
    r = split_kmsg_record("6,1842,96547123,-;NVRM: hello\n SUBSYSTEM=pci")
    assert r is not None and (r.priority, r.seq, r.usec, r.text) == (6, 1842, 96547123, "NVRM: hello")
    assert split_kmsg_record("[ 1.0] NVRM: hello") is None


def test_impossible_dates_fall_back_to_default_ts() -> None:
    ev = parse_kernel_log_line("2024-13-45T25:61:61 NVRM: Xid (PCI:0000:01:00): 13, Ch 1", "n", 42.0)
    assert ev is not None and ev.ts == 42.0
    ev2 = parse_kernel_log_line("Feb 31 10:00:00 h kernel: NVRM: Xid (PCI:0000:01:00): 13, x", "n", 42.0, 2024)
    assert ev2 is not None and ev2.ts == 42.0


def test_unreadable_pci_keeps_the_event() -> None:
    ev = parse_kernel_log_line("NVRM: Xid (PCI:zz:qq): 13, x", "n", 1.0)
    assert ev is not None and ev.code == 13 and ev.pci_bus_id is None


def test_every_xid_log_fixture_parses_with_the_stateful_parser() -> None:
    counts = {}
    for f in sorted((FIX / "xid-logs").glob("*.txt")):
        counts[f.stem] = [e.code for e in parse_kmsg(f.read_text())]
    assert counts["xid79-fallen-off-bus-short"] == [79]
    assert counts["xid31-mmu-fault-open-595-pid-channel"] == [31]
    assert counts["xid119-gsp-rpc-timeout-h100"] == [119] * 5
    assert counts["xid48-63-94-dbe-row-remap-sequence"] == [48, 63] + [94] * 9


def test_parse_kmsg_rejects_binary() -> None:
    import pytest

    with pytest.raises(ValueError, match="binary"):
        parse_kmsg("abc\x00def")


_NVRMISH = st.sampled_from(
    [
        "NVRM: Xid (PCI:",
        "nvidia-nvswitch0: SXid (PCI:",
        "NVRM: The NVIDIA GPU ",
        "NVRM: GPU ",
        "): ",
        ", pid=",
        ", name=",
        "Fatal",
        "Nonfatal",
        "fallen off the bus",
        "0000:3b:00.0",
        "Ch ",
        "channel 0x",
        "due to previous Xid ",
        "6,12,34,-;",
        "2024-13-45T25:61:61",
        "[Sun Feb 31 16:24:18 2025]",
        "Feb 30 10:00:00 ",
        "\n",
    ]
)
_TEXT = st.lists(st.one_of(_NVRMISH, st.text(max_size=30), st.from_regex(r"\d{1,30}", fullmatch=True)), max_size=12)


@settings(max_examples=400, deadline=None)
@given(parts=_TEXT)
def test_parser_never_raises_on_arbitrary_text(parts: list[str]) -> None:
    text = "".join(parts)
    ev = parse_kernel_log_line(text, "n", 5.0)
    assert ev is None or ev.raw == text.rstrip("\r\n")
    p = KernelLogParser("n")
    for line in text.split("\n"):
        for e in p.feed(line, 5.0):
            assert e.ts >= 0 and e.node == "n"


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_parse_kmsg_never_crashes_on_text_without_nul(text: str) -> None:
    """Any text: a list of events, or the one-line refusal of what is not a kernel log; with one
    kernel log line in it, never the refusal."""
    text = text.replace("\x00", "")
    try:
        evs = parse_kmsg(text)
    except ValueError as exc:
        assert str(exc).startswith("kernel log: ")
    else:
        assert isinstance(evs, list)
    assert isinstance(parse_kmsg("[    1.000000] Linux version 6.8.0\n" + text), list)
