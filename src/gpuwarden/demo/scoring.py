"""What a scenario run observed and how it is scored: :class:`RunResult` (failures, remediations,
counters, the job reports) and :func:`score` (expected failures found, missed, false positives;
the strict rules of docs/architecture.md#scenarios). Shared by the process runner
(:mod:`.runner`) and the in-process one (:mod:`.inprocess`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpuwarden.detector.jobreport import JobReporter, job_report_rows
from gpuwarden.detector.jobreport.model import WINDOW_S
from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import Failure, Remediation
from gpuwarden.shared.scenario import Scenario

__all__ = ["RunResult", "failure_row", "score"]


@dataclass
class RunResult:
    """Everything a run observed: failures (latest version of each), remediations, counters."""

    scenario: Scenario
    sim_start: float = 0.0
    #: Wall time (epoch s) of scenario second 0; ``sim_start`` is its event time (EVENT_ORIGIN).
    wall_start: float = 0.0
    started_wall: float = field(default_factory=time.time)
    failures: dict[str, Failure] = field(default_factory=dict)
    failure_seen_wall: dict[str, float] = field(default_factory=dict)
    remediations: list[Remediation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    deadletters: list[dict[str, Any]] = field(default_factory=list)
    ready_s: dict[str, float] = field(default_factory=dict)
    job_reports: JobReporter | None = None
    #: True: the run stopped once its expectations were found (``gpuwarden demo``), before the
    #: scenario's end; False: it played to the end; None: inferred (the job windows stopped
    #: more than two windows short of the scenario's end). See :meth:`verdict_as_of`.
    stopped_early: bool | None = None

    def observe(self, short: str, value: bytes | None) -> None:
        """Feed ``slurm.jobs``, ``job.windows`` and ``failures`` messages to the job verdicts."""
        if short in ("slurm.jobs", "job.windows", "failures") and value is not None:
            if self.job_reports is None:
                self.job_reports = JobReporter(self.scenario.cluster.price_usd_per_gpu_hour)
            try:
                self.job_reports.observe(decode(short, value))
            except (ValueError, ValidationError):
                pass  # counted as unreadable by the caller's own decoding

    def verdict_as_of(self) -> dict[str, float]:
        """Job id -> where the run report's verdict of a running job ends, epoch s (event time).

        A run that played to its end: nothing (each verdict ends where its windows reached,
        the same at every speed once the pipeline drained). A run stopped early: each running
        job with failures at the end of the window of its latest failure
        (:meth:`JobReporter.cut`): after every failure it counts and independent of how far
        the windows got before the stop. (:meth:`verdicts_settled` says whether the windows up
        to there are in.)"""
        rep = self.job_reports
        if rep is None:
            return {}
        early = self.stopped_early
        if early is None:
            end = self.sim_start + self.scenario.duration_s
            early = rep.watermark > 0 and rep.watermark < end - 2 * WINDOW_S
        if not early:
            return {}
        return {k: c for k in rep.jobs() if (c := rep.cut(k)) is not None}

    def verdicts_settled(self) -> bool:
        """Whether every verdict the run report holds is final in event time: the windows of
        each running job with failures reached :meth:`verdict_as_of` (else its failures' cut),
        and an ended job's windows reached its end. A runner that stops early waits for this
        (a failure arrives ahead of the windows of its second)."""
        rep = self.job_reports
        if rep is None:
            return True
        at = self.verdict_as_of()
        return all(rep.settled(k, at.get(k, rep.cut(k))) for k in rep.jobs() if rep.cut(k) is not None)

    def report(self) -> dict[str, Any]:
        """The run report (docs/architecture.md#scenarios; ``first_seen_s`` = seconds since scenario start)."""
        fails = sorted(self.failures.values(), key=lambda f: (f.first_seen, f.node, f.gpu_index or -1))
        first_wall = min(self.failure_seen_wall.values(), default=None)
        return {
            "scenario": self.scenario.name,
            "failures": [failure_row(f, self.sim_start) for f in fails],
            "job_reports": job_report_rows(self.job_reports, self.verdict_as_of()),
            "remediations": [
                {
                    "node": r.node,
                    "action": r.action.value,
                    "dry_run": r.dry_run,
                    "reason": _drain_reason(r),
                    "decision": r.decision.value,
                    "decision_reason": r.reason,
                    "argv": r.argv,
                    "failure_ids": r.failure_ids,
                }
                for r in self.remediations
            ],
            "score": score(self.scenario, fails, self.sim_start),
            "stats": {
                **self.counts,
                "deadlettered": len(self.deadletters),
                "wall_s": round(time.time() - self.started_wall, 2),
                "time_to_first_failure_s": round(first_wall - self.started_wall, 2) if first_wall else None,
                "service_ready_s": self.ready_s,
            },
        }


def failure_row(f: Failure, sim_start: float) -> dict[str, Any]:
    """One failure as the run report lists it (``first_seen_s`` since scenario start)."""
    return {
        "pattern": f.pattern,
        "rule_id": f.rule_id,
        "node": f.node,
        "gpu_index": f.gpu_index,
        "job_id": f.job_id,
        "first_seen_s": round(f.first_seen - sim_start, 3),
        "category": f.category.value,
        "severity": f.severity.value,
        "recommended_action": f.recommended_action.value,
        "state": f.state.value,
        "evidence": [e.model_dump(mode="json") for e in f.evidence],
        "failure_id": f.failure_id,
        "verdict": f.verdict,
        "cannot_determine": list(f.cannot_determine),
        "cost": f.cost.model_dump(mode="json"),
    }


def _drain_reason(r: Remediation) -> str:
    """The Slurm reason the command sets (``reason=...`` in argv), else the decision's reason."""
    for a in r.argv:
        if a.startswith("reason="):
            return a.removeprefix("reason=")
    return r.reason


def score(scenario: Scenario, failures: list[Failure], sim_start: float) -> dict[str, Any]:
    """Match failures against ``expect``/``allow`` (the scenario format's scoring rules).

    An expectation is found by the earliest failure of its pattern (and node, gpu, job when
    given) whose ``first_seen`` lies within ``within_s`` of the fault's ``at_s`` (or the job's
    ``start_s``). Every other failure is a false positive unless it, too, matches an expectation
    (same pattern, node, GPU and job, inside the same window) or ``allow`` lets its pattern
    appear on its node: a failure on another GPU, another node or outside the window is a
    false positive, never a "repeat". An expectation with ``count`` covers at most that many
    distinct failures (the earliest): one fault reported as several findings fails the scenario.
    """
    found, missed, covered = [], [], set()
    for exp in scenario.expect:
        origin = _origin(scenario, exp)
        hit = None
        mine: list[str] = []
        for f in failures:
            if not _matches(exp, f):
                continue
            delay = f.first_seen - sim_start - origin
            if -1.0 <= delay <= exp.within_s:
                if f.failure_id not in mine:
                    if exp.count is not None and len(mine) >= exp.count:
                        continue
                    mine.append(f.failure_id)
                covered.add(f.failure_id)
                if hit is None:
                    hit = (f, delay)
        row = exp.model_dump(exclude_none=True)
        if "job" in row:
            row["job"] = str(row["job"])  # job ids are strings on the bus
        if hit:
            found.append({**row, "delay_s": round(hit[1], 3), "failure_id": hit[0].failure_id})
        else:
            missed.append(row)
    fps = [
        {
            "pattern": f.pattern,
            "node": f.node,
            "gpu_index": f.gpu_index,
            "first_seen_s": round(f.first_seen - sim_start, 3),
            "failure_id": f.failure_id,
        }
        for f in failures
        if f.failure_id not in covered and not scenario.allowed(f.pattern, f.node)
    ]
    return {
        "expected": len(scenario.expect),
        "found": found,
        "missed": missed,
        "false_positives": fps,
        "passed": not missed and not fps,
    }


def _matches(exp: Any, f: Failure) -> bool:
    if f.pattern != exp.pattern or (exp.node and f.node != exp.node):
        return False
    if exp.gpu is not None and f.gpu_index != exp.gpu:
        return False
    return exp.job is None or f.job_id == str(exp.job)


def _origin(scenario: Scenario, exp: Any) -> float:
    """Where ``within_s`` counts from: the first fault on the expected node (and GPU); else the
    first fault on any node of the expected job (a job-level failure is reported on the job's
    first node); else, for patterns that come from a job's profile, the job's start."""
    faults = sorted(scenario.faults, key=lambda f: f.at_s)
    for fault in faults:
        if exp.node in (None, fault.node) and (exp.gpu is None or fault.gpu in (None, exp.gpu)):
            return fault.at_s
    jobs = [j for j in scenario.jobs if exp.job is not None and str(j.id) == str(exp.job)]
    for job in jobs:
        nodes = set(job.node_list())
        for fault in faults:
            if fault.node in nodes:
                return fault.at_s
        return job.start_s
    return 0.0
