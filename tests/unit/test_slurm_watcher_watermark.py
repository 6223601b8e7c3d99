"""slurm-watcher's SlurmWatermark on slurm.watermarks, and the shared helper for tools
(gpuwarden.shared.slurm_progress), against FakeSlurm and an in-memory bus with fake offsets."""

from __future__ import annotations

import asyncio
import itertools
import zlib
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import JobState, NodeState, SlurmWatermark
from gpuwarden.shared.slurm import SlurmError
from gpuwarden.shared.slurm_progress import JobsOffsets, publish_watermark
from gpuwarden.sim.slurm import FakeSlurm
from gpuwarden.slurm_watcher import SlurmWatcher, SlurmWatcherSettings


def job(jid: str, state: str = "RUNNING", ts: float = 100.0, **kw: object) -> JobState:
    return JobState(
        job_id=jid,
        ts=ts,
        state=state,
        nodes=["gpu-node-001"],
        gpus={"gpu-node-001": [0, 1]},
        start_ts=90.0,
        **kw,
    )


def node(name: str) -> NodeState:
    return NodeState(node=name, ts=100.0, state="IDLE")


class OffsetProducer(MemoryPublisher):
    """MemoryPublisher with a Producer-like ``send``: a delivery future per message, resolving
    to (partition, offset) like aiokafka's RecordMetadata (partition = crc32(key) % partitions,
    offsets counted per partition), or failing for the job ids in ``fail``."""

    def __init__(self, partitions: int = 3) -> None:
        super().__init__()
        self.partitions = partitions
        self.next: dict[tuple[str, int], int] = {}
        self.fail: set[str] = set()

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    def partition(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.partitions

    async def send(self, topic: str, key: str | None, value: BaseModel) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if key in self.fail:
            fut.set_exception(OSError("broker unreachable"))
            return fut
        self.sent.append((topic, key, value))
        p = self.partition(key or "")
        o = self.next.get((topic, p), 0)
        self.next[(topic, p)] = o + 1
        fut.set_result(SimpleNamespace(topic=topic, partition=p, offset=o))
        return fut

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: o for (t, p), o in self.next.items() if t == topic}


def make(prod: MemoryPublisher, clock: dict[str, float], **kw: Any) -> tuple[SlurmWatcher, FakeSlurm]:
    fake = FakeSlurm(nodes=[node("gpu-node-001")], jobs=[job("1")])
    s = SlurmWatcherSettings(slurm_watcher_snapshot_s=3600, slurm_watcher_cluster="c1", **kw)
    w = SlurmWatcher(s, client=fake, producer=prod, now=lambda: clock["t"])  # type: ignore[arg-type]
    return w, fake


def gauge(w: SlurmWatcher, name: str) -> float | None:
    return w.metrics.registry.get_sample_value(name)


async def test_heartbeat_on_an_unchanged_poll_at_the_observation_time() -> None:
    clock = {"t": 1000.0}
    prod = OffsetProducer()
    w, _fake = make(prod, clock)
    await w.poll_once()
    first = prod.of("slurm.watermarks")
    clock["t"] = 1002.0
    assert await w.poll_once() == 0  # nothing changed: no job or node record ...
    wms = prod.of("slurm.watermarks")
    assert len(first) == 1 and len(wms) == 2  # ... but a watermark (heartbeat)
    assert [(m.cluster, m.ts, m.polls) for m in wms] == [("c1", 1000.0, 1), ("c1", 1002.0, 2)]
    assert wms[1].jobs_offsets == wms[0].jobs_offsets == prod.end_offsets("slurm.jobs")
    keys = [k for t, k, _ in prod.sent if t == "slurm.watermarks"]
    assert keys == ["c1", "c1"]  # keyed by the cluster
    assert gauge(w, "gpuwarden_slurm_watermark_seconds") == 1002.0
    assert gauge(w, "gpuwarden_slurm_watermarks_total") == 2.0
    assert w.health()["watermark_ts"] == 1002.0 and w.watermarks == 2


async def test_ts_is_taken_before_the_query() -> None:
    clock = {"t": 1000.0}
    prod = OffsetProducer()
    w, fake = make(prod, clock)
    inner = fake.jobs

    async def slow_jobs() -> list[JobState]:
        clock["t"] = 1005.0  # Slurm answers later than the poll started
        return await inner()

    fake.jobs = slow_jobs  # type: ignore[method-assign]
    await w.poll_once()
    (wm,) = prod.of("slurm.watermarks")
    assert wm.ts == 1000.0


async def test_no_watermark_after_a_failed_jobs_read_or_without_the_lease() -> None:
    from gpuwarden.shared.lease import LeaseBoard, MemoryLease

    clock = {"t": 1000.0}
    prod = OffsetProducer()
    w, fake = make(prod, clock)
    await w.poll_once()
    fake.raise_on_read = SlurmError("squeue --json failed (exit 1): Unable to contact slurm controller")
    clock["t"] = 1002.0
    await w.poll_once()
    assert [m.ts for m in prod.of("slurm.watermarks")] == [1000.0]
    assert gauge(w, "gpuwarden_slurm_watermark_seconds") == 1000.0

    board = LeaseBoard()
    holder, standby = MemoryLease(board), MemoryLease(board)
    await holder.start()
    await standby.start()
    prod2 = OffsetProducer()
    w2 = SlurmWatcher(SlurmWatcherSettings(), client=FakeSlurm(jobs=[job("1")]), producer=prod2, lease=standby)  # type: ignore[arg-type]
    assert await w2.poll_once() == 0 and prod2.sent == []
    await holder.stop()
    await standby.stop()


async def test_offsets_accumulate_across_polls_and_partitions() -> None:
    clock = {"t": 1000.0}
    prod = OffsetProducer(partitions=4)
    w, fake = make(prod, clock)
    await w.poll_once()
    seen = []
    for i in range(2, 12):  # new jobs, each poll, on whatever partition their key maps to
        fake.jobs_list = [*fake.jobs_list, job(str(i))]
        clock["t"] += 2
        await w.poll_once()
        wm = prod.of("slurm.watermarks")[-1]
        assert wm.jobs_offsets == prod.end_offsets("slurm.jobs")  # covers every job record so far
        seen.append(wm.jobs_offsets)
    assert len(seen[-1]) > 1  # several partitions; one untouched by the last poll is kept
    for a, b in itertools.pairwise(seen):
        assert all(b[p] >= o for p, o in a.items())
    # a job record published on a partition always comes before the watermark that covers it
    pos: dict[int, int] = {}
    for t, k, v in prod.sent:
        if t == "slurm.jobs":
            p = prod.partition(k or "")
            pos[p] = pos.get(p, 0) + 1
        elif isinstance(v, SlurmWatermark):
            assert v.jobs_offsets == pos


async def test_takeover_recovery_records_count_in_the_offsets() -> None:
    clock = {"t": 10_000.0}
    prod = OffsetProducer(partitions=1)
    fake = FakeSlurm(nodes=[node("gpu-node-001")], jobs=[])
    fake.accounting_map = {"7": job("7", "FAILED", exit_code=3, end_ts=9_990.0, confirmed=True)}
    s = SlurmWatcherSettings(slurm_watcher_snapshot_s=3600, slurm_watcher_takeover_lookback_s=600)
    w = SlurmWatcher(s, client=fake, producer=prod, now=lambda: clock["t"])  # type: ignore[arg-type]
    await w.poll_once()
    (end,) = prod.of("slurm.jobs")  # only the recovered end: squeue is empty
    assert end.job_id == "7" and w.recovered == 1
    (wm,) = prod.of("slurm.watermarks")
    assert wm.jobs_offsets == {0: 1} and wm.ts == 10_000.0


async def test_undelivered_job_record_holds_the_watermark_and_is_sent_again() -> None:
    clock = {"t": 1000.0}
    prod = OffsetProducer(partitions=1)
    w, fake = make(prod, clock)
    await w.poll_once()
    fake.jobs_list = [job("1"), job("2")]
    prod.fail = {"2"}
    clock["t"] = 1002.0
    await w.poll_once()
    assert [m.ts for m in prod.of("slurm.watermarks")] == [1000.0]  # the view is not on the broker
    prod.fail = set()
    clock["t"] = 1004.0
    assert await w.poll_once() == 1  # job 2 again, though squeue shows no change
    assert [j.job_id for j in prod.of("slurm.jobs")] == ["1", "2"]
    wm = prod.of("slurm.watermarks")[-1]
    assert (wm.ts, wm.jobs_offsets) == (1004.0, {0: 2})


async def test_superseded_undelivered_record_is_not_sent_again() -> None:
    clock = {"t": 1000.0}
    prod = OffsetProducer(partitions=1)
    w, fake = make(prod, clock)
    await w.poll_once()
    fake.jobs_list = [job("1", "SUSPENDED")]
    prod.fail = {"1"}
    await w.poll_once()
    prod.fail = set()
    fake.jobs_list = [job("1", "RUNNING", reason="resumed")]
    await w.poll_once()
    assert [(j.state, j.reason) for j in prod.of("slurm.jobs")] == [("RUNNING", None), ("RUNNING", "resumed")]


async def test_publisher_without_delivery_metadata_gives_empty_offsets() -> None:
    class Plain(MemoryPublisher):
        async def start(self) -> None: ...
        async def stop(self) -> None: ...

    prod = Plain()
    w, _ = make(prod, {"t": 1000.0})
    await w.poll_once()
    (wm,) = prod.of("slurm.watermarks")
    assert (wm.ts, wm.jobs_offsets) == (1000.0, {}) and len(prod.of("slurm.jobs")) == 1


# -- the helper for tools ----------------------------------------------------------------------
def test_jobs_offsets_keeps_the_offset_after_the_newest_record_per_partition() -> None:
    acc = JobsOffsets()
    for p, o in ((0, 4), (1, 0), (0, 2), (0, 9)):
        acc.note(SimpleNamespace(partition=p, offset=o))
    assert acc.offsets == {0: 10, 1: 1}
    with pytest.raises(ValueError, match="not a delivered record"):
        acc.note(SimpleNamespace(partition=0, offset=-1))


async def test_publish_watermark_sends_it_keyed_by_cluster() -> None:
    calls: list[tuple[str, bytes, bytes]] = []

    async def send_and_wait(topic: str, value: bytes, key: bytes) -> Any:
        calls.append((topic, value, key))
        return SimpleNamespace(partition=0, offset=0)

    wm = await publish_watermark(send_and_wait, "c1", 1234.5, {0: 3}, "gw.slurm.watermarks")
    ((topic, value, key),) = calls
    assert (topic, key) == ("gw.slurm.watermarks", b"c1")
    assert SlurmWatermark.model_validate_json(value) == wm
    assert (wm.cluster, wm.ts, wm.jobs_offsets) == ("c1", 1234.5, {0: 3})
    with pytest.raises(ValidationError):
        await publish_watermark(send_and_wait, "bad name", 1.0, {}, "t")
    assert len(calls) == 1


def test_cluster_name_is_validated_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watermark's cluster must match the model's pattern: a bad name fails in the settings,
    naming the variable, not in the first poll."""
    from gpuwarden.shared.settings import describe_settings_error

    monkeypatch.setenv("GPUWARDEN_SLURM_WATCHER_CLUSTER", "a b")
    with pytest.raises(ValidationError) as exc:
        SlurmWatcherSettings()
    assert "GPUWARDEN_SLURM_WATCHER_CLUSTER" in describe_settings_error(exc.value)
