"""GPU metrics: data-point attributes, the value of each catalog entry, and the
Prometheus labels (pure).

Nothing here touches the OpenTelemetry SDK, Kafka or the clock. Names, units, instrument
types, help texts and fixed attributes come from the catalog (``metrics.csv``, see
:mod:`.catalog`); this module maps each catalog ``key`` to the function that reads its
value from a :class:`GpuSample` (single-point metrics, :data:`GPU_METRICS`) or its points
from a :class:`GpuView` (several points per GPU, :data:`GPU_MULTI_METRICS`), and checks at
import that the two sets of keys are equal. A field registry row with an ``otel_name`` needs
no code: its value is the field's, scaled to the OTel unit (:func:`gpu_metrics`).

Names follow ``shared/reference/otel-naming.md``: OTel hardware semantic conventions
(``hw.*``) where they exist, ``gpuwarden.*`` otherwise; values in base units
(ratio 0-1, bytes, Celsius, watts, hertz, joules).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuwarden.shared.fields import FIELDS, OTEL_UNITS, FieldSpec
from gpuwarden.shared.models import (
    NVLINK_ERROR_KEYS,
    AttributedEvent,
    AttributedSample,
    EventKind,
    Failure,
    GpuAttribution,
    GpuSample,
    Severity,
)

from .catalog import CATALOG, CatalogEntry, build_catalog, catalog_entries

__all__ = [
    "DATA_POINT_ATTRIBUTE_KEYS",
    "FAILURE_METRICS",
    "GPU_METRICS",
    "GPU_MULTI_METRICS",
    "HW_STATES",
    "MIB",
    "NVLINK_ERROR_TYPES",
    "OTEL_SHARED_DESCRIPTIONS",
    "PROM_FAILURE_LABELS",
    "PROM_GPU_ID_LABELS",
    "PROM_GPU_LABELS",
    "PROM_JOB_INFO_LABELS",
    "AttrValue",
    "GpuView",
    "MetricSpec",
    "MultiMetricSpec",
    "error_counts",
    "error_type_of",
    "failure_labels",
    "failure_metric_attributes",
    "gpu_attributes",
    "gpu_id",
    "gpu_metrics",
    "gpu_state",
    "jobs_by_index",
    "metric_attributes",
    "nvlink_active_points",
    "nvlink_error_points",
    "nvlink_error_totals",
    "prom_gpu_labels",
]

MIB = 1024 * 1024

AttrValue = str | bool | int | float | list[str]


def _put(attrs: dict[str, AttrValue], key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def _check_keys(what: str, rows: Iterable[CatalogEntry], mapped: Mapping[str, object]) -> None:
    """Raise ValueError unless the catalog rows and the code map the same keys."""
    keys = {e.key for e in rows}
    if keys != set(mapped):
        raise ValueError(
            f"metrics.csv and the code disagree on {what} metrics: only in the catalog {sorted(keys - set(mapped))}, "
            f"only in the code {sorted(set(mapped) - keys)}"
        )


def gpu_id(node: str, gpu: GpuSample) -> str:
    """``hw.id`` of a GPU: its UUID, else ``<node>/gpu<index>`` (unique in the cluster)."""
    return gpu.uuid or f"{node}/gpu{gpu.index}"


def jobs_by_index(sample: AttributedSample) -> dict[int, GpuAttribution]:
    """The attribution of each GPU index of an attributed sample (last entry wins)."""
    return {j.gpu_index: j for j in sample.jobs}


def gpu_attributes(
    node: str, gpu: GpuSample, job: GpuAttribution | None, driver_version: str | None = None
) -> dict[str, AttrValue]:
    """OTel data-point attributes of one GPU (and the Slurm job holding it).

    ``hw.id`` is the UUID (dcgm-exporter ``UUID``), ``hw.name`` the device (``nvidia<i>``),
    ``gpu.index`` the index (dcgm ``gpu``), ``host.name`` the Slurm node (dcgm ``Hostname``),
    ``slurm.job.id`` the job (dcgm ``hpc_job``). Absent values are left out, never empty.
    """
    attrs: dict[str, AttrValue] = {
        "host.name": node,
        "hw.id": gpu_id(node, gpu),
        "hw.type": "gpu",
        "hw.name": f"nvidia{gpu.index}",
        "gpu.index": gpu.index,
    }
    if gpu.uuid:
        attrs["gpu.uuid"] = gpu.uuid
    if gpu.pci_bus_id:
        attrs["gpu.pci_bus_id"] = gpu.pci_bus_id
    if gpu.name:
        attrs["hw.model"] = gpu.name
    if driver_version:
        attrs["hw.driver_version"] = driver_version
    if job is not None:
        attrs["slurm.job.id"] = job.job_id
        if job.user:
            attrs["slurm.user"] = job.user
        if job.partition:
            attrs["slurm.partition"] = job.partition
        if job.account:
            attrs["slurm.account"] = job.account
    return attrs


PROM_GPU_LABELS = ("node", "gpu", "uuid", "pci_bus_id", "model", "job_id", "user", "partition")
# With GPUWARDEN_OTLP_BRIDGE_PROM_JOB_LABELS=info (default) the GPU series carry only the GPU's
# identity (the first labels of PROM_GPU_LABELS, which stay the same from job to job), and the
# job rides on one ``gpuwarden_gpu_job_info{node,gpu,job_id,user,partition} 1`` per held GPU.
PROM_GPU_ID_LABELS = PROM_GPU_LABELS[:5]
PROM_JOB_INFO_LABELS = ("node", "gpu", "job_id", "user", "partition")


def prom_gpu_labels(node: str, gpu: GpuSample, job: GpuAttribution | None) -> tuple[str, ...]:
    """Prometheus label values of one GPU, in :data:`PROM_GPU_LABELS` order ('' when absent)."""
    return (
        node,
        str(gpu.index),
        gpu.uuid or "",
        gpu.pci_bus_id or "",
        gpu.name or "",
        job.job_id if job else "",
        (job.user or "") if job else "",
        (job.partition or "") if job else "",
    )


@dataclass(frozen=True)
class MetricSpec:
    """One GPU metric in both worlds.

    ``otel_kind`` is the OTel instrument (all observable, reading the latest-value store):
    ``gauge``, ``updown`` (non-monotonic sum, as semconv wants for ``hw.gpu.memory.*``)
    or ``counter`` (monotonic). ``prom_name`` is the name as exposed (counters end in
    ``_total``). ``sensor`` marks a temperature sensor: its ``hw.id`` is the sensor's,
    with ``hw.parent`` = the GPU (semconv ``hw.temperature``).
    """

    key: str
    otel_name: str
    otel_unit: str
    otel_kind: Literal["gauge", "updown", "counter"]
    description: str
    prom_name: str
    value: Callable[[GpuSample], float | None]
    extra_attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    sensor: str | None = None

    @property
    def prom_type(self) -> Literal["gauge", "counter"]:
        return "counter" if self.otel_kind == "counter" else "gauge"


def _scale(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


def _flag(b: bool | None) -> float | None:
    """1.0 / 0.0 for True / False; None (not reported) stays None."""
    return None if b is None else float(b)


def _mem_ratio(g: GpuSample) -> float | None:
    if g.memory_used_mib is None or not g.memory_total_mib:
        return None
    return g.memory_used_mib / g.memory_total_mib


#: catalog key -> the value of a single-point GPU metric in its OTel unit (None: not reported)
_VALUES: dict[str, Callable[[GpuSample], float | None]] = {
    "utilization": lambda g: _scale(g.utilization_gpu_pct, 0.01),
    "memory_used": lambda g: _scale(g.memory_used_mib, MIB),
    "memory_total": lambda g: _scale(g.memory_total_mib, MIB),
    "memory_utilization": _mem_ratio,
    "temperature": lambda g: g.temperature_c,
    "memory_temperature": lambda g: g.memory_temperature_c,
    "power": lambda g: g.power_w,
    "power_limit": lambda g: g.power_limit_w,
    "sm_clock": lambda g: _scale(g.sm_clock_mhz, 1e6),
    "memory_clock": lambda g: _scale(g.memory_clock_mhz, 1e6),
    "energy": lambda g: g.energy_j,
    "pcie_link_gen": lambda g: g.pcie_link_gen,
    "pcie_link_width": lambda g: g.pcie_link_width,
    "pcie_tx": lambda g: _scale(g.pcie_tx_kbps, 1024.0),
    "pcie_rx": lambda g: _scale(g.pcie_rx_kbps, 1024.0),
    "tensor_activity": lambda g: _scale(g.tensor_activity_pct, 0.01),
    "sm_occupancy": lambda g: _scale(g.sm_occupancy_pct, 0.01),
    "fan_speed": lambda g: _scale(g.fan_speed_pct, 0.01),
    "performance_state": lambda g: g.performance_state,
    "retired_pages_pending": lambda g: _flag(g.retired_pages_pending),
}


def _registry_value(f: FieldSpec) -> Callable[[GpuSample], float | None]:
    """A registry row's value in its OTel unit: the model's value x the factor of
    :data:`~gpuwarden.shared.fields.OTEL_UNITS` (``%`` x 0.01, MiB x 2^20), a bool as 1/0."""
    name, k = f.field, OTEL_UNITS[f.unit][1]
    if f.type == "bool":
        return lambda g: _flag(getattr(g, name))
    return lambda g: _scale(getattr(g, name), k)


def gpu_metrics(fields: Sequence[FieldSpec] = FIELDS) -> tuple[MetricSpec, ...]:
    """The single-point GPU metrics, in catalog order: the ``metrics.csv`` rows, valued by
    :data:`_VALUES`, then the rows of the field registry ``fields`` with an ``otel_name``
    (:func:`~.catalog.registry_entries`), valued from their field alone. ``fields``: the shipped
    registry or another of the same columns (a test's copy with one more row).

    Raises:
        ValueError: ``metrics.csv`` and :data:`_VALUES` name different keys; as
            :func:`~.catalog.build_catalog`.
    """
    cat = CATALOG if fields is FIELDS else build_catalog(fields)
    registry = {f.field: f for f in fields if f.otel_name}
    rows = catalog_entries("otel", multi=False, catalog=cat)
    _check_keys("single-point", [e for e in rows if e.key not in registry], _VALUES)
    return tuple(
        MetricSpec(e.key, e.name, e.unit, e.instrument, e.description, e.prom_name,
                   _registry_value(registry[e.key]) if e.key in registry else _VALUES[e.key], e.attributes, e.sensor)
        for e in rows
    )  # fmt: skip


#: The single-point GPU metrics, in catalog order (:func:`gpu_metrics` of the shipped registry).
GPU_METRICS: tuple[MetricSpec, ...] = gpu_metrics()

#: Description of an OTel name that several catalog rows share (``otel_description``).
OTEL_SHARED_DESCRIPTIONS: dict[str, str] = {
    e.name: e.otel_description for e in catalog_entries("otel") if e.otel_description
}


def metric_attributes(spec: MetricSpec, base: Mapping[str, AttrValue]) -> dict[str, AttrValue]:
    """Data-point attributes of ``spec`` for a GPU whose attributes are ``base``.

    A temperature sensor gets its own ``hw.id`` (``<gpu id>/temperature/<sensor>``),
    ``hw.type=temperature``, ``hw.parent`` = the GPU and ``hw.sensor_location``.
    """
    attrs = {**base, **spec.extra_attributes}
    if spec.sensor is not None:
        parent = attrs["hw.id"]
        attrs["hw.parent"] = parent
        attrs["hw.id"] = f"{parent}/temperature/{spec.sensor}"
        attrs["hw.type"] = "temperature"
        attrs["hw.sensor_location"] = spec.sensor
        attrs["hw.name"] = f"{attrs['hw.name']} {spec.sensor}"
    return attrs


HW_STATES = ("ok", "degraded", "failed", "predicted_failure")


@dataclass(frozen=True, slots=True)
class GpuView:
    """What the multi-point metrics of one GPU read: its latest sample, the XID/SXID counts
    seen on it under its current job (``{"xid_79": 2}``), the worst severity among its open
    failures and the code of the latest XID (event time) under its current job."""

    gpu: GpuSample
    event_errors: Mapping[str, int] = field(default_factory=dict)
    worst_open: Severity | None = None
    last_xid: int | None = None


#: NVLink error counters of ``GpuSample.nvlinks`` entries (:data:`NVLINK_ERROR_KEYS`, those the
#: detector's ``nvlink-rate`` sums) -> their ``error.type`` (the counter's name less ``_errors``).
NVLINK_ERROR_TYPES = tuple((k, k.removesuffix("_errors")) for k in NVLINK_ERROR_KEYS)


def _links(g: GpuSample) -> list[dict[str, Any]]:
    """NVLink entries that carry an integer ``link`` number, sorted by it."""
    return sorted((n for n in g.nvlinks or () if isinstance(n.get("link"), int)), key=lambda n: n["link"])


def nvlink_error_totals(g: GpuSample) -> dict[str, int]:
    """NVLink error counts of a GPU summed over its links, per ``error.type`` (``crc_flit``,
    ``crc_data``, ``replay``, ``recovery``); a type no link reports is absent. Counts, monotonic."""
    out: dict[str, int] = {}
    for n in _links(g):
        for field_name, etype in NVLINK_ERROR_TYPES:
            v = n.get(field_name)
            if v is not None:
                out[etype] = out.get(etype, 0) + int(v)
    return out


def nvlink_error_points(v: GpuView) -> list[tuple[tuple[AttrValue, ...], float]]:
    """``gpuwarden.gpu.nvlink.errors`` points: ``((link, error.type), count)`` per link and
    reported counter (link order, then crc_flit, crc_data, replay, recovery)."""
    out: list[tuple[tuple[AttrValue, ...], float]] = []
    for n in _links(v.gpu):
        for field_name, etype in NVLINK_ERROR_TYPES:
            c = n.get(field_name)
            if c is not None:
                out.append(((n["link"], etype), float(c)))
    return out


def nvlink_active_points(v: GpuView) -> list[tuple[tuple[AttrValue, ...], float]]:
    """``gpuwarden.gpu.nvlink.active`` points: ``((link,), 1 or 0)`` per link that reports ``active``."""
    return [((n["link"],), float(bool(n["active"]))) for n in _links(v.gpu) if n.get("active") is not None]


def error_counts(v: GpuView) -> list[tuple[str, float]]:
    """``hw.errors`` points of a GPU as ``(error.type, count)``: ``corrected`` / ``uncorrected``
    (volatile ECC SBE / DBE), ``pcie_replay`` (PCIe replay counter), ``nvlink_<type>`` (NVLink
    errors summed over the links: crc_flit, crc_data, replay, recovery) when the sample has
    them, then one ``xid_<code>`` / ``sxid_<code>`` per event code seen under the GPU's current
    job (sorted). Counts, monotonic."""
    g = v.gpu
    out: list[tuple[str, float]] = []
    if g.ecc_sbe_volatile is not None:
        out.append(("corrected", g.ecc_sbe_volatile))
    if g.ecc_dbe_volatile is not None:
        out.append(("uncorrected", g.ecc_dbe_volatile))
    if g.pcie_replay_count is not None:
        out.append(("pcie_replay", g.pcie_replay_count))
    out.extend((f"nvlink_{t}", float(n)) for t, n in nvlink_error_totals(g).items())
    out.extend(sorted(v.event_errors.items()))
    return out


def gpu_state(v: GpuView) -> str:
    """``hw.state`` of a GPU: ``failed`` when a row remap failed or a critical/fatal failure is
    open on it; ``degraded`` when a row remap is pending, uncorrectable ECC errors were seen
    or a warning failure is open; else ``ok``. (``predicted_failure`` is never derived.)"""
    g, worst = v.gpu, v.worst_open
    if g.remapped_rows_failure or worst in (Severity.CRITICAL, Severity.FATAL):
        return "failed"
    if g.remapped_rows_pending or (g.ecc_dbe_volatile or 0) > 0 or worst == Severity.WARNING:
        return "degraded"
    return "ok"


def _status_points(v: GpuView) -> list[tuple[str, float]]:
    state = gpu_state(v)
    return [(s, 1 if s == state else 0) for s in HW_STATES]


def _throttle_points(v: GpuView) -> list[tuple[str, float]]:
    return [(r, 1) for r in sorted(set(v.gpu.throttle_reasons))]


def _pairs(
    *pairs: tuple[str, Callable[[GpuSample], int | None]],
) -> Callable[[GpuView], list[tuple[str, float]]]:
    def points(v: GpuView) -> list[tuple[str, float]]:
        return [(k, float(x)) for k, f in pairs if (x := f(v.gpu)) is not None]

    return points


def _one(
    points: Callable[[GpuView], list[tuple[str, float]]],
) -> Callable[[GpuView], list[tuple[tuple[AttrValue, ...], float]]]:
    def wrapped(v: GpuView) -> list[tuple[tuple[AttrValue, ...], float]]:
        return [((k,), x) for k, x in points(v)]

    return wrapped


ecc_lifetime_counts = _pairs(("corrected", lambda g: g.ecc_sbe_aggregate),
                             ("uncorrected", lambda g: g.ecc_dbe_aggregate))  # fmt: skip
retired_page_counts = _pairs(("multiple_sbe", lambda g: g.retired_pages_sbe), ("dbe", lambda g: g.retired_pages_dbe))
remapped_row_counts = _pairs(("correctable", lambda g: g.remapped_rows_correctable),
                             ("uncorrectable", lambda g: g.remapped_rows_uncorrectable))  # fmt: skip


@dataclass(frozen=True)
class MultiMetricSpec:
    """A GPU metric with several points per GPU, told apart by extra attributes
    (``otel_keys`` on OTLP, ``prom_labels`` on Prometheus, same order). ``points`` gives
    ``(attribute values, value)`` pairs of one GPU."""

    key: str
    otel_name: str
    otel_unit: str
    otel_kind: Literal["gauge", "updown", "counter"]
    description: str
    prom_name: str
    otel_keys: tuple[str, ...]
    prom_labels: tuple[str, ...]
    points: Callable[[GpuView], list[tuple[tuple[AttrValue, ...], float]]]

    @property
    def prom_type(self) -> Literal["gauge", "counter"]:
        return "counter" if self.otel_kind == "counter" else "gauge"


#: catalog key -> the points of a multi-point GPU metric: ((attribute values...), value) pairs
_POINTS: dict[str, Callable[[GpuView], list[tuple[tuple[AttrValue, ...], float]]]] = {
    "errors": _one(error_counts),
    "status": _one(_status_points),
    "throttle": _one(_throttle_points),
    "nvlink_errors": nvlink_error_points,
    "nvlink_active": nvlink_active_points,
    "ecc_lifetime": _one(ecc_lifetime_counts),
    "retired_pages": _one(retired_page_counts),
    "remapped_rows": _one(remapped_row_counts),
}


def _multi_metrics() -> tuple[MultiMetricSpec, ...]:
    rows = catalog_entries("otel", multi=True)
    _check_keys("multi-point", rows, _POINTS)
    return tuple(
        MultiMetricSpec(e.key, e.name, e.unit, e.instrument, e.description, e.prom_name, e.point_attributes,
                        e.prom_labels, _POINTS[e.key])
        for e in rows
    )  # fmt: skip


#: The GPU metrics with several points per GPU, in catalog order.
GPU_MULTI_METRICS: tuple[MultiMetricSpec, ...] = _multi_metrics()

#: The failure metrics (both namings): catalog key (``failures``, ``failure_open``) -> entry.
FAILURE_METRICS: dict[str, CatalogEntry] = {e.key: e for e in catalog_entries("all")}
_check_keys("failure", FAILURE_METRICS.values(), {"failures": None, "failure_open": None})


def error_type_of(e: AttributedEvent) -> str | None:
    """The ``hw.errors`` ``error.type`` an event counts as: ``xid_<code>`` / ``sxid_<code>``;
    None for events not counted (no code, or NVLink/ECC/GPU-lost: covered by other series)."""
    ev = e.event
    if ev.code is None or ev.kind not in (EventKind.XID, EventKind.SXID):
        return None
    return f"{ev.kind.value}_{ev.code}"


# Every key a data point may carry: the resource must not repeat any of them
# (Prometheus rejects a write whose resource and point share a key).
DATA_POINT_ATTRIBUTE_KEYS = frozenset(
    {
        "host.name", "hw.id", "hw.type", "hw.name", "hw.model", "hw.driver_version", "hw.parent",
        "hw.sensor_location", "hw.gpu.task", "gpu.index", "gpu.uuid", "gpu.pci_bus_id",
        "error.type", "hw.state", "gpuwarden.throttle.reason", "network.io.direction",
        "gpuwarden.nvlink.link", "gpuwarden.retirement.cause", "gpuwarden.remap.cause",
        "slurm.job.id", "slurm.user", "slurm.partition", "slurm.account",
        "gpuwarden.failure.pattern", "gpuwarden.failure.severity", "gpuwarden.failure.category",
    }
)  # fmt: skip


PROM_FAILURE_LABELS = ("node", "gpu", "uuid", "job_id", "user", "pattern", "severity", "category")


def failure_metric_attributes(f: Failure) -> dict[str, AttrValue]:
    """OTel attributes of an open failure on ``gpuwarden.failure.open`` (bounded: no ids)."""
    attrs: dict[str, AttrValue] = {
        "host.name": f.node,
        "gpuwarden.failure.pattern": f.pattern,
        "gpuwarden.failure.severity": str(f.severity.value),
        "gpuwarden.failure.category": str(f.category.value),
    }
    _put(attrs, "gpu.index", f.gpu_index)
    _put(attrs, "hw.id", f.gpu_uuid)
    _put(attrs, "slurm.job.id", f.job_id)
    _put(attrs, "slurm.user", f.user)
    return attrs


def failure_labels(f: Failure) -> tuple[str, ...]:
    """Prometheus label values of an open failure, in :data:`PROM_FAILURE_LABELS` order."""
    return (
        f.node,
        "" if f.gpu_index is None else str(f.gpu_index),
        f.gpu_uuid or "",
        f.job_id or "",
        f.user or "",
        f.pattern,
        str(f.severity.value),
        str(f.category.value),
    )
