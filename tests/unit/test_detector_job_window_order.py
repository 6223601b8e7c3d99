"""Job windows that arrive out of step (issue 23, event time end to end): a node whose windows
come after the job's window start was evaluated is late (counted, never evaluated as a group of
its own), and a window start waits for every node Slurm gives the job, not only those that have
reported. Found by the 12-node ``partial-idle-large-job`` scenario at 50x under a CPU hog: a late
node's first windows, evaluated alone and after the job's later windows, read as the whole job
stalling (false ``checkpoint-stall``)."""

from __future__ import annotations

from typing import Any

from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.jobwindows import WINDOW_LAG
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


def test_without_the_jobs_state_the_nodes_that_reported_decide() -> None:
    """No JobState seen (the node count unknown): as before, the nodes that reported."""
    d = Detector(load_catalog())
    for k in range(3):
        for n in ("n1", "n2"):
            for w in _windows(n, k):
                d.on_window(w)
    assert [g[0].window_start for g in d._history["88"]] == [T0, T0 + 10]


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
