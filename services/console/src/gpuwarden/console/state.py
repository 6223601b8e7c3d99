"""What the console shows, folded from the topics (pure: messages in, JSON-able views out).

:class:`ConsoleState` takes decoded messages of ``slurm.nodes``, ``slurm.jobs``, ``failures``,
``remediations``, ``job.reports`` and ``job.windows`` and answers the console's JSON views:
the fleet map (nodes x GPUs with their worst open condition), open and recent failures,
remediation decisions with the circuit breaker's state, job verdicts, a failure's evidence
around its fault time, and a job's GPUs side by side. Memory is bounded: the last
``series_points`` windows per GPU, ``max_failures`` failures, ``max_remediations`` decisions.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.shared.models import (
    Failure,
    FailureState,
    JobReport,
    JobState,
    JobWindow,
    NodeState,
    Remediation,
    RemediationDecision,
    Severity,
)

__all__ = ["SEVERITY_RANK", "ConsoleState", "gres_gpus"]

SEVERITY_RANK = {Severity.INFO: 1, Severity.WARNING: 2, Severity.CRITICAL: 3, Severity.FATAL: 4}
_GRES = re.compile(r"gpu(?::[^:(),]+)?:(\d+)")
# window fields a series keeps: (JobWindow attribute, short name in the JSON)
_SERIES = (
    ("utilization_gpu_pct_mean", "util"),
    ("power_w_mean", "power"),
    ("sm_clock_mhz_mean", "clock"),
    ("memory_used_mib_max", "mem"),
    ("tensor_activity_pct_mean", "tensor"),
    ("temperature_c_max", "temp"),
)
# evidence signal -> the series that plots it
_SIGNAL_SERIES = {
    "sm_clock_mhz_mean_vs_job_median": "clock",
    "power_w_mean_vs_job_median": "power",
    "max_gpu_utilization_pct": "util",
    "gpu_utilization_pct_max": "util",
    "mean_gpu_utilization_pct": "util",
    "tensor_activity_pct": "tensor",
    "memory_growth_mib_per_min": "mem",
    "temperature_c": "temp",
    "power_w": "power",
}


def gres_gpus(gres: str | None) -> int | None:
    """GPUs in a Slurm GRES string (``gpu:8``, ``gpu:h100:8(S:0-1)``, several summed); None: none named."""
    if not gres:
        return None
    counts = [int(m) for m in _GRES.findall(gres)]
    return sum(counts) if counts else None


@dataclass
class ConsoleState:
    """The console's view of the fleet. ``version`` grows with every change that shows."""

    series_points: int = 360
    max_failures: int = 2000
    max_remediations: int = 500
    max_jobs: int = 500
    version: int = 0
    nodes: dict[str, NodeState] = field(default_factory=dict)
    node_gpus: dict[str, set[int]] = field(default_factory=dict)
    jobs: OrderedDict[str, JobState] = field(default_factory=OrderedDict)
    failures: OrderedDict[str, Failure] = field(default_factory=OrderedDict)
    remediations: deque[Remediation] = field(default_factory=deque)
    reports: OrderedDict[str, JobReport] = field(default_factory=OrderedDict)
    series: dict[tuple[str, str, int], deque[tuple[float | None, ...]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def apply(self, topic: str, value: Any) -> bool:
        """Fold one decoded message in; True when a view changed."""
        self.counts[topic] = self.counts.get(topic, 0) + 1
        changed = True
        if isinstance(value, NodeState):
            self.nodes[value.node] = value
            n = gres_gpus(value.gres)
            if n is not None:
                self.node_gpus.setdefault(value.node, set()).update(range(n))
        elif isinstance(value, JobState):
            self.jobs[value.job_id] = value
            self.jobs.move_to_end(value.job_id)
            for node, idx in value.gpus.items():
                self.node_gpus.setdefault(node, set()).update(idx)
            while len(self.jobs) > self.max_jobs:
                self.jobs.popitem(last=False)
        elif isinstance(value, Failure):
            old = self.failures.get(value.failure_id)
            if old is None or value.last_seen >= old.last_seen:
                self.failures[value.failure_id] = value
                self.failures.move_to_end(value.failure_id)
            if value.gpu_index is not None:
                self.node_gpus.setdefault(value.node, set()).add(value.gpu_index)
            else:
                self.node_gpus.setdefault(value.node, set())
            while len(self.failures) > self.max_failures:
                self.failures.popitem(last=False)
        elif isinstance(value, Remediation):
            self.remediations.append(value)
            while len(self.remediations) > self.max_remediations:
                self.remediations.popleft()
        elif isinstance(value, JobReport):
            old_r = self.reports.get(value.job_id)
            if old_r is None or value.as_of >= old_r.as_of or value.final:
                self.reports[value.job_id] = value
                self.reports.move_to_end(value.job_id)
            while len(self.reports) > self.max_jobs:
                self.reports.popitem(last=False)
        elif isinstance(value, JobWindow):
            key = (value.job_id, value.node, value.gpu_index)
            s = self.series.get(key)
            if s is None:
                if len(self.series) >= self.max_jobs * 64:
                    self.series.pop(next(iter(self.series)))
                s = self.series[key] = deque(maxlen=self.series_points)
            s.append((value.window_end, *(_num(getattr(value, a)) for a, _ in _SERIES)))
            self.node_gpus.setdefault(value.node, set()).add(value.gpu_index)
        else:
            changed = False
        if changed:
            self.version += 1
        return changed

    # -- views -------------------------------------------------------------------------------
    def fleet(self) -> dict[str, Any]:
        """Nodes x GPUs, each with its worst open failure (severity, pattern, id) and its job."""
        worst: dict[tuple[str, int | None], Failure] = {}
        for f in self.failures.values():
            if f.state is not FailureState.OPEN:
                continue
            k = (f.node, f.gpu_index)
            if k not in worst or SEVERITY_RANK[f.severity] > SEVERITY_RANK[worst[k].severity]:
                worst[k] = f
        holder: dict[tuple[str, int], str] = {}
        for j in self.jobs.values():
            if j.state in ("RUNNING", "COMPLETING", "SUSPENDED"):
                for node, idx in j.gpus.items():
                    for i in idx:
                        holder[(node, i)] = j.job_id
        rows = []
        for node in sorted(set(self.node_gpus) | set(self.nodes)):
            ns = self.nodes.get(node)
            node_f = worst.get((node, None))
            gpus = []
            for i in sorted(self.node_gpus.get(node, set())):
                g = worst.get((node, i))
                if node_f is not None and (g is None or SEVERITY_RANK[node_f.severity] > SEVERITY_RANK[g.severity]):
                    g = node_f
                gpus.append(
                    {
                        "index": i,
                        "job_id": holder.get((node, i)),
                        "severity": g.severity.value if g else None,
                        "pattern": g.pattern if g else None,
                        "failure_id": g.failure_id if g else None,
                    }
                )
            rows.append(
                {
                    "node": node,
                    "state": ns.state if ns else None,
                    "flags": list(ns.flags) if ns else [],
                    "drained": ns.drained if ns else False,
                    "reason": ns.reason if ns else None,
                    "severity": node_f.severity.value if node_f else None,
                    "pattern": node_f.pattern if node_f else None,
                    "gpus": gpus,
                }
            )
        return {"nodes": rows}

    def failure_rows(self, limit: int = 200) -> list[dict[str, Any]]:
        """Open failures first (worst first), then the most recent resolved ones."""
        fs = sorted(
            self.failures.values(),
            key=lambda f: (f.state is not FailureState.OPEN, -SEVERITY_RANK[f.severity], -f.last_seen),
        )
        return [f.model_dump(mode="json") for f in fs[:limit]]

    def breaker(self) -> dict[str, Any]:
        """The remediator's circuit breaker as its decisions show it: open after a refusal that
        names it, closed again by a later executed or dry-run drain."""
        state: dict[str, Any] = {"open": False, "reason": None, "since": None}
        for r in self.remediations:
            if r.decision is RemediationDecision.REFUSED and "circuit breaker" in r.reason:
                if not state["open"]:
                    state = {"open": True, "reason": r.reason, "since": r.decided_at}
            elif (
                r.decision in (RemediationDecision.EXECUTED, RemediationDecision.DRY_RUN) and r.action.value == "drain"
            ):
                state = {"open": False, "reason": None, "since": None}
        return state

    def remediation_rows(self, limit: int = 100) -> list[dict[str, Any]]:
        """Newest first."""
        return [r.model_dump(mode="json") for r in list(self.remediations)[::-1][:limit]]

    def report_rows(self) -> list[dict[str, Any]]:
        """Every job verdict, newest first, without the per-GPU table (see :meth:`job_gpus`)."""
        out = []
        for r in reversed(self.reports.values()):
            d = r.model_dump(mode="json")
            d.pop("per_gpu", None)
            out.append(d)
        return out

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows at once (``GET /api/state``)."""
        return {
            "version": self.version,
            "fleet": self.fleet(),
            "failures": self.failure_rows(),
            "remediations": self.remediation_rows(),
            "breaker": self.breaker(),
            "jobs": self.report_rows(),
            "counts": dict(self.counts),
        }

    def evidence(self, failure_id: str) -> dict[str, Any] | None:
        """A failure's evidence for a plot: its points, threshold, fault time, and the windows of
        its GPU (the job's first GPU for a job-wide finding) in the plotted signal; None if unknown."""
        f = self.failures.get(failure_id)
        if f is None:
            return None
        sig = str(f.evidence[0].signal) if f.evidence else None
        name = _SIGNAL_SERIES.get(sig or "", "util")
        col = 1 + [n for _, n in _SERIES].index(name)
        keys = [k for k in self.series if k[1] == f.node and (f.gpu_index is None or k[2] == f.gpu_index)]
        if f.job_id:
            keys = [k for k in keys if k[0] == f.job_id] or keys
        lines = []
        for k in sorted(keys)[:8]:
            pts = [[p[0], p[col]] for p in self.series[k] if p[col] is not None]
            lines.append({"label": f"{k[1]} GPU {k[2]}", "points": pts})
        thr = [e.threshold for e in f.evidence if isinstance(e.threshold, int | float)]
        return {
            "failure_id": f.failure_id,
            "pattern": f.pattern,
            "node": f.node,
            "gpu_index": f.gpu_index,
            "signal": sig,
            "series": name,
            "unit": f.evidence[0].unit if f.evidence else None,
            "threshold": thr[0] if thr else None,
            "fault_ts": min([f.first_seen, *(e.ts for e in f.evidence)]),
            "first_seen": f.first_seen,
            "evidence": [e.model_dump(mode="json") for e in f.evidence],
            "lines": lines,
        }

    def job_gpus(self, job_id: str, series: str = "util") -> dict[str, Any] | None:
        """A job's GPUs side by side: one line per GPU of ``series`` (util, power, clock, mem,
        tensor, temp), plus the verdict's per-GPU table; None if the job is unknown."""
        names = [n for _, n in _SERIES]
        if series not in names:
            raise ValueError(f"series must be one of {names}, not {series!r}")
        col = 1 + names.index(series)
        keys = sorted(k for k in self.series if k[0] == job_id)
        rep = self.reports.get(job_id)
        if not keys and rep is None:
            return None
        return {
            "job_id": job_id,
            "series": series,
            "lines": [
                {
                    "label": f"{k[1]} GPU {k[2]}",
                    "points": [[p[0], p[col]] for p in self.series[k] if p[col] is not None],
                }
                for k in keys
            ],
            "per_gpu": [g.model_dump(mode="json") for g in rep.per_gpu] if rep else [],
        }


def _num(v: Any) -> float | None:
    return None if v is None else round(float(v), 3)
