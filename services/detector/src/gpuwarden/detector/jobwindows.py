"""Job windows of the detector: the correlator's per-(job, node, GPU) windows grouped by window
start until the job's window is complete, then the job-scope condition rules (idle, partial idle,
hang, stragglers, ...) over it with the job's recent history.

State (in the detector's snapshot): ``_windows``, ``_window_marks``, ``_window_tally``,
``_window_ptally``, ``_window_stream``, ``_window_progress``, ``_window_done``, ``late_windows``,
``_history``, ``_job_ctx``, ``_job_starts``, ``_job_nodes``, ``_ended_jobs``. Mixed into
:class:`~gpuwarden.detector.engine.Detector`, which owns the condition trackers these rules
step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpuwarden.shared.models import Failure, GpuAttribution, JobState, JobWindow

from .conditions import ConditionRule, JobContext, Reading, evaluate_job

__all__ = ["ENDED_JOBS_KEPT", "ENDED_WAIT_S", "STREAM_LAG", "WINDOW_LAG", "JobWindows"]

#: A job's window start is evaluated without a node that has not reported it once the node's own
#: correlator input partition (``JobWindow.stream_partition``) is this many windows past the
#: window's end (``stream_ts``): the node's peers on that partition moved on, it went silent.
#: A partition that is behind (its correlator worker restarting, a backlog) holds the window.
STREAM_LAG = 6
#: The backstop: a job's window start is evaluated with the windows it has once the job's newest
#: node is this many windows past it, whatever the partitions say (a node never reported, windows
#: without a partition from an older correlator, a correlator partition down for this long). "The
#: newest" is the upper median of the reporting nodes' newest window starts: one node of three or
#: more whose clock runs ahead does not evaluate every other node's windows before they come.
WINDOW_LAG = 30
#: Ended jobs whose node count and last evaluated window start are kept (oldest dropped first):
#: a job's last windows close after its end (the window grace, the Slurm hold) and still need both.
ENDED_JOBS_KEPT = 10_000
#: How long after a job's end (event time, s, on the detector's watermark) its window starts still
#: waiting for a node are evaluated with the windows they have and its state dropped: a node silent
#: at the end never completes them, and the job's progress stops with its last windows.
ENDED_WAIT_S = 300.0


class JobWindows:
    """The job-scope part of the detector (a mixin of :class:`~gpuwarden.detector.engine.Detector`)."""

    #: job -> window start -> (node, GPU) -> window, until the window start is complete
    _windows: dict[str, dict[float, dict[tuple[str, int], JobWindow]]]
    #: job -> node -> newest window_start seen from that node (the job's window progress per node)
    _window_marks: dict[str, dict[str, float]]
    #: job -> newest window start -> how many nodes have it
    _window_tally: dict[str, dict[float, int]]
    #: job -> the nodes' gpu.samples partition (-1: not named) -> newest window start -> how many nodes
    _window_ptally: dict[str, dict[int, dict[float, int]]]
    #: job -> node -> the gpu.samples partition its windows name (-1: none)
    _window_stream: dict[str, dict[str, int]]
    #: job -> gpu.samples partition -> the newest ``stream_ts`` of the job's windows from it
    #: (event time, s; the job's own windows only: they share one job.windows partition, so those
    #: of one gpu.samples partition arrive in the order the correlator closed them)
    _window_progress: dict[str, dict[int, float]]
    #: job that ended -> its node count (insertion order: the oldest is dropped first)
    _ended_jobs: dict[str, int]
    #: job -> newest window start evaluated (a window at or before it is late: not evaluated again)
    _window_done: dict[str, float]
    #: windows that came after their window start was evaluated (their job rules did without them)
    late_windows: int
    #: job -> its last ``window_history`` complete window starts
    _history: dict[str, list[list[JobWindow]]]
    _job_ctx: dict[str, JobContext]
    _job_starts: dict[str, float]
    #: job -> how many nodes Slurm gives its GPUs on (from its running state)
    _job_nodes: dict[str, int]
    window_history: int
    _by_scope: dict[str, list[ConditionRule]]

    if TYPE_CHECKING:

        def _cond(
            self,
            rule: ConditionRule,
            node: str,
            gpu: int | None,
            ts: float,
            reading: Reading,
            job: GpuAttribution | None,
            source: str,
        ) -> list[Failure]: ...

    def _init_job_windows(self) -> None:
        self._windows = {}
        self._window_marks = {}
        self._window_tally = {}
        self._window_ptally = {}
        self._window_stream = {}
        self._window_progress = {}
        self._ended_jobs = {}
        self._window_done = {}
        self.late_windows = 0
        self._history = {}
        self._job_ctx = {}
        self._job_starts = {}
        self._job_nodes = {}
        self.window_history = 30

    def nodes_in_job(self, job_id: str) -> int:
        """Nodes that Slurm gives ``job_id`` in its latest running state (0 when this detector
        has not seen one: with several workers, the one that reads the job's ``job.windows``
        partition reads its ``slurm.jobs`` partition too); after the job ended, the count it had."""
        return self._job_nodes.get(job_id) or self._ended_jobs.get(job_id, 0)

    def _on_window(self, w: JobWindow) -> list[Failure]:
        """Job-scope condition rules over one window start of a job, once it is complete: all
        the job's GPUs reported it; or, once the job's running state has been read and every
        node of the job (as many as Slurm's allocations give it) has reported, each node has
        reported a newer window or is silent in its own stream (its correlator input partition
        is :data:`STREAM_LAG` windows past the window's end without it); or the job's newest
        node is :data:`WINDOW_LAG` windows past it (the backstop).

        Readiness depends on the windows' event times, not on the order in which nodes'
        windows arrive: windows of a job's nodes come from different correlator partitions and
        can arrive many windows apart (a correlator worker that restarts, a replay at 50x under
        load). A node is judged silent against its own partition's progress, never against
        another partition's, so a partition that is behind holds the window instead of losing
        its nodes' windows. A window whose start was already evaluated is late: it updates its
        node's progress and is counted (``late_windows``), but is not evaluated again as a
        group of its own (a group of the late nodes alone would look like another job: the
        whole job stalled).
        """
        job_id = w.job_id
        size = max(w.window_end - w.window_start, 1e-9)
        part = w.stream_partition if w.stream_partition is not None else -1
        if part >= 0 and w.stream_ts is not None:
            progress = self._window_progress.setdefault(job_id, {})
            if w.stream_ts > progress.get(part, -1.0):
                progress[part] = w.stream_ts
        marks = self._window_marks.setdefault(job_id, {})
        late = w.window_start <= self._window_done.get(job_id, -1.0)
        if late:
            self.late_windows += 1
        else:
            self._windows.setdefault(job_id, {}).setdefault(w.window_start, {})[(w.node, w.gpu_index)] = w
            if job_id in self._ended_jobs:  # a window closed after the job's end: it waits a bounded time
                self._ending().setdefault(job_id, w.window_end + ENDED_WAIT_S)
        # how many nodes have each newest window start, over the job and per partition: the
        # bounds without a scan of every node (a 3,125-node job would make every window O(nodes))
        old = marks.get(w.node)
        if old is None or w.window_start > old:
            marks[w.node] = w.window_start
            streams = self._window_stream.setdefault(job_id, {})
            ptally = self._window_ptally.setdefault(job_id, {})
            _count(self._window_tally.setdefault(job_id, {}), old, w.window_start)
            old_part = streams.get(w.node, part)
            if old_part != part:  # the node's samples moved partition (gpu.samples repartitioned)
                _count(ptally.setdefault(old_part, {}), old, None)
                old = None
            streams[w.node] = part
            _count(ptally.setdefault(part, {}), old, w.window_start)
        groups = self._windows.get(job_id)
        if not groups:
            return []
        tally = self._window_tally[job_id]
        backstop = _upper_median(tally) - WINDOW_LAG * size
        # every node of the job reported a newer window or is silent on its partition: only when
        # all the nodes Slurm gives the job have reported (one that has not yet is not ahead of
        # anything, and its partition is not known); never before the job's running state has
        # been read (the nodes that reported first are not the job: the event lane that reads
        # slurm.jobs can be behind the sample lane, at start-up or under load)
        # (counted by the nodes whose partition is known: a state saved before partitions were
        # tracked knows none, and its nodes count only once they report again)
        frontier = -math.inf
        nodes = self.nodes_in_job(job_id)
        if nodes and len(self._window_stream.get(job_id, ())) >= nodes:
            bounds = []
            progress_of = self._window_progress.get(job_id, {})
            for p, pt in self._window_ptally.get(job_id, {}).items():
                if not pt:
                    continue
                f = min(pt) - size / 2  # a start before every mark of the partition's nodes
                reached = progress_of.get(p) if p >= 0 else None
                if reached is not None:
                    f = max(f, reached - (STREAM_LAG + 1) * size)
                bounds.append(f)
            if bounds:
                frontier = min(bounds)
        ready = [
            start
            for start in sorted(groups)
            if start <= frontier or start <= backstop or (w.job_gpus is not None and len(groups[start]) >= w.job_gpus)
        ]
        out = self._evaluate_starts(job_id, groups, ready)
        if job_id in self._ended_jobs and not groups:
            self._drop_job_state(job_id)  # a window closed after the job's end: evaluated, nothing waits
        return out

    def _evaluate_starts(
        self, job_id: str, groups: dict[float, dict[tuple[str, int], JobWindow]], ready: list[float]
    ) -> list[Failure]:
        """The job rules over each of ``ready`` (window starts of ``groups``, in order), each
        popped from ``groups``, marked evaluated and added to the job's history."""
        out: list[Failure] = []
        for start in ready:
            windows = sorted(groups.pop(start).values(), key=lambda x: (x.node, x.gpu_index))
            self._window_done[job_id] = max(start, self._window_done.get(job_id, start))
            history = self._history.setdefault(job_id, [])
            first = windows[0]
            ctx = self._job_ctx.get(job_id)
            if ctx is None:
                ctx = self._job_ctx[job_id] = JobContext(self._job_starts.get(job_id, first.window_start))
            ctx.observe(windows)
            by_gpu: dict[tuple[str, int | None], JobWindow] = {}  # a reading's window: one lookup, not a scan
            for x in windows:
                by_gpu.setdefault((x.node, x.gpu_index), x)
                by_gpu.setdefault((x.node, None), x)
            for rule in self._by_scope["job"]:
                for node, gpu, reading in evaluate_job(rule.signal, windows, history, ctx):
                    src = by_gpu.get((node, gpu), first)
                    job = GpuAttribution(
                        gpu_index=src.gpu_index,
                        job_id=src.job_id,
                        user=src.user,
                        partition=src.partition,
                        job_gpus=src.job_gpus,
                    )
                    out += self._cond(rule, node, gpu, src.window_end, reading, job, "job.windows")
            history.append(windows)
            del history[: -self.window_history]
        return out

    def flush_job_windows(self) -> list[Failure]:
        """The end of a finite stream (``analyze``, the in-process runner): every job window start
        still waiting for a node (silent near the end) is evaluated with the windows it has, in
        order, as the backstop would have done had the stream gone on."""
        out: list[Failure] = []
        for job_id in list(self._windows):
            groups = self._windows.get(job_id)
            if groups:
                out += self._evaluate_starts(job_id, groups, sorted(groups))
            if job_id in self._ended_jobs:
                self._drop_job_state(job_id)
        return out

    def _job_started(self, job: JobState) -> None:
        """A running job's start time (the origin of its start-up grace, ``JobContext``) and node count."""
        # the nodes that will send the job's windows: those holding its GPUs (a node of the job
        # without any of its GPUs sends none); every node when Slurm named no GPUs
        with_gpus = {n for n, gpus in job.gpus.items() if gpus}
        if self._ended_jobs.pop(job.job_id, None) is not None:  # running again (requeued)
            self._ending().pop(job.job_id, None)
        if with_gpus or job.nodes:
            self._job_nodes[job.job_id] = len(with_gpus or set(job.nodes))
        if job.start_ts is None:
            return
        self._job_starts[job.job_id] = job.start_ts
        if job.job_id in self._job_ctx:
            self._job_ctx[job.job_id].start_ts = job.start_ts

    def _forget_job(self, job_id: str, end_ts: float) -> None:
        """A job that ended at ``end_ts`` (epoch s). With no window start waiting, its windows,
        progress and history go now; with some (a node behind, or silent), they stay until those
        are evaluated, at the latest :data:`ENDED_WAIT_S` after the end on the detector's watermark
        (:meth:`ended_jobs_due`). Its node count and its last evaluated window start stay (for the
        last :data:`ENDED_JOBS_KEPT` ended jobs): its last windows close after its end, and a window
        of a start already evaluated is late, never a group of its own."""
        nodes = self._job_nodes.pop(job_id, 0) or self._ended_jobs.pop(job_id, 0)
        if self._windows.get(job_id):
            self._ending()[job_id] = end_ts + ENDED_WAIT_S
        else:
            self._drop_job_state(job_id)
        self._ended_jobs[job_id] = nodes
        while len(self._ended_jobs) > ENDED_JOBS_KEPT:
            oldest = next(iter(self._ended_jobs))
            del self._ended_jobs[oldest]
            self._drop_job_state(oldest)
            self._window_done.pop(oldest, None)

    def _ending(self) -> dict[str, float]:
        """Ended job -> when its waiting window starts are evaluated without the missing nodes
        (event time, s). Kept in ``__dict__``: a snapshot from before it restores."""
        ending: dict[str, float] = self.__dict__.setdefault("ending", {})
        return ending

    def ended_jobs_due(self, clock: float) -> list[Failure]:
        """The window starts still waiting of every ended job whose wait (:data:`ENDED_WAIT_S`)
        the watermark ``clock`` (epoch s) has passed, evaluated with the windows they have; the
        job's state then goes."""
        ending = self.__dict__.get("ending")
        if not ending:
            return []
        out: list[Failure] = []
        for job_id in [j for j, due in ending.items() if due <= clock]:
            groups = self._windows.get(job_id)
            if groups:
                out += self._evaluate_starts(job_id, groups, sorted(groups))
            self._drop_job_state(job_id)
        return out

    def _drop_job_state(self, job_id: str) -> None:
        """Every per-job dict but the node count and the last evaluated window start."""
        self._ending().pop(job_id, None)
        self._windows.pop(job_id, None)
        self._window_marks.pop(job_id, None)
        self._window_tally.pop(job_id, None)
        self._window_ptally.pop(job_id, None)
        self._window_stream.pop(job_id, None)
        self._window_progress.pop(job_id, None)
        self._history.pop(job_id, None)
        self._job_ctx.pop(job_id, None)
        self._job_starts.pop(job_id, None)


def _upper_median(tally: dict[float, int]) -> float:
    """The upper median of the nodes' newest window starts (``tally``: start -> how many nodes
    have it as their newest; not empty): the newest with one or two nodes."""
    if len(tally) == 1:
        return next(iter(tally))
    need = (sum(tally.values()) + 1) // 2
    for start in sorted(tally, reverse=True):
        need -= tally[start]
        if need <= 0:
            return start
    return min(tally)  # pragma: no cover - the counts are positive


def _count(tally: dict[float, int], old: float | None, new: float | None) -> None:
    """Move one node's count in ``tally`` from window start ``old`` to ``new`` (None: none)."""
    if old is not None:
        if tally.get(old, 0) <= 1:
            tally.pop(old, None)
        else:
            tally[old] -= 1
    if new is not None:
        tally[new] = tally.get(new, 0) + 1
