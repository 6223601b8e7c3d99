"""The detection engine: pure functions of the messages it is given (event time only).

:class:`Detector` turns attributed events into :class:`~gpuwarden.shared.models.Failure`
records using the catalog. Repeats of the same rule on the same node and GPU within the
rule's burst window fold into one episode (same ``failure_id``); an update is re-emitted
at most every ``update_interval_s`` of event time so a burst of 100 lines yields a handful
of messages, not 100.

Job attribution does not depend on arrival order: the detector keeps its own per-node GPU
allocations from ``slurm.jobs`` (event-time intervals). An event that arrives before its
job is known opens a failure without a job; when the job's state arrives later, the open
failure is re-emitted (same ``failure_id``) with the job, user, partition and cost. So a
replay at any speed ends with the same failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.shared.allocations import Allocation, apply_allocation, attributions_at, expire, fan_out
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    CostEstimate,
    Evidence,
    Failure,
    GpuAttribution,
    GpuEvent,
    JobState,
    stable_id,
)

from .catalog import Catalog, Rule

__all__ = ["Detector", "Episode"]

MAX_EVIDENCE = 20
NO_JOB = "which job was affected: no Slurm allocation covered this GPU at the event time"


@dataclass
class _GpuInfo:
    uuid: str | None = None
    pci_bus_id: str | None = None


@dataclass
class Episode:
    """One open failure: its rule, first event, what is known so far, and the emitted state."""

    rule: Rule
    first: GpuEvent
    job: GpuAttribution | None
    info: _GpuInfo | None
    last_seen: float
    occurrences: int = 1
    evidence: list[Evidence] = field(default_factory=list)
    last_emitted: float = 0.0
    failure: Failure | None = None
    seen: set[str] = field(default_factory=set)


class Detector:
    """Stateful, deterministic rule engine.

    Args:
        catalog: the validated rules.
        price_usd_per_gpu_hour: cost model price, USD per GPU-hour.
        update_interval_s: minimum event-time gap between two emitted updates of one episode, s.
        allocation_retention_s: how long (event time) ended jobs stay known for late events, s.
    """

    def __init__(
        self,
        catalog: Catalog,
        price_usd_per_gpu_hour: float = 3.26,
        update_interval_s: float = 30.0,
        allocation_retention_s: float = 24 * 3600.0,
    ) -> None:
        self.catalog = catalog
        self.price = price_usd_per_gpu_hour
        self.update_interval_s = update_interval_s
        self.retention_s = allocation_retention_s
        self.episodes: dict[tuple[str, str, int | None], Episode] = {}
        self._gpus: dict[tuple[str, int], _GpuInfo] = {}
        self._allocs: dict[str, dict[str, Allocation]] = {}
        self._app_xids: dict[tuple[str, int], list[tuple[float, str]]] = {}

    # -- inputs ----------------------------------------------------------------------
    def on_sample(self, msg: AttributedSample) -> list[Failure]:
        """Remember GPU identities (UUID, PCI bus id) of a node, used to enrich events."""
        s = msg.sample
        for g in s.gpus:
            self._gpus[(s.node, g.index)] = _GpuInfo(g.uuid, g.pci_bus_id)
        return []

    def on_job(self, job: JobState) -> list[Failure]:
        """Update the allocation table; re-emit open failures this job now explains."""
        nodes = set()
        for a in fan_out(job):
            self._allocs[a.node] = expire(apply_allocation(self._allocs.get(a.node, {}), a), job.ts, self.retention_s)
            nodes.add(a.node)
        out = []
        for ep in self.episodes.values():
            if ep.job is None and ep.first.node in nodes and ep.first.gpu_index is not None:
                ep.job = self._job_at(ep.first.node, ep.first.gpu_index, ep.first.ts)
                if ep.job is not None:
                    out.append(self._emit(ep))
        return out

    def on_event(self, msg: AttributedEvent) -> list[Failure]:
        """Failures opened or updated by one event (empty if no rule matches or in a quiet burst).

        A secondary XID that names its cause (``caused_by_xid``) is folded into the cause's
        open failure on the same GPU instead of opening one of its own.
        """
        ev = msg.event
        rule = self.catalog.for_event(ev.kind.value, ev.code)
        if rule is None:
            return []
        evidence = Evidence(
            signal=ev.kind.value,
            value=ev.code if ev.code is not None else ev.message,
            unit="code",
            threshold=None,
            ts=ev.ts,
            source=ev.raw[:500],
        )
        if ev.caused_by_xid is not None:
            cause = self.catalog.for_event(ev.kind.value, ev.caused_by_xid)
            ep = self.episodes.get((cause.id, ev.node, ev.gpu_index)) if cause else None
            if ep is not None and 0 <= ev.ts - ep.last_seen <= ep.rule.burst_window_s:
                return self._fold(ep, ev, evidence)
        job = msg.job
        if job is None and ev.gpu_index is not None:
            job = self._job_at(ev.node, ev.gpu_index, ev.ts)
        out = self._observe(rule, ev, job, evidence)
        for rr in self.catalog.repeat_rules(ev.code):
            out.extend(self._repeat(rr, ev, job, evidence))
        return out

    def _observe(self, rule: Rule, ev: GpuEvent, job: GpuAttribution | None, evidence: Evidence) -> list[Failure]:
        key = (rule.id, ev.node, ev.gpu_index)
        ep = self.episodes.get(key)
        if ep is not None and ev.ts < ep.first.ts:
            return []  # older than the open episode: a late duplicate of history already reported
        if ep is not None and ev.ts - ep.last_seen <= rule.burst_window_s:
            return self._fold(ep, ev, evidence)
        info = self._gpus.get((ev.node, ev.gpu_index)) if ev.gpu_index is not None else None
        ep = Episode(rule=rule, first=ev, job=job, info=info, last_seen=ev.ts, evidence=[evidence])
        self.episodes[key] = ep
        return [self._emit(ep)]

    def _fold(self, ep: Episode, ev: GpuEvent, evidence: Evidence) -> list[Failure]:
        """Count ``ev`` into an open episode; re-emit at most every ``update_interval_s``."""
        if ev.event_id == ep.first.event_id or ev.event_id in ep.seen:
            return []  # redelivery
        ep.seen.add(ev.event_id)
        ep.occurrences += 1
        ep.last_seen = max(ep.last_seen, ev.ts)
        if len(ep.evidence) < MAX_EVIDENCE:
            ep.evidence.append(evidence)
        if ev.ts - ep.last_emitted >= self.update_interval_s:
            return [self._emit(ep)]
        return []

    def _repeat(self, rule: Rule, ev: GpuEvent, job: GpuAttribution | None, evidence: Evidence) -> list[Failure]:
        """Application XIDs recurring on one GPU under several jobs: the GPU, not the code."""
        if job is None or ev.gpu_index is None or rule.match.window_s is None or rule.match.jobs is None:
            return []
        hist = self._app_xids.setdefault((ev.node, ev.gpu_index), [])
        hist.append((ev.ts, job.job_id))
        window = rule.match.window_s
        hist[:] = [(t, j) for t, j in hist if ev.ts - t <= window]
        jobs = sorted({j for _, j in hist})
        if len(jobs) < rule.match.jobs:
            return []
        note = ev.model_copy(update={"message": f"XIDs {sorted(rule.match.codes)} under jobs {', '.join(jobs)}"})
        return self._observe(rule, note, job, evidence)

    # -- helpers ---------------------------------------------------------------------
    def _job_at(self, node: str, gpu: int, ts: float) -> GpuAttribution | None:
        found = attributions_at(self._allocs.get(node, {}), ts, [gpu])
        return found[0] if found else None

    def _emit(self, ep: Episode) -> Failure:
        ep.last_emitted = ep.last_seen
        ep.failure = self._render(ep)
        return ep.failure

    def _render(self, ep: Episode) -> Failure:
        rule, ev, job, info = ep.rule, ep.first, ep.job, ep.info
        gpu_text = str(ev.gpu_index) if ev.gpu_index is not None else f"at PCI {ev.pci_bus_id or 'unknown'}"
        job_text = f"job {job.job_id} ({job.user or 'unknown user'})" if job else "no Slurm job (idle GPU)"
        verdict = rule.verdict.format(node=ev.node, gpu=gpu_text, job_text=job_text, code=ev.code, message=ev.message)
        cannot = list(rule.cannot_determine)
        if ev.gpu_index is None:
            cannot.insert(0, "which GPU index the PCI bus id maps to (no sample from this node yet)")
        if job is None:
            cannot.append(NO_JOB)
        gpus = job.job_gpus if rule.cost.scope == "job" and job is not None and job.job_gpus else 1
        return Failure(
            failure_id=stable_id(rule.id, ev.node, ev.gpu_index, ev.ts),
            pattern=rule.pattern,
            rule_id=rule.id,
            category=rule.category,
            severity=rule.severity,
            node=ev.node,
            gpu_index=ev.gpu_index,
            gpu_uuid=ev.gpu_uuid or (info.uuid if info else None),
            pci_bus_id=ev.pci_bus_id or (info.pci_bus_id if info else None),
            job_id=job.job_id if job else None,
            user=job.user if job else None,
            partition=job.partition if job else None,
            first_seen=ev.ts,
            last_seen=ep.last_seen,
            occurrences=ep.occurrences,
            evidence=list(ep.evidence),
            verdict=verdict,
            cannot_determine=cannot,
            recommended_action=rule.action,
            cost=CostEstimate(
                affected_gpus=gpus,
                usd_per_hour=round(gpus * self.price, 4),
                gpu_hours_lost=round(gpus * max(0.0, ep.last_seen - ev.ts) / 3600.0, 6),
            ),
        )
