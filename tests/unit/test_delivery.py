"""Delivery you can count (issue 13, points 1 and 5): confirmed deliveries, failed ones back in
the outbox in order, events kept before samples, degraded health, rate-limited client logs,
oversize records dead-lettered by reference, security settings that never fall back silently."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpuwarden.collector.outbox import Outbox
from gpuwarden.shared.bus import DEAD_LETTER_MAX_BYTES, Consumer, MemoryPublisher
from gpuwarden.shared.logfilter import RateLimitFilter
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.models import DeadLetter, GpuEvent, NodeSample
from gpuwarden.shared.settings import BusSettings
from gpuwarden.shared.topics import replication_plan


class FutureProducer:
    """``send`` returns a delivery future the test settles (like aiokafka's)."""

    def __init__(self) -> None:
        self.futs: list[tuple[tuple[str, str | None, BaseModel], asyncio.Future[Any]]] = []

    async def send(self, topic: str, key: str | None, value: BaseModel) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futs.append(((topic, key, value), fut))
        return fut

    def settle(self, ok: bool) -> None:
        for _, f in self.futs:
            if not f.done():
                f.set_result(None) if ok else f.set_exception(TimeoutError("Batch expired"))


def sample(i: int) -> NodeSample:
    return NodeSample(node="n1", ts=float(i), collector_id="t", source="nvml")


def event(i: int) -> GpuEvent:
    return GpuEvent(event_id=f"e{i}", node="n1", ts=float(i), kind="xid", code=79, gpu_index=0, raw=f"Xid 79 #{i}",
                    source="kmsg")  # fmt: skip


async def test_a_failed_delivery_goes_back_to_the_outbox_in_order_and_is_counted() -> None:
    p = FutureProducer()
    ob = Outbox(p.send, max_messages=100)
    for i in range(3):
        assert await ob.submit("gpu.samples", "n1", sample(i))
    assert ob.pending == 3 and len(ob.inflight) == 3
    p.settle(ok=False)  # the broker never confirmed them
    assert ob.reap() == 3 and ob.failures == 3 and ob.degraded
    assert [v.ts for _, _, v in ob.queue] == [0, 1, 2]  # type: ignore[attr-defined]
    # while degraded only one probe is in flight; the rest waits in order
    for i in range(3, 6):
        assert not await ob.submit("gpu.samples", "n1", sample(i))
    assert len(ob.inflight) == 1 and [v.ts for _, _, v in ob.queue] == [1, 2, 3, 4, 5]  # type: ignore[attr-defined]
    p.settle(ok=True)
    ob.reap()
    assert not ob.degraded
    await ob.flush()
    p.settle(ok=True)
    ob.reap()
    assert ob.pending == 0 and ob.dropped == {}
    sent_ok = [item[2].ts for item, f in p.futs if f.exception() is None]  # type: ignore[attr-defined]
    assert sent_ok == [0, 1, 2, 3, 4, 5]


async def test_events_are_never_dropped_before_samples() -> None:
    async def down(topic: str, key: str | None, value: BaseModel) -> None:
        raise ConnectionError("broker unreachable")

    ob = Outbox(down, max_messages=4)
    await ob.submit("gpu.events", "n1", event(0))
    for i in range(1, 4):
        await ob.submit("gpu.samples", "n1", sample(i))
    await ob.submit("gpu.events", "n1", event(4))
    await ob.submit("gpu.events", "n1", event(5))
    assert [t for t, _, _ in ob.queue] == ["gpu.events", "gpu.samples", "gpu.events", "gpu.events"]
    assert ob.dropped == {"gpu.samples": 2}
    for i in range(6, 9):
        await ob.submit("gpu.events", "n1", event(i))
    assert all(t == "gpu.events" for t, _, _ in ob.queue) and ob.dropped == {"gpu.samples": 3, "gpu.events": 2}


async def test_in_flight_messages_are_spooled_while_failing(tmp_path: Path) -> None:
    spool = tmp_path / "spool.jsonl"
    p = FutureProducer()
    ob = Outbox(p.send, spool=spool)
    await ob.submit("gpu.events", "n1", event(1))
    p.settle(ok=False)
    ob.reap()
    await ob.submit("gpu.samples", "n1", sample(2))  # the probe (event 1) in flight, sample queued
    assert len(ob.inflight) == 1
    again = Outbox(p.send, spool=spool)  # kill -9 and restart: nothing lost
    assert [t for t, _, _ in again.queue] == ["gpu.events", "gpu.samples"]


async def test_collector_health_is_degraded_while_deliveries_fail() -> None:
    from gpuwarden.collector.service import CollectorService
    from gpuwarden.collector.settings import CollectorSettings

    class Src:
        name = "fake"

        async def collect(self) -> list[NodeSample]:
            return [sample(1)]

        async def events(self) -> list[GpuEvent]:
            return []

        async def close(self) -> None: ...

    p = FutureProducer()
    svc = CollectorService(CollectorSettings(collector_source="replay", collector_replay_dir=Path(".")),
                           producer=MemoryPublisher(), source=Src())  # type: ignore[arg-type]  # fmt: skip
    svc.producer = p  # type: ignore[assignment]
    svc._started = True
    await svc.tick()
    assert svc.health()["status"] == "ok" and svc.health()["buffered"] == 1
    p.settle(ok=False)
    await svc.tick()
    h = svc.health()
    assert h["status"] == "degraded" and h["broker"] == "unreachable" and h["delivery_failures"] == 1


def test_reconnect_logging_is_rate_limited() -> None:
    now = [0.0]
    flt = RateLimitFilter(30.0, clock=lambda: now[0])

    def rec(name: str, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, "x", 1, msg, (), None)

    passed = [flt.filter(rec("aiokafka.conn", "Unable connect to %s")) for _ in range(1000)]
    assert passed.count(True) == 1 and flt.suppressed_total == 999
    assert flt.filter(rec("gpuwarden.collector", "other")) and flt.filter(rec("gpuwarden.collector", "other"))
    now[0] = 31.0
    r = rec("aiokafka.conn", "Unable connect to %s")
    assert flt.filter(r) and "999 similar" in str(r.msg)


class DLProducer(MemoryPublisher):
    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        self.sent.append((topic, key, value))


async def test_oversize_record_is_dead_lettered_by_reference_and_counts_as_handled() -> None:
    s = BusSettings(topic_prefix="p.")
    prod = DLProducer()
    handled: list[Any] = []

    async def handler(topic: str, value: BaseModel, rec: Any) -> None:
        handled.append(value)

    c = Consumer(s, "detector", ["failures"], "g", handler, prod, ServiceMetrics("t"))  # type: ignore[arg-type]
    big = b"\xff" * 800_000  # not JSON, too large to carry in base64
    huge = b"x" * 1_200_000  # over the message bound
    for i, raw in enumerate((big, huge)):
        await c._one("failures", SimpleNamespace(value=raw, key=b"k", topic="p.failures", partition=0, offset=10 + i))  # type: ignore[arg-type]
    dls = prod.of("deadletter")
    assert [d.offset for d in dls] == [10, 11] and handled == []
    for d, raw in zip(dls, (big, huge), strict=True):
        assert isinstance(d, DeadLetter) and d.truncated and d.value_size == len(raw)
        assert len(base64.b64decode(d.value_b64)) <= 4096 and len(d.value_b64) < DEAD_LETTER_MAX_BYTES
    assert "oversize" in dls[1].error and dls[0].error.startswith("schema:")


def test_security_settings_never_fall_back_to_plaintext(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUWARDEN_SECURITY_PROTOCOL", "SASL_SSL")
    with pytest.raises(ValidationError, match="SASL_USERNAME"):
        BusSettings()
    monkeypatch.setenv("GPUWARDEN_SASL_USERNAME", "gw")
    monkeypatch.setenv("GPUWARDEN_SASL_PASSWORD", "s3cret")
    s = BusSettings()
    kw = s.kafka_kwargs()
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["ssl_context"].check_hostname and "s3cret" not in repr(s)
    monkeypatch.setenv("GPUWARDEN_SSL_CA_FILE", "/etc/ca.pem")  # a typo is an error, not ignored
    with pytest.raises(ValidationError, match="unknown Kafka security setting"):
        BusSettings()
    monkeypatch.delenv("GPUWARDEN_SSL_CA_FILE")
    monkeypatch.setenv("GPUWARDEN_SSL_CAFILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ValidationError, match="no such file"):
        BusSettings()
    monkeypatch.setenv("GPUWARDEN_SECURITY_PROTOCOL", "bogus")
    with pytest.raises(ValidationError):
        BusSettings()


def test_replication_plan() -> None:
    assert replication_plan(1) == (1, 1) and replication_plan(3) == (3, 2) and replication_plan(5) == (3, 2)
    assert replication_plan(2) == (2, 1)
    with pytest.raises(ValueError, match="needs at least 3 brokers"):
        replication_plan(1, 3)
    with pytest.raises(ValueError, match=r"min\.insync"):
        replication_plan(3, 3, 4)


class OneBatchConsumer:
    """The aiokafka consumer surface :meth:`Consumer.run` uses, serving one batch then nothing."""

    def __init__(self, records: list[Any], tp: Any) -> None:
        self.batches = [{tp: records}]
        self.tp = tp
        self.committed: dict[Any, int] = {}

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        if self.batches:
            return self.batches.pop()
        await asyncio.sleep(timeout_ms / 1000)
        return {}

    def assignment(self) -> set[Any]:
        return {self.tp}

    def highwater(self, tp: Any) -> int | None:
        return None

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.committed.update(offsets)


async def test_a_long_batch_gives_the_loop_to_other_lanes_while_it_runs() -> None:
    """A handler that never suspends (the detector's sample path) must not hold the event loop for
    a whole batch: another lane in the process (the event lane) runs between its records."""
    import time as _time

    from aiokafka import TopicPartition

    s = BusSettings(topic_prefix="p.")
    tp = TopicPartition("p.gpu.samples", 0)
    n = 100
    records = [
        SimpleNamespace(value=sample(i).to_json(), key=b"n1", partition=0, offset=i, topic=tp.topic) for i in range(n)
    ]
    done = 0

    async def handler(topic: str, value: BaseModel, rec: Any) -> None:
        nonlocal done
        t_end = _time.monotonic() + 0.001  # 1 ms of CPU per record, no await that suspends
        while _time.monotonic() < t_end:
            pass
        done += 1

    c = Consumer(s, "detector", ["gpu.samples"], "g", handler, MemoryPublisher(), ServiceMetrics("t"))  # type: ignore[arg-type]
    fake = OneBatchConsumer(records, tp)
    c._consumer = fake  # type: ignore[assignment]
    progress_seen: list[int] = []

    async def other_lane() -> None:
        while done < n:
            progress_seen.append(done)
            await asyncio.sleep(0)

    runner = asyncio.create_task(c.run())
    lane = asyncio.create_task(other_lane())
    while fake.committed.get(tp) != n:
        await asyncio.sleep(0.01)
    c.request_stop()
    await asyncio.wait_for(runner, 5)
    await lane
    # the batch took >= 100 ms; the other lane got the loop every <= 5 ms of it, mid-batch
    mid_batch = {d for d in progress_seen if 0 < d < n}
    assert len(mid_batch) >= 5, progress_seen[:20]
    assert c.handled == n


async def test_a_revocation_commit_waits_for_the_commit_in_progress() -> None:
    """A rebalance listener's ``commit_now`` while the run loop's commit waits on its checkpoint
    (the state snapshot taken, its write not yet confirmed): it must not return before that
    commit has finished, or the next owner restores a state without the snapshot and emits
    again what the snapshot covered (found by the correlator restarts test: 18 windows twice,
    0.1 s apart, at a graceful rebalance)."""
    from aiokafka import TopicPartition

    s = BusSettings(topic_prefix="p.")
    tp = TopicPartition("p.gpu.samples", 0)

    async def handler(topic: str, value: BaseModel, rec: Any) -> None:
        return None

    c = Consumer(s, "correlator", ["gpu.samples"], "g", handler, MemoryPublisher(), ServiceMetrics("t"))  # type: ignore[arg-type]
    fake = OneBatchConsumer([], tp)
    c._consumer = fake  # type: ignore[assignment]
    c._handled = {tp: 42}
    order: list[str] = []
    snapshot_written = asyncio.Event()

    async def checkpoint(offsets: dict[Any, int]) -> dict[Any, int]:
        order.append("snapshot taken")
        await snapshot_written.wait()  # the changelog write in flight
        order.append("snapshot confirmed")
        return offsets

    c.checkpoint = checkpoint
    run_commit = asyncio.create_task(c._commit(fake, force=True))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert order == ["snapshot taken"]
    revocation = asyncio.create_task(c.commit_now())
    await asyncio.sleep(0.05)
    assert not revocation.done(), "the revocation returned while the snapshot was still in flight"
    snapshot_written.set()
    await asyncio.wait_for(asyncio.gather(run_commit, revocation), 5)
    order.append("revocation done")
    assert order == ["snapshot taken", "snapshot confirmed", "revocation done"]
    assert fake.committed == {tp: 42}


class ConfirmingProducer:
    """``send`` returns a delivery future, confirmed at once unless ``fail`` is set."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, BaseModel]] = []
        self.fail = False

    async def send(self, topic: str, key: str | None, value: BaseModel) -> asyncio.Future[Any]:
        self.sent.append((topic, key, value))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_exception(TimeoutError("Batch expired")) if self.fail else fut.set_result(None)
        return fut

    async def flush(self) -> None:
        """Every future is settled when sent."""


async def test_a_record_read_again_is_not_dead_lettered_twice() -> None:
    """A record read again before its offset is committed (the batch's other outputs were not
    confirmed, or a rebalance gave the partition back: the correlator's commit waits below the
    records it holds for Slurm) whose dead letter the broker confirmed is not dead-lettered again
    (CI, bench chaos: 409 of 5,000 hostile records dead-lettered twice by the correlator); one
    whose dead letter failed is; a commit past them forgets them."""
    from aiokafka import TopicPartition

    s = BusSettings(topic_prefix="p.")
    tp = TopicPartition("p.gpu.samples", 0)
    prod = ConfirmingProducer()

    async def handler(topic: str, value: BaseModel, rec: Any) -> None:
        return None

    c = Consumer(s, "correlator", ["gpu.samples"], "g", handler, prod, ServiceMetrics("t"))  # type: ignore[arg-type]

    def bad(offset: int) -> Any:
        return SimpleNamespace(value=b"{not json", key=b"n1", partition=0, offset=offset, topic=tp.topic)

    await c._one("gpu.samples", bad(5))
    prod.fail = True
    await c._one("gpu.samples", bad(6))  # its dead letter is not confirmed
    prod.fail = False
    for off in (5, 6):  # both read again
        await c._one("gpu.samples", bad(off))
    assert [v.offset for _, _, v in prod.sent] == [5, 6, 6]  # type: ignore[attr-defined]
    assert c.repeats == 1 and c.rejected == 4
    fake = OneBatchConsumer([], tp)
    c._consumer = fake  # type: ignore[assignment]
    c._handled = {tp: 7}
    await c._commit(fake, force=True)  # type: ignore[arg-type]
    assert fake.committed == {tp: 7} and c._dead == {tp: {}}


class LogConsumer:
    """The aiokafka consumer surface :meth:`Consumer.run` uses, over an in-memory log: each
    ``getmany`` serves up to ``per_fetch`` records of the next partition in turn from its position;
    ``seek`` moves a position; ``commit`` records the offsets."""

    def __init__(self, logs: dict[Any, int], per_fetch: int = 3) -> None:
        self.ends = dict(logs)
        self.pos = dict.fromkeys(logs, 0)
        self.per_fetch = per_fetch
        self.committed: dict[Any, int] = {}
        self.seeks: list[tuple[Any, int]] = []
        self._turn = 0

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        tps = list(self.ends)
        for i in range(len(tps)):
            tp = tps[(self._turn + i) % len(tps)]
            if self.pos[tp] < self.ends[tp]:
                self._turn = (self._turn + i + 1) % len(tps)
                start, end = self.pos[tp], min(self.ends[tp], self.pos[tp] + self.per_fetch)
                self.pos[tp] = end
                return {tp: [SimpleNamespace(value=sample(o).to_json(), key=b"n1", partition=tp.partition, offset=o,
                                             topic=tp.topic) for o in range(start, end)]}  # fmt: skip
        await asyncio.sleep(0.01)
        return {}

    def assignment(self) -> set[Any]:
        return set(self.ends)

    def highwater(self, tp: Any) -> int | None:
        return self.ends[tp]

    async def position(self, tp: Any) -> int:
        return self.pos[tp]

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp, offset))
        self.pos[tp] = offset

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.committed.update(offsets)


class LosingProducer:
    """Outputs wait for ``flush``; the flush numbered ``lose_at`` loses them all and raises
    :class:`DeliveryError` (once, as :meth:`Producer.confirm` reports a failure once)."""

    def __init__(self, lose_at: int) -> None:
        self.pending: list[Any] = []
        self.delivered: list[Any] = []
        self.flushes = 0
        self.lose_at = lose_at

    async def flush(self) -> None:
        from gpuwarden.shared.bus import DeliveryError

        self.flushes += 1
        pending, self.pending = self.pending, []
        if self.flushes == self.lose_at:
            raise DeliveryError([("out", TimeoutError("Batch expired")) for _ in pending])
        self.delivered.extend(pending)


@pytest.mark.parametrize("idle", [False, True], ids=["commit-after-a-batch", "commit-when-idle"])
async def test_a_lost_output_is_never_covered_by_a_later_commit(idle: bool) -> None:
    """Outputs the broker did not confirm: every partition handled since its last commit is read
    again, not only the batch whose commit failed (with a commit interval, earlier batches of
    other partitions wait uncommitted; the producer reports a failure once, so the next commit
    covered their lost outputs). Also when the failure comes from the commit of an idle poll
    (before, it was logged and the next commit covered the lost outputs). The caller's
    ``on_rewind`` hears which partitions go back first."""
    from aiokafka import TopicPartition

    s = BusSettings(topic_prefix="p.")
    tps = [TopicPartition("p.gpu.samples", p) for p in range(3)]
    fake = LogConsumer(dict.fromkeys(tps, 6))  # served p0 0-2, p1 0-2, p2 0-2, p0 3-5, p1 3-5, p2 3-5
    prod = LosingProducer(lose_at=7 if idle else 2)

    async def handler(topic: str, value: BaseModel, rec: Any) -> None:
        prod.pending.append((rec.partition, rec.offset))
        if (rec.partition, rec.offset) == (2, 3) and not idle:
            c._commit_interval_s = 0.0  # the interval has passed: the last batch's commit is due

    c = Consumer(s, "correlator", ["gpu.samples"], "g", handler, prod, ServiceMetrics("t"), retry_s=0.0,  # type: ignore[arg-type]
                 commit_interval_s=0.0 if idle else 3600.0)  # fmt: skip
    c._consumer = fake  # type: ignore[assignment]
    rewound: list[set[Any]] = []

    async def on_rewind(parts: set[Any]) -> None:
        rewound.append(parts)

    c.on_rewind = on_rewind
    if idle:
        # the first batch commits; later ones are deferred (the detector's state write not due),
        # then a caught-up hook queues outputs of its own whose flush is lost with theirs
        verdicts = [True] + [False] * 5

        async def before_commit(force: bool) -> bool:
            return verdicts.pop(0) if verdicts else True

        async def caught_up() -> None:
            prod.pending.append(("released", len(rewound)))

        c.before_commit = before_commit
        c.on_caught_up = caught_up
    runner = asyncio.create_task(c.run())
    for _ in range(500):
        if fake.committed == dict.fromkeys(tps, 6) and c.rewinds:
            break
        await asyncio.sleep(0.01)
    c.request_stop()
    await asyncio.wait_for(runner, 5)
    assert c.rewinds == 1 and len(rewound) == 1
    assert fake.committed == dict.fromkeys(tps, 6)
    # every committed record's output reached the broker
    assert {d for d in prod.delivered if d[0] != "released"} == {(tp.partition, o) for tp in tps for o in range(6)}
    # every partition handled since its commit went back to that commit, not only the failed batch's
    assert rewound[0] == set(tps)
    assert sorted((tp.partition, o) for tp, o in fake.seeks) == [(0, 3), (1, 0), (2, 0)]


async def test_a_revocation_commit_that_finds_outputs_lost_makes_the_run_loop_rewind() -> None:
    """The rebalance listener's commit (``commit_now``, concurrent with the run loop's batch)
    whose flush reports outputs lost: no later commit may cover them (before, the batch's own
    commit flushed nothing new, succeeded and committed past them), and the run loop reads the
    partitions handled since their commit again before its next batch."""
    from aiokafka import TopicPartition

    s = BusSettings(topic_prefix="p.")
    tps = [TopicPartition("p.gpu.samples", p) for p in range(2)]
    fake = LogConsumer(dict.fromkeys(tps, 6))  # served p0 0-2, p1 0-2, p0 3-5, p1 3-5
    prod = LosingProducer(lose_at=2)  # the first commit confirms; the revocation's flush loses
    errors: list[Exception] = []

    async def revocation() -> None:
        try:
            await c.commit_now()
        except Exception as exc:  # the correlator's listener logs it and goes on
            errors.append(exc)

    async def handler(topic: str, value: BaseModel, rec: Any) -> None:
        prod.pending.append((rec.partition, rec.offset))
        if (rec.partition, rec.offset) == (1, 1) and not errors:
            await asyncio.create_task(revocation())  # the listener runs while the batch is in hand

    c = Consumer(s, "correlator", ["gpu.samples"], "g", handler, prod, ServiceMetrics("t"), retry_s=0.0)  # type: ignore[arg-type]
    c._consumer = fake  # type: ignore[assignment]
    runner = asyncio.create_task(c.run())
    for _ in range(500):
        if fake.committed == dict.fromkeys(tps, 6):
            break
        await asyncio.sleep(0.01)
    c.request_stop()
    await asyncio.wait_for(runner, 5)
    assert len(errors) == 1 and c.rewinds == 1
    assert fake.committed == dict.fromkeys(tps, 6)
    assert set(prod.delivered) == {(tp.partition, o) for tp in tps for o in range(6)}
    assert sorted((tp.partition, o) for tp, o in fake.seeks) == [(1, 0)]
