# Over 500 lines: one unit, nvidia-smi's text outputs share value cleaning, SmiError and the GpuSample field map.
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
import functools
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuwarden.shared.fieldgen import gpu_sample_model
from gpuwarden.shared.fields import FIELDS, FieldSpec, SmiKind, smi_q_fields, smi_query_fields
from gpuwarden.shared.models import GpuSample
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id
from gpuwarden.shared.nvidia.tokens import NA_TOKENS
from gpuwarden.shared.nvidia.values import gpu_sample

from .smi_xml import MigDevice, SmiReport

__all__ = [
    "CSV_ALIASES",
    "CSV_SAMPLE_FIELDS",
    "TEXT_READERS",
    "CsvRow",
    "SmiError",
    "csv_converter",
    "csv_field_name",
    "csv_header",
    "csv_row_to_sample",
    "csv_value_to_field",
    "detect_smi_error",
    "parse_nvidia_smi_csv",
    "parse_nvidia_smi_csv_records",
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

_NUM_RE = re.compile(r"^[-+]?\d+(?:\.\d+)?")


def _clean(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    return None if v.lower() in NA_TOKENS else v


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


#: GpuSample fields the ``-q`` text reader reads in code (:func:`_gpu_q`); every other scalar row of
#: the field registry with ``smi_q`` paths is read generically (:func:`_q_readers`)
Q_IN_CODE = frozenset(
    {
        "index",  # Minor Number, else the GPU's order in the report
        "pci_bus_id",  # the GPU block's own header (GPU 00000000:53:00.0), else PCI/Bus Id
        "throttle_reasons",  # the Active entries of Clocks Event Reasons / Clocks Throttle Reasons
        "ecc_sbe_volatile",  # ECC Errors/Volatile: Single Bit/Total, or the SRAM + DRAM sums
        "ecc_dbe_volatile",
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "retired_pages",  # Retired Pages: single + double bit
        "processes",
    }
)

#: how a ``-q`` value (also a default-table cell) is read, by the registry row's ``smi_kind`` or
#: type: the leading number (unit dropped), yes/enabled/active as True, ``P2`` as 2, N/A as None
TEXT_READERS: dict[str, Callable[[str | None], Any]] = {
    "float": _numv,
    "int": _intv,
    "bool": _yes,
    "str": _clean,
    "pstate": _pstate,
    "pci": lambda v: normalize_pci_bus_id(c) if (c := _clean(v)) else None,
}


@functools.cache
def _q_readers(fields: tuple[FieldSpec, ...]) -> tuple[tuple[str, tuple[str, ...], Callable[[str | None], Any]], ...]:
    """(field, paths, reader) of each registry row the ``-q`` text is read for generically."""
    return tuple((f, paths, TEXT_READERS[kind]) for f, paths, kind in smi_q_fields(fields) if f not in Q_IN_CODE)


def _gpu_q(g: _Node, order: int, fields: Sequence[FieldSpec] = FIELDS) -> tuple[GpuSample, list[MigDevice]]:
    data: dict[str, Any] = {}
    for name, paths, read in _q_readers(tuple(fields)):
        for p in paths:  # the first path that reads a value
            if (v := read(g.val(p))) is not None:
                data[name] = v
                break
    pci_raw = g.value or _clean(g.val("PCI/Bus Id"))
    minor = _intv(g.val("Minor Number"))
    vol_sbe, vol_dbe = _ecc(g.get("ECC Errors/Volatile"))
    agg_sbe, agg_dbe = _ecc(g.get("ECC Errors/Aggregate"))
    data.update(
        index=minor if minor is not None else order,
        pci_bus_id=normalize_pci_bus_id(pci_raw) if pci_raw else None,
        throttle_reasons=_reasons(g),
        ecc_sbe_volatile=vol_sbe,
        ecc_dbe_volatile=vol_dbe,
        ecc_sbe_aggregate=agg_sbe,
        ecc_dbe_aggregate=agg_dbe,
        retired_pages=_sum(_numv(g.val("Retired Pages/Single Bit ECC")), _numv(g.val("Retired Pages/Double Bit ECC"))),
        processes=_processes(g),
    )
    where = f"nvidia-smi -q GPU {pci_raw or order}"
    return gpu_sample(data, where, gpu_sample_model(fields)), []


def parse_nvidia_smi_q(text: str, fields: Sequence[FieldSpec] = FIELDS) -> SmiReport | SmiError:
    """Parse ``nvidia-smi -q`` text (drivers 535.183 and 560.35 tested) into a :class:`SmiReport`.

    The values are read from the ``smi_q`` paths of the field registry ``fields``
    (:mod:`gpuwarden.shared.fields`; another registry gives samples of the model it generates)
    except those in :data:`Q_IN_CODE`.

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
        s, _ = _gpu_q(c, order, fields)
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
    unit suffix removed) to a number (in MiB, W, MHz, %, C: a value printed in GiB, mW or GHz
    is converted), a string (name, uuid, pstate, pci.bus_id) or None (``[N/A]``,
    ``[Not Supported]``)."""

    values: dict[str, CsvValue]


_UNIT_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_.]*)(?:\s*\[(?P<unit>[^\]]*)\])?$")
_VAL_UNIT_RE = re.compile(r"^(?P<num>[-+]?\d+(?:\.\d+)?)\s*(?P<unit>%|MiB|W|MHz|C|KB/s|GiB|KiB|mW|kW|GHz|s|ms)?$")
#: Factor from a printed unit to the unit of :class:`GpuSample` (MiB, W, MHz); others are 1.
_UNIT_FACTOR = {"gib": 1024.0, "kib": 1 / 1024, "mw": 0.001, "kw": 1000.0, "ghz": 1000.0}
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

#: Column names of custom loggers (lower-case, unit suffix dropped) -> the nvidia-smi field.
CSV_ALIASES: dict[str, str] = {
    "gpu_index": "index",
    "gpu_id": "index",
    "gpu": "index",
    "gpu_idx": "index",
    "idx": "index",
    "device": "index",
    "time": "timestamp",
    "datetime": "timestamp",
    "date_time": "timestamp",
    "ts": "timestamp",
    "temperature_c": "temperature.gpu",
    "temperature": "temperature.gpu",
    "temp": "temperature.gpu",
    "temp_c": "temperature.gpu",
    "gpu_temp": "temperature.gpu",
    "memory_temperature_c": "temperature.memory",
    "mem_temp": "temperature.memory",
    "utilization_gpu_percent": "utilization.gpu",
    "utilization_gpu": "utilization.gpu",
    "gpu_utilization": "utilization.gpu",
    "util": "utilization.gpu",
    "gpu_util": "utilization.gpu",
    "util_gpu": "utilization.gpu",
    "utilization_memory_percent": "utilization.memory",
    "utilization_memory": "utilization.memory",
    "mem_util": "utilization.memory",
    "memory_util": "utilization.memory",
    "power_w": "power.draw",
    "power": "power.draw",
    "power_draw": "power.draw",
    "power_draw_w": "power.draw",
    "power_limit_w": "power.limit",
    "power_limit": "power.limit",
    "memory_used_mib": "memory.used",
    "memory_used_mb": "memory.used",
    "memory_used": "memory.used",
    "mem_used": "memory.used",
    "mem_used_mib": "memory.used",
    "memory_total_mib": "memory.total",
    "memory_total_mb": "memory.total",
    "memory_total": "memory.total",
    "mem_total": "memory.total",
    "memory_free_mib": "memory.free",
    "memory_free": "memory.free",
    "mem_free": "memory.free",
    "sm_clock_mhz": "clocks.current.sm",
    "sm_clock": "clocks.current.sm",
    "clock_sm": "clocks.current.sm",
    "mem_clock_mhz": "clocks.current.memory",
    "memory_clock_mhz": "clocks.current.memory",
    "mem_clock": "clocks.current.memory",
    "graphics_clock_mhz": "clocks.current.graphics",
    "fan_speed": "fan.speed",
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "bus_id": "pci.bus_id",
    "pci_bus_id": "pci.bus_id",
}
#: Units a custom logger writes as a name suffix (``power_W``, ``temperature_C``): for aliases only.
_ALIAS_UNIT_RE = re.compile(r"^(?P<base>.+?)_(?P<unit>w|c|mib|mb|mhz|percent|pct)$")


def csv_field_name(header_cell: str) -> tuple[str, str | None] | None:
    """The nvidia-smi field name and unit of one CSV header cell, None when the cell is no field name.

    ``power.draw [W]`` -> ``("power.draw", "W")``; custom loggers' names map through
    :data:`CSV_ALIASES` (``gpu_index`` -> ``index``, ``temperature_C`` -> ``temperature.gpu``,
    ``power_W`` -> ``("power.draw", "W")``); other names are kept as written.
    """
    m = _UNIT_RE.match(header_cell.strip())
    if m is None or _VAL_UNIT_RE.match(header_cell.strip()):
        return None
    name, unit = m["name"], m["unit"]
    low = name.lower()
    if low in CSV_ALIASES:
        return CSV_ALIASES[low], unit
    if (am := _ALIAS_UNIT_RE.match(low)) and (am["base"] + "_" + am["unit"]) not in CSV_ALIASES:
        base = am["base"]
        for cand in (base + "_" + am["unit"], base):
            if cand in CSV_ALIASES:
                return CSV_ALIASES[cand], unit or am["unit"]
    return name, unit


def csv_header(cells: list[str]) -> list[tuple[str, str | None]] | None:
    """Field names and units of a CSV header line, None when ``cells`` is a data line.

    A header is a line whose every cell is a field name and where at least one cell is a
    dotted nvidia-smi field (``power.draw``) or a known alias (``gpu_index``, ``timestamp``).
    """
    out = []
    known = False
    for c in cells:
        f = csv_field_name(c)
        if f is None:
            return None
        known = known or "." in f[0] or f[0] in _STRING_FIELDS or f[0] in _SAMPLE_KEYS or f[0] == "index"
        out.append(f)
    return out if known else None


def csv_converter(name: str, unit: str | None = None) -> Callable[[str], CsvValue]:
    """The function reading one value of column ``name`` (header unit ``unit``): text fields
    stay strings; numbers with or without a unit become floats in the model's units (``1.5 GiB``
    -> 1536 MiB, ``[mW]`` -> W); ``[N/A]``, ``N/A``, ``[Not Supported]`` -> None; any other text
    is returned as the stripped string (the caller decides whether that is an error)."""
    if name in _STRING_FIELDS:
        return _clean
    hdr_factor = _UNIT_FACTOR.get((unit or "").lower(), 1.0)

    def conv(raw: str) -> CsvValue:
        v = raw.strip()
        num, _, u = v.partition(" ")
        try:
            x = float(num)
        except ValueError:
            if v.lower() in NA_TOKENS:
                return None
            m = _VAL_UNIT_RE.match(v)
            if m is None:
                return v
            x, u = float(m["num"]), m["unit"] or ""
        if u:
            f = _UNIT_FACTOR.get(u.lower())
            if f is None and _VAL_UNIT_RE.match("0 " + u) is None:
                return v  # "12 apples": not a number with a unit
            return x * (f if f is not None else 1.0)
        return x * hdr_factor if hdr_factor != 1.0 else x

    return conv


def parse_nvidia_smi_csv(text: str, fields: list[str] | None = None) -> list[CsvRow] | SmiError:
    """Parse ``nvidia-smi --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]`` (also
    ``--query-compute-apps``; nvidia-smi 450 .. 595) output into one :class:`CsvRow` per line.

    With a header, field names come from it (``memory.used [MiB]`` -> ``memory.used``; custom
    loggers' names via :data:`CSV_ALIASES`); without one (``noheader``) ``fields`` must give
    them. Values are split by the csv module (nvidia-smi writes ", "); numbers with or without
    units become floats (:func:`csv_converter`); ``[N/A]``, ``N/A``, ``[Not Supported]`` become
    None. Known text fields (name, uuid, pstate, ...) stay strings.

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
    hdr = csv_header(rows[0])
    if hdr is not None:
        cols, body = hdr, rows[1:]
    elif fields is not None:
        cols = [csv_field_name(f) or (f, None) for f in fields]
        body = rows
    else:
        raise ValueError("nvidia-smi CSV: no header line (noheader) and no field names given")
    names = [n for n, _ in cols]
    convs = [csv_converter(n, u) for n, u in cols]
    out = []
    for i, r in enumerate(body, start=2 if hdr is not None else 1):
        if len(r) != len(names):
            raise ValueError(f"nvidia-smi CSV line {i}: {len(r)} values, header has {len(names)}")
        out.append(CsvRow({n: c(raw) for n, c, raw in zip(names, convs, r, strict=True)}))
    return out


#: How a CSV value is read for its GpuSample field (the registry's kinds).
SampleKind = SmiKind
#: GpuSample field <- the ``--query-gpu`` names read for it, first present wins; how the value
#: is read. From the field registry (``gpuwarden/shared/fields.csv`` ``smi_query``/``smi_kind``).
CSV_SAMPLE_FIELDS: tuple[tuple[str, tuple[str, ...], SampleKind], ...] = smi_query_fields()
_SAMPLE_KEYS = frozenset(k for _, keys, _ in CSV_SAMPLE_FIELDS for k in keys)


def csv_value_to_field(kind: SampleKind, x: CsvValue) -> Any:
    """One converted CSV value as the :class:`GpuSample` field of ``kind`` wants it; None when it
    is not of that kind (a number where text is expected, text where a number is)."""
    if kind == "float":
        return x if isinstance(x, float) else None
    if kind == "int":
        return int(x) if isinstance(x, float) else None
    if not isinstance(x, str):
        return None
    if kind == "pstate":
        return _pstate(x)
    if kind == "pci":
        return normalize_pci_bus_id(x)
    return x


@functools.cache
def _csv_table(fields: tuple[FieldSpec, ...]) -> tuple[tuple[str, tuple[str, ...], SampleKind], ...]:
    return CSV_SAMPLE_FIELDS if fields is FIELDS else smi_query_fields(fields)


def csv_row_to_sample(row: CsvRow, order: int, fields: Sequence[FieldSpec] = FIELDS) -> GpuSample:
    """A :class:`GpuSample` from the standard ``--query-gpu`` fields present in ``row``
    (:data:`CSV_SAMPLE_FIELDS`; absent or N/A fields stay None). ``index`` from the row's
    ``index`` column, else ``order``. ``fields``: another field registry (its ``smi_query``
    columns, the model it generates: :func:`~gpuwarden.shared.fieldgen.gpu_sample_model`).

    A value the model cannot hold (out of range, a sentinel) is dropped and named
    (:func:`~gpuwarden.shared.nvidia.values.gpu_sample`); the row's other values are kept.

    Raises:
        ValueError: an unreadable PCI bus id or GPU index.
    """
    v = row.values
    data: dict[str, Any] = {}
    for fname, keys, kind in _csv_table(tuple(fields)):
        for k in keys:
            got = csv_value_to_field(kind, v.get(k))
            if got is not None:
                data[fname] = got
                break
    idx = v.get("index")
    data["index"] = int(idx) if isinstance(idx, float) else order
    return gpu_sample(data, f"nvidia-smi CSV row {order + 1}", gpu_sample_model(fields))


def parse_nvidia_smi_csv_samples(text: str, fields: Sequence[FieldSpec] = FIELDS) -> list[GpuSample] | SmiError:
    """``--query-gpu`` CSV with a header -> one :class:`GpuSample` per row (the fields of the
    registry ``fields`` mapped, see :func:`csv_row_to_sample`; other columns dropped), or
    :class:`SmiError`.

    Raises:
        ValueError: as :func:`parse_nvidia_smi_csv` (a header line is required here).
    """
    rows = parse_nvidia_smi_csv(text)
    if isinstance(rows, SmiError):
        return rows
    return [csv_row_to_sample(r, i, fields) for i, r in enumerate(rows)]


def parse_nvidia_smi_csv_records(text: str) -> list[dict[str, Any]] | SmiError:
    """``--query-gpu`` CSV with a header (nvidia-smi 450 .. 595, or a custom logger's header,
    :data:`CSV_ALIASES`; ``gpuwarden parse nvidia-smi-csv``) -> one object per row holding
    ``gpu`` (the mapped :class:`GpuSample`) and ``columns`` (every column's value, so fields
    the model lacks, such as ``clocks.current.video``, are kept), or :class:`SmiError`.

    Headerless (``noheader``) files are read by :func:`gpuwarden.recordings.load_recording`
    with ``columns=[...]``.

    Raises:
        ValueError: as :func:`parse_nvidia_smi_csv` (a header line is required here).
    """
    rows = parse_nvidia_smi_csv(text)
    if isinstance(rows, SmiError):
        return rows
    return [{"gpu": csv_row_to_sample(r, i), "columns": r.values} for i, r in enumerate(rows)]
