"""slurm-watcher: the pure diff, and poll_once against FakeSlurm with an in-memory bus."""

from __future__ import annotations

import pytest

from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.slurm import SlurmError
from gpuwarden.sim.slurm import FakeSlurm
from gpuwarden.slurm_watcher import GONE_STATE, SlurmWatcher, SlurmWatcherSettings, diff_jobs, diff_nodes
from gpuwarden.slurm_watcher.diff import resolve_ends


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
    assert [k for t, k, _ in prod.sent if t != "slurm.watermarks"] == ["1", "gpu-node-001", "gpu-node-002"]
    prod.sent.clear()
    assert await w.poll_once() == 0
    await fake.update_node("gpu-node-002", "DRAIN", "gpuwarden: r gpu=0 failure=f")
    fake.jobs_list = []
    fake.accounting_map["1"] = job("1", "COMPLETED", end_ts=99.0, exit_code=0, confirmed=True)
    assert await w.poll_once() == 2
    (gone,) = prod.of("slurm.jobs")
    (drained,) = prod.of("slurm.nodes")
    assert (gone.state, gone.confirmed, gone.end_ts, gone.gpus) == ("COMPLETED", True, 99.0, {"gpu-node-001": [0, 1]})
    assert not gone.snapshot and fake.accounting_calls == [["1"]]
    assert drained.node == "gpu-node-002" and drained.drained and drained.reason.startswith("gpuwarden:")
    prod.sent.clear()
    assert await w.poll_once(force_snapshot=True) == 2  # snapshot: every node, no jobs left
    assert all(v.snapshot for t, _, v in prod.sent if t != "slurm.watermarks")


async def test_poll_survives_slurm_errors(watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer]) -> None:
    w, fake, _prod = watcher
    fake.raise_on_read = SlurmError("squeue --json failed (exit 1): Unable to contact slurm controller")
    assert await w.poll_once() == 0
    assert w.last_error is not None and "Unable to contact" in w.last_error
    fake.raise_on_read = None
    assert await w.poll_once() == 3  # the snapshot is retried after a failed one
    assert w.health()["polls"] == 2


async def test_vanished_job_is_not_ended_while_accounting_is_down(
    watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer],
) -> None:
    w, fake, prod = watcher
    w.settings.slurm_watcher_gone_grace_polls = 3
    await w.poll_once()
    prod.sent.clear()
    fake.jobs_list = []  # squeue answers, but without the job (e.g. a slurmctld restart lost it)
    fake.accounting_error = SlurmError("sacct --json failed (exit 1): slurmdbd unreachable")
    assert await w.poll_once() == 0 and await w.poll_once() == 0
    assert w.status == "degraded" and w.health()["jobs"] == 1  # last good state kept
    assert await w.poll_once() == 1  # grace over: ENDED, explicitly unconfirmed
    (gone,) = prod.of("slurm.jobs")
    assert (gone.state, gone.confirmed, gone.gpus) == (GONE_STATE, False, {"gpu-node-001": [0, 1]})
    assert w.health()["jobs"] == 0


async def test_vanished_job_that_sacct_still_runs_is_kept(watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer]) -> None:
    w, fake, prod = watcher
    await w.poll_once()
    prod.sent.clear()
    fake.jobs_list = []
    fake.accounting_map["1"] = job("1", "RUNNING")
    assert await w.poll_once() == 0 and w.health()["jobs"] == 1
    fake.accounting_map["1"] = job("1", "FAILED", exit_code=3, end_ts=101.0, confirmed=True)
    assert await w.poll_once() == 1
    (j,) = prod.of("slurm.jobs")
    assert (j.state, j.exit_code, j.confirmed, j.end_ts) == ("FAILED", 3, True, 101.0)


async def test_squeue_end_state_confirmed_by_sacct(watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer]) -> None:
    w, fake, prod = watcher
    await w.poll_once()
    prod.sent.clear()
    fake.jobs_list = [job("1", "FAILED", exit_code=3, end_ts=105.0)]
    fake.accounting_map["1"] = job("1", "FAILED", exit_code=None, end_ts=104.0, confirmed=True)
    assert await w.poll_once() == 1
    (j,) = prod.of("slurm.jobs")
    # sacct's end time, squeue's exit code where 22.05's sacct JSON has none, squeue's GPUs
    assert (j.state, j.exit_code, j.end_ts, j.confirmed, j.gpus) == (
        "FAILED",
        3,
        104.0,
        True,
        {"gpu-node-001": [0, 1]},
    )
    assert await w.poll_once() == 0  # no flapping between the squeue and the sacct view


async def test_backoff_and_status(watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer]) -> None:
    w, fake, _ = watcher
    w.settings.slurm_watcher_max_backoff_s = 10.0
    await w.poll_once()
    assert (w.status, w.next_period(2.0)) == ("ok", 2.0)
    fake.raise_on_read = SlurmError("squeue --json failed (exit 1): Unable to contact slurm controller")
    await w.poll_once()
    assert (w.status, w.next_period(2.0)) == ("unreachable", 4.0)
    await w.poll_once()
    await w.poll_once()
    assert w.next_period(2.0) == 10.0 and w.health()["slurm_status"] == "unreachable"
    assert w.health()["jobs"] == 1  # nothing forgotten, nothing published as ended
    fake.raise_on_read = None
    await w.poll_once()
    assert (w.status, w.next_period(2.0)) == ("ok", 2.0)


def test_resolve_ends_without_record_waits_then_ends_unconfirmed() -> None:
    prev = {"7": job("7")}
    changed, seen = diff_jobs(prev, [], 200.0)
    misses: dict[str, int] = {}
    out, seen2 = resolve_ends(changed, seen, prev, {}, misses, 2, 200.0)
    assert out == [] and seen2 == prev and misses == {"7": 1}
    changed, seen = diff_jobs(seen2, [], 202.0)
    out, seen3 = resolve_ends(changed, seen, seen2, {}, misses, 2, 202.0)
    assert [(j.state, j.confirmed, j.end_ts) for j in out] == [(GONE_STATE, False, 202.0)]
    assert seen3 == {} and misses == {}


def test_resolve_ends_holds_squeue_end_until_sacct_has_it() -> None:
    prev = {"7": job("7")}
    changed, seen = diff_jobs(prev, [job("7", "COMPLETED", exit_code=0)], 200.0)
    misses: dict[str, int] = {}
    out, seen2 = resolve_ends(changed, seen, prev, {"7": job("7", "RUNNING")}, misses, 3, 200.0)
    assert out == [] and seen2["7"].state == "RUNNING"
    changed, seen = diff_jobs(seen2, [job("7", "COMPLETED", exit_code=0)], 202.0)
    acct = {"7": job("7", "COMPLETED", exit_code=0, end_ts=201.0, confirmed=True)}
    out, seen3 = resolve_ends(changed, seen, seen2, acct, misses, 3, 202.0)
    assert [(j.state, j.confirmed, j.end_ts) for j in out] == [("COMPLETED", True, 201.0)]
    assert seen3["7"].state == "COMPLETED" and misses == {}


def test_carry_gpus_through_the_end() -> None:
    from gpuwarden.slurm_watcher.diff import carry_gpus

    prev = {"1": job("1")}
    done = JobState(job_id="1", ts=110.0, state="COMPLETING", nodes=["gpu-node-001"])
    pend = JobState(job_id="2", ts=110.0, state="PENDING")
    (c, p) = carry_gpus(prev, [done, pend])
    assert c.gpus == {"gpu-node-001": [0, 1]} and p.gpus == {}
    (c2,) = carry_gpus({"1": c}, [done.model_copy(update={"state": "COMPLETED"})])
    assert c2.gpus == {"gpu-node-001": [0, 1]}


async def test_single_publisher_lease_failover() -> None:
    from gpuwarden.shared.lease import LeaseBoard, MemoryLease

    board = LeaseBoard()
    fake = FakeSlurm(nodes=[node("gpu-node-001")], jobs=[job("1")])
    s = SlurmWatcherSettings(slurm_watcher_snapshot_s=3600)
    pa, pb = MemProducer(), MemProducer()
    a = SlurmWatcher(s, client=fake, producer=pa, now=lambda: 100.0, lease=MemoryLease(board))  # type: ignore[arg-type]
    b = SlurmWatcher(s, client=fake, producer=pb, now=lambda: 100.0, lease=MemoryLease(board))  # type: ignore[arg-type]
    await a.lease.start()
    await b.lease.start()
    assert await a.poll_once() == 2 and await b.poll_once() == 0
    assert b.status == "standby" and pb.sent == []
    await a.lease.stop()  # holder gone: b takes over with a full snapshot
    fake.jobs_list = [job("1"), job("2")]
    assert await b.poll_once() == 3 and all(v.snapshot for t, _, v in pb.sent if t != "slurm.watermarks")
    assert await a.poll_once() == 0 and a.status == "standby"


async def test_takeover_publishes_ends_missed_while_no_watcher_held_the_lease() -> None:
    """Jobs that ended and left squeue during a lease gap come from sacct on takeover, once."""
    from gpuwarden.shared.lease import LeaseBoard, MemoryLease

    clock = {"t": 10_000.0}
    board = LeaseBoard()
    fake = FakeSlurm(nodes=[node("gpu-node-001")], jobs=[job("1")])
    s = SlurmWatcherSettings(slurm_watcher_snapshot_s=3600, slurm_watcher_takeover_lookback_s=600)
    pa, pb = MemProducer(), MemProducer()
    a = SlurmWatcher(s, client=fake, producer=pa, now=lambda: clock["t"], lease=MemoryLease(board))  # type: ignore[arg-type]
    b = SlurmWatcher(s, client=fake, producer=pb, now=lambda: clock["t"], lease=MemoryLease(board))  # type: ignore[arg-type]
    await b.lease.start()
    await a.lease.start()  # b holds the lease; a stands by
    assert await b.poll_once() == 2 and fake.ended_since_calls == [10_000.0 - 600]
    assert await a.poll_once() == 0
    await b.lease.stop()  # the holder dies; nobody polls for 300 s
    clock["t"] = 10_300.0
    fake.jobs_list = [job("1")]  # "2" ran, failed and left squeue in the gap; "3" ended long before
    fake.accounting_map = {
        "2": job("2", "FAILED", exit_code=3, end_ts=10_100.0, confirmed=True),
        "3": job("3", "COMPLETED", exit_code=0, end_ts=9_000.0, confirmed=True),
        "1": job("1", "RUNNING"),
    }
    fake.accounting_error = SlurmError("sacct --json failed (exit 1): slurmdbd unreachable")
    assert await a.poll_once() == 2  # snapshot (job 1 + node); recovery failed: retried next poll
    assert a.status == "degraded" and a.recovered == 0
    fake.accounting_error = None
    clock["t"] = 10_302.0
    assert await a.poll_once() == 1
    assert fake.ended_since_calls == [9_400.0, 9_700.0, 9_700.0]  # a never polled: now - look-back
    _, key, end = [m for m in pa.sent if m[0] == "slurm.jobs"][-1]
    assert (key, end.state, end.exit_code, end.end_ts, end.confirmed, end.snapshot, end.ts) == (
        "2",
        "FAILED",
        3,
        10_100.0,
        True,
        False,
        10_302.0,
    )
    assert await a.poll_once() == 0 and a.recovered == 1  # published once, not again
    assert len(fake.ended_since_calls) == 3


async def test_takeover_recovery_starts_at_own_last_poll_when_later() -> None:
    from gpuwarden.shared.lease import LeaseBoard, MemoryLease

    clock = {"t": 10_000.0}
    board = LeaseBoard()
    fake = FakeSlurm(nodes=[node("gpu-node-001")], jobs=[])
    s = SlurmWatcherSettings(slurm_watcher_snapshot_s=3600, slurm_watcher_takeover_lookback_s=600)
    lease = MemoryLease(board)
    w = SlurmWatcher(s, client=fake, producer=MemProducer(), now=lambda: clock["t"], lease=lease)  # type: ignore[arg-type]
    await lease.start()
    await w.poll_once()
    await lease.stop()
    assert await w.poll_once() == 0
    clock["t"] = 10_030.0
    await lease.start()
    await w.poll_once()
    assert fake.ended_since_calls == [9_400.0, 10_000.0]
    off = SlurmWatcher(
        SlurmWatcherSettings(slurm_watcher_takeover_lookback_s=0), client=fake, producer=MemProducer(), now=lambda: 1.0
    )  # type: ignore[arg-type]
    await off.poll_once()
    assert fake.ended_since_calls == [9_400.0, 10_000.0]  # look-back 0: recovery off


def test_kafka_lease_names_one_lease_per_cluster() -> None:
    from gpuwarden.slurm_watcher.service import kafka_lease

    lease = kafka_lease("k:9092", "gw.", "c1", 6000)
    assert (lease.topic, lease.group, lease.session_timeout_ms) == (
        "gw.slurm-watcher.lease.c1",
        "gw.slurm-watcher.c1",
        6000,
    )
    assert not lease.held()  # not started: cannot show it holds anything
    for bad in ("", "a b", "c1;rm", "x" * 101):
        with pytest.raises(ValueError, match="invalid cluster name"):
            kafka_lease("k:9092", "gw.", bad)


async def test_every_poll_publishes_a_watermark_at_its_observation_time(
    watcher: tuple[SlurmWatcher, FakeSlurm, MemProducer],
) -> None:
    """A heartbeat on slurm.watermarks after each poll whose job read worked, changes or not;
    none after a failed job read (the view is not complete)."""
    w, fake, prod = watcher
    await w.poll_once()
    await w.poll_once()  # nothing changed: still a heartbeat
    wms = prod.of("slurm.watermarks")
    assert [(m.ts, m.cluster, m.polls) for m in wms] == [(100.0, "default", 1), (100.0, "default", 2)]
    fake.raise_on_read = SlurmError("squeue failed")
    await w.poll_once()
    assert len(prod.of("slurm.watermarks")) == 2 and w.watermark_ts == 100.0
