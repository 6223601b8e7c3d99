"""Recovery after an outage longer than the delivery timeout (issue 13, bench chaos): the
idempotent producer gets a new producer id once the broker refuses its sequence, the outbox
leaves probe mode, replays events before samples, counts every failed delivery, and a paced
source that ended with a backlog still gets it delivered."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import pytest
from aiokafka.errors import KafkaConnectionError, LeaderNotAvailableError, OutOfOrderSequenceNumber
from prometheus_client import generate_latest
from pydantic import BaseModel

from gpuwarden.collector.outbox import Outbox
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.settings import CollectorSettings
from gpuwarden.shared.bus import Producer
from gpuwarden.shared.bus import clients as bus_clients
from gpuwarden.shared.models import GpuEvent, NodeSample
from gpuwarden.shared.settings import BusSettings


def sample(i: int, node: str = "n1") -> NodeSample:
    return NodeSample(node=node, ts=float(i), collector_id="t", source="nvml")


def event(i: int) -> GpuEvent:
    return GpuEvent(event_id=f"e{i}", node="n1", ts=float(i), kind="xid", code=79, gpu_index=0, raw=f"Xid 79 #{i}",
                    source="kmsg")  # fmt: skip


class Broker:
    """A broker with Kafka's idempotence rule: per (producer id, partition) the next batch must
    carry the next sequence number, else OUT_OF_ORDER_SEQUENCE_NUMBER."""

    def __init__(self) -> None:
        self.up = True
        self.pids = 0
        self.expected: dict[tuple[int, str], int] = defaultdict(int)
        self.log: list[bytes] = []
        self.clients: list[FakeKafka] = []

    def pump(self) -> None:
        """The clients' sender loops: deliver what is pending, or expire it while down."""
        for c in self.clients:
            c.pump()


class FakeKafka:
    """What :class:`~gpuwarden.shared.bus.Producer` uses of ``AIOKafkaProducer``, with aiokafka's
    flaw: a batch that expires unsent (no leader) has used up its sequence number."""

    broker: ClassVar[Broker]

    def __init__(self, **kw: Any) -> None:
        self.kw = kw
        self.pid: int | None = None
        self.seq: dict[str, int] = defaultdict(int)
        self.pending: list[tuple[str, int, bytes, asyncio.Future[Any]]] = []
        self.stopped = False

    async def start(self) -> None:
        if not self.broker.up:
            raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9092)]")
        self.broker.pids += 1
        self.pid = self.broker.pids
        self.broker.clients.append(self)

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((topic, self.seq[topic], value, fut))
        self.seq[topic] += 1
        return fut

    def pump(self) -> None:
        assert self.pid is not None
        for topic, seq, value, fut in self.pending:
            if not self.broker.up:
                fut.set_exception(LeaderNotAvailableError())  # expired with no leader: seq used
            elif self.broker.expected[(self.pid, topic)] != seq:
                fut.set_exception(OutOfOrderSequenceNumber())
            else:
                self.broker.expected[(self.pid, topic)] = seq + 1
                self.broker.log.append(value)
                fut.set_result(None)
        self.pending = []

    async def flush(self) -> None:
        if self.broker.up:
            self.pump()

    async def stop(self) -> None:
        await self.flush()
        self.stopped = True


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    b = Broker()
    FakeKafka.broker = b
    monkeypatch.setattr(bus_clients, "AIOKafkaProducer", FakeKafka)  # what kafka_producer builds
    return b


async def tick(ob: Outbox, broker: Broker, i: int, n: int = 2) -> None:
    for k in range(n):
        await ob.submit("gpu.samples", f"n{k}", sample(i * 10 + k, f"n{k}"))
    broker.pump()
    await asyncio.sleep(0)  # the loop runs the delivery futures' callbacks
    ob.reap()


async def test_backlog_is_delivered_after_an_outage_longer_than_the_delivery_timeout(broker: Broker) -> None:
    p = Producer(BusSettings(producer_idempotence="true"))
    await p.start()
    ob = Outbox(p.send, max_messages=1000)
    for i in range(3):
        await tick(ob, broker, i)
    assert ob.pending == 0 and len(broker.log) == 6
    broker.up = False  # every broker down for longer than the delivery timeout
    for i in range(3, 10):
        await tick(ob, broker, i)
    assert ob.degraded and ob.failures > 0 and len(broker.log) == 6
    broker.up = True
    for i in range(10, 14):
        await tick(ob, broker, i)
    # the first probe is refused (sequence gap), the producer renews its id, the backlog is replayed
    assert not ob.degraded and ob.pending == 0
    assert len(broker.log) == 28 and len(set(broker.log)) == 28  # every message once, nothing lost
    assert p.renewals == 1 and broker.pids == 2 and broker.clients[0].stopped
    await p.stop()


async def test_renewal_waits_for_the_broker(broker: Broker) -> None:
    """A renewal that cannot connect raises from ``send`` (the outbox keeps the message) and is
    tried again on the next ``send``."""
    s = BusSettings(producer_idempotence="true")
    p = Producer(s)
    await p.start()
    broker.clients[0].seq[s.topic("gpu.samples")] += 1  # a batch expired unsent: a gap
    fut = await p.send("gpu.samples", "n1", sample(1))
    broker.pump()
    await asyncio.sleep(0)
    assert isinstance(fut.exception(), OutOfOrderSequenceNumber)
    broker.up = False
    with pytest.raises(KafkaConnectionError):
        await p.send("gpu.samples", "n1", sample(2))
    assert p.renewals == 0
    broker.up = True
    fut = await p.send("gpu.samples", "n1", sample(3))
    broker.pump()
    assert fut.result() is None and p.renewals == 1 and len(broker.log) == 1
    await p.stop()


class Gate:
    """``send`` returning a delivery future the test settles one by one."""

    def __init__(self) -> None:
        self.futs: list[tuple[str, BaseModel, asyncio.Future[Any]]] = []

    async def send(self, topic: str, key: str | None, value: BaseModel) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futs.append((topic, value, fut))
        return fut

    def settle(self, ok: bool) -> None:
        for _, _, f in self.futs:
            if not f.done():
                f.set_result(None) if ok else f.set_exception(TimeoutError("Batch expired"))


async def test_events_are_the_probe_and_are_replayed_before_samples() -> None:
    g = Gate()
    ob = Outbox(g.send)
    await ob.submit("gpu.samples", "n1", sample(0))
    g.settle(ok=False)
    ob.reap()
    assert ob.degraded
    for item in (sample(1), event(2), sample(3), event(4)):  # sample 1 is the probe, then queued
        await ob.submit("gpu.events" if isinstance(item, GpuEvent) else "gpu.samples", "n1", item)
    g.settle(ok=False)  # the probe fails too
    ob.reap()
    await ob.flush()
    # the next probe is the oldest event, not the oldest sample
    assert [(t, v.ts) for t, v, f in g.futs if not f.done()] == [("gpu.events", 2.0)]  # type: ignore[attr-defined]
    g.settle(ok=True)
    ob.reap()
    assert not ob.degraded
    await ob.flush()
    order = [(t, v.ts) for t, v, _ in g.futs[3:]]  # type: ignore[attr-defined]
    assert order == [("gpu.events", 4.0), ("gpu.samples", 0.0), ("gpu.samples", 1.0), ("gpu.samples", 3.0)]
    g.settle(ok=True)
    ob.reap()
    assert ob.pending == 0


async def test_every_failed_delivery_is_counted_and_logged_with_its_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    g = Gate()
    seen: list[tuple[str, int]] = []
    ob = Outbox(g.send, on_failure=lambda t, n: seen.append((t, n)), log_interval_s=30.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "gpuwarden.collector.outbox")
    for i in range(5):
        await ob.submit("gpu.samples", "n1", sample(i))
        g.settle(ok=False)
        ob.reap()
        now[0] += 10.0
    assert ob.failures == 5 and ob.failures_by_topic == {"gpu.samples": 5} and seen == [("gpu.samples", 1)] * 5
    lines = [r.getMessage() for r in caplog.records if "delivery to" in r.getMessage()]
    assert len(lines) == 2  # t = 0 and t = 30 s: one line per interval, with the count
    assert "1 failures so far" in lines[0] and "4 failures so far, 3 since the last report" in lines[1]


class Finishing:
    """A paced source with ``n`` ticks due at once, then finished."""

    name = "finishing"

    def __init__(self, n: int) -> None:
        self.left = n

    def next_due(self) -> float | None:
        return 0.0 if self.left > 0 else None

    async def collect(self) -> list[NodeSample]:
        self.left -= 1
        return [sample(self.left)]

    async def events(self) -> list[GpuEvent]:
        return []

    async def close(self) -> None: ...


async def test_a_backlog_left_when_the_source_ends_is_delivered_before_finished() -> None:
    down = [True]
    sent: list[BaseModel] = []
    naps: list[float] = []

    class Pub:
        async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
            if down[0]:
                raise ConnectionError("broker unreachable")
            sent.append(value)

    async def sleep(d: float) -> None:
        naps.append(d)
        if len(naps) == 3:
            down[0] = False  # the broker comes back after the last tick

    s = CollectorSettings(collector_source="replay", collector_replay_dir=Path("/nonexistent"))
    svc = CollectorService(s, producer=Pub(), source=Finishing(4), sleep=sleep)  # type: ignore[arg-type]
    await svc.run_loop()
    assert svc.finished.is_set() and svc.outbox.pending == 0
    assert [v.ts for v in sent] == [3.0, 2.0, 1.0, 0.0]  # type: ignore[attr-defined]
    text = generate_latest(svc.metrics.registry).decode()
    assert 'gpuwarden_collector_delivery_failures_total{topic="gpu.samples"}' in text
    assert f'gpuwarden_collector_delivery_failures_total{{topic="gpu.samples"}} {float(svc.outbox.failures)}' in text
    assert svc.outbox.failures >= 4
