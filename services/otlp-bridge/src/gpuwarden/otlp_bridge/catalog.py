"""The bridge's metric catalog: ``metrics.csv`` (shipped in the package), loaded and validated
at import, as dcgm-exporter reads its metric CSV.

One row per metric the bridge emits (or, where several rows share an OTel name such as
``hw.temperature``, per series family of it). Columns:

- ``naming``: ``otel`` (OTel semantic-convention names), ``dcgm`` (dcgm-exporter names) or
  ``all`` (emitted in both namings: the failure metrics);
- ``key``: the name the code maps a value function to (unique per naming);
- ``name``: the OTLP metric name; ``unit``: its UCUM unit (``""`` in dcgm naming, as
  dcgm-exporter); ``instrument``: ``gauge``, ``updown`` (non-monotonic sum) or ``counter``
  (monotonic sum);
- ``prom_name``: the name on ``/metrics`` (counters end in ``_total``);
- ``attributes``: fixed extra data-point attributes, ``k=v;k2=v2``;
- ``point_attributes`` / ``prom_labels``: the attributes (OTLP) and labels (Prometheus) that
  tell apart several points of one GPU, same order, ``;``-separated;
- ``sensor``: a temperature sensor's location (its point gets the sensor's own ``hw.id``);
- ``otel_description``: the OTLP description where several rows share one name (must then
  be equal on those rows); else ``description`` is used;
- ``description``: help text (Prometheus ``# HELP`` and OTLP description).

A row of the field registry (``gpuwarden/shared/fields.csv``) with an ``otel_name`` is a catalog
entry too (:func:`registry_entries`, ``otel`` naming, key = the field): the field's value in the
OTel unit of :data:`~gpuwarden.shared.fields.OTEL_UNITS`, no ``metrics.csv`` row and no code.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Literal, cast

from gpuwarden.shared.fields import FIELDS, OTEL_UNITS, FieldSpec

__all__ = ["CATALOG", "CatalogEntry", "build_catalog", "catalog_entries", "load_catalog", "registry_entries"]

Naming = Literal["otel", "dcgm", "all"]
Instrument = Literal["gauge", "updown", "counter"]

_COLUMNS = (
    "naming", "key", "name", "unit", "instrument", "prom_name", "attributes", "point_attributes", "prom_labels",
    "sensor", "otel_description", "description",
)  # fmt: skip
_PROM_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_OTEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-/]{0,254}")


@dataclass(frozen=True)
class CatalogEntry:
    """One validated row of ``metrics.csv`` (see the module docstring for the columns)."""

    naming: Naming
    key: str
    name: str
    unit: str
    instrument: Instrument
    prom_name: str
    description: str
    attributes: dict[str, str] = field(default_factory=dict)
    point_attributes: tuple[str, ...] = ()
    prom_labels: tuple[str, ...] = ()
    sensor: str | None = None
    otel_description: str = ""

    @property
    def metric_description(self) -> str:
        """The OTLP description: ``otel_description`` when set, else ``description``."""
        return self.otel_description or self.description


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(";") if p.strip())


def _pairs(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in _split(text):
        k, sep, v = item.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise ValueError(f"{where}: attributes: expected k=v, got {item!r}")
        out[k.strip()] = v.strip()
    return out


def load_catalog(text: str, source: str = "metrics.csv") -> tuple[CatalogEntry, ...]:
    """Parse and validate a catalog CSV (the format of ``metrics.csv``).

    Returns:
        The rows in file order.

    Raises:
        ValueError: a missing or extra column, an unknown ``naming``/``instrument``, an empty
            or malformed ``key``/``name``/``prom_name``/``description``, a key twice in one
            naming, ``point_attributes`` and ``prom_labels`` of different lengths, an OTLP
            unit missing in otel naming, or rows sharing an OTel name that disagree on unit,
            instrument or ``otel_description``.
    """
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != _COLUMNS:
        raise ValueError(f"{source}: columns must be {','.join(_COLUMNS)}, got {reader.fieldnames}")
    rows: list[CatalogEntry] = []
    keys: set[tuple[str, str]] = set()
    for n, raw in enumerate(reader, start=2):
        where = f"{source}:{n}"
        if None in raw or any(v is None for v in raw.values()):
            raise ValueError(f"{where}: expected {len(_COLUMNS)} fields")
        r = {k: v.strip() for k, v in raw.items()}
        if r["naming"] not in ("otel", "dcgm", "all"):
            raise ValueError(f"{where}: naming must be otel, dcgm or all, got {r['naming']!r}")
        if r["instrument"] not in ("gauge", "updown", "counter"):
            raise ValueError(f"{where}: instrument must be gauge, updown or counter, got {r['instrument']!r}")
        for col in ("key", "name", "prom_name", "description"):
            if not r[col]:
                raise ValueError(f"{where}: empty {col}")
        if not _OTEL_NAME.fullmatch(r["name"]):
            raise ValueError(f"{where}: invalid metric name {r['name']!r}")
        if not _PROM_NAME.fullmatch(r["prom_name"]):
            raise ValueError(f"{where}: invalid Prometheus name {r['prom_name']!r}")
        if r["naming"] != "dcgm" and not r["unit"]:
            raise ValueError(f"{where}: {r['name']} needs a unit")
        if (r["naming"], r["key"]) in keys:
            raise ValueError(f"{where}: key {r['key']!r} twice in naming {r['naming']}")
        keys.add((r["naming"], r["key"]))
        point_attributes, prom_labels = _split(r["point_attributes"]), _split(r["prom_labels"])
        if len(point_attributes) != len(prom_labels):
            raise ValueError(f"{where}: point_attributes and prom_labels must have the same length")
        rows.append(
            CatalogEntry(
                naming=cast(Naming, r["naming"]), key=r["key"], name=r["name"], unit=r["unit"],
                instrument=cast(Instrument, r["instrument"]), prom_name=r["prom_name"], description=r["description"],
                attributes=_pairs(r["attributes"], where), point_attributes=point_attributes, prom_labels=prom_labels,
                sensor=r["sensor"] or None, otel_description=r["otel_description"],
            )
        )  # fmt: skip
    _check_names(rows, source)
    return tuple(rows)


def _check_names(rows: Iterable[CatalogEntry], source: str) -> None:
    by_name: dict[tuple[str, str], CatalogEntry] = {}
    for e in rows:
        first = by_name.setdefault((e.naming, e.name), e)
        if (first.unit, first.instrument, first.metric_description) != (e.unit, e.instrument, e.metric_description):
            raise ValueError(
                f"{source}: rows named {e.name} disagree on unit, instrument or otel_description ({first.key}, {e.key})"
            )


#: The suffix a field name gives its unit with (``memory_used_mib``), dropped from the Prometheus name.
_FIELD_UNIT_SUFFIX = {"%": "_pct", "MiB": "_mib", "C": "_c", "W": "_w", "MHz": "_mhz", "J": "_j", "KB/s": "_kbps"}


def _unit_suffix(f: FieldSpec) -> str:
    """The field name without its unit suffix (``widget_activity_pct`` -> ``widget_activity``)."""
    return f.field.removesuffix(_FIELD_UNIT_SUFFIX.get(f.unit, "\0"))


def registry_entries(fields: Iterable[FieldSpec] = FIELDS) -> tuple[CatalogEntry, ...]:
    """The ``otel`` entries of the registry rows with an ``otel_name``, in registry order: key
    = the field, unit and factor from :data:`~gpuwarden.shared.fields.OTEL_UNITS` (``%`` ->
    ``1``, ``MiB`` -> ``By``...), instrument ``otel_instrument`` (blank: gauge), Prometheus name
    ``gpuwarden_gpu_<field without its unit>_<unit>`` (``_total`` for a counter), description
    the field's with its unit in words (``"Widget activity, ratio 0-1"``)."""
    out = []
    for f in fields:
        if not f.otel_name:
            continue
        unit, _, prom_unit, words = OTEL_UNITS[f.unit]
        instrument: Instrument = f.otel_instrument or "gauge"
        prom = "_".join(p for p in ("gpuwarden_gpu", _unit_suffix(f), prom_unit) if p)
        prom += "_total" if instrument == "counter" else ""
        desc = f.description or f.field
        if f.unit and words:
            desc = re.sub(rf", {re.escape(f.unit)}(?=$| \(| of )", f", {words}", desc, count=1)
        out.append(CatalogEntry(naming="otel", key=f.field, name=f.otel_name, unit=unit, instrument=instrument,
                                prom_name=prom, description=desc))  # fmt: skip
    return tuple(out)


def build_catalog(fields: Sequence[FieldSpec] = FIELDS, text: str | None = None) -> tuple[CatalogEntry, ...]:
    """The bridge's catalog: the rows of ``metrics.csv`` (or ``text``) then :func:`registry_entries`
    of ``fields`` (the shipped field registry, or another of the same columns).

    Raises:
        ValueError: as :func:`load_catalog`; a registry entry whose key (its field) is an ``otel``
            key of ``metrics.csv``, whose Prometheus name a ``metrics.csv`` row or another registry
            row has, or that disagrees on unit, instrument or description with the rows of its OTel
            name.
    """
    rows = load_catalog(text if text is not None else files(__package__).joinpath("metrics.csv").read_text("utf-8"))
    extra = registry_entries(fields)
    keys = {e.key for e in rows if e.naming == "otel"}
    if twice := sorted(e.key for e in extra if e.key in keys):
        raise ValueError(f"fields.csv: otel_name rows {twice} have the key of a metrics.csv row")
    prom = {e.prom_name for e in rows if e.naming != "dcgm"}
    if twice := sorted(e.prom_name for e in extra if e.prom_name in prom):
        raise ValueError(f"fields.csv: otel_name rows make Prometheus names of metrics.csv rows {twice}")
    by_prom: dict[str, list[str]] = {}
    for e in extra:
        by_prom.setdefault(e.prom_name, []).append(e.key)
    if clash := {p: ks for p, ks in by_prom.items() if len(ks) > 1}:
        # two HELP/TYPE blocks of one name: Prometheus refuses the whole scrape
        raise ValueError(f"fields.csv: rows {', '.join(f'{ks} make {p}' for p, ks in clash.items())}: one name each")
    _check_names((*rows, *extra), "metrics.csv + fields.csv")
    return (*rows, *extra)


#: Every row of the packaged ``metrics.csv`` and the registry's ``otel_name`` rows (validated at import).
CATALOG: tuple[CatalogEntry, ...] = build_catalog()


def catalog_entries(
    naming: Naming, *, multi: bool | None = None, catalog: Sequence[CatalogEntry] = CATALOG
) -> tuple[CatalogEntry, ...]:
    """Rows of ``naming`` exactly (``all`` rows only when ``naming="all"``), in file order;
    ``multi`` True/False keeps only rows with/without ``point_attributes``; ``catalog``: another
    catalog (:func:`build_catalog` of another field registry)."""
    return tuple(e for e in catalog if e.naming == naming and (multi is None or bool(e.point_attributes) == multi))
