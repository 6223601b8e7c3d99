"""Kernel logs of a recording: XID/SXID events with their original timestamps. Pure.

Lines are parsed by :class:`~gpuwarden.shared.nvidia.kernel_log.KernelLogParser` (which reads ISO,
``dmesg -T`` ctime and syslog stamps itself); this module supplies the time of the stamps it
does not read: relative ``[  123.456789]`` (dmesg, ``journalctl -o short-monotonic``),
``journalctl -o short-precise`` (``Jan 21 02:21:33.123456``), ``journalctl -o json`` records
(through :meth:`~gpuwarden.collector.sources.JournalctlFollower.accept`), raw ``/dev/kmsg``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from gpuwarden.collector.sources import JournalctlFollower
from gpuwarden.shared.models import GpuEvent
from gpuwarden.shared.nvidia.kernel_log import KernelLogParser

from ._core import ReadContext

__all__ = ["read_kernel_log"]

_REL_RE = re.compile(r"^\[\s*(?P<s>\d+\.\d+)\]")
_PRECISE_RE = re.compile(r"^(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<t>\d{2}:\d{2}:\d{2})\.(?P<f>\d{1,9}) ")
_SYSLOG_RE = re.compile(r"^[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} ")


def read_kernel_log(
    text: str,
    ctx: ReadContext,
    node: str,
    *,
    json: bool = False,
    boot_ts: float | None = None,
    year: int | None = None,
) -> list[GpuEvent]:
    """XID/SXID events of a kernel log, ascending by ts (epoch s).

    Reads ``dmesg`` (relative stamps: ``boot_ts`` + seconds, or seconds from 0 with a note),
    ``dmesg --time-format iso`` (with or without ``--decode`` columns), ``dmesg -T`` (in
    ``ctx.tz``), ``journalctl -k`` ``short`` / ``short-iso`` / ``short-precise`` /
    ``short-monotonic`` / ``json``, ``/var/log/kern.log`` and ``/dev/kmsg`` records. Syslog
    stamps print no year: ``year`` (the recording's), else the current year, said in a note.
    Continuation lines without a stamp take the previous line's time. ``gpu_index`` is left
    None (the caller resolves PCI bus ids against its inventory).

    Raises:
        ValueError: NUL bytes (binary data, not a log).
    """
    if "\x00" in text:
        raise ValueError(f"{ctx.file}: binary data (NUL bytes), not a kernel log")
    lines = text.splitlines()
    if json:
        lines = JournalctlFollower(output="json").accept(lines)
    else:
        lines = [ln for ln in lines if not ln.startswith("-- ")]
    y = year if year is not None else datetime.now(UTC).year
    parser = KernelLogParser(node, source="recording", year=y, tz=ctx.tz)
    parser.boot_ts = boot_ts if boot_ts is not None else 0.0
    base = boot_ts if boot_ts is not None else 0.0
    last = base
    relative = syslog = False
    out: list[GpuEvent] = []
    for line in lines:
        ctx.rows += 1
        default = last
        if m := _REL_RE.match(line):
            default = base + float(m["s"])
            relative = True
        elif m2 := _PRECISE_RE.match(line):
            try:
                dt = datetime.strptime(f"{y} {m2['mon']} {m2['day']} {m2['t']}", "%Y %b %d %H:%M:%S")
                default = dt.replace(tzinfo=ctx.tz).timestamp() + int(m2["f"]) / 10 ** len(m2["f"])
            except ValueError:
                pass
            syslog = True
            line = f"[{default:.6f}] {line[m2.end() :]}"  # the parser then takes ``default`` as the time
        elif _SYSLOG_RE.match(line):
            syslog = True
        evs = parser.feed(line, default)
        last = evs[-1].ts if evs else default
        out.extend(evs)
    if relative and boot_ts is None:
        ctx.note("relative [seconds since boot] stamps and no boot_ts: event times are seconds since boot, from 0")
    if syslog and year is None:
        ctx.note(f"syslog stamps print no year: read as {y}")
    return sorted(out, key=lambda e: e.ts)
