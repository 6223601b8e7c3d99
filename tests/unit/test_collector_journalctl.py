"""journalctl -k fallback: argv, both output formats over recorded output, cursor resume,
restart after exit, and the /dev/kmsg -> journalctl choice (fake runner, no subprocess)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuwarden.collector.sources import JournalctlFollower, KmsgReader, LineReader, open_kernel_log
from gpuwarden.shared.models import EventKind
from gpuwarden.shared.nvidia.kernel_log import KernelLogParser

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "journalctl"


class FakeStream:
    """A recorded journalctl run: hands out its lines in chunks, then (optionally) exits."""

    def __init__(self, lines: list[str], chunk: int = 3, exit_code: int | None = None) -> None:
        self.lines, self.chunk, self.exit_code = list(lines), chunk, exit_code
        self.returncode: int | None = None
        self.closed = False

    def read_available(self) -> list[str]:
        out, self.lines = self.lines[: self.chunk], self.lines[self.chunk :]
        if not self.lines and self.exit_code is not None:
            self.returncode = self.exit_code
        return out

    def close(self) -> None:
        self.closed = True


class FakeRunner:
    def __init__(self, *runs: FakeStream) -> None:
        self.runs = list(runs)
        self.argvs: list[list[str]] = []

    def __call__(self, argv: list[str]) -> FakeStream:
        self.argvs.append(argv)
        return self.runs.pop(0) if self.runs else FakeStream([])


def events_of(reader: LineReader, calls: int) -> list:
    parser = KernelLogParser("gpu-node-001", source="journal")
    out = []
    for _ in range(calls):
        for line in reader.read_new_lines():
            out.extend(parser.feed(line, 0.0))
    return out


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def test_short_iso_precise_recording() -> None:
    runner = FakeRunner(FakeStream((FIX / "kernel-short-iso-precise.txt").read_text().splitlines()))
    f = JournalctlFollower(runner)
    evs = events_of(f, 4)
    assert runner.argvs == [["journalctl", "-k", "-f", "-o", "short-iso-precise", "--no-pager", "-n", "0"]]
    assert [(e.kind, e.code) for e in evs] == [
        (EventKind.XID, 149),
        (EventKind.XID, 149),
        (EventKind.XID, 48),
        (EventKind.XID, 63),
        (EventKind.SXID, 20034),
        (EventKind.XID, 79),
    ]
    assert [e.fatal for e in evs[:2]] == [False, True] and evs[4].fatal is True
    assert iso(evs[0].ts) == "2025-02-14T05:03:42.118734+00:00" and iso(evs[5].ts) == "2025-02-14T05:12:00.000180+00:00"
    assert evs[2].pci_bus_id == "0000:9b:00.0" and "kernel: NVRM: Xid" in evs[2].raw


def test_json_recording_and_cursor_resume(tmp_path: Path) -> None:
    state = tmp_path / "journal.cursor"
    recs = (FIX / "kernel-json.txt").read_text().splitlines()
    f = JournalctlFollower(FakeRunner(FakeStream(recs)), output="json", state_path=state)
    evs = events_of(f, 3)
    assert [(e.kind, e.code) for e in evs] == [
        (EventKind.XID, 149),
        (EventKind.XID, 48),
        (EventKind.SXID, 20034),
        (EventKind.XID, 79),
    ]
    assert iso(evs[3].ts) == "2025-02-14T05:12:00.000180+00:00" and evs[3].message.startswith(
        "GPU has fallen off the bus"
    )
    cursor = state.read_text()
    assert cursor.startswith("s=6b1d0c2f") and ";i=1a2b04;" in cursor  # the last record's cursor
    runner = FakeRunner()
    again = JournalctlFollower(runner, output="json", state_path=state)
    assert again.read_new_lines() == []
    assert runner.argvs == [["journalctl", "-k", "-f", "-o", "json", "--no-pager", "--after-cursor", cursor]]


def test_restart_after_exit() -> None:
    line = (
        "2025-02-14T05:12:00.000180+00:00 gpu-node-001 kernel: NVRM: Xid (PCI:0000:2a:00): 13, pid=1, name=x, Ch 0008"
    )
    first = FakeStream([line], exit_code=1)
    runner = FakeRunner(first, FakeStream([line.replace(": 13,", ": 31,")]))
    f = JournalctlFollower(runner)
    assert [e.code for e in events_of(f, 3)] == [13, 31]
    assert f.restarts == 1 and first.closed and len(runner.argvs) == 2


def test_bad_output_format() -> None:
    with pytest.raises(ValueError, match="short-iso-precise"):
        JournalctlFollower(FakeRunner(), output="cat")


def test_unreadable_kmsg_falls_back_to_journalctl(tmp_path: Path) -> None:
    runner = FakeRunner()
    fallback = JournalctlFollower(runner)
    r = open_kernel_log("/dev/no-such-kmsg-device", journal=lambda: fallback)
    assert r is fallback
    assert open_kernel_log("/dev/no-such-kmsg-device", journal=lambda: None) is None
    dev = "/dev/null"  # readable device: the kmsg reader
    assert isinstance(open_kernel_log(dev, journal=lambda: fallback), KmsgReader)
    log = tmp_path / "kern.log"
    log.write_text("old line\n")
    follower = open_kernel_log(str(log))
    assert follower is not None and follower.read_new_lines() == []  # a file is followed from its end
