"""Job windows that arrive out of step (issue 23, event time end to end): a node whose windows
come after the job's window start was evaluated is late (counted, never evaluated as a group of
its own), and a window start waits for every node Slurm gives the job, not only those that have
reported. Found by the 12-node ``partial-idle-large-job`` scenario at 50x under a CPU hog: a late
node's first windows, evaluated alone and after the job's later windows, read as the whole job
stalling (false ``checkpoint-stall``)."""

from __future__ import annotations

from typing import Any

from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.jobwindows import STREAM_LAG, WINDOW_LAG
from gpuwarden.shared.models import JobState, JobWindow

T0 = 1_700_000_000.0


def _windows(node: str, k: int, gpus: int = 4, **kw: Any) -> list[JobWindow]:
    base: dict[str, Any] = dict(job_id="88", node=node, user="bob", partition="gpu", job_gpus=12,
                                window_start=T0 + 10 * k, window_end=T0 + 10 * k + 10, samples=10,
                                utilization_gpu_pct_mean=95.0, utilization_gpu_pct_max=99.0, power_w_mean=650.0,
                                power_limit_w=700.0)  # fmt: skip
    return [JobWindow(gpu_index=g, **base, **kw) for g in range(gpus)]


def _running(d: Detector, nodes: list[str]) -> None:
    d.on_job(JobState(job_id="88", ts=T0, state="RUNNING", user="bob", nodes=nodes,
                      gpus={n: [0, 1, 2, 3] for n in nodes}, start_ts=T0))  # fmt: skip


def test_a_late_nodes_windows_are_counted_not_evaluated_alone() -> None:
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    ahead = WINDOW_LAG + 5
    for k in range(ahead):  # n3 is behind: the first window starts go without it (the lag rule)
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    done = len(d._history["88"])
    assert done == ahead - WINDOW_LAG
    for k in range(ahead):
        for w in _windows("n3", k):
            d.on_window(w)
    assert d.late_windows == 4 * done  # its windows of the starts already evaluated
    starts = [g[0].window_start for g in d._history["88"]]
    assert starts == sorted(starts)  # no start evaluated twice, none out of order
    assert all({w.node for w in g} != {"n3"} for g in d._history["88"])


def test_a_window_start_waits_for_every_node_of_the_job() -> None:
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    for k in range(3):  # two of three nodes past start 0: not complete (n3 has not reported)
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert "88" not in d._history or not d._history["88"]
    for k in range(2):
        for w in _windows("n3", k):
            d.on_window(w)
    first = d._history["88"][0]
    assert first[0].window_start == T0 and {w.node for w in first} == {"n1", "n2", "n3"}
    assert d.late_windows == 0


def test_without_the_jobs_state_a_start_waits_for_all_its_gpus() -> None:
    """No JobState read yet (the event lane behind the sample lane): the nodes that reported
    first are not the job. Found by ``partial-idle-large-job`` at 50x under a CPU hog: 3 of 8
    nodes' first windows evaluated as the job, the other 5 nodes' windows late, three node-level
    findings instead of one for the job. A start waits for all the job's GPUs (``job_gpus``,
    from the windows) or the backstop."""
    d = Detector(load_catalog())
    for k in range(3):
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert not d._history.get("88")
    _running(d, ["n1", "n2", "n3"])
    for k in range(3):
        for w in _windows("n3", k):
            d.on_window(w)
    assert _starts(d) == [0, 10, 20]  # every GPU of the job: complete, whole
    assert all({w.node for w in g} == {"n1", "n2", "n3"} for g in d._history["88"])
    assert d.late_windows == 0


def test_without_the_jobs_state_the_backstop_still_ends_the_wait() -> None:
    d = Detector(load_catalog())
    for k in range(WINDOW_LAG + 1):
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert _starts(d) == [0]


def test_a_node_of_the_job_without_its_gpus_is_not_waited_for() -> None:
    """Slurm lists n3 in the job but gives it none of the job's GPUs: it sends no windows, and a
    window start is complete once n1 and n2 have passed it (not only by the 6-window lag)."""
    d = Detector(load_catalog())
    d.on_job(JobState(job_id="88", ts=T0, state="RUNNING", user="bob", nodes=["n1", "n2", "n3"],
                      gpus={"n1": [0, 1, 2, 3], "n2": [0, 1, 2, 3]}, start_ts=T0))  # fmt: skip
    for k in range(2):
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert [g[0].window_start for g in d._history["88"]] == [T0]


def _streamed(node: str, k: int, partition: int, progress_k: float) -> list[JobWindow]:
    """``node``'s windows of start k, closed when its correlator partition had reached the end
    of window ``progress_k`` plus the 5 s grace."""
    return _windows(node, k, stream_partition=partition, stream_ts=T0 + 10 * progress_k + 15)


def _starts(d: Detector) -> list[float]:
    return [g[0].window_start - T0 for g in d._history.get("88", [])]


def test_a_partition_that_is_behind_holds_the_window_instead_of_losing_its_nodes() -> None:
    """n3's correlator partition is 20 windows behind n1's and n2's (a worker restarting, a
    replay at 50x under load): the job's windows wait for it, far past the 6 windows that once
    split the job, and every window start is evaluated whole once it comes (issue 23: the large
    job scenarios at 50x under a CPU hog)."""
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    behind = 20
    for w in _streamed("n3", 0, 1, 0):
        d.on_window(w)
    for k in range(behind):
        for n in ("n1", "n2"):
            for w in _streamed(n, k, 0, k):
                d.on_window(w)
    assert _starts(d) == [0], "evaluated without the node of the partition that is behind"
    for k in range(1, behind):
        for w in _streamed("n3", k, 1, k):
            d.on_window(w)
    assert _starts(d) == [10 * k for k in range(behind)]
    assert all({w.node for w in g} == {"n1", "n2", "n3"} for g in d._history["88"])
    assert d.late_windows == 0


def test_a_node_silent_on_its_own_partition_stops_holding_the_job() -> None:
    """n3 shares partition 0 with n1 and n2 and stops reporting after its first window: once
    partition 0 is STREAM_LAG windows past a window's end, the window start goes without n3."""
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    for n in ("n1", "n2", "n3"):
        for w in _streamed(n, 0, 0, 0):
            d.on_window(w)
    ahead = STREAM_LAG + 6
    for k in range(1, ahead):
        for n in ("n1", "n2"):
            for w in _streamed(n, k, 0, k):
                d.on_window(w)
    # the partition reached window ahead - 1 (+ grace): the starts up to STREAM_LAG before it
    assert _starts(d) == [10 * k for k in range(ahead - STREAM_LAG)]
    history = d._history["88"]
    assert {w.node for w in history[0]} == {"n1", "n2", "n3"}
    assert all({w.node for w in g} == {"n1", "n2"} for g in history[1:])


def test_windows_without_a_partition_wait_for_the_backstop() -> None:
    """Windows from an older correlator name no partition: only every node's newer window, all
    the job's GPUs, or the WINDOW_LAG backstop makes a start ready."""
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    for w in _windows("n3", 0):
        d.on_window(w)
    for k in range(WINDOW_LAG + 1):
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert _starts(d) == [0]  # complete: every GPU of the job
    for n in ("n1", "n2"):
        for w in _windows(n, WINDOW_LAG + 1):
            d.on_window(w)
    assert _starts(d) == [0, 10]


def test_another_jobs_window_ahead_does_not_make_this_jobs_nodes_silent() -> None:
    """Progress is the job's own: a window of another job from the same correlator partition that
    is consumed first (it sits in another job.windows partition) or comes from a node whose clock
    runs ahead says nothing about this job's nodes (found by review: one such window made every
    later start of the job go with its first GPU window, the rest late)."""
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    d.on_job(JobState(job_id="99", ts=T0, state="RUNNING", user="eve", nodes=["m1"], gpus={"m1": [0]},
                      start_ts=T0))  # fmt: skip
    for n in ("n1", "n2", "n3"):
        for w in _streamed(n, 0, 0, 0):
            d.on_window(w)
    far = JobWindow(job_id="99", node="m1", gpu_index=0, job_gpus=1, window_start=T0 + 90, window_end=T0 + 100,
                    samples=10, stream_partition=0, stream_ts=T0 + 105)  # fmt: skip
    d.on_window(far)
    for k in (1, 2, 3):
        for n in ("n1", "n2"):
            for w in _streamed(n, k, 0, k):
                d.on_window(w)
    assert _starts(d) == [0]  # starts 1-3 wait for n3
    for k in (1, 2, 3):
        for w in _streamed("n3", k, 0, k):
            d.on_window(w)
    assert _starts(d) == [0, 10, 20, 30] and d.late_windows == 0


def test_an_ended_jobs_last_windows_are_late_or_evaluated_and_leave_no_state() -> None:
    """A job's last windows close after its end (grace, Slurm hold): a start already evaluated
    stays evaluated (its late windows are counted, never a group of their own), a complete one is
    evaluated, and nothing of the job is kept after but its node count and last start."""
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    for k in range(2):
        for n in ("n1", "n2", "n3"):
            for w in _streamed(n, k, 0, k):
                d.on_window(w)
    assert _starts(d) == [0, 10]
    d.on_job(JobState(job_id="88", ts=T0 + 25, state="COMPLETED", user="bob", nodes=["n1", "n2", "n3"],
                      gpus={n: [0, 1, 2, 3] for n in ("n1", "n2", "n3")}, start_ts=T0, end_ts=T0 + 25))  # fmt: skip
    assert d.nodes_in_job("88") == 3
    for w in _streamed("n1", 1, 0, 1):  # a redelivered window of an evaluated start
        d.on_window(w)
    assert d.late_windows == 4
    for n in ("n1", "n2", "n3"):  # the last window, closed after the end
        for w in _streamed(n, 2, 0, 2):
            d.on_window(w)
    for state in (d._windows, d._window_marks, d._window_tally, d._window_ptally, d._window_stream,
                  d._window_progress, d._history, d._job_ctx):  # fmt: skip
        assert "88" not in state, state
    assert d._window_done["88"] == T0 + 20
    # running again (requeued): its state is kept while it runs
    _running(d, ["n1", "n2", "n3"])
    for n in ("n1", "n2", "n3"):
        for w in _streamed(n, 40, 0, 40):
            d.on_window(w)
    assert "88" in d._history


def test_the_end_of_a_finite_stream_evaluates_the_starts_still_waiting() -> None:
    """``analyze`` and the in-process runner end with ``flush()``: a start still waiting for a node
    that went silent near the end is evaluated with the windows it has (it used to be dropped:
    its job rules never ran)."""
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    for k in range(4):  # n3 silent from the start: starts 0-3 wait (no backstop within 4 windows)
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert not d._history.get("88")
    d.flush()
    assert _starts(d) == [0.0, 10.0, 20.0, 30.0]
    assert all({w.node for w in g} == {"n1", "n2"} for g in d._history["88"])
    assert not d._windows.get("88")
    assert d.flush() == [] and _starts(d) == [0.0, 10.0, 20.0, 30.0]  # nothing evaluated twice


def test_an_ended_jobs_starts_waiting_for_a_silent_node_are_evaluated_after_a_bounded_wait() -> None:
    """A node silent at the job's end never completes the job's last window starts, and the
    job's own progress stops with its last windows: they are evaluated with the windows they have
    once the detector's watermark is ENDED_WAIT_S past the end, and the job's state goes (it
    waited until 10,000 more jobs had ended)."""
    from gpuwarden.detector.jobwindows import ENDED_WAIT_S
    from gpuwarden.shared.models import AttributedSample, GpuSample, NodeSample

    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3"])
    for k in range(3):  # n3 silent: starts 0-2 wait (its partition is not known, no backstop yet)
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert not d._history.get("88")
    d.on_job(JobState(job_id="88", ts=T0 + 30, state="FAILED", user="bob", nodes=["n1", "n2", "n3"],
                      gpus={n: [0, 1, 2, 3] for n in ("n1", "n2", "n3")}, start_ts=T0, end_ts=T0 + 30))  # fmt: skip
    assert d._windows.get("88")  # kept: still waiting
    for w in _windows("n1", 3):  # a window closed after the end waits too
        d.on_window(w)

    def tick(ts: float) -> None:
        ns = NodeSample(node="n9", ts=ts, collector_id="c", source="test", gpus=[GpuSample(index=0)])
        d.on_sample(AttributedSample(sample=ns, jobs=[]), 0)

    tick(T0 + 30 + ENDED_WAIT_S - 10)
    assert "88" in d._windows  # not yet
    tick(T0 + 40 + ENDED_WAIT_S + 1)
    assert "88" not in d._windows and "88" not in d._history
    assert d._window_done["88"] == T0 + 30  # starts 0-3 were evaluated, the late n1 window too
    assert not d.__dict__.get("ending")


def test_a_node_clock_ahead_does_not_evaluate_the_others_windows_before_they_come() -> None:
    """n4's clock runs 400 s ahead (40 windows, past the 30-window backstop): the window starts
    of n1-n3 are still evaluated only once all of them have reported, whole, none late. (Until
    three nodes have reported, the upper median is the newest: with n4 and one other alone, a
    start could go early; here n1-n3 report first.)"""
    d = Detector(load_catalog())
    _running(d, ["n1", "n2", "n3", "n4"])
    for k in range(10):
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
        for w in _windows("n4", k + 40):
            d.on_window(w)
        for w in _windows("n3", k):
            d.on_window(w)
    assert d.late_windows == 0
    groups = d._history["88"]
    assert len(groups) >= 8 and all({w.node for w in g} == {"n1", "n2", "n3"} for g in groups)
