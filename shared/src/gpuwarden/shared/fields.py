"""The registry of GPU fields: one row per :class:`~gpuwarden.shared.models.GpuSample` field, as data (``fields.csv``).

``fields.csv`` (package data next to this module) says, for each field, its type and unit and
where each source reads it from, so the tables of the readers and the bridge are derived from
one place instead of being written once per reader. Columns (lists are ``;``-separated, in the
order a reader tries them, first present wins):

=============  ===================================================================================
field          the ``GpuSample`` attribute
type           ``float``, ``int``, ``bool``, ``str`` or ``list`` (nested: ``nvlinks``, ``processes``,
               ``throttle_reasons``; read by code, listed for their sources)
unit           the model's unit (:data:`UNITS`; blank for none); ``description`` states it
               (``"..., MiB"``)
str_kind       a ``str`` field's model type: ``token`` (``Token``: no spaces, at most 128
               characters), ``text`` (``Text``: one line, at most 256), blank (any ``str``)
ge, le         the model's bounds of a number (``0``, ``100``; or a constant of
               :mod:`gpuwarden.shared.models` such as ``MAX_GPU_INDEX``), blank for none
nvml           the nvidia-ml-py call the NVML source reads the field with: ``FUNCTION``, then the
               handle's extra arguments as pynvml constant names in parentheses
               (``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)``), then an attribute (``.used``) or an
               item (``[2]``) of the answer; calls shared by rows are made once per GPU and tick.
               The source reads a scalar row generically by ``type``
               (``gpuwarden.collector.sources.nvml.NVML_IN_CODE`` lists those read in code: the
               handle, bus id, bitmasks, lists, GPM, MIG)
nvml_scale     factor from NVML's unit to the model's (``nvmlDeviceGetPowerUsage`` mW -> W: 0.001)
nvml_static    ``yes``: a reading that does not change while the driver is loaded (name, serial,
               maximum clocks): read once per GPU and kept (``NvmlSource`` says when it is re-read)
smi_query      ``nvidia-smi --query-gpu`` names read for the field (also the ``--query-compute-apps``
               names ``gpu_uuid``...); the CSV readers' column table (:func:`smi_query_fields`)
smi_kind       how the CSV text is read when not by ``type``: ``pstate`` (``P0`` -> 0), ``pci``
               (normalised bus id)
smi_xml        ``nvidia-smi -q -x`` paths under ``<gpu>``, tried in order (the XML reader reads a
               scalar row's paths generically; ``smi_xml.XML_IN_CODE`` lists those read in code)
smi_q          ``nvidia-smi -q`` (text) paths under a ``GPU`` block, the indented keys joined by
               ``/`` (``FB Memory Usage/Used``), tried in order; the text reader reads them
               generically by ``type`` / ``smi_kind`` (``smi_text.Q_IN_CODE`` lists those read in code)
smi_table      the cell of the default ``nvidia-smi`` table that shows the field (``Temp``,
               ``Pwr:Cap``, ``Memory-Usage:Used``: ``smi_table.TABLE_CELLS``, a fixed layout), read
               by ``type`` / ``smi_kind``
dmon           ``nvidia-smi dmon`` column (:func:`dmon_columns`)
dmon_scale     factor from dmon's unit to the model's (``rxpci`` MB/s -> KB/s: 1000)
dcgm_field     the DCGM field (``DCGM_FI_*``); list rows may name several (read by code)
dcgm_scale     factor from DCGM's unit to the model's (``TOTAL_ENERGY_CONSUMPTION`` mJ -> J: 0.001);
               the bridge writes ``value / dcgm_scale``
dcgm_dir       ``read`` (the collector's dcgm-exporter reader maps it), ``write`` (the bridge's
               ``dcgm`` naming writes it), ``both``, blank
otel_key       ``metrics.csv`` keys (otlp-bridge catalog, ``otel`` naming) whose value it feeds
otel_name      an OTel metric the otlp-bridge exports from this field alone, without a
               ``metrics.csv`` row: the field's value in the OTel unit of :data:`OTEL_UNITS`
               (``%`` -> ratio ``1``, ``MiB`` -> ``By``...); blank for none
otel_instrument  ``gauge`` (blank), ``updown`` or ``counter`` (monotonic), with ``otel_name``
description    the model's ``Field`` description (the JSON Schema's), one line, ending in the unit
notes          where the sources differ, what code does (documentation)
=============  ===================================================================================

``GpuSample`` (:mod:`gpuwarden.shared.models`) is generated from the rows: ``python -m
gpuwarden.shared.fieldgen`` rewrites its scalar fields from ``type``, ``str_kind``, ``ge``,
``le`` and ``description`` (the list fields are code); a unit test fails when the two differ.

Read by the model's generator, the collector's NVML source (and the simulator's, through it), the
readers (dcgm-exporter scrapes, ``--query-gpu`` CSV, ``dmon``, ``-q``, ``nvidia-smi -q -x``, the
default table) and the otlp-bridge (dcgm-exporter naming, ``otel_name`` metrics).
:func:`load_fields` reads another CSV of the same columns (tests); the readers and the bridge's
catalog take such a registry as their ``fields`` argument.
"""

from __future__ import annotations

import csv
import functools
import io
import keyword
import math
import re
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path
from typing import Literal, NamedTuple

import pynvml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "FIELDS",
    "KEY_FIELD",
    "OTEL_UNITS",
    "UNITS",
    "FieldSpec",
    "FieldType",
    "NvmlRead",
    "SmiKind",
    "by_dcgm",
    "by_field",
    "dcgm_read_map",
    "dcgm_write_fields",
    "dmon_columns",
    "load_fields",
    "parse_nvml",
    "smi_q_fields",
    "smi_query_fields",
    "smi_table_fields",
    "smi_xml_fields",
]

FieldType = Literal["float", "int", "bool", "str", "list"]
DcgmDir = Literal["read", "write", "both", ""]
#: How a ``--query-gpu`` CSV value is read: as the field's type, or ``pstate``/``pci``.
SmiKind = Literal["float", "int", "str", "pstate", "pci"]
#: Units the model uses (``fields.csv`` ``unit``): percent, MiB, Celsius, watts, MHz, joules,
#: a count, kilobytes per second, PCIe lanes.
UNITS = ("%", "MiB", "C", "W", "MHz", "J", "count", "KB/s", "lanes")
#: The GPU key: every reader takes it apart from the value columns, so the column tables skip it.
KEY_FIELD = "index"
#: A model unit -> (the OTel metric's UCUM unit, factor from the model's unit to it, Prometheus
#: name suffix, the unit in words) for a field exported by ``otel_name``: values in base units.
OTEL_UNITS: dict[str, tuple[str, float, str, str]] = {
    "%": ("1", 0.01, "ratio", "ratio 0-1"),
    "MiB": ("By", 1024.0 * 1024.0, "bytes", "bytes"),
    "C": ("Cel", 1.0, "celsius", "Celsius"),
    "W": ("W", 1.0, "watts", "watts"),
    "MHz": ("Hz", 1e6, "hertz", "hertz"),
    "J": ("J", 1.0, "joules", "joules"),
    "count": ("{count}", 1.0, "", "count"),
    "KB/s": ("By/s", 1024.0, "bytes_per_second", "bytes per second"),
    "lanes": ("{lane}", 1.0, "lanes", "lanes"),
    "": ("1", 1.0, "", ""),
}
_BOUND_RE = re.compile(r"^(-?[0-9]+(\.[0-9]+)?|[A-Z][A-Z0-9_]*)$")
_INT_RE = re.compile(r"^-?[0-9]+$")
#: Longest description of a scalar row: the generator writes its declaration on one line of 120
#: characters at most (``fieldgen.LINE_LENGTH``).
MAX_SCALAR_DESCRIPTION = 90
_OTEL_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-/]{0,254}$")


_NVML_RE = re.compile(
    r"^(?P<call>nvml[A-Za-z0-9_]+)(?:\((?P<args>[A-Z0-9_, ]*)\))?"
    r"(?:\.(?P<attr>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<item>[0-9]+)\])?$"
)


class NvmlRead(NamedTuple):
    """An ``nvml`` cell taken apart: ``call(handle, *args)``, then ``.attr`` or ``[item]`` of the answer."""

    call: str
    args: tuple[str, ...] = ()
    attr: str | None = None
    item: int | None = None

    def constants(self) -> tuple[int, ...]:
        """The arguments' values, pynvml's own constants."""
        return tuple(int(getattr(pynvml, a)) for a in self.args)


def parse_nvml(text: str) -> NvmlRead:
    """``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)`` -> ``NvmlRead("nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",))``.

    Raises:
        ValueError: not ``FUNCTION[(CONSTANT, ...)][.attr|[n]]``, a function or constant the
            installed nvidia-ml-py (``pynvml``) does not have.
    """
    m = _NVML_RE.match(text)
    if m is None:
        raise ValueError(f"nvml {text!r} is not FUNCTION[(NVML_CONSTANT, ...)][.attribute|[n]]")
    args = tuple(a.strip() for a in (m["args"] or "").split(",") if a.strip())
    if not callable(getattr(pynvml, m["call"], None)):
        raise ValueError(f"nvml: pynvml has no function {m['call']}")
    if bad := [a for a in args if not isinstance(getattr(pynvml, a, None), int)]:
        raise ValueError(f"nvml: pynvml has no integer constant {', '.join(bad)}")
    return NvmlRead(m["call"], args, m["attr"], int(m["item"]) if m["item"] is not None else None)


def _names(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(p.strip() for p in v.split(";") if p.strip())
    return tuple(v) if isinstance(v, Iterable) else ()


class FieldSpec(BaseModel):
    """One row of ``fields.csv`` (module docstring: the columns). ``;`` lists become tuples, blank
    cells empty strings / tuples / None."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    type: FieldType
    unit: str = Field("", description="The model's unit, one of UNITS or blank")
    str_kind: Literal["token", "text", ""] = ""
    ge: str = Field("", description="Lower bound: a number or a gpuwarden.shared.models constant")
    le: str = Field("", description="Upper bound: a number or a gpuwarden.shared.models constant")
    nvml: str = ""
    nvml_scale: float | None = None
    nvml_static: bool = False
    smi_query: tuple[str, ...] = ()
    smi_kind: Literal["pstate", "pci", ""] = ""
    smi_xml: tuple[str, ...] = ()
    smi_q: tuple[str, ...] = ()
    smi_table: str = ""
    dmon: str = ""
    dmon_scale: float | None = None
    dcgm_field: tuple[str, ...] = ()
    dcgm_scale: float | None = None
    dcgm_dir: DcgmDir = ""
    otel_key: tuple[str, ...] = ()
    otel_name: str = ""
    otel_instrument: Literal["gauge", "updown", "counter", ""] = ""
    description: str = Field("", max_length=200, pattern=r'^[^"\\\x00-\x1f]*$')
    notes: str = ""

    @field_validator("smi_query", "smi_xml", "smi_q", "dcgm_field", "otel_key", mode="before")
    @classmethod
    def _split(cls, v: object) -> tuple[str, ...]:
        return _names(v)

    @field_validator("dmon_scale", "dcgm_scale", "nvml_scale", mode="before")
    @classmethod
    def _blank_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("nvml_static", mode="before")
    @classmethod
    def _yes(cls, v: object) -> object:
        if isinstance(v, str):
            if v not in ("", "yes"):
                raise ValueError(f"nvml_static is 'yes' or blank, not {v!r}")
            return v == "yes"
        return v

    @field_validator("nvml")
    @classmethod
    def _nvml(cls, v: str) -> str:
        if v:
            parse_nvml(v)
        return v

    @field_validator("dmon_scale", "dcgm_scale", "nvml_scale")
    @classmethod
    def _scale(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"scale {v} must be a finite number > 0")
        return v

    @field_validator("field")
    @classmethod
    def _name(cls, v: str) -> str:
        # the generator writes it as a GpuSample attribute: a keyword, a pydantic name or a
        # BaseModel attribute would break models.py (and every import of gpuwarden with it)
        if len(v) > 64 or keyword.iskeyword(v) or v.startswith("model_") or hasattr(BaseModel, v):
            raise ValueError(f"field name {v!r} cannot be a GpuSample attribute (a Python keyword, a pydantic "
                             "name such as model_*, or longer than 64 characters)")  # fmt: skip
        return v

    @field_validator("description", "notes")
    @classmethod
    def _printable(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("text must be printable, one line (no control or line/paragraph separators)")
        return v

    @field_validator("unit")
    @classmethod
    def _unit(cls, v: str) -> str:
        if v and v not in UNITS:
            raise ValueError(f"unit {v!r} is not one of {', '.join(UNITS)}")
        return v

    @field_validator("ge", "le")
    @classmethod
    def _bound(cls, v: str) -> str:
        if v and not _BOUND_RE.match(v):
            raise ValueError(f"bound {v!r} is neither a number nor a constant name")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> FieldSpec:
        scalar = self.type != "list"
        if not all(n.startswith("DCGM_FI_") for n in self.dcgm_field):
            raise ValueError(f"{self.field}: dcgm_field must be DCGM_FI_* names")
        if self.dcgm_field and not self.dcgm_dir:
            raise ValueError(f"{self.field}: dcgm_field without dcgm_dir (read, write or both)")
        if scalar and len(self.dcgm_field) > 1:
            raise ValueError(f"{self.field}: a scalar field has one dcgm_field")
        if scalar and self.dcgm_field and not self.dcgm_scale:
            raise ValueError(f"{self.field}: dcgm_field without a non-zero dcgm_scale")
        if (self.nvml_scale or self.nvml_static) and not self.nvml:
            raise ValueError(f"{self.field}: nvml_scale/nvml_static without an nvml call")
        if self.nvml_scale and self.type not in ("int", "float"):
            raise ValueError(f"{self.field}: nvml_scale scales a number (int or float)")
        if self.dmon and not self.dmon_scale and self.field != KEY_FIELD:
            raise ValueError(f"{self.field}: dmon without a non-zero dmon_scale")
        if not scalar and (self.smi_query or self.smi_q or self.smi_table or self.dmon):
            raise ValueError(f"{self.field}: a list field has no smi_query/smi_q/smi_table/dmon column (read by code)")
        if self.str_kind and self.type != "str":
            raise ValueError(f"{self.field}: str_kind is for a str field")
        if (self.ge or self.le) and self.type not in ("int", "float"):
            raise ValueError(f"{self.field}: ge/le bound a number (int or float)")
        numbers = [b for b in (self.ge, self.le) if b and not b[0].isalpha()]
        if self.type == "int" and not all(_INT_RE.match(b) for b in numbers):
            raise ValueError(f"{self.field}: an int field's bounds are whole numbers")
        if len(numbers) == 2 and float(self.ge) > float(self.le):
            raise ValueError(f"{self.field}: ge {self.ge} is above le {self.le}: no value would pass")
        if self.smi_kind and (self.smi_kind, self.type) not in (("pstate", "int"), ("pci", "str")):
            raise ValueError(
                f"{self.field}: smi_kind {self.smi_kind} reads an {'int' if self.smi_kind == 'pstate' else 'str'} field"
            )
        if scalar and len(self.description) > MAX_SCALAR_DESCRIPTION:
            raise ValueError(f"{self.field}: description of {len(self.description)} characters (at most "
                             f"{MAX_SCALAR_DESCRIPTION}: the generated declaration is one line)")  # fmt: skip
        if self.otel_name:
            if self.type not in ("int", "float", "bool"):
                raise ValueError(f"{self.field}: otel_name needs a number or bool field")
            if not _OTEL_NAME_RE.match(self.otel_name):
                raise ValueError(f"{self.field}: invalid OTel metric name {self.otel_name!r}")
        elif self.otel_instrument:
            raise ValueError(f"{self.field}: otel_instrument without otel_name")
        return self

    @property
    def nvml_read(self) -> NvmlRead | None:
        """The ``nvml`` cell taken apart (None when blank)."""
        return parse_nvml(self.nvml) if self.nvml else None

    @property
    def dcgm_read(self) -> bool:
        """The collector's dcgm-exporter reader maps this field's DCGM field."""
        return self.dcgm_dir in ("read", "both")

    @property
    def dcgm_write(self) -> bool:
        """The bridge's dcgm-exporter naming writes this field's DCGM field."""
        return self.dcgm_dir in ("write", "both")

    @property
    def smi_value_kind(self) -> SmiKind:
        """How a ``--query-gpu`` CSV value of this field is read (``smi_kind``, else ``type``)."""
        if self.smi_kind:
            return self.smi_kind
        if self.type in ("float", "int", "str"):
            return self.type
        raise ValueError(f"{self.field}: a {self.type} field has no CSV reading")


def _default_text() -> str:
    return files(__package__).joinpath("fields.csv").read_text(encoding="utf-8")


def load_fields(path: str | Path | None = None) -> tuple[FieldSpec, ...]:
    """The field registry: the shipped ``fields.csv`` (or the CSV at ``path``), in file order.

    Raises:
        ValueError: unreadable file, a row that fails validation (the message names the line),
            a field listed twice, or a DCGM field / dmon column two scalar rows map.
    """
    where = str(path) if path else "fields.csv"
    try:
        # utf-8-sig: a spreadsheet's CSV starts with a byte-order mark
        text = Path(path).read_text(encoding="utf-8-sig") if path else _default_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read: {exc}") from exc
    out: list[FieldSpec] = []
    seen: dict[str, int] = {}
    reader = csv.DictReader(io.StringIO(text))
    columns = list(FieldSpec.model_fields)
    header = reader.fieldnames or []
    if missing := [c for c in columns if c not in header]:
        raise ValueError(f"{where} line 1: the header lacks the column(s) {', '.join(missing)}")
    if unknown := [c for c in header if c not in columns]:
        raise ValueError(f"{where} line 1: unknown column(s) {', '.join(map(repr, unknown))}; the columns are "
                         f"{', '.join(columns)}")  # fmt: skip
    for row in reader:
        n = reader.line_num
        if None in row or any(v is None for v in row.values()):
            cells = len(header) + len(row.get(None) or ()) - sum(v is None for v in row.values())
            raise ValueError(f"{where} line {n}: {cells} cells, the header has {len(header)}")
        try:
            spec = FieldSpec.model_validate(row)
        except ValueError as exc:
            name = row.get("field") or "?"
            errs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in exc.errors()) \
                if isinstance(exc, ValidationError) else str(exc)  # fmt: skip
            raise ValueError(f"{where} line {n} (field {name}): {errs}") from None
        keys = [("field", spec.field)]
        if spec.type != "list":
            keys += [("dcgm_field", d) for d in spec.dcgm_field] + ([("dmon", spec.dmon)] if spec.dmon else [])
        for col, v in keys:
            if (k := f"{col} {v}") in seen:
                raise ValueError(f"{where} line {n}: {k} is also on line {seen[k]}")
            seen[k] = n
        out.append(spec)
    if not out:
        raise ValueError(f"{where}: no field rows")
    return tuple(out)


#: The shipped registry, read once at import (``fields.csv``, model order).
FIELDS: tuple[FieldSpec, ...] = load_fields()


def by_field(fields: Iterable[FieldSpec] = FIELDS) -> dict[str, FieldSpec]:
    """``GpuSample`` attribute -> its row."""
    return {f.field: f for f in fields}


def by_dcgm(fields: Iterable[FieldSpec] = FIELDS) -> dict[str, FieldSpec]:
    """DCGM field name -> the row of the scalar field it maps (either direction; list rows,
    read by code, are left out)."""
    return {d: f for f in fields if f.type != "list" for d in f.dcgm_field}


@functools.cache
def _dcgm_read_map(fields: tuple[FieldSpec, ...]) -> dict[str, tuple[str, float]]:
    return {f.dcgm_field[0]: (f.field, f.dcgm_scale or 1.0) for f in fields if f.type != "list" and f.dcgm_read}


def dcgm_read_map(fields: tuple[FieldSpec, ...] = FIELDS) -> dict[str, tuple[str, float]]:
    """What the dcgm-exporter reader maps: DCGM field -> (``GpuSample`` field, factor from DCGM's
    unit to the model's), scalar rows with ``dcgm_dir`` read/both. A fresh dict per call."""
    return dict(_dcgm_read_map(tuple(fields)))


def dcgm_write_fields(fields: Iterable[FieldSpec] = FIELDS) -> tuple[FieldSpec, ...]:
    """The scalar rows the bridge writes under their DCGM name (``dcgm_dir`` write/both);
    the value written is the model's value / ``dcgm_scale`` (a bool as 0/1)."""
    return tuple(f for f in fields if f.type != "list" and f.dcgm_write)


def smi_query_fields(fields: Iterable[FieldSpec] = FIELDS) -> tuple[tuple[str, tuple[str, ...], SmiKind], ...]:
    """The ``--query-gpu`` CSV column table: (``GpuSample`` field, query names tried in order,
    how the value is read), for every row with ``smi_query`` but the GPU key ``index`` (read
    apart by the CSV readers)."""
    return tuple((f.field, f.smi_query, f.smi_value_kind) for f in fields if f.smi_query and f.field != KEY_FIELD)


def smi_q_fields(fields: Iterable[FieldSpec] = FIELDS) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """(field, ``nvidia-smi -q`` text paths in the order tried, how the value is read: ``smi_kind``,
    else the field's type) for every scalar row with ``smi_q`` (the text reader reads them
    generically)."""
    return tuple((f.field, f.smi_q, f.smi_kind or f.type) for f in fields if f.smi_q and f.type != "list")


def smi_table_fields(fields: Iterable[FieldSpec] = FIELDS) -> tuple[tuple[str, str, str], ...]:
    """(field, default ``nvidia-smi`` table cell, how the value is read: ``smi_kind``, else the
    field's type) for every scalar row with ``smi_table``."""
    return tuple((f.field, f.smi_table, f.smi_kind or f.type) for f in fields if f.smi_table and f.type != "list")


def smi_xml_fields(fields: Iterable[FieldSpec] = FIELDS) -> tuple[tuple[str, tuple[str, ...], FieldType], ...]:
    """The ``nvidia-smi -q -x`` path table: (``GpuSample`` field, paths under ``<gpu>`` tried in
    order, the field's type), for every scalar row with ``smi_xml`` (the XML reader reads
    those it does not read in code generically: value text, unit dropped, N/A -> None)."""
    return tuple((f.field, f.smi_xml, f.type) for f in fields if f.smi_xml and f.type != "list")


def dmon_columns(fields: Iterable[FieldSpec] = FIELDS) -> dict[str, tuple[str, float]]:
    """``nvidia-smi dmon`` column -> (``GpuSample`` field, factor from dmon's unit to the
    model's), every row with ``dmon`` but the GPU key ``index`` (dmon's ``gpu`` column)."""
    return {f.dmon: (f.field, f.dmon_scale or 1.0) for f in fields if f.dmon and f.field != KEY_FIELD}
