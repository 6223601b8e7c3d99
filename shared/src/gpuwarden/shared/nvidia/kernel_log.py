"""Pure parsing of the NVIDIA driver's kernel-log messages: XID, SXID, lost and unbound GPUs.

No I/O here: the readers that tail ``/dev/kmsg``, journald or a file live with their callers
(the collector's sources) and hand lines to these functions.

* :func:`parse_kernel_log_line` reads one kernel-log line with an ``NVRM: Xid`` (GPU) or
  ``nvidia-nvswitchN: SXid`` (NVSwitch) record into a :class:`~gpuwarden.shared.models.GpuEvent`;
* :class:`KernelLogParser` adds the messages that span lines (fallen off the bus, probe failures);
* :func:`parse_kmsg` reads a whole log (``gpuwarden parse kmsg``);
* :func:`split_kmsg_record` splits a ``/dev/kmsg`` record header.

Drivers r340 .. 595, open and proprietary kernel modules.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from gpuwarden.shared.models import EventKind, GpuEvent, Severity, stable_id

from .pci import normalize_pci_bus_id
from .xids import xid_severities

__all__ = [
    "NVLINK5_XIDS",
    "XID79_DEDUPE_S",
    "KernelLogParser",
    "KmsgRecord",
    "parse_kernel_log_line",
    "parse_kmsg",
    "split_kmsg_record",
]

_PCI_TOKEN = r"[0-9a-fA-F]{1,8}(?::[0-9a-fA-F]{1,4}){1,2}(?:\.[0-7])?"
# ``NVRM: Xid (PCI:0000:44:00): 79, ...``; very old drivers print ``NVRM: Xid (0000:02:00): 13, ...``.
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)\s]{0,40})\): (?P<code>\d{1,6})(?:,\s*(?P<rest>.*))?$", re.DOTALL
)
_SXID_RE = re.compile(
    r"nvidia-nvswitch(?P<sw>\d{0,4}): SXid \((?:PCI:)?(?P<pci>[^)\s]{0,40})\): (?P<code>\d{1,6})(?:,\s*(?P<rest>.*))?$",
    re.DOTALL,
)
_PID_RE = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d{1,10}),\s*name=(?P<name>[^,]*),\s*")
# "Ch 0000000c" (r470-r570), "channel 0x0000000c" (595 open module), legacy "Channel ID 00000009"
_CHANNEL_RE = re.compile(r"\b(?:channel\s+(?:0x)?|Channel ID\s+(?:0x)?|Ch\s+)(?P<ch>[0-9a-fA-F]{1,8})\b")
# NVLink5 XIDs 144-150 (r570+): "145, RLW, nonfatal, ..., Link 3 (0x00000004 0x00000001 ... 0x00000000)"
NVLINK5_XIDS = frozenset(range(144, 151))
_REGS_RE = re.compile(r"\((?P<words>0x[0-9a-fA-F]{1,8}(?:\s+0x[0-9a-fA-F]{1,8}){1,15})\)")
_LINK_RE = re.compile(r"\bLink\s+(?P<link>\d{1,3})\b")
# a GPU the driver could not bind: the per-device lines, then the "probe routine" summary
_PROBE_SUMMARY_RE = re.compile(r"NVRM: The NVIDIA probe routine was not called for (?P<n>\d{1,4}) device\(s\)")
_NO_PROBE_RE = re.compile(
    r"NVRM: (?:No NVIDIA (?:devices|graphics adapter) probed|None of the NVIDIA devices were initialized)"
)
# a GPU whose probe ran and failed (nv.c, r340 .. 595): "NVRM: This PCI I/O region assigned to your
# NVIDIA device is invalid:" / "NVRM: BAR0 is 0M @ 0x0 (PCI:0000:01:00.0)", then the summary
_PROBE_FAILED_RE = re.compile(r"NVRM: The NVIDIA probe routine failed for (?P<n>\d{1,4}) device\(s\)")
_BAR_INVALID_RE = re.compile(rf"NVRM: BAR(?P<bar>\d) is \d+M @ 0x[0-9a-fA-F]+ \(PCI:(?P<pci>{_PCI_TOKEN})\)")
_UNBOUND_RE = re.compile(
    rf"NVRM: (?:GPU (?P<pci>{_PCI_TOKEN}) is already bound to (?P<drv>[\w.-]+)"
    rf"|ignoring the legacy GPU (?P<pci2>{_PCI_TOKEN}))"
)
_INIT_FAIL_RE = re.compile(
    rf"NVRM: GPU (?P<pci>{_PCI_TOKEN}): (?P<what>RmInitAdapter failed!?.*|rm_init_adapter failed.*)$"
)
_GPU_UUID_RE = re.compile(rf"NVRM: GPU at (?:PCI:)?(?P<pci>{_PCI_TOKEN}): (?P<uuid>GPU-[0-9a-fA-F-]{{36}})")
# "Nonfatal"/"Non-fatal" must win over "Fatal" (a substring of it): one alternation, word-bounded.
_FATAL_RE = re.compile(r"(?<![A-Za-z])(?P<tok>non-?fatal|fatal)(?![A-Za-z])", re.IGNORECASE)
_CAUSE_RE = re.compile(
    r"(?:caused by|due to|because of|following|after|result of|secondary (?:to|of))\s+(?:an?\s+)?"
    r"(?:previous\s+|earlier\s+|prior\s+)?Xid\s*(?P<xid>\d{1,6})",
    re.IGNORECASE,
)
_OFF_BUS_START_RE = re.compile(rf"NVRM: The NVIDIA GPU (?P<pci>{_PCI_TOKEN})")
_OFF_BUS_GPU_RE = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI_TOKEN}):? .*fallen off the bus")
_OFF_BUS_TEXT = "fallen off the bus"
_KMSG_RE = re.compile(r"^(?P<pri>\d{1,5}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]{0,40};")
_ISO_RE = re.compile(
    r"(?P<d>\d{4}-\d{2}-\d{2})[T ](?P<t>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)
_CTIME_RE = re.compile(r"\[(?:\w{3}) (?P<mon>\w{3}) +(?P<day>\d{1,2}) (?P<t>\d{2}:\d{2}:\d{2}) (?P<y>\d{4})\]")
_SYSLOG_RE = re.compile(r"^(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<t>\d{2}:\d{2}:\d{2}) ")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
XID79_DEDUPE_S = 60.0
"""A "fallen off the bus" message and an ``Xid ...: 79`` for the same GPU within this many
seconds are one event (the driver prints both; some drivers only the first)."""


def _ts_of(prefix: str, default_ts: float, year: int | None, tz: tzinfo) -> float:
    try:
        if m := _ISO_RE.search(prefix):
            frac = (m["frac"] or "0")[:6].ljust(6, "0")
            zone = m["tz"] or ""
            if zone == "Z":
                zone = "+00:00"
            elif zone and ":" not in zone:
                zone = f"{zone[:3]}:{zone[3:]}"
            dt = datetime.fromisoformat(f"{m['d']}T{m['t']}.{frac}{zone}")
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=tz)
            return dt.timestamp()
        if m := _CTIME_RE.search(prefix):
            dt = datetime.strptime(f"{m['y']} {m['mon']} {m['day']} {m['t']}", "%Y %b %d %H:%M:%S")
            return dt.replace(tzinfo=tz).timestamp()
        if (m := _SYSLOG_RE.match(prefix)) and m["mon"] in _MONTHS:
            y = year if year is not None else datetime.fromtimestamp(default_ts, UTC).year
            dt = datetime.strptime(f"{y} {m['mon']} {m['day']} {m['t']}", "%Y %b %d %H:%M:%S")
            ts = dt.replace(tzinfo=tz).timestamp()
            if year is None and ts > default_ts + 86400:  # "Dec 31" read on Jan 1: last year's line
                ts = dt.replace(year=y - 1, tzinfo=tz).timestamp()
            return ts
    except (ValueError, OverflowError, OSError):
        return default_ts  # a timestamp-shaped prefix that is not a real date
    return default_ts  # monotonic ``[  12.345]``, /dev/kmsg records, or no timestamp


def _pci(text: str) -> str | None:
    try:
        return normalize_pci_bus_id(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class KmsgRecord:
    """One ``/dev/kmsg`` record header: ``PRI,SEQ,USEC,FLAGS;TEXT`` (usec since boot)."""

    priority: int
    seq: int
    usec: int
    text: str


def split_kmsg_record(line: str) -> KmsgRecord | None:
    """Split a ``/dev/kmsg`` record (Linux >= 3.5 format) into header and text; None if it is not one.

    Only the first line of a record is the message; ``KEY=value`` continuation lines are dropped.
    """
    m = _KMSG_RE.match(line)
    if m is None:
        return None
    text = line[m.end() :].split("\n", 1)[0]
    return KmsgRecord(int(m["pri"]), int(m["seq"]), int(m["usec"]), text)


def _fatal_of(text: str) -> bool | None:
    m = _FATAL_RE.search(text)
    if m is None:
        return None
    return not m["tok"].lower().startswith("non")


def _nvlink5(code: int, rest: str) -> tuple[int | None, int | None]:
    """(sub-code, link) of an NVLink5 XID 144-150: sub-code = bits 20-25 of the first register word."""
    link = int(lm["link"]) if (lm := _LINK_RE.search(rest)) else None
    if code not in NVLINK5_XIDS:
        return None, link
    rm = _REGS_RE.search(rest)
    if rm is None:
        return None, link
    first = int(rm["words"].split()[0], 16)
    return (first >> 20) & 0x3F, link


def parse_kernel_log_line(
    line: str,
    node: str,
    default_ts: float,
    year: int | None = None,
    *,
    source: str = "kmsg",
    tz: tzinfo = UTC,
    severities: Mapping[int, Severity] | None = None,
) -> GpuEvent | None:
    """Parse one kernel-log line into an XID or SXID :class:`GpuEvent`; None for any other line.

    Reads the NVIDIA driver's ``NVRM: Xid (PCI:dddd:bb:dd): CODE, [pid=P, name=N, ]TEXT``
    (drivers r470 .. 595, open and proprietary modules; ``pid='<unknown>'`` accepted; legacy
    lines without ``PCI:`` and without pid/name; any PCI domain) and
    ``nvidia-nvswitchN: SXid (PCI:...): CODE, TEXT``. From the text it also reads the channel
    (``Ch 0000000c`` or ``channel 0x0000000c``), a ``Fatal`` vs ``Non-fatal``/``Nonfatal``
    token (``fatal``), and the XID a secondary XID names as its cause (``caused_by_xid``).
    ``/dev/kmsg`` records (``6,1234,5678,-;NVRM: ...``) are accepted. Timestamps, in event time:

    * ISO prefix as printed by ``dmesg --time-format iso`` (``2024-11-15T05:39:15,491363+00:00``),
      with or without the ``kern  :warn  :`` columns of ``dmesg --decode``;
    * ``dmesg -T`` ctime (``[Sun Feb 23 16:24:18 2025]``) and syslog (``Nov 15 05:39:15 host``,
      year from ``year``, else ``default_ts``'s, or the year before when that would put the line
      more than a day after ``default_ts``), both read in ``tz`` (default UTC);
    * monotonic ``[  365.969681]``, raw ``/dev/kmsg`` records, bare lines and impossible dates:
      ``default_ts``.

    Legacy r340-r390 layouts print a channel and no pid (``31, Ch 00000004, engmask ...``,
    ``32, Channel ID 00000009 intr 00800000``): ``channel`` is read, ``pid`` None. NVLink5 XIDs
    144-150 (r570+, ``145, RLW, nonfatal, ..., Link 3 (0x00000004 0x00000001 ...)``) get
    ``sub_code`` (bits 20-25 of the first register word, the intrinfo) and ``link``; each line
    is its own event (its ``event_id`` covers the register words). An SXID keeps the switch:
    ``pci_bus_id`` of the NVSwitch and ``nvswitch_index`` N of ``nvidia-nvswitchN``.
    ``severity`` is ``severities[code]`` for XIDs (see
    :func:`~gpuwarden.shared.nvidia.xids.xid_severities`), None without a table or for SXIDs.

    ``message`` is the driver's text after the code and the pid/name fields; ``pid`` and
    ``process_name`` are None when printed as ``<unknown>``; ``pci_bus_id`` is None when the
    printed id cannot be read. ``gpu_index`` is left None: the caller maps ``pci_bus_id`` to an
    index with its own inventory. Multi-line "fallen off the bus" messages need the stateful
    :class:`KernelLogParser`. Never raises on any text.
    """
    line = line.rstrip("\r\n")
    if "Xid" not in line:
        return None
    rec = split_kmsg_record(line)
    body = rec.text if rec is not None else line
    kind = EventKind.XID
    m = _XID_RE.search(body)
    if m is None:
        m = _SXID_RE.search(body)
        kind = EventKind.SXID
        if m is None:
            return None
    ts = _ts_of(body[: m.start()], default_ts, year, tz)
    code = int(m["code"])
    rest = (m["rest"] or "").strip()
    pid: int | None = None
    name: str | None = None
    if kind is EventKind.XID and (pm := _PID_RE.match(rest)):
        pid = int(pm["pid"]) if pm["pid"].isdigit() else None
        name = pm["name"].strip() or None
        if name in {"<unknown>", "'<unknown>'"}:
            name = None
        rest = rest[pm.end() :]
    ch = _CHANNEL_RE.search(rest) if kind is EventKind.XID else None
    cause = _CAUSE_RE.search(rest)
    sub, link = _nvlink5(code, rest) if kind is EventKind.XID else (None, _nvlink5(code, rest)[1])
    sw = m["sw"] if kind is EventKind.SXID else None
    return GpuEvent(
        event_id=stable_id(node, ts, kind.value, code, line),
        node=node,
        ts=ts,
        kind=kind,
        code=code,
        pci_bus_id=_pci(m["pci"]),
        pid=pid,
        process_name=name,
        message=rest,
        raw=line,
        source=source,
        channel=int(ch["ch"], 16) if ch else None,
        fatal=_fatal_of(rest),
        caused_by_xid=int(cause["xid"]) if cause else None,
        severity=severities.get(code) if severities is not None and kind is EventKind.XID else None,
        nvswitch_index=int(sw) if sw else None,
        sub_code=sub,
        link=link,
    )


class KernelLogParser:
    """Stateful kernel-log parser: :func:`parse_kernel_log_line` plus the messages that span lines.

    Reads the NVIDIA kernel module's messages of drivers r340 .. 595 (open and proprietary).
    ``feed(line, default_ts)`` returns the events that line completes:

    * XID/SXID lines as :func:`parse_kernel_log_line`, with ``gpu_uuid`` from an earlier
      ``NVRM: GPU at PCI:0000:9b:00: GPU-<uuid>`` line for the same bus and ``severity`` from
      ``severities`` (XID code -> catalog severity, :func:`~gpuwarden.shared.nvidia.xids.xid_severities`);
    * "GPU has fallen off the bus" without an XID number, on one line
      (``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``) or split over up to 4 lines
      (``NVRM: The NVIDIA GPU 0000:b3:00.0`` / ``NVRM: (PCI ID: 10de:26b5) installed in this
      system has`` / ``NVRM: fallen off the bus and is not responding to commands.``): an XID 79
      event (``message`` says no number was printed; ``raw`` is the lines joined by ``\n``).
      It and an ``Xid ...: 79`` line for the same GPU within :data:`XID79_DEDUPE_S` seconds of
      each other are one event: the later one is dropped;
    * a GPU the driver could not bind: ``NVRM: GPU 0000:01:00.0 is already bound to vfio-pci.``
      (or ``ignoring the legacy GPU ...``) lines, then ``NVRM: The NVIDIA probe routine was not
      called for N device(s).``: one ``gpu-lost`` event per named device at the summary line
      (plus one without ``pci_bus_id`` for devices the log does not name); ``NVRM: GPU
      0000:3b:00.0: RmInitAdapter failed! (...)``: a ``gpu-lost`` event at once;
    * a GPU whose probe failed: ``NVRM: BAR0 is 0M @ 0x0 (PCI:0000:01:00.0)`` (the second line of
      "This PCI I/O region assigned to your NVIDIA device is invalid:") lines, then ``NVRM: The
      NVIDIA probe routine failed for N device(s).``: one ``gpu-lost`` event per named device, plus
      one without ``pci_bus_id`` for devices the log does not name, unless a "fallen off the bus"
      event came within :data:`XID79_DEDUPE_S` s before (that GPU is the one that failed).

    Never raises on any text.
    """

    def __init__(
        self,
        node: str,
        *,
        source: str = "kmsg",
        year: int | None = None,
        tz: tzinfo = UTC,
        max_lines: int = 4,
        severities: Mapping[int, Severity] | None = None,
    ) -> None:
        self.node = node
        self.source = source
        self.year = year
        self.tz = tz
        self.max_lines = max_lines
        self.severities = severities
        self._pending: list[str] = []
        self._pending_pci: str | None = None
        self._pending_ts = 0.0
        self._last79: dict[str | None, float] = {}
        self._uuids: dict[str, str] = {}
        self._unbound: list[tuple[str | None, str, str]] = []  # (pci, why, raw line)
        self._bad_bar: list[tuple[str | None, str, str]] = []  # (pci, why, raw line)
        self.boot_ts: float | None = None
        """Epoch s of boot: ``/dev/kmsg`` records then get ts = boot_ts + their usec stamp."""

    def _dup79(self, pci: str | None, ts: float) -> bool:
        last = self._last79.get(pci)
        self._last79[pci] = ts if last is None else max(last, ts)
        return last is not None and abs(ts - last) <= XID79_DEDUPE_S

    def _sev(self, code: int) -> Severity | None:
        return self.severities.get(code) if self.severities is not None else None

    def _off_bus(self, lines: list[str], pci: str | None, ts: float) -> GpuEvent | None:
        if self._dup79(pci, ts):
            return None
        raw = "\n".join(lines)
        return GpuEvent(
            event_id=stable_id(self.node, ts, EventKind.XID.value, 79, raw),
            node=self.node,
            ts=ts,
            kind=EventKind.XID,
            code=79,
            pci_bus_id=pci,
            gpu_uuid=self._uuids.get(pci) if pci else None,
            message="GPU has fallen off the bus (no XID number printed)",
            raw=raw,
            source=self.source,
            severity=self._sev(79),
        )

    def _lost(self, pci: str | None, ts: float, message: str, raw: str) -> GpuEvent:
        return GpuEvent(
            event_id=stable_id(self.node, ts, EventKind.GPU_LOST.value, pci, raw),
            node=self.node,
            ts=ts,
            kind=EventKind.GPU_LOST,
            pci_bus_id=pci,
            gpu_uuid=self._uuids.get(pci) if pci else None,
            message=message,
            raw=raw,
            source=self.source,
        )

    def _probe_summary(self, n: int, ts: float, line: str) -> list[GpuEvent]:
        head = f"the NVIDIA probe routine was not called for {n} device(s)"
        out = [self._lost(pci, ts, f"{head}: {why}", f"{raw}\n{line}") for pci, why, raw in self._unbound]
        if len(self._unbound) < n:
            out.append(self._lost(None, ts, f"{head} ({n - len(self._unbound)} not named in the log)", line))
        self._unbound = []
        return out

    def _probe_failed(self, n: int, ts: float, line: str) -> list[GpuEvent]:
        head = f"the NVIDIA probe routine failed for {n} device(s)"
        out = [self._lost(pci, ts, f"{head}: {why}", f"{raw}\n{line}") for pci, why, raw in self._bad_bar]
        recent79 = any(abs(ts - t) <= XID79_DEDUPE_S for t in self._last79.values())
        if len(self._bad_bar) < n and not recent79:
            out.append(self._lost(None, ts, f"{head} ({n - len(self._bad_bar)} not named in the log)", line))
        self._bad_bar = []
        return out

    def _driver_lines(self, body: str, line: str, default_ts: float) -> list[GpuEvent] | None:
        """Events of the bind/probe messages; None when ``body`` is none of them."""
        if m := _GPU_UUID_RE.search(body):
            if (pci := _pci(m["pci"])) is not None:
                self._uuids[pci] = m["uuid"]
            return []
        if m := _UNBOUND_RE.search(body):
            pci = _pci(m["pci"] or m["pci2"])
            why = f"GPU already bound to {m['drv']}" if m["drv"] else "legacy GPU ignored by this driver"
            self._unbound.append((pci, why, line))
            return []
        if m := _PROBE_SUMMARY_RE.search(body):
            return self._probe_summary(int(m["n"]), _ts_of(body[: m.start()], default_ts, self.year, self.tz), line)
        if m := _BAR_INVALID_RE.search(body):
            if (pci := _pci(m["pci"])) is not None:
                self._bad_bar.append((pci, f"PCI I/O region BAR{m['bar']} assigned to the GPU is invalid", line))
            return []
        if m := _PROBE_FAILED_RE.search(body):
            return self._probe_failed(int(m["n"]), _ts_of(body[: m.start()], default_ts, self.year, self.tz), line)
        if _NO_PROBE_RE.search(body):
            self._unbound = []  # the closing line of the summary above
            self._bad_bar = []
            return []
        if m := _INIT_FAIL_RE.search(body):
            ts = _ts_of(body[: m.start()], default_ts, self.year, self.tz)
            pci = _pci(m["pci"])
            return [self._lost(pci, ts, f"driver could not initialise the GPU: {m['what'].strip()}", line)]
        return None

    def feed(self, line: str, default_ts: float) -> list[GpuEvent]:
        """Events completed by ``line`` (0, 1, or 2 when it also ends a dangling multi-line message)."""
        line = line.rstrip("\r\n")
        rec = split_kmsg_record(line)
        body = rec.text if rec is not None else line
        if rec is not None and self.boot_ts is not None:
            default_ts = max(0.0, self.boot_ts + rec.usec / 1e6)
        out: list[GpuEvent] = []
        if self._pending:
            if "NVRM:" in body and not _XID_RE.search(body) and not _OFF_BUS_START_RE.search(body):
                self._pending.append(line)
                joined = " ".join(self._pending)
                if _OFF_BUS_TEXT in joined:
                    ev = self._off_bus(self._pending, self._pending_pci, self._pending_ts)
                    self._pending = []
                    return [ev] if ev else []
                if len(self._pending) < self.max_lines:
                    return []
            self._pending = []  # not the message we waited for
        if "NVRM:" in body and "Xid" not in body and (drv := self._driver_lines(body, line, default_ts)) is not None:
            return out + drv
        if m := _OFF_BUS_START_RE.search(body):
            ts = _ts_of(body[: m.start()], default_ts, self.year, self.tz)
            if _OFF_BUS_TEXT in body:
                ev = self._off_bus([line], _pci(m["pci"]), ts)
                return out + ([ev] if ev else [])
            self._pending, self._pending_pci, self._pending_ts = [line], _pci(m["pci"]), ts
            return out
        if (m2 := _OFF_BUS_GPU_RE.search(body)) and "Xid" not in body:
            ts = _ts_of(body[: m2.start()], default_ts, self.year, self.tz)
            ev = self._off_bus([line], _pci(m2["pci"]), ts)
            return out + ([ev] if ev else [])
        ev2 = parse_kernel_log_line(
            line, self.node, default_ts, self.year, source=self.source, tz=self.tz, severities=self.severities
        )
        if ev2 is not None:
            if ev2.kind is EventKind.XID and ev2.code == 79 and self._dup79(ev2.pci_bus_id, ev2.ts):
                return out
            if ev2.pci_bus_id and ev2.gpu_uuid is None and (uuid := self._uuids.get(ev2.pci_bus_id)):
                ev2 = ev2.model_copy(update={"gpu_uuid": uuid})
            out.append(ev2)
        return out

    def feed_lines(self, lines: list[str], default_ts: float) -> list[GpuEvent]:
        """:meth:`feed` over ``lines`` in order."""
        out: list[GpuEvent] = []
        for line in lines:
            out.extend(self.feed(line, default_ts))
        return out


#: A plain ``dmesg`` line's stamp: seconds since boot, ``[  365.969681]``.
_MONOTONIC_STAMP_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")
#: What makes a line a kernel log line: a time stamp of dmesg (monotonic or ``-T``), journalctl
#: (ISO), syslog or a raw ``/dev/kmsg`` record at its start, or a message of the NVIDIA driver
#: (``NVRM:``, ``nvidia-modeset: ...``) or of the kernel (``host kernel: ...``) anywhere.
_KERNEL_LINE_RE = re.compile(
    r"^(?:\[\s*\d+\.\d+\]|\[\w{3} \w{3} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}\]|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}"
    r"|[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} |\d{1,5},\d{1,20},\d{1,20},[^;]{0,40};)"
    r"|\bNVRM: |\bnvidia(?:-[a-z]+)?(?: [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d)?: |\bkernel: "
)


def parse_kmsg(text: str) -> list[GpuEvent]:
    """Every XID/SXID/lost-GPU event of a kernel log, NVIDIA driver r340 .. 595 (dmesg with any
    time format, ``journalctl -k``, ``/var/log/kern.log``, raw ``/dev/kmsg`` records).

    Node is ``unknown`` (a log names no Slurm node). Monotonic ``[ 12.3]`` stamps (plain ``dmesg``)
    and raw ``/dev/kmsg`` records give seconds since boot (ts 12.3: the log holds no boot time;
    ``gpuwarden analyze --boot-time`` places them in time); a line without any stamp takes the
    time of the line before it (0.0 before the first stamp); syslog stamps, which print no year,
    are read in the current year.
    Multi-line messages are joined (:class:`KernelLogParser`); each XID event carries the
    severity of its code in the XID table (:func:`~gpuwarden.shared.nvidia.xids.xid_severities`).

    Raises:
        ValueError: ``text`` contains NUL bytes (binary data, not a log), or no line of it is a
            kernel log line (an empty file, another tool's output such as ``nvidia-smi -q``):
            no dmesg, journalctl, syslog or ``/dev/kmsg`` time stamp and no NVIDIA driver or
            kernel message. A kernel log without GPU events gives ``[]``.
    """
    if "\x00" in text:
        raise ValueError("kernel log: binary data (NUL bytes), not a text log")
    if not any(_KERNEL_LINE_RE.search(line) for line in text.splitlines()):
        what = "an empty file" if not text.strip() else "no line has a dmesg, journalctl, syslog or /dev/kmsg"
        raise ValueError(
            f"kernel log: {what}{' time stamp or an NVIDIA driver or kernel message' if text.strip() else ''}"
        )
    year = datetime.now(UTC).year
    parser = KernelLogParser("unknown", source="file", year=year, severities=xid_severities())
    parser.boot_ts = 0.0  # raw records: seconds since boot
    out: list[GpuEvent] = []
    last = 0.0
    for line in text.splitlines():
        m = _MONOTONIC_STAMP_RE.match(line)
        evs = parser.feed(line, float(m[1]) if m else last)
        if m:
            last = float(m[1])
        elif evs:
            last = evs[-1].ts
        out.extend(evs)
    return out
