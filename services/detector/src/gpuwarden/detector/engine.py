"""The detection engine: pure functions of the messages it is given (event time only).

:class:`Detector` turns attributed events into :class:`~gpuwarden.shared.models.Failure`
records using the catalog. Repeats of the same rule on the same node and GPU within the
rule's burst window fold into one episode (same ``failure_id``); an update is re-emitted
at most every ``update_interval_s`` of event time so a burst of 100 lines yields a handful
of messages, not 100.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    CostEstimate,
    Evidence,
    Failure,
    GpuAttribution,
    stable_id,
)

from .catalog import Catalog, Rule

__all__ = ["Detector", "Episode"]

MAX_EVIDENCE = 20


@dataclass
class Episode:
    failure: Failure
    last_emitted: float
    evidence: list[Evidence] = field(default_factory=list)


@dataclass
class _GpuInfo:
    uuid: str | None = None
    pci_bus_id: str | None = None


class Detector:
    """Stateful, deterministic rule engine.

    Args:
        catalog: the validated rules.
        price_usd_per_gpu_hour: cost model price, USD per GPU-hour.
        update_interval_s: minimum event-time gap between two emitted updates of one episode, s.
    """

    def __init__(self, catalog: Catalog, price_usd_per_gpu_hour: float = 3.26, update_interval_s: float = 30.0):
        self.catalog = catalog
        self.price = price_usd_per_gpu_hour
        self.update_interval_s = update_interval_s
        self.episodes: dict[tuple[str, str, int | None], Episode] = {}
        self._gpus: dict[tuple[str, int], _GpuInfo] = {}
        self._jobs: dict[tuple[str, int], tuple[float, GpuAttribution]] = {}

    # -- inputs ----------------------------------------------------------------------
    def on_sample(self, msg: AttributedSample) -> list[Failure]:
        """Remember GPU identities and job attribution of a node (used to enrich events)."""
        s = msg.sample
        for g in s.gpus:
            self._gpus[(s.node, g.index)] = _GpuInfo(g.uuid, g.pci_bus_id)
        for a in msg.jobs:
            self._jobs[(s.node, a.gpu_index)] = (s.ts, a)
        return []

    def on_event(self, msg: AttributedEvent) -> list[Failure]:
        """Failures opened or updated by one event (empty if no rule matches or in a quiet burst)."""
        ev = msg.event
        rule = self.catalog.for_event(ev.kind.value, ev.code)
        if rule is None:
            return []
        job = msg.job
        if job is None and ev.gpu_index is not None:
            seen = self._jobs.get((ev.node, ev.gpu_index))
            # attribution from a sample is only trusted if the job had started by the event
            if seen and (seen[1].job_start_ts is None or seen[1].job_start_ts <= ev.ts):
                job = seen[1]
        info = self._gpus.get((ev.node, ev.gpu_index)) if ev.gpu_index is not None else None
        evidence = Evidence(
            signal=f"{ev.kind.value}",
            value=ev.code if ev.code is not None else ev.message,
            unit="code",
            threshold=None,
            ts=ev.ts,
            source=ev.raw[:500],
        )
        key = (rule.id, ev.node, ev.gpu_index)
        ep = self.episodes.get(key)
        if ep is not None and ev.ts - ep.failure.last_seen <= rule.burst_window_s and ev.ts >= ep.failure.first_seen:
            return self._update(ep, rule, ev.ts, evidence)
        if ep is not None and ev.ts < ep.failure.first_seen:
            return []  # older than the open episode: a late duplicate of history already reported
        failure = self._open(rule, msg, job, info, evidence)
        self.episodes[key] = Episode(failure, failure.last_seen, [evidence])
        return [failure]

    # -- helpers ---------------------------------------------------------------------
    def _cost(self, rule: Rule, job: GpuAttribution | None, first: float, last: float) -> CostEstimate:
        gpus = 1
        if rule.cost.scope == "job" and job is not None and job.job_gpus:
            gpus = job.job_gpus
        return CostEstimate(
            affected_gpus=gpus,
            usd_per_hour=round(gpus * self.price, 4),
            gpu_hours_lost=round(gpus * max(0.0, last - first) / 3600.0, 6),
        )

    def _open(
        self, rule: Rule, msg: AttributedEvent, job: GpuAttribution | None, info: _GpuInfo | None, evidence: Evidence
    ) -> Failure:
        ev = msg.event
        gpu_text = str(ev.gpu_index) if ev.gpu_index is not None else f"at PCI {ev.pci_bus_id or 'unknown'}"
        job_text = f"job {job.job_id} ({job.user or 'unknown user'})" if job else "no Slurm job (idle GPU)"
        verdict = rule.verdict.format(node=ev.node, gpu=gpu_text, job_text=job_text, code=ev.code, message=ev.message)
        cannot = list(rule.cannot_determine)
        if ev.gpu_index is None:
            cannot.insert(0, "which GPU index the PCI bus id maps to (no sample from this node yet)")
        if job is None:
            cannot.append("which job was affected: no Slurm allocation covered this GPU at the event time")
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
            last_seen=ev.ts,
            evidence=[evidence],
            verdict=verdict,
            cannot_determine=cannot,
            recommended_action=rule.action,
            cost=self._cost(rule, job, ev.ts, ev.ts),
        )

    def _update(self, ep: Episode, rule: Rule, ts: float, evidence: Evidence) -> list[Failure]:
        f = ep.failure
        if len(ep.evidence) < MAX_EVIDENCE:
            ep.evidence.append(evidence)
        last = max(f.last_seen, ts)
        job = (
            GpuAttribution(gpu_index=f.gpu_index or 0, job_id=f.job_id, job_gpus=f.cost.affected_gpus)
            if f.job_id
            else None
        )
        ep.failure = f.model_copy(
            update={
                "last_seen": last,
                "occurrences": f.occurrences + 1,
                "evidence": list(ep.evidence),
                "cost": self._cost(rule, job, f.first_seen, last)
                if job
                else self._cost(rule, None, f.first_seen, last),
            }
        )
        if ts - ep.last_emitted >= self.update_interval_s:
            ep.last_emitted = ts
            return [ep.failure]
        return []
