"""The per-job accumulator of the job verdicts: follows ``slurm.jobs``, ``job.windows`` and ``failures``."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.shared.models import Failure, JobReport, JobState, JobWindow
from gpuwarden.shared.slurm import TERMINAL_JOB_STATES

from .breakdown import build
from .model import REQUEUE_STATES, Series

__all__ = ["JobReporter", "job_report_rows"]


@dataclass
class _Job:
    state: JobState | None = None
    series: dict[tuple[str, int], Series] = field(default_factory=dict)
    failures: dict[str, Failure] = field(default_factory=dict)
    last_window_end: float = 0.0
    last_published: float | None = None
    user: str | None = None
    partition: str | None = None

    def synth_state(self, job_id: str) -> JobState:
        """The job's state, or one made from its windows when slurm.jobs said nothing yet."""
        if self.state is not None:
            return self.state
        gpus: dict[str, list[int]] = {}
        for n, i in sorted(self.series):
            gpus.setdefault(n, []).append(i)
        starts = [s.cols["start"][0] for s in self.series.values() if len(s)]
        start = min(starts, default=0.0)
        return JobState(
            job_id=job_id,
            ts=max(0.0, self.last_window_end or start),
            state="UNKNOWN",
            user=self.user,
            partition=self.partition,
            nodes=sorted(gpus),
            gpus=gpus,
            start_ts=start,
        )


class JobReporter:
    """Per-job state for the verdicts: windows (compact columns), failures, the Slurm state.

    Feed it every ``slurm.jobs``, ``job.windows`` and ``failures`` message with :meth:`observe`;
    it returns the final report of a job that ends (or is requeued) and forgets the job. Memory
    is about 100 bytes per GPU window (a 64-GPU job over 6 h: about 14 MB) until the job ends.

    Args:
        price_usd_per_gpu_hour: USD per GPU-hour.
        max_jobs: jobs followed at once; beyond it the job with the oldest window is dropped.
        keep_final: final reports kept for :meth:`report` after their job ended.
    """

    def __init__(self, price_usd_per_gpu_hour: float, max_jobs: int = 5000, keep_final: int = 1000) -> None:
        if price_usd_per_gpu_hour < 0:
            raise ValueError("price must be >= 0")
        self.price = price_usd_per_gpu_hour
        self.max_jobs = max_jobs
        self.keep_final = keep_final
        self._jobs: dict[str, _Job] = {}
        self._final: OrderedDict[str, JobReport] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()

    def jobs(self) -> list[str]:
        """Job ids with a report available (followed now, or ended recently)."""
        return sorted(set(self._jobs) | set(self._final))

    def observe(self, value: Any) -> list[JobReport]:
        """Take one message (JobState, JobWindow or Failure; others are ignored).

        Returns:
            The final report of a job this state ends (empty otherwise).
        """
        if isinstance(value, JobWindow):
            if value.job_id in self._ended:
                return []
            j = self._job(value.job_id)
            j.series.setdefault((value.node, value.gpu_index), Series()).add(value)
            j.last_window_end = max(j.last_window_end, value.window_end)
            j.user, j.partition = value.user or j.user, value.partition or j.partition
            return []
        if isinstance(value, Failure):
            if value.job_id and value.job_id not in self._ended:
                j = self._job(value.job_id)
                old = j.failures.get(value.failure_id)
                if old is None or value.last_seen >= old.last_seen:
                    j.failures[value.failure_id] = value
            return []
        if isinstance(value, JobState):
            return self._on_state(value)
        return []

    def _job(self, job_id: str) -> _Job:
        j = self._jobs.get(job_id)
        if j is None:
            if len(self._jobs) >= self.max_jobs:
                oldest = min(self._jobs, key=lambda k: self._jobs[k].last_window_end)
                del self._jobs[oldest]
            j = self._jobs[job_id] = _Job()
        return j

    def _on_state(self, st: JobState) -> list[JobReport]:
        ended = st.state in TERMINAL_JOB_STATES or st.state in REQUEUE_STATES
        if st.job_id in self._ended:
            return []
        j = self._jobs.get(st.job_id)
        if j is None and not ended and st.state not in ("RUNNING", "COMPLETING", "SUSPENDED"):
            return []  # pending: nothing allocated yet
        j = j or self._job(st.job_id)
        if j.state is not None and st.ts < j.state.ts:
            return []  # an older snapshot
        if not ended:
            if j.state is not None and j.state.start_ts != st.start_ts and st.start_ts is not None:
                j.series.clear()  # a new run of a requeued job
                j.failures.clear()
            j.state = st
            return []
        if j.state is None and not j.series:
            self._jobs.pop(st.job_id, None)
            return []
        if st.start_ts is None and j.state is not None:
            st = st.model_copy(update={"start_ts": j.state.start_ts})
        if not st.gpus and j.state is not None and j.state.gpus:
            st = st.model_copy(update={"gpus": j.state.gpus, "nodes": j.state.nodes})
        rep = build(st, j.series, list(j.failures.values()), self.price, None)
        self._jobs.pop(st.job_id, None)
        self._final[st.job_id] = rep
        while len(self._final) > self.keep_final:
            self._final.popitem(last=False)
        if st.state not in REQUEUE_STATES:
            self._ended[st.job_id] = None
            while len(self._ended) > 10 * self.keep_final:
                self._ended.popitem(last=False)
        return [rep]

    def report(self, job_id: str, as_of: float | None = None) -> JobReport | None:
        """The job's report now (a running job: up to ``as_of``, default its last window); the
        final one for a job that ended; None for a job never seen."""
        j = self._jobs.get(job_id)
        if j is None:
            return self._final.get(job_id)
        if j.state is None and not j.series:
            return None
        return build(j.synth_state(job_id), j.series, list(j.failures.values()), self.price, as_of)

    def reports(self) -> list[JobReport]:
        """Reports of every job followed now, and the final ones kept."""
        out = [r for k in sorted(self._jobs) if (r := self.report(k)) is not None]
        running = {r.job_id for r in out}
        return out + [r for k, r in self._final.items() if k not in running]

    def due(self, job_id: str, interval_s: float) -> JobReport | None:
        """The job's running report when its windows advanced ``interval_s`` (event time) since the
        last report returned here (the first one after ``interval_s`` of windows); else None."""
        j = self._jobs.get(job_id)
        if j is None or interval_s <= 0 or not j.series:
            return None
        starts = [s.cols["start"][0] for s in j.series.values() if len(s)]
        ref = j.last_published if j.last_published is not None else min(starts, default=j.last_window_end)
        if j.last_window_end - ref < interval_s:
            return None
        return self.mark(job_id)

    def mark(self, job_id: str) -> JobReport | None:
        """The job's running report now, noted as published (for :meth:`due`)."""
        rep = self.report(job_id)
        j = self._jobs.get(job_id)
        if rep is not None and j is not None:
            j.last_published = j.last_window_end
        return rep


def job_report_rows(reporter: JobReporter | None) -> list[dict[str, Any]]:
    """The ``job_reports`` of a run report: every job's verdict (JobReport as JSON)."""
    return [r.model_dump(mode="json") for r in reporter.reports()] if reporter is not None else []
