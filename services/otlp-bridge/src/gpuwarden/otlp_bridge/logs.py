"""Log records of the bridge (pure): failures, remediations, GPU events and Slurm node-state
changes as :class:`LogFields` (what one OTLP log record carries; the bridge hands them to the
SDK's logger). Times in epoch ns, event time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from opentelemetry._logs import SeverityNumber

from gpuwarden.shared.models import AttributedEvent, EventKind, Failure, NodeState, Remediation, Severity

from .metrics import AttrValue

__all__ = [
    "EVENT_NAME_PREFIX",
    "FAILURE_EVENT_NAME",
    "NODE_STATE_EVENT_NAME",
    "REMEDIATION_EVENT_NAME",
    "LogFields",
    "event_log",
    "failure_log",
    "node_state_key",
    "node_state_log",
    "remediation_log",
    "severity_of",
    "to_ns",
]

FAILURE_EVENT_NAME = "gpuwarden.failure"
REMEDIATION_EVENT_NAME = "gpuwarden.remediation"


def to_ns(ts: float) -> int:
    """Epoch seconds (float) to epoch nanoseconds (int), as OTLP wants them."""
    return round(ts * 1e9)


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
