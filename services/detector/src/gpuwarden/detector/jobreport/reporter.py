"""The per-job accumulator of the job verdicts: follows ``slurm.jobs``, ``job.windows`` and ``failures``.

When a report is taken (event time, epoch s): a running job's report ends at the later of the
time most of its GPUs' windows reached and :func:`~.model.failure_cut` (the end of the window
holding its latest failure's ``first_seen``), so it is never taken before a failure it counts.
A report a failure asks for (:meth:`JobReporter.mark`) waits until every GPU's windows reached
that cut (:meth:`JobReporter.settled`) and then ends exactly there: the same report whenever and
however fast the windows arrived. An ended job's data is kept a while (:attr:`JobReporter.linger_s`
of event time): its late windows and failures update the final report.
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.shared.models import Failure, JobReport, JobState, JobWindow
from gpuwarden.shared.slurm import TERMINAL_JOB_STATES

from .breakdown import build, job_gpus, loss_gpus, span
from .model import REQUEUE_STATES, WINDOW_S, Series, failure_cut, is_loss, onset

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
    #: a failure asked for a report that waits for the windows up to its cut
    pending: bool = False
    #: an ended job: (start, end) of its span; ``dirty``: late data since its final report
    span: tuple[float, float] | None = None
    dirty: bool = False
    #: the ``as_of`` of the last report returned by mark/due (consumers keep the latest)
    published_as_of: float | None = None
    #: the earliest window start of any GPU (kept as windows come: read per window)
    first_start: float | None = None
    #: bumped whenever a failure is kept, or the state replaced (part of :attr:`unsettled`'s key;
    #: a counter, not an object's id: CPython reuses the id of a freed object)
    failures_version: int = 0
    state_version: int = 0
    #: the GPU that kept the last :meth:`JobReporter._settled` False, with what it depended on
    #: (``t``, the GPU's window count, failures, state, GPUs known, first start): while they
    #: are unchanged and it has not fallen ``linger_s`` behind, the answer is still False
    unsettled: tuple[Any, ...] | None = None
    #: how many GPUs' last window has each length, s (:func:`~.model.window_len` without a sort)
    last_lens: Counter[float] = field(default_factory=Counter)

    def synth_state(self, job_id: str) -> JobState:
        """The job's state, or one made from its windows when slurm.jobs said nothing yet."""
        if self.state is not None:
            return self.state
        gpus: dict[str, list[int]] = {}
        for n, i in sorted(self.series):
            gpus.setdefault(n, []).append(i)
        start = self.first_start if self.first_start is not None else 0.0
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

    def cut(self) -> float | None:
        """:func:`~.model.failure_cut` of the job's failures, epoch s; None without failures."""
        if not self.failures:
            return None
        return failure_cut(list(self.failures.values()), self.window_len())

    def window_len(self) -> float:
        """:func:`~.model.window_len` of the series, from :attr:`last_lens` (no pass over every GPU)."""
        positive = sorted((x, n) for x, n in self.last_lens.items() if x > 0 and n > 0)
        k = sum(n for _, n in positive) // 2  # the index window_len takes in the sorted lengths
        for x, n in positive:
            if k < n:
                return x
            k -= n
        return WINDOW_S

    def add_window(self, w: JobWindow) -> None:
        s = self.series.get((w.node, w.gpu_index))
        if s is None:
            s = self.series[(w.node, w.gpu_index)] = Series()
        before = s.cols["end"][-1] - s.cols["start"][-1] if len(s) else None
        s.add(w)
        after = s.cols["end"][-1] - s.cols["start"][-1]
        if before != after:
            if before is not None:
                self.last_lens[before] -= 1
            self.last_lens[after] += 1
        self.last_window_end = max(self.last_window_end, w.window_end)
        if self.first_start is None or w.window_start < self.first_start:
            self.first_start = w.window_start
        self.user, self.partition = w.user or self.user, w.partition or self.partition

    def add_failure(self, f: Failure) -> bool:
        """Keep ``f`` if it is a newer version of its failure; whether it was kept."""
        old = self.failures.get(f.failure_id)
        if old is None or f.last_seen >= old.last_seen:
            self.failures[f.failure_id] = f
            self.failures_version += 1
            return True
        return False


class JobReporter:
    """Per-job state for the verdicts: windows (compact columns), failures, the Slurm state.

    Feed it every ``slurm.jobs``, ``job.windows`` and ``failures`` message with :meth:`observe`;
    it returns the final report of a job that ends (or is requeued). Memory is about 100 bytes
    per GPU window (a 64-GPU job over 6 h: about 14 MB) until the job ends, and for up to
    ``keep_closing`` ended jobs until the windows (of any job) are ``linger_s`` past their end.

    Args:
        price_usd_per_gpu_hour: USD per GPU-hour.
        max_jobs: jobs followed at once; beyond it the job with the oldest window is dropped.
        keep_final: final reports kept for :meth:`report` after their job ended.
        keep_closing: ended jobs whose data is kept for late windows and failures.
        linger_s: how long (event time, s: the latest window end seen) an ended job's data is
            kept; also how far behind the job's other GPUs a GPU may fall before a report stops
            waiting for it (:meth:`settled`).
    """

    def __init__(
        self,
        price_usd_per_gpu_hour: float,
        max_jobs: int = 5000,
        keep_final: int = 1000,
        keep_closing: int = 64,
        linger_s: float = 120.0,
    ) -> None:
        if price_usd_per_gpu_hour < 0:
            raise ValueError("price must be >= 0")
        self.price = price_usd_per_gpu_hour
        self.max_jobs = max_jobs
        self.keep_final = keep_final
        self.keep_closing = keep_closing
        self.linger_s = linger_s
        self._jobs: dict[str, _Job] = {}
        self._final: OrderedDict[str, JobReport] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._closing: OrderedDict[str, _Job] = OrderedDict()
        self._watermark = 0.0  # the latest window end seen, any job (event time, epoch s)

    def jobs(self) -> list[str]:
        """Job ids with a report available (followed now, or ended recently)."""
        return sorted(set(self._jobs) | set(self._final))

    def observe(self, value: Any) -> list[JobReport]:
        """Take one message (JobState, JobWindow or Failure; others are ignored).

        A window or failure of an ended job (inside its span, arriving late) updates its final
        report: :meth:`report` and :meth:`mark` give the updated one, :meth:`due` returns it once
        its windows are in.

        Returns:
            The final report of a job this state ends (empty otherwise).
        """
        if isinstance(value, JobWindow):
            self._watermark = max(self._watermark, value.window_end)
            c = self._closing.get(value.job_id)
            if c is not None and c.span is not None and c.span[0] <= value.window_start < c.span[1]:
                c.add_window(value)
                c.dirty = True
                return []
            if value.job_id in self._ended:
                return []
            self._job(value.job_id).add_window(value)
            self._forget_closed()
            return []
        if isinstance(value, Failure):
            if not value.job_id:
                return []
            c = self._closing.get(value.job_id)
            if (
                c is not None
                and c.span is not None
                and (value.failure_id in c.failures or c.span[0] <= onset(value) <= c.span[1])
            ):
                if c.add_failure(value):
                    c.dirty = True
                return []
            if value.job_id not in self._ended:
                self._job(value.job_id).add_failure(value)
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
                j.pending = False
                j.first_start, j.unsettled = None, None
                j.last_lens.clear()
                j.failures_version += 1
            j.state = st
            j.state_version += 1
            return []
        if j.state is None and not j.series:
            self._jobs.pop(st.job_id, None)
            return []
        if st.start_ts is None and j.state is not None:
            st = st.model_copy(update={"start_ts": j.state.start_ts})
        if not st.gpus and j.state is not None and j.state.gpus:
            st = st.model_copy(update={"gpus": j.state.gpus, "nodes": j.state.nodes})
        j.state = st
        j.state_version += 1
        rep = build(st, j.series, list(j.failures.values()), self.price, None)
        self._jobs.pop(st.job_id, None)
        j.span, j.dirty, j.pending = (rep.start_ts, rep.as_of), False, False
        self._closing[st.job_id] = j
        self._closing.move_to_end(st.job_id)
        while len(self._closing) > self.keep_closing:
            self._closing.popitem(last=False)
        self._keep_final(rep)
        if st.state not in REQUEUE_STATES:
            self._ended[st.job_id] = None
            while len(self._ended) > 10 * self.keep_final:
                self._ended.popitem(last=False)
        return [rep]

    def _keep_final(self, rep: JobReport) -> None:
        self._final[rep.job_id] = rep
        self._final.move_to_end(rep.job_id)
        while len(self._final) > self.keep_final:
            self._final.popitem(last=False)

    def _forget_closed(self) -> None:
        """Drop the data of ended jobs the windows are ``linger_s`` past (their final report
        rebuilt first if late data came in)."""
        while self._closing:
            job_id, c = next(iter(self._closing.items()))
            if c.span is None or self._watermark < c.span[1] + self.linger_s:
                return
            self._refresh_final(job_id)
            self._closing.pop(job_id, None)

    def _refresh_final(self, job_id: str) -> JobReport | None:
        """The ended job's final report, rebuilt when late windows or failures came in."""
        c = self._closing.get(job_id)
        if c is not None and c.dirty and c.state is not None:
            c.dirty = False
            rep = build(c.state, c.series, list(c.failures.values()), self.price, None)
            self._keep_final(rep)
            return rep
        return self._final.get(job_id)

    @property
    def watermark(self) -> float:
        """The latest window end seen (any job), epoch s; 0 before the first window."""
        return self._watermark

    def cut(self, job_id: str) -> float | None:
        """Where a report a failure asks for ends (:meth:`mark`), epoch s: the end of the window
        holding the running job's latest failure (:func:`~.model.failure_cut`; not before the
        job's start nor before the last report :meth:`mark`/:meth:`due` returned); None for a
        job without failures or not running."""
        j = self._jobs.get(job_id)
        return self._pending_at(j, job_id) if j is not None else None

    def as_of(self, job_id: str) -> float | None:
        """Where the job's report ends by default, epoch s: a running job's later of the median
        of its GPUs' last window ends and its failures' cut; an ended job's end; None for a job
        never seen."""
        j = self._jobs.get(job_id)
        if j is None:
            c = self._closing.get(job_id)
            return c.span[1] if c is not None and c.span is not None else None
        if j.state is None and not j.series:
            return None
        return span(j.synth_state(job_id), j.series, None, list(j.failures.values()))[1]

    def settled(self, job_id: str, as_of: float | None = None) -> bool:
        """Whether a report of the job up to ``as_of`` (default: its failures' cut, else
        :meth:`as_of`) built now is the one built at any later time: every GPU of the job has
        windows up to ``as_of`` (or up to the onset of a failure that cost it its work before
        then), or has fallen more than ``linger_s`` behind the job's most advanced GPU (it
        stopped reporting: its gap is no telemetry); an ended job once its GPUs' windows reached
        its end, or the windows of any job are ``linger_s`` past it. True for a job never seen.
        """
        j = self._jobs.get(job_id)
        if j is not None:
            t = as_of if as_of is not None else (j.cut() or self.as_of(job_id))
            return t is None or self._settled(j, job_id, t)
        c = self._closing.get(job_id)
        if c is None or c.span is None:
            return True
        return self._watermark >= c.span[1] + self.linger_s or self._settled(c, job_id, c.span[1])

    def _settled(self, j: _Job, job_id: str, t: float) -> bool:
        # The GPU that held it back last time, unchanged and not left behind: still not settled
        # (O(1) for the windows of a round that arrive before that GPU's; the rest is O(GPUs)).
        memo = j.unsettled
        if memo is not None:
            g = memo[0]
            s = j.series.get(g)
            end = s.cols["end"][-1] if s is not None and len(s) else None
            same = memo[1:-1] == (t, len(s) if s is not None else -1, end, *self._settle_inputs(j))
            if same and j.last_window_end - (end if end is not None else memo[-1]) <= self.linger_s:
                return False
        j.unsettled = None
        state = j.synth_state(job_id)
        gpus = job_gpus(state, j.series)
        lost: dict[tuple[str, int], float] = {}
        for f in j.failures.values():
            if is_loss(f):
                for g in loss_gpus(f, gpus):
                    lost[g] = min(lost.get(g, t), onset(f))
        ends = {g: s.cols["end"][-1] for g, s in j.series.items() if len(s)}
        front = max(ends.values(), default=0.0)
        t0 = state.start_ts if state.start_ts is not None else (j.first_start if j.first_start is not None else t)
        for g in gpus:
            need = min(t, lost.get(g, t))
            if need <= t0:
                continue
            s = j.series.get(g)
            if s is not None and _holds(s, need):
                continue
            end = ends.get(g)
            if end is not None and end >= need + self.linger_s:
                continue  # far past it: the window that would hold it is a gap (no telemetry)
            if front - (end if end is not None else t0) > self.linger_s:
                continue  # this GPU stopped reporting
            j.unsettled = (g, t, len(s) if s is not None else -1, end, *self._settle_inputs(j), t0)
            return False
        return True

    @staticmethod
    def _settle_inputs(j: _Job) -> tuple[Any, ...]:
        """What :meth:`_settled` reads of a job besides one GPU's windows and ``t``."""
        return (j.failures_version, j.state_version, len(j.series), j.first_start)

    def report(self, job_id: str, as_of: float | None = None) -> JobReport | None:
        """The job's report now (a running job: up to ``as_of``, default :meth:`as_of`); the
        final one for a job that ended (rebuilt with late windows and failures); None for a
        job never seen."""
        j = self._jobs.get(job_id)
        if j is None:
            return self._refresh_final(job_id)
        if j.state is None and not j.series:
            return None
        return build(j.synth_state(job_id), j.series, list(j.failures.values()), self.price, as_of)

    def reports(self, as_of: dict[str, float] | None = None) -> list[JobReport]:
        """Reports of every job followed now (up to ``as_of[job_id]`` where given), and the
        final ones kept."""
        as_of = as_of or {}
        out = [r for k in sorted(self._jobs) if (r := self.report(k, as_of.get(k))) is not None]
        running = {r.job_id for r in out}
        for k in list(self._closing):
            self._refresh_final(k)
        return out + [r for k, r in self._final.items() if k not in running]

    def due(self, job_id: str, interval_s: float) -> JobReport | None:
        """A report to publish now, else None: an ended job's final report updated by late data
        once its windows are in (:meth:`settled`); the report a failure asked for (:meth:`mark`)
        once settled, ending at the failures' cut (or at the last report returned here, if
        that ended later); else the running report when the job's windows advanced
        ``interval_s`` (event time) since the last report returned here (the first one after
        ``interval_s`` of windows)."""
        c = self._closing.get(job_id)
        if (
            c is not None
            and c.dirty
            and c.span is not None
            and (self._watermark >= c.span[1] + self.linger_s or self._settled(c, job_id, c.span[1]))
        ):
            return self._refresh_final(job_id)
        j = self._jobs.get(job_id)
        if j is None or not j.series:
            return None
        if j.pending:
            at = self._pending_at(j, job_id)
            if at is None or self._settled(j, job_id, at):
                j.pending = False
                return self._published(j, self.report(job_id, at))
            return None
        if interval_s <= 0:
            return None
        ref = (
            j.last_published
            if j.last_published is not None
            else (j.first_start if j.first_start is not None else j.last_window_end)
        )
        if j.last_window_end - ref < interval_s:
            return None
        return self.mark(job_id)

    def _pending_at(self, j: _Job, job_id: str) -> float | None:
        """Where a report a failure asked for ends: the failures' cut, not before the job's
        start nor before the last report returned (consumers keep the latest ``as_of``)."""
        cut = j.cut()
        if cut is None:
            return None
        st = j.synth_state(job_id)  # span()'s start, without its pass over every GPU
        t0 = st.start_ts if st.start_ts is not None else (j.first_start if j.first_start is not None else st.ts)
        return max(cut, t0, j.published_as_of or cut)

    def _published(self, j: _Job, rep: JobReport | None) -> JobReport | None:
        if rep is not None:
            j.last_published = j.last_window_end
            j.published_as_of = max(j.published_as_of or rep.as_of, rep.as_of)
        return rep

    def mark(self, job_id: str) -> JobReport | None:
        """The job's report now, noted as published (for :meth:`due`). A running job with
        failures whose windows have not reached the failures' cut yet gets None: the report
        waits (:meth:`due` returns it, ending at the cut, once :meth:`settled`); otherwise it
        ends at the later of :meth:`as_of` and the cut. An ended job: its final report (with
        late windows and failures)."""
        j = self._jobs.get(job_id)
        if j is None:
            return self._refresh_final(job_id)
        at = self._pending_at(j, job_id)
        if at is not None and not self._settled(j, job_id, at):
            j.pending = True
            return None
        j.pending = False
        rep = self.report(job_id, None if at is None else max(at, self.as_of(job_id) or at))
        return self._published(j, rep)


def _holds(s: Series, ts: float) -> bool:
    """Whether a window of ``s`` holds the moment just before ``ts`` (start < ts <= end)."""
    starts = s.cols["start"]
    i = bisect.bisect_left(starts, ts) - 1  # the last window starting before ts
    return i >= 0 and s.cols["end"][i] >= ts


def job_report_rows(reporter: JobReporter | None, as_of: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The ``job_reports`` of a run report: every job's verdict (JobReport as JSON); a running
    job's up to ``as_of[job_id]`` where given (epoch s)."""
    return [r.model_dump(mode="json") for r in reporter.reports(as_of)] if reporter is not None else []
