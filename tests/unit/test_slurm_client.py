"""CliSlurm with a fake runner replaying recorded output; SimulatedSlurm; FakeSlurm."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest

from gpuwarden.shared.command import AsyncSubprocessRunner, CommandNotFound, CommandTimeout
from gpuwarden.shared.models import JobState
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.shared.slurm import CliSlurm, CommandResult, SlurmError, drain_argv, ended_after, sacct_ended_argv
from gpuwarden.sim.slurm import SimulatedSlurm

LOCAL = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "local-22.05"


class ReplayRunner:
    """Answers argv prefixes with canned results, in order; records every call."""

    def __init__(self, answers: dict[tuple[str, ...], list[tuple[int, str, str]]]) -> None:
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls: list[list[str]] = []

    async def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(list(argv))
        for prefix, queue in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix and queue:
                rc, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
                return CommandResult(list(argv), rc, out, err, 0.01)
        raise AssertionError(f"unexpected command {argv}")


def cli(runner: ReplayRunner, **kw: object) -> CliSlurm:
    return CliSlurm(runner, timeout_s=1, retries=2, backoff_s=0, now=lambda: 1796023520.0, **kw)  # type: ignore[arg-type]


async def test_jobs_from_squeue_json() -> None:
    r = ReplayRunner({("squeue", "--json"): [(0, (LOCAL / "squeue.json").read_text(), "")]})
    jobs = await cli(r).jobs()
    assert {j.job_id: j.gpus for j in jobs if j.state == "RUNNING"} == {
        "1": {"gpu-node-001": [0, 1, 2, 3]},
        "2": {"gpu-node-002": list(range(8)), "gpu-node-003": list(range(8))},
    }
    assert r.calls == [["squeue", "--json"]]


async def test_jobs_fall_back_to_scontrol_detail() -> None:
    import json

    doc = json.loads((LOCAL / "squeue.json").read_text())
    for j in doc["jobs"]:
        j["gres_detail"] = []
        if j["job_id"] == 1:
            j["gres_detail"] = ["gpu:4(IDX:0-3)", "extra"]  # cannot be matched to its one node
    detail = (LOCAL / "scontrol-show-job-d.txt").read_text()
    r = ReplayRunner({("squeue",): [(0, json.dumps(doc), "")], ("scontrol", "show", "job"): [(0, detail, "")]})
    jobs = await cli(r).jobs()
    assert next(j for j in jobs if j.job_id == "1").gpus == {"gpu-node-001": [0, 1, 2, 3]}
    assert ["scontrol", "show", "job", "-d", "1"] in r.calls


async def test_read_retries_then_raises() -> None:
    r = ReplayRunner({("sinfo",): [(124, "", "timed out after 1s")]})
    with pytest.raises(SlurmError) as ei:
        await cli(r).nodes()
    assert len(r.calls) == 3 and ei.value.result is not None and ei.value.result.exit_code == 124


async def test_read_recovers_after_transient_error() -> None:
    good = (LOCAL / "sinfo-with-drained.json").read_text()
    r = ReplayRunner(
        {("sinfo",): [(1, "", "slurm_load_node error: Unable to contact slurm controller"), (0, good, "")]}
    )
    nodes = await cli(r).nodes()
    assert len(r.calls) == 2 and sum(n.drained for n in nodes) == 2


async def test_node_found_and_not_found() -> None:
    text = (LOCAL / "scontrol-show-node-all-with-drained.txt").read_text()
    r = ReplayRunner(
        {
            ("scontrol", "show", "node", "gpu-node-002"): [(0, text, "")],
            ("scontrol", "show", "node", "nope"): [(1, "Node nope not found\n", "")],
        }
    )
    c = cli(r)
    n = await c.node("gpu-node-002")
    assert n is not None and n.drained and n.reason == "test drain: bad gpu"
    assert await c.node("nope") is None
    with pytest.raises(ValueError):
        await c.node("x; reboot")


async def test_update_node_argv_and_refusal() -> None:
    refused = "You must specify a reason when DOWNING or DRAINING a node. Request denied"
    r = ReplayRunner(
        {
            ("scontrol", "update", "nodename=gpu-node-002", "state=DRAIN"): [(0, "", "")],
            ("scontrol", "update", "nodename=gpu-node-003"): [(1, "", refused)],
        }
    )
    c = cli(r)
    res = await c.update_node("gpu-node-002", "DRAIN", "gpuwarden: r gpu=3 failure=abc")
    assert res.ok and res.argv == [
        "scontrol",
        "update",
        "nodename=gpu-node-002",
        "state=DRAIN",
        "reason=gpuwarden: r gpu=3 failure=abc",
    ]
    res2 = await c.update_node("gpu-node-003", "RESUME", None)
    assert res2.exit_code == 1 and "Request denied" in res2.stderr
    assert len([a for a in r.calls if a[2] == "nodename=gpu-node-003"]) == 1  # not transient: no retry
    with pytest.raises(ValueError):
        await c.update_node("gpu-node-002", "DRAIN", None)
    with pytest.raises(ValueError):
        await c.update_node("gpu-node-002", "DRAIN", "two\nlines")


def test_drain_argv_never_a_shell_string() -> None:
    argv = drain_argv("n1", "DRAIN", "a reason with spaces; and $(stuff)")
    assert argv[-1] == "reason=a reason with spaces; and $(stuff)" and len(argv) == 5


async def test_subprocess_runner_timeout_and_missing_binary() -> None:
    """The runner raises on a timeout / missing program; CliSlurm sees them as exit 124 / 127."""
    r = AsyncSubprocessRunner()
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout):
        await r.run(["sleep", "5"], 0.2)
    assert time.monotonic() - t0 < 2
    with pytest.raises(CommandNotFound):
        await r.run(["/nonexistent/scontrol"], 1)
    res = await r.run(["sh", "-c", "echo out; echo err >&2; exit 3"], 5)
    assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")
    with pytest.raises(ValueError, match="shell string"):
        await r.run("scontrol show node x", 1)  # type: ignore[arg-type]

    missing = CliSlurm(r, timeout_s=1, retries=2, backoff_s=0, bin_prefix="/nonexistent/")
    with pytest.raises(SlurmError) as ei:
        await missing.nodes()
    assert ei.value.result is not None and ei.value.result.exit_code == 127
    res = await missing.update_node("gpu-node-001", "RESUME", None)
    assert res.exit_code == 127 and not res.ok

    class Sleeps(AsyncSubprocessRunner):
        async def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
            return await super().run(["sleep", "5"], timeout_s)

    hang = CliSlurm(Sleeps(), timeout_s=0.2, retries=1, backoff_s=0)
    t0 = time.monotonic()
    with pytest.raises(SlurmError) as ei:
        await hang.nodes()
    assert ei.value.result is not None and ei.value.result.exit_code == 124 and time.monotonic() - t0 < 2


def _scenario() -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "duration_s": 100,
            "cluster": {"nodes": 3, "gpus_per_node": 4},
            "jobs": [
                {"id": 11, "nodes": "gpu-node-[001-002]", "gpus_per_node": 4, "start_s": 0, "end_s": 50},
                {"id": 12, "nodes": "gpu-node-003", "gpus_per_node": 2, "start_s": 10},
            ],
        }
    )


class FixedClock(ScenarioClock):
    def __init__(self, t: float) -> None:
        super().__init__(1_000_000.0)
        self.t = t

    def scenario_s(self, wall: float | None = None) -> float:
        return self.t


async def test_simulated_slurm_jobs_nodes_and_shared_drain_state(tmp_path: Path) -> None:
    clock = FixedClock(5)
    sim = SimulatedSlurm(_scenario(), clock, tmp_path / "state.json")
    jobs = await sim.jobs()
    assert [(j.job_id, j.state) for j in jobs] == [("11", "RUNNING")]
    assert jobs[0].gpus == {"gpu-node-001": [0, 1, 2, 3], "gpu-node-002": [0, 1, 2, 3]}
    assert jobs[0].start_ts == clock.event_ts(0) and jobs[0].ts == clock.event_ts(5)
    clock.t = 20
    states = {n.node: n.state for n in await sim.nodes()}
    assert states == {"gpu-node-001": "ALLOCATED", "gpu-node-002": "ALLOCATED", "gpu-node-003": "MIXED"}
    clock.t = 60
    by = {j.job_id: j for j in await sim.jobs()}
    assert by["11"].state == "COMPLETED" and by["11"].exit_code == 0 and by["12"].state == "RUNNING"
    assert (await sim.node("gpu-node-001")).state == "IDLE"  # type: ignore[union-attr]

    with pytest.raises(ValueError):
        await sim.update_node("gpu-node-002", "DRAIN", "")
    res = await sim.update_node("gpu-node-002", "DRAIN", "gpuwarden: r gpu=1 failure=f1")
    assert res.ok
    other = SimulatedSlurm(_scenario(), clock, tmp_path / "state.json")  # e.g. the watcher process
    n2 = await other.node("gpu-node-002")
    assert n2 is not None and n2.flags == ["DRAIN"] and n2.reason == "gpuwarden: r gpu=1 failure=f1"
    assert n2.reason_ts == clock.event_ts(60)
    assert (await sim.update_node("gpu-node-999", "RESUME", None)).exit_code == 1
    assert await sim.node("gpu-node-999") is None
    assert (await other.update_node("gpu-node-002", "RESUME", None)).ok
    assert not (await sim.node("gpu-node-002")).drained  # type: ignore[union-attr]


async def test_simulated_slurm_node_is_the_node_of_the_cluster_listing(tmp_path: Path) -> None:
    """``node(N)`` builds one node (the remediator reads one per failure: at 3,125 nodes building
    them all took most of its CPU) and answers exactly what ``nodes()`` lists for N."""
    clock = FixedClock(0)
    sim = SimulatedSlurm(_scenario(), clock, tmp_path / "state.json")
    assert (await sim.update_node("gpu-node-003", "DRAIN", "gpuwarden: r gpu=0 failure=f2")).ok
    for t in (0, 5, 20, 45, 60, 500):
        clock.t = t
        listing = {n.node: n for n in await sim.nodes()}
        assert len(listing) == 3
        for name, state in listing.items():
            assert await sim.node(name) == state, (t, name)


async def test_ended_since_argv_and_window_filter() -> None:
    """``sacct -S <since> -s <terminal states>`` as an argv list; records ending before are dropped."""
    since = 1796023514.0
    r = ReplayRunner({("sacct", "--json"): [(0, (LOCAL / "sacct.json").read_text(), "")]})
    ended = await cli(r).ended_since(since)
    assert sorted(j.job_id for j in ended) == ["1", "2", "3", "5"]  # job 4 ended at ...513
    assert all(j.confirmed for j in ended)
    (argv,) = r.calls
    assert argv == sacct_ended_argv(since) and argv[:5] == ["sacct", "--json", "-X", "-a", "-S"]
    assert argv[6:] == ["-E", "now", "-s", "CD,F,CA,TO,NF,PR,OOM,BF,DL"]
    assert datetime.fromisoformat(argv[5]).timestamp() == since  # local time, as sacct reads it
    r_fail = ReplayRunner({("sacct",): [(1, "", "sacct: error: slurmdbd: Connection refused")]})
    with pytest.raises(SlurmError, match="sacct"):
        await cli(r_fail).ended_since(since)


def test_ended_after_keeps_terminal_records_in_the_window() -> None:
    def rec(jid: str, state: str, end: float | None) -> JobState:
        return JobState(job_id=jid, ts=1.0, state=state, end_ts=end)

    got = ended_after([rec("1", "COMPLETED", 10.0), rec("2", "FAILED", 5.0), rec("3", "RUNNING", None)], 8.0)
    assert [j.job_id for j in got] == ["1"]
    assert [j.job_id for j in ended_after([rec("4", "CANCELLED", None)], 8.0)] == ["4"]
