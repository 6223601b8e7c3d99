"""Pure parsers of ``nvidia-smi -q`` text and ``nvidia-smi --query-gpu=... --format=csv`` output,
and of nvidia-smi's error outputs. No I/O.

* :func:`parse_nvidia_smi_q` reads ``nvidia-smi -q`` (drivers 535 and 560 tested; the layout
  has been stable since r450 apart from renamed blocks, handled here: "Clocks Throttle Reasons"
  -> "Clocks Event Reasons", "Power Readings" -> "GPU Power Readings", ECC "Single Bit/Double
  Bit" -> "SRAM/DRAM Correctable/Uncorrectable").
* :func:`parse_nvidia_smi_csv` reads ``--query-gpu`` CSV with or without the header line, with
  or without units (``nounits``), ``[N/A]``/``[Not Supported]`` as not supported.
* :func:`detect_smi_error` recognises nvidia-smi's whole-output errors ("Unable to determine the
  device handle for GPU ...", "No devices were found", "NVIDIA-SMI has failed ...") as a typed
  :class:`SmiError`; both parsers return it instead of raising.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuwarden.shared.models import GpuSample

from .parsers import MigDevice, SmiReport, normalize_pci_bus_id

__all__ = [
    "CsvRow",
    "SmiError",
    "csv_row_to_sample",
    "detect_smi_error",
    "parse_nvidia_smi_csv",
    "parse_nvidia_smi_csv_samples",
    "parse_nvidia_smi_q",
]

SmiErrorKind = Literal["device-handle", "no-devices", "driver-communication", "gpu-lost", "not-supported-driver"]


@dataclass(frozen=True)
class SmiError:
    """nvidia-smi printed an error instead of a report.

    ``kind``: ``device-handle`` (one GPU unreachable via NVML; nvidia-smi aborts, the other GPUs'
    state is unknown), ``no-devices``, ``driver-communication`` (driver not loaded / NVML cannot
    talk to it), ``gpu-lost`` ("GPU is lost"), ``not-supported-driver`` (driver/library
    version mismatch). ``pci_bus_id`` (``dddd:bb:dd.f``) when the message names a GPU;
    ``reason`` is NVML's error string ("Unknown Error", "GPU is lost"); ``message`` the line.
    """

    kind: SmiErrorKind
    message: str
    pci_bus_id: str | None = None
    reason: str | None = None
    error: Literal[True] = True


_HANDLE_RE = re.compile(
    r"Unable to determine the device handle for (?:GPU\d*\s*)?"
    r"(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
    r"\s*:\s*(?P<reason>[^\r\n]*)"
)
_ERRORS: list[tuple[re.Pattern[str], SmiErrorKind]] = [
    (re.compile(r"No devices were found"), "no-devices"),
    (
        re.compile(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver[^\r\n]*"),
        "driver-communication",
    ),
    (re.compile(r"Failed to initialize NVML: Driver/library version mismatch[^\r\n]*"), "not-supported-driver"),
    (re.compile(r"Failed to initialize NVML:[^\r\n]*"), "driver-communication"),
    (re.compile(r"Unable to determine the device handle for[^\r\n]*GPU is lost[^\r\n]*"), "gpu-lost"),
]


def detect_smi_error(text: str) -> SmiError | None:
    """The :class:`SmiError` nvidia-smi printed instead of a report, None when ``text`` has none.

    Only looked for when no report header is present, so a report mentioning such words is not
    an error. Shell prompt lines around the message are ignored.
    """
    if "==============NVSMI LOG==============" in text or "<nvidia_smi_log" in text:
        return None
    if m := _HANDLE_RE.search(text):
        reason = m["reason"].strip() or None
        kind: SmiErrorKind = "gpu-lost" if reason and "lost" in reason.lower() else "device-handle"
        return SmiError(kind, m.group(0).strip(), normalize_pci_bus_id(m["pci"]), reason)
    for rx, kind in _ERRORS:
        if m2 := rx.search(text):
            return SmiError(kind, m2.group(0).strip())
    return None


# -- values ----------------------------------------------------------------------------

_NA = {
    "",
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "unknown error",
    "[unknown error]",
    "none",
    "requested functionality has been deprecated",
    "[requested functionality has been deprecated]",
}
_NUM_RE = re.compile(r"^[-+]?\d+(?:\.\d+)?")


def _clean(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    return None if v.lower() in _NA else v


def _numv(v: str | None) -> float | None:
    v = _clean(v)
    if v is None:
        return None
    m = _NUM_RE.match(v)
    return float(m.group()) if m else None


def _intv(v: str | None) -> int | None:
    f = _numv(v)
    return int(f) if f is not None else None


def _pstate(v: str | None) -> int | None:
    v = _clean(v)
    if v is None or not re.fullmatch(r"P\d{1,2}", v):
        return None
    return int(v[1:])


def _yes(v: str | None) -> bool | None:
    v = _clean(v)
    if v is None:
        return None
    return v.lower() in {"yes", "enabled", "active", "true"}


def _sum(*vals: float | None) -> int | None:
    got = [v for v in vals if v is not None]
    return int(sum(got)) if got else None


# -- nvidia-smi -q ------------------------------------------------------------------------


@dataclass
class _Node:
    key: str
    value: str | None
    children: list[_Node] = field(default_factory=list)

    def get(self, path: str) -> _Node | None:
        node: _Node | None = self
        for part in path.split("/"):
            if node is None:
                return None
            node = next((c for c in node.children if c.key == part), None)
        return node

    def val(self, path: str) -> str | None:
        n = self.get(path)
        return n.value if n is not None else None

    def first(self, *paths: str) -> str | None:
        for p in paths:
            v = _clean(self.val(p))
            if v is not None:
                return v
        return None


_LINE_RE = re.compile(r"^(?P<ind> *)(?P<key>[^:]*?)\s*(?::\s?(?P<val>.*))?$")
_GPU_HDR_RE = re.compile(r"^GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")


def _tree(lines: list[str]) -> _Node:
    root = _Node("", None)
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for line in lines:
        if not line.strip():
            continue
        m = _LINE_RE.match(line.rstrip())
        if m is None:
            continue
        ind = len(m["ind"])
        node = _Node(m["key"].strip(), m["val"].strip() if m["val"] is not None else None)
        while stack[-1][0] >= ind:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((ind, node))
    return root


_REASON_NAMES = {"idle": "gpu_idle", "display clock setting": "display_clocks_setting"}


def _reasons(g: _Node) -> list[str]:
    block = g.get("Clocks Event Reasons") or g.get("Clocks Throttle Reasons")
    out: list[str] = []

    def walk(n: _Node) -> None:
        for c in n.children:
            if (c.value or "").strip() == "Active":
                k = c.key.lower()
                out.append(_REASON_NAMES.get(k, k.replace(" ", "_")))
            walk(c)

    if block is not None:
        walk(block)
    return out


def _ecc(block: _Node | None) -> tuple[int | None, int | None]:
    if block is None:
        return None, None
    if block.get("Single Bit") is not None:
        return _intv(block.val("Single Bit/Total")), _intv(block.val("Double Bit/Total"))
    sbe = _sum(_numv(block.val("SRAM Correctable")), _numv(block.val("DRAM Correctable")))
    dbe = _sum(
        _numv(block.val("SRAM Uncorrectable")),
        _numv(block.val("SRAM Uncorrectable Parity")),
        _numv(block.val("SRAM Uncorrectable SEC-DED")),
        _numv(block.val("DRAM Uncorrectable")),
    )
    return sbe, dbe


def _processes(g: _Node) -> list[dict[str, Any]] | None:
    p = g.get("Processes")
    if p is None:
        return None
    out: list[dict[str, Any]] = []
    for c in p.children:
        if c.key == "Process ID" and (pid := _intv(c.value)) is not None:
            proc: dict[str, Any] = {"pid": pid}
            mem = _numv(c.val("Used GPU Memory"))
            if mem is not None:
                proc["used_memory_mib"] = mem
            out.append(proc)
    return out


def _gpu_q(g: _Node, order: int) -> tuple[GpuSample, list[MigDevice]]:
    pci_raw = g.value or _clean(g.val("PCI/Bus Id"))
    minor = _intv(g.val("Minor Number"))
    rr = g.get("Remapped Rows")
    has_rr = rr is not None and bool(rr.children)
    vol_sbe, vol_dbe = _ecc(g.get("ECC Errors/Volatile"))
    agg_sbe, agg_dbe = _ecc(g.get("ECC Errors/Aggregate"))
    power = g.first(
        "GPU Power Readings/Average Power Draw",
        "GPU Power Readings/Power Draw",
        "GPU Power Readings/Instantaneous Power Draw",
        "Power Readings/Power Draw",
    )
    enforced = g.first(
        "GPU Power Readings/Current Power Limit",
        "Power Readings/Enforced Power Limit",
        "GPU Power Readings/Enforced Power Limit",
    )
    mgmt = g.first("Power Readings/Power Limit", "GPU Power Readings/Current Power Limit")
    link = "PCI/GPU Link Info"
    mig_mode = _yes(g.val("MIG Mode/Current"))
    return (
        GpuSample(
            index=minor if minor is not None else order,
            uuid=_clean(g.val("GPU UUID")),
            pci_bus_id=normalize_pci_bus_id(pci_raw) if pci_raw else None,
            name=_clean(g.val("Product Name")),
            serial=_clean(g.val("Serial Number")),
            vbios_version=_clean(g.val("VBIOS Version")),
            utilization_gpu_pct=_numv(g.val("Utilization/Gpu")),
            utilization_memory_pct=_numv(g.val("Utilization/Memory")),
            memory_used_mib=_numv(g.val("FB Memory Usage/Used")),
            memory_total_mib=_numv(g.val("FB Memory Usage/Total")),
            memory_free_mib=_numv(g.val("FB Memory Usage/Free")),
            memory_reserved_mib=_numv(g.val("FB Memory Usage/Reserved")),
            temperature_c=_numv(g.val("Temperature/GPU Current Temp")),
            memory_temperature_c=_numv(g.val("Temperature/Memory Current Temp")),
            # Only the absolute thresholds; "... T.Limit Temp" values are offsets from T.Limit.
            temperature_slowdown_c=_numv(g.val("Temperature/GPU Slowdown Temp")),
            temperature_shutdown_c=_numv(g.val("Temperature/GPU Shutdown Temp")),
            power_w=_numv(power),
            power_limit_w=_numv(enforced),
            power_management_limit_w=_numv(mgmt),
            sm_clock_mhz=_numv(g.val("Clocks/SM")),
            graphics_clock_mhz=_numv(g.val("Clocks/Graphics")),
            memory_clock_mhz=_numv(g.val("Clocks/Memory")),
            max_sm_clock_mhz=_numv(g.val("Max Clocks/SM")),
            max_graphics_clock_mhz=_numv(g.val("Max Clocks/Graphics")),
            max_memory_clock_mhz=_numv(g.val("Max Clocks/Memory")),
            throttle_reasons=_reasons(g),
            performance_state=_pstate(g.val("Performance State")),
            fan_speed_pct=_numv(g.val("Fan Speed")),
            ecc_sbe_volatile=vol_sbe,
            ecc_dbe_volatile=vol_dbe,
            ecc_sbe_aggregate=agg_sbe,
            ecc_dbe_aggregate=agg_dbe,
            retired_pages_sbe=_intv(g.val("Retired Pages/Single Bit ECC")),
            retired_pages_dbe=_intv(g.val("Retired Pages/Double Bit ECC")),
            retired_pages_pending=_yes(
                g.first("Retired Pages/Pending Page Blacklist", "Retired Pages/Pending Page Retirement")
            ),
            retired_pages=_sum(
                _numv(g.val("Retired Pages/Single Bit ECC")), _numv(g.val("Retired Pages/Double Bit ECC"))
            ),
            remapped_rows_correctable=_intv(rr.val("Correctable Error")) if has_rr and rr else None,
            remapped_rows_uncorrectable=_intv(rr.val("Uncorrectable Error")) if has_rr and rr else None,
            remapped_rows_pending=_yes(rr.val("Pending")) if has_rr and rr else None,
            remapped_rows_failure=_yes(rr.val("Remapping Failure Occurred")) if has_rr and rr else None,
            pcie_replay_count=_intv(g.val("PCI/Replays Since Reset")),
            pcie_link_gen=_intv(g.val(f"{link}/PCIe Generation/Current")),
            pcie_link_gen_max=_intv(g.val(f"{link}/PCIe Generation/Max")),
            pcie_link_width=_intv(g.val(f"{link}/Link Width/Current")),
            pcie_link_width_max=_intv(g.val(f"{link}/Link Width/Max")),
            pcie_tx_kbps=_numv(g.val("PCI/Tx Throughput")),
            pcie_rx_kbps=_numv(g.val("PCI/Rx Throughput")),
            processes=_processes(g),
            mig_mode=mig_mode,
        ),
        [],
    )


def parse_nvidia_smi_q(text: str) -> SmiReport | SmiError:
    """Parse ``nvidia-smi -q`` text (drivers 535.183 and 560.35 tested) into a :class:`SmiReport`.

    ``N/A``/``Not Supported`` values are None (absent), never 0. Units (MiB, W, C, MHz, %,
    KB/s) are the model's and are dropped. ``dtd_version`` is None (text has none).
    Temperature thresholds are read only from the absolute ``GPU Slowdown/Shutdown Temp``
    lines; Hopper's ``... T.Limit Temp`` lines are offsets and are not thresholds.

    Returns:
        :class:`SmiError` when the output is one of nvidia-smi's error messages.

    Raises:
        ValueError: neither a ``-q`` report nor a known nvidia-smi error.
    """
    err = detect_smi_error(text)
    if err is not None:
        return err
    if "==============NVSMI LOG==============" not in text:
        raise ValueError("nvidia-smi -q: no '==============NVSMI LOG==============' header")
    root = _tree(text.splitlines())
    gpus: list[GpuSample] = []
    order = 0
    for c in root.children:
        # "GPU 00000000:53:00.0" splits at its first colon into key "GPU 00000000" and value "53:00.0"
        m = _GPU_HDR_RE.match(c.key + (":" + c.value if c.value else ""))
        if m is None:
            continue
        c.value = m["pci"]
        s, _ = _gpu_q(c, order)
        gpus.append(s)
        order += 1
    return SmiReport(
        dtd_version=None,
        driver_version=_clean(root.val("Driver Version")),
        cuda_version=_clean(root.val("CUDA Version")),
        timestamp=_clean(root.val("Timestamp")),
        gpus=gpus,
    )


# -- --query-gpu CSV ------------------------------------------------------------------------

CsvValue = str | float | None


@dataclass(frozen=True)
class CsvRow:
    """One GPU row of ``--query-gpu`` CSV: ``values`` maps each query field (``memory.used``,
    unit suffix removed) to a number (units as nvidia-smi prints them: MiB, W, MHz, %, C),
    a string (name, uuid, pstate, pci.bus_id) or None (``[N/A]``, ``[Not Supported]``)."""

    values: dict[str, CsvValue]


_UNIT_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)(?:\s*\[(?P<unit>[^\]]*)\])?$")
_VAL_UNIT_RE = re.compile(r"^(?P<num>[-+]?\d+(?:\.\d+)?)\s*(?:%|MiB|W|MHz|C|KB/s|GiB|mW|s|ms)?$")
_STRING_FIELDS = {
    "name",
    "uuid",
    "pstate",
    "pci.bus_id",
    "serial",
    "vbios_version",
    "driver_version",
    "gpu_name",
    "gpu_uuid",
    "gpu_serial",
    "gpu_bus_id",
    "compute_mode",
    "persistence_mode",
    "mig.mode.current",
    "display_mode",
    "timestamp",
}


def parse_nvidia_smi_csv(text: str, fields: list[str] | None = None) -> list[CsvRow] | SmiError:
    """Parse ``nvidia-smi --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]`` (also
    ``--query-compute-apps``) output into one :class:`CsvRow` per line.

    With a header, field names come from it (``memory.used [MiB]`` -> ``memory.used``);
    without one (``noheader``) ``fields`` must give them. Values are split on commas (nvidia-smi
    writes ", "); numbers with or without units become floats; ``[N/A]``, ``N/A``, ``[Not
    Supported]`` become None. Known text fields (name, uuid, pstate, ...) stay strings.

    Returns:
        :class:`SmiError` when the output is one of nvidia-smi's error messages.

    Raises:
        ValueError: no header and no ``fields``; a row whose column count differs from the
            header's; empty input.
    """
    err = detect_smi_error(text)
    if err is not None:
        return err
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("nvidia-smi CSV: empty output")
    rows = list(csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True))
    first = [c.strip() for c in rows[0]]
    header = all(_UNIT_RE.match(c) and not _VAL_UNIT_RE.match(c) for c in first) and any("." in c for c in first)
    if header:
        names = []
        for c in first:
            hm = _UNIT_RE.match(c)
            assert hm is not None
            names.append(hm["name"])
        body = rows[1:]
    elif fields is not None:
        names, body = list(fields), rows
    else:
        raise ValueError("nvidia-smi CSV: no header line (noheader) and no field names given")
    out = []
    for i, r in enumerate(body, start=2 if header else 1):
        if len(r) != len(names):
            raise ValueError(f"nvidia-smi CSV line {i}: {len(r)} values, header has {len(names)}")
        vals: dict[str, CsvValue] = {}
        for name, raw in zip(names, r, strict=True):
            v = _clean(raw)
            if v is None or name in _STRING_FIELDS:
                vals[name] = v
                continue
            vm = _VAL_UNIT_RE.match(v)
            vals[name] = float(vm["num"]) if vm else v
        out.append(CsvRow(vals))
    return out


def csv_row_to_sample(row: CsvRow, order: int) -> GpuSample:
    """A :class:`GpuSample` from the standard ``--query-gpu`` fields present in ``row``
    (absent or N/A fields stay None)."""
    v = row.values

    def f(*keys: str) -> float | None:
        for k in keys:
            x = v.get(k)
            if isinstance(x, float):
                return x
        return None

    def s(*keys: str) -> str | None:
        for k in keys:
            x = v.get(k)
            if isinstance(x, str):
                return x
        return None

    idx = f("index")
    pci = s("pci.bus_id", "gpu_bus_id")
    return GpuSample(
        index=int(idx) if idx is not None else order,
        uuid=s("uuid", "gpu_uuid"),
        pci_bus_id=normalize_pci_bus_id(pci) if pci else None,
        name=s("name", "gpu_name"),
        serial=s("serial", "gpu_serial"),
        vbios_version=s("vbios_version"),
        utilization_gpu_pct=f("utilization.gpu"),
        utilization_memory_pct=f("utilization.memory"),
        memory_used_mib=f("memory.used"),
        memory_total_mib=f("memory.total"),
        memory_free_mib=f("memory.free"),
        memory_reserved_mib=f("memory.reserved"),
        temperature_c=f("temperature.gpu"),
        memory_temperature_c=f("temperature.memory"),
        power_w=f("power.draw", "power.draw.average", "power.draw.instant"),
        power_limit_w=f("enforced.power.limit", "power.limit"),
        power_management_limit_w=f("power.limit"),
        sm_clock_mhz=f("clocks.current.sm", "clocks.sm"),
        graphics_clock_mhz=f("clocks.current.graphics", "clocks.gr"),
        memory_clock_mhz=f("clocks.current.memory", "clocks.mem"),
        max_sm_clock_mhz=f("clocks.max.sm"),
        max_graphics_clock_mhz=f("clocks.max.graphics", "clocks.max.gr"),
        max_memory_clock_mhz=f("clocks.max.memory", "clocks.max.mem"),
        performance_state=_pstate(s("pstate")),
        fan_speed_pct=f("fan.speed"),
        pcie_link_gen=_int_or_none(f("pcie.link.gen.current", "pcie.link.gen.gpucurrent")),
        pcie_link_gen_max=_int_or_none(f("pcie.link.gen.max")),
        pcie_link_width=_int_or_none(f("pcie.link.width.current")),
        pcie_link_width_max=_int_or_none(f("pcie.link.width.max")),
        ecc_sbe_volatile=_int_or_none(f("ecc.errors.corrected.volatile.total")),
        ecc_dbe_volatile=_int_or_none(f("ecc.errors.uncorrected.volatile.total")),
        ecc_sbe_aggregate=_int_or_none(f("ecc.errors.corrected.aggregate.total")),
        ecc_dbe_aggregate=_int_or_none(f("ecc.errors.uncorrected.aggregate.total")),
    )


def _int_or_none(x: float | None) -> int | None:
    return int(x) if x is not None else None


def parse_nvidia_smi_csv_samples(text: str) -> list[GpuSample] | SmiError:
    """``gpuwarden parse nvidia-smi-csv``: ``--query-gpu`` CSV with a header -> one
    :class:`GpuSample` per row (standard fields mapped; others dropped), or :class:`SmiError`.

    Raises:
        ValueError: as :func:`parse_nvidia_smi_csv` (a header line is required here).
    """
    rows = parse_nvidia_smi_csv(text)
    if isinstance(rows, SmiError):
        return rows
    return [csv_row_to_sample(r, i) for i, r in enumerate(rows)]
