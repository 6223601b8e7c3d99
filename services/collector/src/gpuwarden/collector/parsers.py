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
    "MigDevice",
    "SmiReport",
    "normalize_pci_bus_id",
    "parse_kernel_log_line",
    "parse_nvidia_smi_xml",
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

_XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?$")
_SXID_RE = re.compile(r"nvidia-nvswitch\d*: SXid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?$")
_PID_RE = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d+),\s*name=(?P<name>[^,]*),\s*")
_ISO_RE = re.compile(
    r"(?P<d>\d{4}-\d{2}-\d{2})[T ](?P<t>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)
_CTIME_RE = re.compile(r"\[(?:\w{3}) (?P<mon>\w{3}) +(?P<day>\d{1,2}) (?P<t>\d{2}:\d{2}:\d{2}) (?P<y>\d{4})\]")
_SYSLOG_RE = re.compile(r"^(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<t>\d{2}:\d{2}:\d{2}) ")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}


def _ts_of(prefix: str, default_ts: float, year: int | None, tz: tzinfo) -> float:
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
        return dt.replace(tzinfo=tz).timestamp()
    return default_ts  # monotonic ``[  12.345]``, /dev/kmsg records, or no timestamp


def parse_kernel_log_line(
    line: str, node: str, default_ts: float, year: int | None = None, *, source: str = "kmsg", tz: tzinfo = UTC
) -> GpuEvent | None:
    """Parse one kernel-log line into an XID or SXID :class:`GpuEvent`; None for any other line.

    Reads the NVIDIA driver's ``NVRM: Xid (PCI:dddd:bb:dd): CODE, [pid=P, name=N, ]TEXT``
    (drivers r470 .. 595, open and proprietary modules; ``pid='<unknown>'`` accepted) and
    ``nvidia-nvswitchN: SXid (PCI:...): CODE, TEXT``. Timestamps, in event time:

    * ISO prefix as printed by ``dmesg --time-format iso`` (``2024-11-15T05:39:15,491363+00:00``),
      with or without the ``kern  :warn  :`` columns of ``dmesg --decode``;
    * ``dmesg -T`` ctime (``[Sun Feb 23 16:24:18 2025]``) and syslog (``Nov 15 05:39:15 host``,
      year from ``year`` or from ``default_ts``), both read in ``tz`` (default UTC);
    * monotonic ``[  365.969681]``, raw ``/dev/kmsg`` records and bare lines: ``default_ts``.

    ``message`` is the driver's text after the code and the pid/name fields; ``pid`` and
    ``process_name`` are None when printed as ``<unknown>``. ``gpu_index`` is left None:
    the caller maps ``pci_bus_id`` to an index with its own inventory.

    Raises:
        ValueError: an XID/SXID line whose PCI id cannot be read (never for other lines).
    """
    line = line.rstrip("\r\n")
    kind = EventKind.XID
    m = _XID_RE.search(line)
    if m is None:
        m = _SXID_RE.search(line)
        kind = EventKind.SXID
        if m is None:
            return None
    ts = _ts_of(line[: m.start()], default_ts, year, tz)
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
    return GpuEvent(
        event_id=stable_id(node, ts, kind.value, code, line),
        node=node,
        ts=ts,
        kind=kind,
        code=code,
        pci_bus_id=normalize_pci_bus_id(m["pci"]),
        pid=pid,
        process_name=name,
        message=rest,
        raw=line,
        source=source,
    )
