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
    AttributedSample,
    Failure,
    GpuAttribution,
    GpuSample,
    Remediation,
    Severity,
)

__all__ = [
    "DATA_POINT_ATTRIBUTE_KEYS",
    "FAILURE_EVENT_NAME",
    "GPU_METRICS",
    "MIB",
    "OTEL_SHARED_DESCRIPTIONS",
    "PROM_FAILURE_LABELS",
    "PROM_GPU_LABELS",
    "REMEDIATION_EVENT_NAME",
    "AttrValue",
    "LogFields",
    "MetricSpec",
    "failure_labels",
    "failure_log",
    "failure_metric_attributes",
    "gpu_attributes",
    "gpu_id",
    "jobs_by_index",
    "metric_attributes",
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
)  # fmt: skip


# Description of an OTel name that several rows share.
OTEL_SHARED_DESCRIPTIONS = {"hw.temperature": "GPU temperature per sensor (hw.sensor_location gpu or memory), Celsius"}


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


# Every key a data point may carry: the resource must not repeat any of them
# (Prometheus rejects a write whose resource and point share a key).
DATA_POINT_ATTRIBUTE_KEYS = frozenset(
    {
        "host.name", "hw.id", "hw.type", "hw.name", "hw.model", "hw.driver_version", "hw.parent",
        "hw.sensor_location", "hw.gpu.task", "gpu.index", "gpu.uuid", "gpu.pci_bus_id",
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
