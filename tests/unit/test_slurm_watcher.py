"""slurm-watcher: the pure diff, and poll_once against FakeSlurm with an in-memory bus."""

from __future__ import annotations

import pytest

from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.slurm import FakeSlurm, SlurmError
from gpuwarden.slurm_watcher import GONE_STATE, SlurmWatcher, SlurmWatcherSettings, diff_jobs, diff_nodes


def job(jid: str, state: str = "RUNNING", ts: float = 100.0, **kw: object) -> JobState:
    return JobState(
        job_id=jid, ts=ts, state=state, nodes=["gpu-node-001"], gpus={"gpu-node-001": [0, 1]}, start_ts=90.0, **kw
    )  # type: ignore[arg-type]


def node(name: str, ts: float = 100.0, **kw: object) -> NodeState:
    return NodeState(node=name, ts=ts, state=kw.pop("state", "IDLE"), **kw)  # type: ignore[arg-type]


def test_diff_jobs_new_changed_unchanged_gone() -> None:
    changed, seen = diff_jobs({}, [job("1"), job("2", "PENDING")], 100)
    assert [j.job_id for j in changed] == ["1", "2"]
    changed, seen = diff_jobs(seen, [job("1", ts=102), job("2", "PENDING", ts=102)], 102)
    assert changed == []  # only ts differs
    changed, seen = diff_jobs(seen, [job("1", ts=104), job("2", "RUNNING", ts=104)], 104)
    assert [(j.job_id, j.state) for j in changed] == [("2", "RUNNING")]
    changed, seen = diff_jobs(seen, [job("1", ts=106)], 106)
    assert [(j.job_id, j.state, j.end_ts, j.ts) for j in changed] == [("2", GONE_STATE, 106, 106)]
    assert set(seen) == {"1"}


def test_diff_jobs_terminal_state_then_gone_emits_nothing_more() -> None:
    _, seen = diff_jobs({}, [job("1")], 100)
    changed, seen = diff_jobs(seen, [job("1", "COMPLETED", ts=110, exit_code=0)], 110)
    assert [(j.state, j.exit_code) for j in changed] == [("COMPLETED", 0)]
    changed, seen = diff_jobs(seen, [], 400)
    assert changed == [] and seen == {}


def test_diff_nodes() -> None:
    changed, seen = diff_nodes({}, [node("a"), node("b")])
    assert len(changed) == 2
    changed, seen = diff_nodes(seen, [node("a", ts=200), node("b", ts=200, flags=["DRAIN"], reason="x")])
    assert [(n.node, n.flags) for n in changed] == [("b", ["DRAIN"])]


class MemProducer(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


@pytest.fixture
def watcher() -> tuple[SlurmWatcher, FakeSlurm, MemProducer]:
    fake = FakeSlurm(nodes=[node("gpu-node-001"), node("gpu-node-002")], jobs=[job("1")])
    prod = MemProducer()
    s = SlurmWatcherSettings(slurm_watcher_snapshot_s=3600)
    w = SlurmWatcher(s, client=fake, producer=prod, now=lambda: 100.0)  # type: ignore[arg-type]
    return w, fake, prod


async def test_poll_publishes_snapshot_then_only_changes(watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer]) -> None:
    w, fake, prod = watcher
    assert await w.poll_once() == 3
    assert all(v.snapshot for v in prod.of("slurm.jobs") + prod.of("slurm.nodes"))
    assert [k for t, k, _ in prod.sent] == ["1", "gpu-node-001", "gpu-node-002"]
    prod.sent.clear()
    assert await w.poll_once() == 0
    await fake.update_node("gpu-node-002", "DRAIN", "gpuwarden: r gpu=0 failure=f")
    fake.jobs_list = []
    assert await w.poll_once() == 2
    (gone,) = prod.of("slurm.jobs")
    (drained,) = prod.of("slurm.nodes")
    assert gone.state == GONE_STATE and not gone.snapshot
    assert drained.node == "gpu-node-002" and drained.drained and drained.reason.startswith("gpuwarden:")
    prod.sent.clear()
    assert await w.poll_once(force_snapshot=True) == 2  # snapshot: every node, no jobs left
    assert all(v.snapshot for _, _, v in prod.sent)


async def test_poll_survives_slurm_errors(watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer]) -> None:
    w, fake, _prod = watcher
    fake.raise_on_read = SlurmError("squeue --json failed (exit 1): Unable to contact slurm controller")
    assert await w.poll_once() == 0
    assert w.last_error is not None and "Unable to contact" in w.last_error
    fake.raise_on_read = None
    assert await w.poll_once() == 3  # the snapshot is retried after a failed one
    assert w.health()["polls"] == 2
