"""Pure parsers of GPU tool output: ``nvidia-smi -q -x`` XML and NVRM/NVSwitch kernel-log lines.

No I/O here: callers read files, ``/dev/kmsg`` or NVML and hand text to these functions.

* :func:`parse_nvidia_smi_xml` reads ``nvidia-smi -q -x`` (DTD ``nvsmi_device_v11`` .. ``v13``,
  drivers 510 .. 595 seen in tests) into :class:`SmiReport`.
* :func:`parse_kernel_log_line` reads one kernel-log line with an ``NVRM: Xid`` (GPU) or
  ``nvidia-nvswitchN: SXid`` (NVSwitch) record into a :class:`~gpuwarden.shared.models.GpuEvent`.
* :func:`normalize_pci_bus_id` turns every PCI id spelling into ``dddd:bb:dd.f`` lower-case.
"""

from __future__ import annotations

import calendar
import logging
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo

from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, stable_id

__all__ = [
    "KNOWN_DTD_VERSIONS",
    "XID79_DEDUPE_S",
    "KernelLogParser",
    "KmsgRecord",
    "MigDevice",
    "SmiReport",
    "normalize_pci_bus_id",
    "parse_kernel_log_line",
    "parse_kmsg",
    "parse_nvidia_smi_xml",
    "split_kmsg_record",
]

log = logging.getLogger(__name__)

KNOWN_DTD_VERSIONS = frozenset({"11", "12", "13"})
_warned_dtd: set[str] = set()

# -- PCI ids ---------------------------------------------------------------------------

_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def normalize_pci_bus_id(text: str) -> str:
    """Normalise a PCI bus id to ``dddd:bb:dd.f`` lower-case (4-digit domain).

    Accepts the spellings of nvidia-smi/NVML (``00000000:0C:00.0``), the kernel log
    (``0000:44:00``, no function: ``.0`` is assumed) and ``PCI:``-prefixed forms.

    Raises:
        ValueError: ``text`` is not a PCI bus id.
    """
    m = _PCI_RE.match(text.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {text!r}")
    dom = int(m["dom"] or "0", 16)
    return f"{dom:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{m['fn'] or '0'}"


# -- nvidia-smi -q -x --------------------------------------------------------------------

_NA = {
    "",
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "unknown error",
    "unknown",
    "requested functionality has been deprecated",
    "none",
}
_NUM_RE = re.compile(r"^[-+]?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU (``<mig_devices><mig_device>``); memory in MiB."""

    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessor_count: int | None
    memory_used_mib: float | None
    memory_total_mib: float | None


@dataclass(frozen=True)
class SmiReport:
    """What one ``nvidia-smi -q -x`` run reports.

    ``dtd_version`` is the number of ``nvsmi_device_vNN.dtd`` ("11", "13"), None if absent;
    ``gpus`` in ``<gpu>`` order; ``mig`` maps a GPU index to its MIG instances (only GPUs
    with MIG enabled appear).
    """

    dtd_version: str | None
    driver_version: str | None
    cuda_version: str | None
    timestamp: str | None
    gpus: list[GpuSample]
    mig: dict[int, list[MigDevice]] = field(default_factory=dict)


def _text(el: ET.Element | None, path: str) -> str | None:
    """Whitespace-stripped text at ``path`` under ``el``; None when missing or N/A-like."""
    if el is None:
        return None
    node = el.find(path)
    if node is None or node.text is None:
        return None
    t = node.text.strip()
    return None if t.lower() in _NA else t


def _num(el: ET.Element | None, path: str) -> float | None:
    """Leading number of the value at ``path`` ("139.62 W" -> 139.62, "16x" -> 16)."""
    t = _text(el, path)
    if t is None:
        return None
    m = _NUM_RE.match(t)
    return float(m.group()) if m else None


def _int(el: ET.Element | None, path: str) -> int | None:
    v = _num(el, path)
    return int(v) if v is not None else None


def _first_num(el: ET.Element | None, *paths: str) -> float | None:
    for p in paths:
        v = _num(el, p)
        if v is not None:
            return v
    return None


def _sum_opt(*vals: float | None) -> int | None:
    present = [v for v in vals if v is not None]
    return int(sum(present)) if present else None


def _yes_no(el: ET.Element | None, path: str) -> bool | None:
    t = _text(el, path)
    if t is None:
        return None
    return t.lower() in {"yes", "true", "1", "active"}


def _throttle(gpu: ET.Element) -> list[str]:
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = gpu.find(block)
        if el is None:
            continue
        out = []
        for child in el:
            state = (child.text or "").strip()
            if state == "Active" and child.tag.startswith(prefix):
                out.append(child.tag[len(prefix) :])
        return out
    return []


def _ecc(gpu: ET.Element) -> tuple[int | None, int | None]:
    vol = gpu.find("ecc_errors/volatile")
    if vol is None:
        return None, None
    if vol.find("single_bit") is not None:  # DTD <= v10 layout
        return _int(vol, "single_bit/total"), _int(vol, "double_bit/total")
    sbe = _sum_opt(_num(vol, "sram_correctable"), _num(vol, "dram_correctable"))
    dbe = _sum_opt(
        _num(vol, "sram_uncorrectable"),
        _num(vol, "sram_uncorrectable_parity"),
        _num(vol, "sram_uncorrectable_secded"),
        _num(vol, "dram_uncorrectable"),
    )
    return sbe, dbe


def _mig(gpu: ET.Element) -> list[MigDevice]:
    out = []
    for d in gpu.findall("mig_devices/mig_device"):
        out.append(
            MigDevice(
                index=_int(d, "index") or 0,
                gpu_instance_id=_int(d, "gpu_instance_id"),
                compute_instance_id=_int(d, "compute_instance_id"),
                multiprocessor_count=_int(d, "device_attributes/shared/multiprocessor_count"),
                memory_used_mib=_num(d, "fb_memory_usage/used"),
                memory_total_mib=_num(d, "fb_memory_usage/total"),
            )
        )
    return out


def _gpu(gpu: ET.Element, order: int) -> GpuSample:
    minor = _int(gpu, "minor_number")
    pci_raw = _text(gpu, "pci/pci_bus_id") or gpu.get("id")
    sbe, dbe = _ecc(gpu)
    rr = gpu.find("remapped_rows")
    has_rr = rr is not None and len(rr) > 0
    # v13 splits power into average/instant in <gpu_power_readings>; v11/v12 have <power_readings>.
    power = _first_num(
        gpu,
        "gpu_power_readings/average_power_draw",
        "gpu_power_readings/power_draw",
        "gpu_power_readings/instant_power_draw",
        "power_readings/power_draw",
        "power_readings/average_power_draw",
        "power_readings/instant_power_draw",
    )
    limit = _first_num(
        gpu,
        "gpu_power_readings/current_power_limit",
        "gpu_power_readings/enforced_power_limit",
        "power_readings/enforced_power_limit",
        "power_readings/current_power_limit",
        "power_readings/power_limit",
    )
    link = "pci/pci_gpu_link_info"
    return GpuSample(
        index=minor if minor is not None else order,
        uuid=_text(gpu, "uuid"),
        pci_bus_id=normalize_pci_bus_id(pci_raw) if pci_raw else None,
        name=_text(gpu, "product_name"),
        utilization_gpu_pct=_num(gpu, "utilization/gpu_util"),
        utilization_memory_pct=_num(gpu, "utilization/memory_util"),
        memory_used_mib=_num(gpu, "fb_memory_usage/used"),
        memory_total_mib=_num(gpu, "fb_memory_usage/total"),
        temperature_c=_num(gpu, "temperature/gpu_temp"),
        memory_temperature_c=_num(gpu, "temperature/memory_temp"),
        power_w=power,
        power_limit_w=limit,
        sm_clock_mhz=_num(gpu, "clocks/sm_clock"),
        memory_clock_mhz=_num(gpu, "clocks/mem_clock"),
        max_sm_clock_mhz=_num(gpu, "max_clocks/sm_clock"),
        throttle_reasons=_throttle(gpu),
        ecc_sbe_volatile=sbe,
        ecc_dbe_volatile=dbe,
        retired_pages=_sum_opt(
            _num(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
            _num(gpu, "retired_pages/double_bit_retirement/retired_count"),
        ),
        remapped_rows_pending=_yes_no(rr, "remapped_row_pending") if has_rr else None,
        remapped_rows_failure=_yes_no(rr, "remapped_row_failure") if has_rr else None,
        pcie_replay_count=_int(gpu, "pci/replay_counter"),
        pcie_link_gen=_int(gpu, f"{link}/pcie_gen/current_link_gen"),
        pcie_link_width=_int(gpu, f"{link}/link_widths/current_link_width"),
    )


_DTD_RE = re.compile(r"nvsmi_device_v(\d+)\.dtd")


def parse_nvidia_smi_xml(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q -x`` output (DTD v11, v12, v13; drivers 510-595 tested).

    Values are whitespace-stripped; ``N/A``, ``[N/A]``, ``Not Supported`` and "deprecated"
    become None, never 0. Units are dropped after conversion to the model's units (nvidia-smi
    already prints W, MiB, C, MHz, %). An unknown DTD version is logged once and parsed anyway.

    Raises:
        ValueError: not XML, or the root is not ``<nvidia_smi_log>``.
    """
    m = _DTD_RE.search(text[:500])
    dtd = m.group(1) if m else None
    if dtd is not None and dtd not in KNOWN_DTD_VERSIONS and dtd not in _warned_dtd:
        _warned_dtd.add(dtd)
        log.warning(
            "nvidia-smi XML DTD v%s is not one this parser was tested on (%s); parsing anyway",
            dtd,
            ", ".join(sorted(KNOWN_DTD_VERSIONS)),
        )
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi XML: not well-formed: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"nvidia-smi XML: root is <{root.tag}>, expected <nvidia_smi_log>")
    gpus: list[GpuSample] = []
    mig: dict[int, list[MigDevice]] = {}
    for order, g in enumerate(root.findall("gpu")):
        s = _gpu(g, order)
        gpus.append(s)
        devs = _mig(g)
        if devs:
            mig[s.index] = devs
    return SmiReport(
        dtd_version=dtd,
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        timestamp=_text(root, "timestamp"),
        gpus=gpus,
        mig=mig,
    )


# -- kernel log ----------------------------------------------------------------------

_PCI_TOKEN = r"[0-9a-fA-F]{1,8}(?::[0-9a-fA-F]{1,4}){1,2}(?:\.[0-7])?"
# ``NVRM: Xid (PCI:0000:44:00): 79, ...``; very old drivers print ``NVRM: Xid (0000:02:00): 13, ...``.
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)\s]{0,40})\): (?P<code>\d{1,6})(?:,\s*(?P<rest>.*))?$", re.DOTALL
)
_SXID_RE = re.compile(
    r"nvidia-nvswitch\d{0,4}: SXid \((?:PCI:)?(?P<pci>[^)\s]{0,40})\): (?P<code>\d{1,6})(?:,\s*(?P<rest>.*))?$",
    re.DOTALL,
)
_PID_RE = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d{1,10}),\s*name=(?P<name>[^,]*),\s*")
_CHANNEL_RE = re.compile(r"\b(?:channel\s+(?:0x)?|Ch\s+)(?P<ch>[0-9a-fA-F]{1,8})\b")
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


def parse_kernel_log_line(
    line: str, node: str, default_ts: float, year: int | None = None, *, source: str = "kmsg", tz: tzinfo = UTC
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
    )


class KernelLogParser:
    """Stateful kernel-log parser: :func:`parse_kernel_log_line` plus the messages that span lines.

    ``feed(line, default_ts)`` returns the events that line completes:

    * XID/SXID lines as :func:`parse_kernel_log_line`;
    * "GPU has fallen off the bus" without an XID number, on one line
      (``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``) or split over up to 4 lines
      (``NVRM: The NVIDIA GPU 0000:b3:00.0`` / ``NVRM: (PCI ID: 10de:26b5) installed in this
      system has`` / ``NVRM: fallen off the bus and is not responding to commands.``): an XID 79
      event (``message`` says no number was printed; ``raw`` is the lines joined by ``\n``).
      It and an ``Xid ...: 79`` line for the same GPU within :data:`XID79_DEDUPE_S` seconds of
      each other are one event: the later one is dropped.

    Never raises on any text.
    """

    def __init__(
        self, node: str, *, source: str = "kmsg", year: int | None = None, tz: tzinfo = UTC, max_lines: int = 4
    ) -> None:
        self.node = node
        self.source = source
        self.year = year
        self.tz = tz
        self.max_lines = max_lines
        self._pending: list[str] = []
        self._pending_pci: str | None = None
        self._pending_ts = 0.0
        self._last79: dict[str | None, float] = {}
        self.boot_ts: float | None = None
        """Epoch s of boot: ``/dev/kmsg`` records then get ts = boot_ts + their usec stamp."""

    def _dup79(self, pci: str | None, ts: float) -> bool:
        last = self._last79.get(pci)
        self._last79[pci] = ts if last is None else max(last, ts)
        return last is not None and abs(ts - last) <= XID79_DEDUPE_S

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
            message="GPU has fallen off the bus (no XID number printed)",
            raw=raw,
            source=self.source,
        )

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
        ev2 = parse_kernel_log_line(line, self.node, default_ts, self.year, source=self.source, tz=self.tz)
        if ev2 is not None:
            if ev2.kind is EventKind.XID and ev2.code == 79 and self._dup79(ev2.pci_bus_id, ev2.ts):
                return out
            out.append(ev2)
        return out

    def feed_lines(self, lines: list[str], default_ts: float) -> list[GpuEvent]:
        """:meth:`feed` over ``lines`` in order."""
        out: list[GpuEvent] = []
        for line in lines:
            out.extend(self.feed(line, default_ts))
        return out


def parse_kmsg(text: str) -> list[GpuEvent]:
    """``gpuwarden parse kmsg``: every XID/SXID event of a kernel log (dmesg with any time
    format, ``journalctl -k``, ``/var/log/kern.log``, raw ``/dev/kmsg`` records).

    Node is ``"-"`` (unknown); lines without a readable date (monotonic ``[ 12.3]``, raw
    records) get ts 0.0; syslog stamps, which print no year, are read in the current year.
    Multi-line messages are joined (:class:`KernelLogParser`).

    Raises:
        ValueError: ``text`` contains NUL bytes (binary data, not a log).
    """
    if "\x00" in text:
        raise ValueError("kernel log: binary data (NUL bytes), not a text log")
    year = datetime.now(UTC).year
    return KernelLogParser("-", source="file", year=year).feed_lines(text.splitlines(), 0.0)
