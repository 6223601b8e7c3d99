"""Outage buffering: bounded queue, drops counted, in-order replay, spool across restarts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import pytest
from pydantic import BaseModel

from gpuwarden.collector.outbox import Outbox
from gpuwarden.shared.models import NodeSample


class FlakyProducer:
    """Fails while ``down`` is True, records what it sent otherwise."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[tuple[str, str | None, BaseModel]] = []

    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.sent.append((topic, key, value))


def sample(i: int) -> NodeSample:
    return NodeSample(node="n1", ts=float(i), collector_id="t", source="nvml")


async def test_outage_buffers_and_replays_in_order() -> None:
    p = FlakyProducer()
    ob = Outbox(p.publish, max_messages=100)
    assert await ob.submit("gpu.samples", "n1", sample(0))
    p.down = True
    for i in range(1, 6):
        assert not await ob.submit("gpu.samples", "n1", sample(i))
    assert len(ob.queue) == 5 and len(p.sent) == 1
    p.down = False
    assert await ob.submit("gpu.samples", "n1", sample(6)) is True
    assert [v.ts for _, _, v in p.sent] == [0, 1, 2, 3, 4, 5, 6]  # type: ignore[attr-defined]
    assert not ob.queue and ob.dropped == {}


async def test_full_buffer_drops_oldest_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    p = FlakyProducer()
    drops: list[tuple[str, int]] = []
    ob = Outbox(p.publish, max_messages=3, on_drop=lambda t, n: drops.append((t, n)))
    p.down = True
    with caplog.at_level(logging.WARNING):
        for i in range(5):
            await ob.submit("gpu.samples", "n1", sample(i))
    assert ob.dropped == {"gpu.samples": 2} and drops == [("gpu.samples", 1)] * 2
    assert "dropped the oldest" in caplog.text
    p.down = False
    await ob.flush()
    assert [v.ts for _, _, v in p.sent] == [2, 3, 4]  # type: ignore[attr-defined]


async def test_spool_survives_a_restart(tmp_path: Path) -> None:
    spool = tmp_path / "outbox.jsonl"
    p = FlakyProducer()
    p.down = True
    ob = Outbox(p.publish, max_messages=10, spool=spool)
    for i in range(3):
        await ob.submit("gpu.samples", "n1", sample(i))
    assert len(spool.read_text().splitlines()) == 3
    p.down = False
    ob2 = Outbox(p.publish, max_messages=10, spool=spool)
    assert len(ob2.queue) == 3
    assert await ob2.flush() == 3
    assert [v.ts for _, _, v in p.sent] == [0, 1, 2]  # type: ignore[attr-defined]
    assert spool.read_text() == ""


async def test_service_tick_buffers_when_broker_down() -> None:
    from gpuwarden.collector.service import CollectorService
    from gpuwarden.collector.settings import CollectorSettings

    class OneSample:
        name = "one"

        async def collect(self) -> list[NodeSample]:
            return [sample(1)]

        async def events(self) -> list:  # type: ignore[type-arg]
            return []

        async def close(self) -> None:
            return None

    p = FlakyProducer()
    settings = CollectorSettings(collector_source="nvml", collector_node="n1", collector_buffer_messages=1)
    svc = CollectorService(settings, producer=p, source=OneSample())  # type: ignore[arg-type]
    p.down = True
    await svc.tick()
    await svc.tick()
    from prometheus_client import generate_latest

    text = generate_latest(svc.metrics.registry).decode()
    assert svc.outbox.dropped == {"gpu.samples": 1}
    assert 'gpuwarden_collector_dropped_total{topic="gpu.samples"} 1.0' in text
    assert "gpuwarden_collector_buffered 1.0" in text
    p.down = False
    await svc.tick()
    assert len(p.sent) == 2 and not svc.outbox.queue


async def test_a_producer_that_blocks_never_blocks_the_tick() -> None:
    """Issue 25: with the broker down, aiokafka's ``send`` waits for room in a full batch; the
    outbox gives up on it after ``send_timeout_s``, queues the message (bounded, counted) and is
    degraded, so the collector keeps sampling at its interval."""
    import asyncio
    import time

    blocked = asyncio.Event()

    async def send(_topic: str, _key: str | None, _value: BaseModel) -> None:
        blocked.set()
        await asyncio.sleep(3600)  # a full producer buffer: never returns while the broker is down

    box = Outbox(send, max_messages=5, send_timeout_s=0.05)
    t0 = time.monotonic()
    for i in range(20):  # 20 ticks
        await box.submit("gpu.samples", "n1", sample(i))
    took = time.monotonic() - t0
    assert blocked.is_set() and box.degraded
    # degraded: one probe per submit waits at most the timeout; the rest is queued at once
    assert took < 20 * 0.05 + 1.0, took
    assert len(box.queue) == 5 and sum(box.dropped.values()) == 15 and box.failures == 20


async def test_stalled_in_flight_deliveries_are_measured() -> None:
    import asyncio

    now = [100.0]
    loop = asyncio.get_running_loop()
    futs: list[asyncio.Future[None]] = []

    async def send(_topic: str, _key: str | None, _value: BaseModel) -> asyncio.Future[None]:
        futs.append(loop.create_future())
        return futs[-1]

    box = Outbox(send, clock=lambda: now[0])
    assert box.stalled_s() == 0.0
    await box.submit("gpu.samples", "n1", sample(0))
    now[0] = 130.0
    assert box.stalled_s() == 30.0  # no confirmation for 30 s: the collector's /healthz is degraded
    futs[0].set_result(None)
    box.reap()
    assert box.stalled_s() == 0.0 and box.delivered == 1


class FutureProducer:
    """Returns a delivery future per message, as aiokafka's ``send`` does; the test settles them."""

    def __init__(self) -> None:
        self.futures: list[tuple[float, asyncio.Future[None]]] = []

    async def send(self, topic: str, key: str | None, value: BaseModel) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.futures.append((value.ts, fut))  # type: ignore[attr-defined]
        return fut


def _spooled(spool: Path) -> list[float]:
    return [orjson.loads(line)["value"]["ts"] for line in spool.read_bytes().splitlines()]


async def test_a_message_is_spooled_before_it_is_sent_so_a_kill_9_loses_nothing(tmp_path: Path) -> None:
    """Issue 25: the spool is written ahead of the send; what a kill -9 interrupts (handed to the
    producer, not yet confirmed) is replayed by the next collector, and in steady state the spool
    holds only the messages in flight."""
    spool = tmp_path / "outbox.jsonl"
    p = FutureProducer()
    ob = Outbox(p.send, max_messages=10, spool=spool)
    assert await ob.submit("gpu.samples", "n1", sample(0))
    assert _spooled(spool) == [0.0]  # in flight: on disk before any confirmation
    p.futures[0][1].set_result(None)
    assert await ob.submit("gpu.samples", "n1", sample(1))
    assert _spooled(spool) == [1.0]  # 0 confirmed and gone, 1 in flight
    assert await ob.submit("gpu.samples", "n1", sample(2))
    assert _spooled(spool) == [1.0, 2.0]
    # kill -9: the process ends here, nothing settled, no shutdown
    del ob
    p2 = FlakyProducer()
    ob2 = Outbox(p2.publish, max_messages=10, spool=spool)
    assert [v.ts for _, _, v in ob2.queue] == [1.0, 2.0]  # type: ignore[attr-defined]
    assert await ob2.submit("gpu.samples", "n1", sample(3))
    assert [v.ts for _, _, v in p2.sent] == [1.0, 2.0, 3.0]  # type: ignore[attr-defined]
    ob2.reap()
    assert spool.read_bytes() == b""


async def test_a_message_in_flight_through_an_outage_stays_ahead_of_the_replay() -> None:
    """Issue 25 (full chaos: 'readings lost 47'): a sample whose batch was in flight when the
    broker went away and is still unsettled when it comes back is not overtaken by the replay
    of newer samples of its node: the replay waits for it, then sends it again first."""
    now = [0.0]
    p = FutureProducer()
    ob = Outbox(p.send, max_messages=100, clock=lambda: now[0], reorder_wait_s=5.0)
    for i in (0, 1):  # two nodes' samples in flight as the outage starts
        assert await ob.submit("gpu.samples", "n1", sample(i))
    (_, f0), (_, f1) = p.futures
    assert await ob.submit("gpu.samples", "n1", sample(2))
    p.futures[2][1].set_exception(ConnectionError("broker unreachable"))  # the outage: degraded
    for i in range(3, 6):
        assert not await ob.submit("gpu.samples", "n1", sample(i))
    assert [v.ts for _, _, v in ob.queue] == [2, 3, 4, 5]  # type: ignore[attr-defined]
    f0.set_result(None)  # the broker is back: sample 0's batch is confirmed, sample 1's is stuck
    assert not await ob.submit("gpu.samples", "n1", sample(6))
    assert len(p.futures) == 3 and not ob.degraded  # the replay waits for sample 1
    now[0] = 4.9
    await ob.flush()
    assert len(p.futures) == 3
    now[0] = 5.0  # still unsettled: sent again, ahead of the queue
    assert await ob.flush() == 6
    assert [ts for ts, _ in p.futures[3:]] == [1, 2, 3, 4, 5, 6]
    assert ob.superseded == 1
    f1.set_exception(ConnectionError("expired"))  # the first copy fails late: not queued again
    assert ob.reap() == 0 and not ob.queue


async def test_a_settled_straggler_releases_the_replay_at_once() -> None:
    """The wait ends as soon as the message in flight through the outage is settled; a failed one
    goes back to the front of the queue, so it is still sent before newer ones."""
    now = [0.0]
    p = FutureProducer()
    ob = Outbox(p.send, max_messages=100, clock=lambda: now[0], reorder_wait_s=5.0)
    for i in (0, 1, 2):
        await ob.submit("gpu.samples", "n1", sample(i))
    p.futures[2][1].set_exception(ConnectionError("broker unreachable"))
    await ob.submit("gpu.samples", "n1", sample(3))
    p.futures[0][1].set_result(None)
    await ob.submit("gpu.samples", "n1", sample(4))
    assert len(p.futures) == 3
    p.futures[1][1].set_exception(ConnectionError("expired"))  # settled (failed) within the wait
    ob.reap()
    assert ob.degraded  # the failure makes the outbox probe again, one at a time, oldest first
    await ob.flush()
    assert [ts for ts, _ in p.futures[3:]] == [1]
    p.futures[3][1].set_result(None)
    await ob.submit("gpu.samples", "n1", sample(5))
    assert [ts for ts, _ in p.futures[3:]] == [1, 2, 3, 4, 5] and ob.superseded == 0


async def test_the_spool_is_a_journal_writes_grow_with_messages_not_with_the_backlog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through an outage each message costs one append (before: the whole backlog was rewritten
    at every message, up to 130-260 MB per tick at the bound); confirmations are appended as
    ``done`` lines and the journal is rewritten only when it is more than twice the pending."""
    spool = tmp_path / "outbox.jsonl"
    written = [0]
    real_append = Outbox._append

    def counting(self: Outbox, data: bytes, lines: int) -> None:
        written[0] += len(data)
        real_append(self, data, lines)

    monkeypatch.setattr(Outbox, "_append", counting)
    rewrites = [0]
    real_rewrite = Outbox._rewrite

    def counting_rewrite(self: Outbox) -> None:
        rewrites[0] += 1
        real_rewrite(self)

    monkeypatch.setattr(Outbox, "_rewrite", counting_rewrite)
    p = FlakyProducer()
    p.down = True
    ob = Outbox(p.publish, max_messages=10_000, spool=spool)
    for i in range(2000):
        await ob.submit("gpu.samples", "n1", sample(i))
    one = len(Outbox._line(ob.queue[-1]))
    assert written[0] < 2000 * one * 1.1 and rewrites[0] == 0
    assert spool.stat().st_size == written[0]
    # the broker is back for 1,500 of them, then down again: a done line, then one compaction
    p.down = False
    sent = 0
    while sent < 1500:
        item = ob.queue.popleft()
        assert await ob._send(item)
        sent += 1
    ob._journal()
    assert rewrites[0] == 1  # 2,000 lines + a done line > 2 x 500 pending + 64
    again = Outbox(FlakyProducer().publish, max_messages=10_000, spool=spool)  # kill -9, restart
    assert [v.ts for _, _, v in again.queue] == [float(i) for i in range(1500, 2000)]  # type: ignore[attr-defined]


async def test_a_journal_restores_in_order_without_what_was_confirmed(tmp_path: Path) -> None:
    """A kill -9 between confirmations: the next outbox has exactly the unconfirmed messages, in
    their order (a delivered one in the middle is not sent again); an old spool without sequence
    numbers still reads, in file order."""
    spool = tmp_path / "outbox.jsonl"
    p = FutureProducer()
    ob = Outbox(p.send, max_messages=100, spool=spool)
    for i in range(4):
        await ob.submit("gpu.samples", "n1", sample(i))
    p.futures[1][1].set_result(None)
    p.futures[3][1].set_result(None)
    ob.reap()
    del ob
    again = Outbox(FlakyProducer().publish, max_messages=100, spool=spool)
    assert [v.ts for _, _, v in again.queue] == [0.0, 2.0]  # type: ignore[attr-defined]
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(
        orjson.dumps({"topic": "gpu.samples", "key": "n1", "value": sample(i).model_dump(mode="json")}) + b"\n"
        for i in (5, 6)
    ))  # fmt: skip
    legacy = Outbox(FlakyProducer().publish, max_messages=100, spool=old)
    assert [v.ts for _, _, v in legacy.queue] == [5.0, 6.0]  # type: ignore[attr-defined]
