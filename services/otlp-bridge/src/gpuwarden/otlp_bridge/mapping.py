"""Pure mapping from gpuwarden models to OpenTelemetry and Prometheus shapes.

Nothing here touches the OpenTelemetry SDK, Kafka or the clock: every function takes
models and returns plain data, so the naming and the unit conversions are unit-tested
on their own. The GPU metric catalog is the table :data:`GPU_METRICS`: one row per
metric, with both its OTel name/unit/instrument and its Prometheus name/help.

Names follow ``shared/reference/otel-naming.md``: OTel hardware semantic conventions
(``hw.*``) where they exist, ``gpuwarden.*`` otherwise; values in base units
(ratio 0-1, bytes, Celsius, watts, hertz, joules).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry._logs import SeverityNumber

from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    EventKind,
    Failure,
    GpuAttribution,
    GpuSample,
    NodeState,
    Remediation,
    Severity,
)

__all__ = [
    "DATA_POINT_ATTRIBUTE_KEYS",
    "DCGM_LABELS",
    "DCGM_METRICS",
    "EVENT_NAME_PREFIX",
    "FAILURE_EVENT_NAME",
    "GPU_METRICS",
    "GPU_MULTI_METRICS",
    "HW_STATES",
    "MIB",
    "NODE_STATE_EVENT_NAME",
    "NVLINK_ERROR_TYPES",
    "OTEL_SHARED_DESCRIPTIONS",
    "PROM_FAILURE_LABELS",
    "PROM_GPU_LABELS",
    "REMEDIATION_EVENT_NAME",
    "AttrValue",
    "DcgmSpec",
    "GpuView",
    "LogFields",
    "MetricSpec",
    "MultiMetricSpec",
    "dcgm_attributes",
    "dcgm_labels",
    "error_counts",
    "error_type_of",
    "event_log",
    "failure_labels",
    "failure_log",
    "failure_metric_attributes",
    "gpu_attributes",
    "gpu_id",
    "gpu_state",
    "jobs_by_index",
    "metric_attributes",
    "node_state_key",
    "node_state_log",
    "nvlink_active_points",
    "nvlink_error_points",
    "nvlink_error_totals",
    "prom_gpu_labels",
    "remediation_log",
    "severity_of",
    "to_ns",
]

MIB = 1024 * 1024
FAILURE_EVENT_NAME = "gpuwarden.failure"
REMEDIATION_EVENT_NAME = "gpuwarden.remediation"

AttrValue = str | bool | int | float | list[str]


def to_ns(ts: float) -> int:
    """Epoch seconds (float) to epoch nanoseconds (int), as OTLP wants them."""
    return round(ts * 1e9)


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


GPU_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("utilization", "hw.gpu.utilization", "1", "gauge",
               "GPU (SM) utilisation over the last sample period, ratio 0-1",
               "gpuwarden_gpu_utilization_ratio", lambda g: _scale(g.utilization_gpu_pct, 0.01),
               {"hw.gpu.task": "general"}),
    MetricSpec("memory_used", "hw.gpu.memory.usage", "By", "updown",
               "Framebuffer memory used, bytes",
               "gpuwarden_gpu_memory_used_bytes", lambda g: _scale(g.memory_used_mib, MIB)),
    MetricSpec("memory_total", "hw.gpu.memory.limit", "By", "updown",
               "Framebuffer memory total, bytes",
               "gpuwarden_gpu_memory_total_bytes", lambda g: _scale(g.memory_total_mib, MIB)),
    MetricSpec("memory_utilization", "hw.gpu.memory.utilization", "1", "gauge",
               "Fraction of framebuffer memory used (not bandwidth), ratio 0-1",
               "gpuwarden_gpu_memory_used_ratio", _mem_ratio),
    MetricSpec("temperature", "hw.temperature", "Cel", "gauge",
               "GPU core temperature, Celsius",
               "gpuwarden_gpu_temperature_celsius", lambda g: g.temperature_c, sensor="gpu"),
    MetricSpec("memory_temperature", "hw.temperature", "Cel", "gauge",
               "GPU memory (HBM) temperature, Celsius",
               "gpuwarden_gpu_memory_temperature_celsius", lambda g: g.memory_temperature_c, sensor="memory"),
    MetricSpec("power", "hw.power", "W", "gauge",
               "Power draw, watts",
               "gpuwarden_gpu_power_watts", lambda g: g.power_w),
    MetricSpec("power_limit", "gpuwarden.gpu.power.limit", "W", "gauge",
               "Enforced power limit, watts",
               "gpuwarden_gpu_power_limit_watts", lambda g: g.power_limit_w),
    MetricSpec("sm_clock", "gpuwarden.gpu.clock.sm", "Hz", "gauge",
               "SM clock, hertz",
               "gpuwarden_gpu_sm_clock_hertz", lambda g: _scale(g.sm_clock_mhz, 1e6)),
    MetricSpec("memory_clock", "gpuwarden.gpu.clock.memory", "Hz", "gauge",
               "Memory clock, hertz",
               "gpuwarden_gpu_memory_clock_hertz", lambda g: _scale(g.memory_clock_mhz, 1e6)),
    MetricSpec("energy", "hw.energy", "J", "counter",
               "Energy consumed since driver load, joules",
               "gpuwarden_gpu_energy_joules_total", lambda g: g.energy_j),
    MetricSpec("pcie_link_gen", "gpuwarden.gpu.pcie.link.generation", "{generation}", "gauge",
               "Current PCIe link generation",
               "gpuwarden_gpu_pcie_link_generation", lambda g: g.pcie_link_gen),
    MetricSpec("pcie_link_width", "gpuwarden.gpu.pcie.link.width", "{lane}", "gauge",
               "Current PCIe link width, lanes",
               "gpuwarden_gpu_pcie_link_width_lanes", lambda g: g.pcie_link_width),
    MetricSpec("pcie_tx", "gpuwarden.gpu.pcie.throughput", "By/s", "gauge",
               "PCIe throughput by network.io.direction (transmit/receive), bytes per second (KB/s x 1024)",
               "gpuwarden_gpu_pcie_transmit_bytes_per_second", lambda g: _scale(g.pcie_tx_kbps, 1024.0),
               {"network.io.direction": "transmit"}),
    MetricSpec("pcie_rx", "gpuwarden.gpu.pcie.throughput", "By/s", "gauge",
               "PCIe throughput by network.io.direction (transmit/receive), bytes per second (KB/s x 1024)",
               "gpuwarden_gpu_pcie_receive_bytes_per_second", lambda g: _scale(g.pcie_rx_kbps, 1024.0),
               {"network.io.direction": "receive"}),
    MetricSpec("tensor_activity", "gpuwarden.gpu.tensor.activity", "1", "gauge",
               "Tensor pipe activity (GPM, Hopper+), ratio 0-1 (% / 100)",
               "gpuwarden_gpu_tensor_activity_ratio", lambda g: _scale(g.tensor_activity_pct, 0.01)),
    MetricSpec("sm_occupancy", "gpuwarden.gpu.sm.occupancy", "1", "gauge",
               "SM occupancy (GPM, Hopper+), ratio 0-1 (% / 100)",
               "gpuwarden_gpu_sm_occupancy_ratio", lambda g: _scale(g.sm_occupancy_pct, 0.01)),
    MetricSpec("fan_speed", "gpuwarden.gpu.fan.speed", "1", "gauge",
               "Fan speed, ratio 0-1 of the maximum (% / 100)",
               "gpuwarden_gpu_fan_speed_ratio", lambda g: _scale(g.fan_speed_pct, 0.01)),
    MetricSpec("performance_state", "gpuwarden.gpu.performance_state", "{state}", "gauge",
               "Performance state N of PN (0 = P0, fastest)",
               "gpuwarden_gpu_performance_state", lambda g: g.performance_state),
    MetricSpec("retired_pages_pending", "gpuwarden.gpu.memory.retired_pages.pending", "1", "gauge",
               "1 when a page retirement waits for a reboot, else 0",
               "gpuwarden_gpu_retired_pages_pending", lambda g: _flag(g.retired_pages_pending)),
)  # fmt: skip


# Description of an OTel name that several rows share.
OTEL_SHARED_DESCRIPTIONS = {
    "hw.temperature": "GPU temperature per sensor (hw.sensor_location gpu or memory), Celsius",
    "gpuwarden.gpu.pcie.throughput": "PCIe throughput by network.io.direction (transmit/receive), bytes per second",
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


# -- per-GPU metrics with one extra attribute (several points per GPU) ------------------

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


#: NVLink error counters of ``GpuSample.nvlinks`` entries -> their ``error.type``.
NVLINK_ERROR_TYPES = (
    ("crc_flit_errors", "crc_flit"),
    ("crc_data_errors", "crc_data"),
    ("replay_errors", "replay"),
    ("recovery_errors", "recovery"),
)


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


GPU_MULTI_METRICS: tuple[MultiMetricSpec, ...] = (
    MultiMetricSpec("errors", "hw.errors", "{error}", "counter",
                    "GPU errors by error.type: corrected/uncorrected (volatile ECC), pcie_replay, "
                    "nvlink_<type> (summed over links), xid_<code>",
                    "gpuwarden_gpu_errors_total", ("error.type",), ("error_type",), _one(error_counts)),
    MultiMetricSpec("status", "hw.status", "1", "updown",
                    "GPU status: 1 for the current hw.state, 0 for the others",
                    "gpuwarden_gpu_status", ("hw.state",), ("state",), _one(_status_points)),
    MultiMetricSpec("throttle", "gpuwarden.gpu.throttle.active", "1", "gauge",
                    "Active clock throttle (clock event) reasons: 1 per active reason",
                    "gpuwarden_gpu_throttle_active", ("gpuwarden.throttle.reason",), ("reason",),
                    _one(_throttle_points)),
    MultiMetricSpec("nvlink_errors", "gpuwarden.gpu.nvlink.errors", "{error}", "counter",
                    "NVLink errors per link by error.type (crc_flit, crc_data, replay, recovery), count",
                    "gpuwarden_gpu_nvlink_errors_total", ("gpuwarden.nvlink.link", "error.type"),
                    ("link", "error_type"), nvlink_error_points),
    MultiMetricSpec("nvlink_active", "gpuwarden.gpu.nvlink.active", "1", "gauge",
                    "1 when the NVLink is active, else 0, per link",
                    "gpuwarden_gpu_nvlink_active", ("gpuwarden.nvlink.link",), ("link",), nvlink_active_points),
    MultiMetricSpec("ecc_lifetime", "gpuwarden.gpu.memory.ecc.errors.lifetime", "{error}", "counter",
                    "ECC errors over the GPU's lifetime (aggregate) by error.type corrected/uncorrected, count",
                    "gpuwarden_gpu_ecc_errors_lifetime_total", ("error.type",), ("error_type",),
                    _one(ecc_lifetime_counts)),
    MultiMetricSpec("retired_pages", "gpuwarden.gpu.memory.retired_pages", "{page}", "updown",
                    "Retired framebuffer pages by gpuwarden.retirement.cause (multiple_sbe, dbe), count",
                    "gpuwarden_gpu_retired_pages", ("gpuwarden.retirement.cause",), ("cause",),
                    _one(retired_page_counts)),
    MultiMetricSpec("remapped_rows", "gpuwarden.gpu.memory.remapped_rows", "{row}", "updown",
                    "Remapped memory rows by gpuwarden.remap.cause (correctable, uncorrectable), count",
                    "gpuwarden_gpu_remapped_rows", ("gpuwarden.remap.cause",), ("cause",),
                    _one(remapped_row_counts)),
)  # fmt: skip


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


# -- failures and remediations ------------------------------------------------------

_SEVERITY: dict[Severity, tuple[SeverityNumber, str]] = {
    Severity.INFO: (SeverityNumber.INFO, "INFO"),
    Severity.WARNING: (SeverityNumber.WARN, "WARN"),
    Severity.CRITICAL: (SeverityNumber.ERROR, "ERROR"),
    Severity.FATAL: (SeverityNumber.FATAL, "FATAL"),
}


def severity_of(severity: Severity) -> tuple[SeverityNumber, str]:
    """OTel severity (number, text) of a failure severity: info->INFO, warning->WARN,
    critical->ERROR, fatal->FATAL."""
    return _SEVERITY[Severity(severity)]


@dataclass(frozen=True)
class LogFields:
    """What one OTLP log record carries (times in epoch ns, event time)."""

    timestamp_ns: int
    severity_number: SeverityNumber
    severity_text: str
    body: str
    event_name: str
    attributes: dict[str, AttrValue]


def _put(attrs: dict[str, AttrValue], key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def failure_log(f: Failure) -> LogFields:
    """A :class:`Failure` as a log record: body = verdict, timestamp = ``last_seen``.

    Identity, location (node/GPU/job), action, cost and episode fields become attributes;
    the evidence list is one JSON string (``gpuwarden.failure.evidence``).
    """
    number, text = severity_of(f.severity)
    attrs: dict[str, AttrValue] = {
        "gpuwarden.failure.id": f.failure_id,
        "gpuwarden.failure.pattern": f.pattern,
        "gpuwarden.failure.rule_id": f.rule_id,
        "gpuwarden.failure.category": str(f.category.value),
        "gpuwarden.failure.severity": str(f.severity.value),
        "gpuwarden.failure.state": str(f.state.value),
        "gpuwarden.failure.occurrences": f.occurrences,
        "gpuwarden.failure.first_seen": f.first_seen,
        "gpuwarden.failure.last_seen": f.last_seen,
        "gpuwarden.failure.recommended_action": str(f.recommended_action.value),
        "gpuwarden.failure.evidence": json.dumps([e.model_dump(mode="json") for e in f.evidence]),
        "gpuwarden.cost.affected_gpus": f.cost.affected_gpus,
        "gpuwarden.cost.usd_per_hour": f.cost.usd_per_hour,
        "gpuwarden.cost.gpu_hours_lost": f.cost.gpu_hours_lost,
        "host.name": f.node,
    }
    if f.cannot_determine:
        attrs["gpuwarden.failure.cannot_determine"] = list(f.cannot_determine)
    _put(attrs, "gpu.index", f.gpu_index)
    _put(attrs, "gpu.uuid", f.gpu_uuid)
    _put(attrs, "hw.id", f.gpu_uuid)
    _put(attrs, "gpu.pci_bus_id", f.pci_bus_id)
    _put(attrs, "slurm.job.id", f.job_id)
    _put(attrs, "slurm.user", f.user)
    _put(attrs, "slurm.partition", f.partition)
    return LogFields(to_ns(f.last_seen), number, text, f.verdict, FAILURE_EVENT_NAME, attrs)


_DECISION_SEVERITY = {
    "failed": (SeverityNumber.ERROR, "ERROR"),
    "refused": (SeverityNumber.WARN, "WARN"),
}


def remediation_log(r: Remediation) -> LogFields:
    """A :class:`Remediation` as a log record: body = reason, timestamp = ``ts`` (event time).

    Severity: ``failed`` -> ERROR, ``refused`` -> WARN, anything else INFO.
    """
    number, text = _DECISION_SEVERITY.get(str(r.decision.value), (SeverityNumber.INFO, "INFO"))
    attrs: dict[str, AttrValue] = {
        "gpuwarden.remediation.id": r.remediation_id,
        "gpuwarden.remediation.action": str(r.action.value),
        "gpuwarden.remediation.decision": str(r.decision.value),
        "gpuwarden.remediation.dry_run": r.dry_run,
        "gpuwarden.remediation.decided_at": r.decided_at,
        "gpuwarden.remediation.argv": list(r.argv),
        "gpuwarden.remediation.failure_ids": list(r.failure_ids),
        "host.name": r.node,
    }
    _put(attrs, "gpuwarden.remediation.exit_code", r.exit_code)
    _put(attrs, "gpuwarden.remediation.output", r.output)
    return LogFields(to_ns(r.ts), number, text, r.reason, REMEDIATION_EVENT_NAME, attrs)


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


# -- GPU events and node states --------------------------------------------------------

EVENT_NAME_PREFIX = "gpuwarden.gpu."
NODE_STATE_EVENT_NAME = "gpuwarden.node.state"


def event_log(e: AttributedEvent) -> LogFields:
    """A GPU event (XID, SXID, NVLink, ECC, GPU lost) as a log record: body = the raw log line,
    timestamp = the event's ``ts``, ``event.name`` ``gpuwarden.gpu.<kind>`` (``gpu_lost``),
    ``gpu.xid`` = the code for XIDs. Severity ERROR for a lost GPU, else WARN."""
    ev = e.event
    kind = str(ev.kind.value)
    attrs: dict[str, AttrValue] = {
        "gpuwarden.event.id": ev.event_id,
        "gpuwarden.event.kind": kind,
        "gpuwarden.event.source": ev.source,
        "host.name": ev.node,
    }
    _put(attrs, "gpuwarden.event.code", ev.code)
    if ev.kind == EventKind.XID:
        _put(attrs, "gpu.xid", ev.code)
    if ev.message:
        attrs["gpuwarden.event.message"] = ev.message
    _put(attrs, "gpu.index", ev.gpu_index)
    _put(attrs, "gpu.uuid", ev.gpu_uuid)
    _put(attrs, "hw.id", ev.gpu_uuid)
    _put(attrs, "gpu.pci_bus_id", ev.pci_bus_id)
    _put(attrs, "process.pid", ev.pid)
    _put(attrs, "process.executable.name", ev.process_name)
    if e.job is not None:
        attrs["slurm.job.id"] = e.job.job_id
        _put(attrs, "slurm.user", e.job.user)
        _put(attrs, "slurm.partition", e.job.partition)
        _put(attrs, "slurm.account", e.job.account)
    number, text = (SeverityNumber.ERROR, "ERROR") if ev.kind == EventKind.GPU_LOST else (SeverityNumber.WARN, "WARN")
    return LogFields(to_ns(ev.ts), number, text, ev.raw, EVENT_NAME_PREFIX + kind.replace("-", "_"), attrs)


_BAD_NODE_WORDS = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "ERROR"})


def node_state_key(ns: NodeState) -> tuple[str, tuple[str, ...], str | None]:
    """What makes a node state a *change*: (state, sorted flags, reason)."""
    return (ns.state.upper(), tuple(sorted(f.upper() for f in ns.flags)), ns.reason)


def node_state_log(ns: NodeState) -> LogFields:
    """A Slurm node state (change) as a log record: body ``<node>: STATE+FLAG (reason)``,
    timestamp = its ``ts``; WARN when down/drained/failing/not responding, else INFO."""
    state, flags, reason = node_state_key(ns)
    body = f"{ns.node}: {'+'.join((state, *flags))}" + (f" ({reason})" if reason else "")
    attrs: dict[str, AttrValue] = {
        "host.name": ns.node,
        "slurm.node.state": state,
        "slurm.node.flags": list(flags),
        "slurm.node.snapshot": ns.snapshot,
    }
    _put(attrs, "slurm.node.reason", reason)
    _put(attrs, "slurm.node.reason_user", ns.reason_user)
    _put(attrs, "slurm.node.reason_time", ns.reason_ts)
    _put(attrs, "slurm.node.gres", ns.gres)
    _put(attrs, "slurm.node.gres_used", ns.gres_used)
    if ns.partitions:
        attrs["slurm.node.partitions"] = list(ns.partitions)
    bad = bool(_BAD_NODE_WORDS & {state, *flags})
    number, text = (SeverityNumber.WARN, "WARN") if bad else (SeverityNumber.INFO, "INFO")
    return LogFields(to_ns(ns.ts), number, text, body, NODE_STATE_EVENT_NAME, attrs)


# -- dcgm-exporter naming mode ------------------------------------------------------------

DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION", "hpc_job")


def dcgm_labels(attrs: Mapping[str, AttrValue]) -> tuple[str, ...]:
    """dcgm-exporter label values (:data:`DCGM_LABELS` order, '' when absent) from a GPU's
    OTel attributes: ``gpu.index``->gpu, ``gpu.uuid``->UUID, ``hw.name``->device,
    ``hw.model``->modelName, ``host.name``->Hostname, ``hw.driver_version``->
    DCGM_FI_DRIVER_VERSION, ``slurm.job.id``->hpc_job."""
    keys = ("gpu.index", "gpu.uuid", "hw.name", "hw.model", "host.name", "gpu.pci_bus_id", "hw.driver_version",
            "slurm.job.id")  # fmt: skip
    return tuple(str(attrs.get(k, "")) for k in keys)


def dcgm_attributes(attrs: Mapping[str, AttrValue]) -> dict[str, AttrValue]:
    """dcgm-exporter labels of a GPU as OTLP data-point attributes: :func:`dcgm_labels`
    without the empty ones (an attribute is left out, never empty)."""
    return {k: v for k, v in zip(DCGM_LABELS, dcgm_labels(attrs), strict=True) if v}


@dataclass(frozen=True)
class DcgmSpec:
    """One dcgm-exporter field: name, kind, help and the value in dcgm-exporter's unit."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    value: Callable[[GpuView], float | None]


def _fb_free(v: GpuView) -> float | None:
    g = v.gpu
    if g.memory_used_mib is None or g.memory_total_mib is None:
        return None
    return max(g.memory_total_mib - g.memory_used_mib, 0.0)


DCGM_METRICS: tuple[DcgmSpec, ...] = (
    DcgmSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda v: v.gpu.utilization_gpu_pct),
    DcgmSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
             lambda v: v.gpu.utilization_memory_pct),
    DcgmSpec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda v: v.gpu.memory_used_mib),
    DcgmSpec("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _fb_free),
    DcgmSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda v: v.gpu.temperature_c),
    DcgmSpec("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
             lambda v: v.gpu.memory_temperature_c),
    DcgmSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda v: v.gpu.power_w),
    DcgmSpec("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).",
             lambda v: v.gpu.power_limit_w),
    DcgmSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda v: v.gpu.sm_clock_mhz),
    DcgmSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda v: v.gpu.memory_clock_mhz),
    DcgmSpec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
             "Total energy consumption since boot (in mJ).", lambda v: _scale(v.gpu.energy_j, 1000.0)),
    DcgmSpec("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
             lambda v: v.gpu.ecc_sbe_volatile),
    DcgmSpec("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
             lambda v: v.gpu.ecc_dbe_volatile),
    DcgmSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
             lambda v: v.gpu.pcie_replay_count),
    DcgmSpec("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe link generation.", lambda v: v.gpu.pcie_link_gen),
    DcgmSpec("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe link width (lanes).", lambda v: v.gpu.pcie_link_width),
    DcgmSpec("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
             lambda v: _flag(v.gpu.remapped_rows_failure)),
    DcgmSpec("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether a row remap is pending a GPU reset",
             lambda v: _flag(v.gpu.remapped_rows_pending)),
    DcgmSpec("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors",
             lambda v: v.gpu.remapped_rows_correctable),
    DcgmSpec("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
             "Number of remapped rows for uncorrectable errors", lambda v: v.gpu.remapped_rows_uncorrectable),
    DcgmSpec("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors.",
             lambda v: v.gpu.ecc_sbe_aggregate),
    DcgmSpec("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors.",
             lambda v: v.gpu.ecc_dbe_aggregate),
    DcgmSpec("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors.",
             lambda v: v.gpu.retired_pages_sbe),
    DcgmSpec("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors.",
             lambda v: v.gpu.retired_pages_dbe),
    DcgmSpec("DCGM_FI_DEV_RETIRED_PENDING", "gauge", "Whether a page retirement is pending (0/1).",
             lambda v: _flag(v.gpu.retired_pages_pending)),
    DcgmSpec("DCGM_FI_DEV_FAN_SPEED", "gauge", "Fan speed (in %).", lambda v: v.gpu.fan_speed_pct),
    DcgmSpec("DCGM_FI_DEV_PSTATE", "gauge", "Performance state (0 = P0).", lambda v: v.gpu.performance_state),
    DcgmSpec("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus (in B/s).",
             lambda v: _scale(v.gpu.pcie_tx_kbps, 1024.0)),
    DcgmSpec("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus (in B/s).",
             lambda v: _scale(v.gpu.pcie_rx_kbps, 1024.0)),
    DcgmSpec("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
             lambda v: _scale(v.gpu.tensor_activity_pct, 0.01)),
    DcgmSpec("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
             lambda v: _scale(v.gpu.sm_occupancy_pct, 0.01)),
    DcgmSpec("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
             "Total number of NVLink flow-control CRC errors.", lambda v: _nvl(v, "crc_flit")),
    DcgmSpec("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
             "Total number of NVLink data CRC errors.", lambda v: _nvl(v, "crc_data")),
    DcgmSpec("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries.",
             lambda v: _nvl(v, "replay")),
    DcgmSpec("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
             "Total number of NVLink recovery errors.", lambda v: _nvl(v, "recovery")),
    DcgmSpec("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
             lambda v: None if v.last_xid is None else float(v.last_xid)),
)  # fmt: skip


def _nvl(v: GpuView, etype: str) -> float | None:
    n = nvlink_error_totals(v.gpu).get(etype)
    return None if n is None else float(n)
