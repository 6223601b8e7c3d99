"""Publishing: the narrow :class:`Publisher` protocol, its in-memory fake and the aiokafka :class:`Producer`."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, OutOfOrderSequenceNumber, UnknownProducerId
from aiokafka.partitioner import DefaultPartitioner
from pydantic import BaseModel

from ..metrics import ServiceMetrics
from ..models import dumps
from ..settings import BusSettings
from .clients import kafka_client, kafka_producer
from .codec import decode
from .deadletter import MAX_MESSAGE_BYTES
from .errors import DeliveryError

__all__ = [
    "MemoryPublisher",
    "Producer",
    "ProducerLike",
    "Publisher",
    "supports_idempotence",
]

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """What a service needs to publish: one method. Kafka in production, memory in tests."""

    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        """Queue ``value`` (a registered model) on the short-named ``topic`` under ``key``."""


class ProducerLike(Publisher, Protocol):
    """A :class:`Publisher` with a lifecycle: :class:`Producer` or :class:`MemoryPublisher`."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def flush(self) -> None: ...
    async def publish_raw(self, topic: str, key: str | None, value: bytes) -> None: ...
    def queue(self, topic: str, key: str | None, value: bytes) -> None: ...
    async def drain(self) -> None: ...
    async def drain_soon(self) -> None: ...


class MemoryPublisher:
    """In-memory :class:`Publisher` for unit tests: ``sent`` holds (topic, key, value)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, BaseModel]] = []

    async def start(self) -> None:
        """Nothing to connect (same lifecycle as :class:`Producer`)."""

    async def stop(self) -> None:
        """Nothing to flush."""

    async def flush(self) -> None:
        """Nothing queued."""

    async def publish_raw(self, topic: str, key: str | None, value: bytes) -> None:
        """Raw bytes are decoded with the topic's model so tests see models either way."""
        self.sent.append((topic, key, decode(topic, value)))

    def queue(self, topic: str, key: str | None, value: bytes) -> None:
        """Same as :meth:`publish_raw`, at once (nothing to batch)."""
        self.sent.append((topic, key, decode(topic, value)))

    async def drain(self) -> None:
        """Nothing queued."""

    async def drain_soon(self) -> None:
        """Nothing queued."""

    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        self.sent.append((topic, key, value))

    def of(self, topic: str) -> list[Any]:
        """Values sent to ``topic``, in order."""
        return [v for t, _, v in self.sent if t == topic]


async def supports_idempotence(settings: BusSettings, timeout_s: float = 10.0) -> bool:
    """True if the cluster grants a producer id (``InitProducerId``, Kafka >= 0.11): the
    idempotent producer works there. False for brokers without it (the embedded Tansu broker
    answers with an error).

    Raises:
        aiokafka.errors.KafkaError: no broker answers.
    """
    from aiokafka.protocol.transaction import InitProducerIdRequest

    client = kafka_client(settings, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        brokers = list(client.cluster.brokers())
        if not brokers:
            return False
        end = time.monotonic() + timeout_s
        while True:
            try:
                resp = await asyncio.wait_for(
                    client.send(brokers[0].nodeId, InitProducerIdRequest(None, 60000)), timeout_s
                )
            except (KafkaError, TimeoutError):
                return False
            code = getattr(resp, "error_code", -1)
            # a broker that just started answers COORDINATOR_LOAD_IN_PROGRESS (14) or
            # COORDINATOR_NOT_AVAILABLE (15) / NOT_COORDINATOR (16) for a moment: ask again
            if code not in (14, 15, 16) or time.monotonic() > end:
                return bool(code == 0)
            await asyncio.sleep(0.2)
    finally:
        await client.close()


class Producer:
    """aiokafka producer that takes models and short topic names, and counts every delivery.

    ``publish`` queues and returns (batched by ``linger_ms``); every queued message's delivery
    is tracked, and :meth:`confirm` (also :meth:`flush`) waits for all of them and raises
    :class:`DeliveryError` if any was not delivered, so a caller commits its input only after
    its output is on the broker. :meth:`send` returns one message's delivery future.

    Durability: ``acks=all`` and the idempotent producer by default (settings
    ``producer_acks``, ``producer_idempotence``; ``auto`` turns idempotence off, with a
    warning, on a broker without ``InitProducerId`` such as the embedded Tansu broker).
    A message not confirmed within ``delivery_timeout_s`` fails (aiokafka's request timeout).

    An idempotent producer whose batch expired unsent (e.g. every broker down for longer than
    ``delivery_timeout_s``) has used up sequence numbers the broker never saw: aiokafka keeps
    its producer id, so the broker refuses every later batch of that partition with
    ``OutOfOrderSequenceNumber`` and nothing is delivered there again. On that error (or
    ``UnknownProducerId``) the next :meth:`send` replaces the client by a new one (a new
    producer id; counted in ``renewals``); the failed messages stay failed, for their caller
    to send again.
    """

    def __init__(
        self,
        settings: BusSettings,
        metrics: ServiceMetrics | None = None,
        linger_ms: int = 5,
        delivery_timeout_s: float = 30.0,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._linger_ms = linger_ms
        self._timeout_s = delivery_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._pending: list[tuple[str, asyncio.Future[Any]]] = []
        self.idempotent: bool | None = None
        """Whether the running producer is idempotent (None before ``start``)."""
        self.delivered = 0
        self.failed = 0
        self.last_ok_at: float | None = None
        self.last_error_at: float | None = None
        self.last_error: str | None = None
        self.renewals = 0
        """How many times the client was replaced after the broker lost its sequence."""
        self._renew = False
        self._retiring: set[asyncio.Task[None]] = set()
        #: messages queued by :meth:`queue` for the next :meth:`drain`: (short topic, key, value)
        self._queued: list[tuple[str, str | None, bytes]] = []
        self._partitioner = DefaultPartitioner()
        #: full topic name -> (sorted partition ids, when read (monotonic s), key -> partition)
        self._layout: dict[str, tuple[list[int], float, dict[bytes, int]]] = {}
        self._names: dict[str, str] = {}
        self._drain_lock = asyncio.Lock()
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0
        """Batches handed to the client by :meth:`drain`."""

    async def start(self) -> None:
        """Connect to the brokers. Raises ``aiokafka.errors.KafkaConnectionError`` if none answers,
        ``ValueError`` for ``producer_idempotence=true`` with ``producer_acks=1``."""
        if self._producer is not None:
            return
        s = self._settings
        want = s.producer_idempotence
        if want == "true" and s.producer_acks != "all":
            raise ValueError("GPUWARDEN_PRODUCER_IDEMPOTENCE=true needs GPUWARDEN_PRODUCER_ACKS=all")
        idem = want == "true" or (want == "auto" and s.producer_acks == "all" and await supports_idempotence(s))
        if want == "auto" and not idem and s.producer_acks == "all":
            log.warning(
                "broker %s has no idempotent producer (InitProducerId): producing with acks=all, "
                "not idempotent (a retried batch may be duplicated)",
                s.bootstrap_servers,
            )
        self._producer = await self._client(idem)
        self.idempotent = idem

    async def _client(self, idem: bool) -> AIOKafkaProducer:
        """A started aiokafka producer (the connection errors of ``start`` propagate)."""
        s = self._settings
        p = kafka_producer(
            s,
            client_id=f"{s.client_id}-producer",
            linger_ms=self._linger_ms,
            partitioner=self._partitioner,
            acks="all" if s.producer_acks == "all" else 1,
            enable_idempotence=idem,
            request_timeout_ms=int(self._timeout_s * 1000),
            max_batch_size=1 << 20,
            max_request_size=MAX_MESSAGE_BYTES + 4096,
            compression_type=None if s.producer_compression == "none" else s.producer_compression,
        )
        try:
            await p.start()
        except BaseException:
            await p.stop()  # release the half-open client: no "Unclosed AIOKafkaProducer"
            raise
        return p

    async def _renew_client(self) -> None:
        """Replace the client (new producer id); the old one delivers what it can, then closes."""
        old = self._producer
        assert old is not None
        self._renew = False
        try:
            new = await self._client(bool(self.idempotent))
        except BaseException:
            self._renew = True  # broker still unreachable: try again on the next send
            raise
        self._producer = new
        self.renewals += 1
        log.warning("the broker refused this producer's sequence (%s): replaced by a new producer (%d so far); "
                    "unconfirmed messages are sent again by their caller", self.last_error, self.renewals)  # fmt: skip
        task = asyncio.create_task(self._retire(old))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, old: AIOKafkaProducer) -> None:
        try:
            await old.stop()
        except Exception as exc:  # a replaced client: nothing of it is used any more
            log.debug("closing a replaced producer: %s: %s", type(exc).__name__, exc)

    async def stop(self) -> None:
        """Deliver queued messages and disconnect; safe twice and before ``start``. Messages
        the broker did not confirm are logged and counted (``errors_total{kind="delivery"}``)."""
        if self._producer is not None:
            try:
                await self._settle()
            except Exception as exc:
                log.error("stopping with %d queued messages not handed to the client: %s", len(self._queued), exc)
        p, self._producer = self._producer, None
        if p is not None:
            try:
                await p.flush()
                await self.confirm()
            except DeliveryError as exc:
                log.error("stopping with undelivered messages: %s", exc)
            finally:
                await p.stop()
        if self._retiring:
            await asyncio.wait(set(self._retiring), timeout=self._timeout_s)

    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        await self.send(topic, key, dumps(value))

    async def publish_raw(self, topic: str, key: str | None, value: bytes) -> None:
        """Queue raw bytes on a short-named topic (used by the dead-letter path and tests)."""
        await self.send(topic, key, value)

    async def send(self, topic: str, key: str | None, value: bytes | BaseModel) -> asyncio.Future[Any]:
        """Queue one message on a short-named topic; returns its delivery future (tracked: a
        failure is counted and raised by :meth:`confirm`, never left unretrieved).

        Raises:
            RuntimeError: not started.
            aiokafka.errors.KafkaError: refused at once (too large, no metadata in time).
        """
        if self._producer is None:
            raise RuntimeError("producer not started")
        if self._renew:
            await self._renew_client()
        raw = value if isinstance(value, bytes) else dumps(value)
        client = self._producer
        fut: asyncio.Future[Any] = await client.send(
            self._settings.topic(topic), value=raw, key=key.encode() if key is not None else None
        )
        fut.add_done_callback(functools.partial(self._finished, topic, client))
        self._pending.append((topic, fut))
        if len(self._pending) > 4096:
            self._pending = [(t, f) for t, f in self._pending if not f.done() or f.exception() is not None]
        return fut

    def queue(self, topic: str, key: str | None, value: bytes) -> None:
        """Queue raw bytes on a short-named topic for the next :meth:`drain` (no future, no
        await per message: the hot path of a stage that emits per input record).

        A queued message is not on its way until :meth:`drain`; :meth:`confirm` (and so
        :meth:`flush` and :meth:`stop`) drains first, so a commit after ``flush`` covers it.
        """
        self._queued.append((topic, key, value))

    @property
    def queued(self) -> int:
        """Messages queued by :meth:`queue` and not yet drained."""
        return len(self._queued)

    async def drain_soon(self, max_queued: int = 20_000) -> None:
        """Start handing the queued messages to the client in the background and return at once
        (the caller goes on consuming while a partition's previous batch is still on its way:
        aiokafka takes one batch per partition at a time, and the messages queued meanwhile go
        in the next, larger one). Waits only when more than ``max_queued`` messages are queued
        (back-pressure). A failure is raised by the next :meth:`drain` or :meth:`confirm`.
        """
        if not self._queued:
            return
        if self._drainer is None or self._drainer.done():
            if self._drainer is not None and not self._drainer.cancelled():
                self._drainer.exception()  # retrieved: the queue still holds what it failed on
            self._drainer = asyncio.create_task(self._drain_all(), name="producer-drain")
        if len(self._queued) > max_queued:
            await asyncio.wait({self._drainer})

    async def _settle(self) -> None:
        """Wait for a background drain, then drain what is left (raises what :meth:`drain` raises)."""
        d = self._drainer
        if d is not None and not d.done():
            await asyncio.wait({d})
        if self._queued:
            await self.drain()

    async def _drain_all(self) -> None:
        while self._queued and self._producer is not None:
            try:
                await self.drain()
            except Exception as exc:  # the messages stay queued: confirm() drains and raises
                log.warning("handing queued messages to the producer failed (%s); retried at the next flush", exc)
                return

    async def drain(self) -> None:
        """Hand every queued message to the client, in one record batch per topic-partition
        (aiokafka's ``create_batch``/``send_batch``: one delivery future per batch, not per
        message). Keyed messages go to the partition aiokafka's default partitioner gives the
        key (murmur2, as the Java client), so they land where :meth:`send` would put them.

        Raises:
            RuntimeError: not started.
            aiokafka.errors.KafkaError: no metadata for a topic in time (the messages not yet
                handed over stay queued).
        """
        if not self._queued:
            return
        if self._producer is None:
            raise RuntimeError("producer not started")
        async with self._drain_lock:  # two drains at once would interleave a partition's batches
            if self._renew:
                await self._renew_client()
            client = self._producer
            queued, self._queued = self._queued, []
            sent: set[int] = set()  # indices in `queued` handed to the client
            try:
                await self._drain(client, queued, sent)
            except BaseException:
                # what was not handed to the client goes back to the front of the queue, in order
                self._queued = [m for i, m in enumerate(queued) if i not in sent] + self._queued
                raise

    async def _drain(
        self, client: AIOKafkaProducer, queued: list[tuple[str, str | None, bytes]], sent: set[int]
    ) -> None:
        parts = []
        keys = []
        for topic, key, _value in queued:
            full = self._names.get(topic) or self._names.setdefault(topic, self._settings.topic(topic))
            kb = key.encode() if key is not None else None
            keys.append(kb)
            parts.append(await self._partition_of(client, full, kb))
        # (short, partition) -> [builder, messages in it, index of each in `queued`]
        slots: dict[tuple[str, int], list[Any]] = {}
        for i, (topic, _key, value) in enumerate(queued):
            kb = keys[i]
            slot = slots.get((topic, parts[i]))
            if slot is None:
                slot = slots[(topic, parts[i])] = [client.create_batch(), 0, []]
            if slot[0].append(key=kb, value=value, timestamp=None) is None:  # full: send it, start another
                if slot[1]:
                    await self._send_batch(client, topic, parts[i], slot, sent)
                    slot[0], slot[1], slot[2] = client.create_batch(), 0, []
                if slot[0].append(key=kb, value=value, timestamp=None) is None:
                    # larger than a batch: on its own, in order (the batch before it is on its way)
                    await self.send(topic, _key, value)
                    sent.add(i)
                    continue
            slot[1] += 1
            slot[2].append(i)
        for (topic, part), slot in slots.items():
            if slot[1]:
                await self._send_batch(client, topic, part, slot, sent)

    async def _partition_of(self, client: AIOKafkaProducer, full: str, key: bytes | None) -> int:
        layout = self._layout.get(full)
        now = time.monotonic()
        if layout is None or now - layout[1] > 30.0:
            parts = sorted(await client.partitions_for(full))
            layout = self._layout[full] = (parts, now, {} if layout is None or layout[0] != parts else layout[2])
        parts, _, by_key = layout
        if key is None:
            return int(self._partitioner(None, parts, parts))
        part = by_key.get(key)
        if part is None:
            if len(by_key) > 100_000:
                by_key.clear()
            part = by_key[key] = int(self._partitioner(key, parts, parts))
        return part

    async def _send_batch(
        self, client: AIOKafkaProducer, topic: str, part: int, slot: list[Any], sent: set[int]
    ) -> None:
        fut: asyncio.Future[Any] = await client.send_batch(slot[0], self._names[topic], partition=part)
        sent.update(slot[2])
        fut.add_done_callback(functools.partial(self._finished, topic, client, count=slot[1]))
        self._pending.append((topic, fut))
        self.batches += 1

    def _finished(self, topic: str, client: AIOKafkaProducer, fut: asyncio.Future[Any], count: int = 1) -> None:
        """Done callback of a send or a batch (``functools.partial`` of topic, client, count)."""
        self._done(topic, fut, client, count)

    def _done(
        self, topic: str, fut: asyncio.Future[Any], client: AIOKafkaProducer | None = None, count: int = 1
    ) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()  # retrieved here: never "Future exception was never retrieved"
        if exc is None:
            self.delivered += count
            self.last_ok_at = time.time()
            if self._metrics:
                self._metrics.messages_out.labels(topic).inc(count)
            return
        self.failed += count
        self.last_error_at = time.time()
        self.last_error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OutOfOrderSequenceNumber | UnknownProducerId) and client is self._producer:
            self._renew = True  # this client cannot deliver to that partition again: replace it
        if self._metrics:
            self._metrics.errors.labels("delivery").inc()

    async def confirm(self) -> None:
        """Wait for every message queued so far. Raises :class:`DeliveryError` listing those the
        broker did not confirm (each is counted once, then forgotten). Messages queued by
        :meth:`queue` are drained first (including those a background drain has taken)."""
        await self._settle()
        pending, self._pending = self._pending, []
        if not pending:
            return
        if self._producer is not None:
            await self._producer.flush()
        await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
        failed = [(t, f.exception()) for t, f in pending if not f.cancelled() and f.exception() is not None]
        if failed:
            raise DeliveryError([(t, e) for t, e in failed if e is not None])

    async def flush(self) -> None:
        """Same as :meth:`confirm`."""
        await self.confirm()

    def broker_state(self, stale_s: float = 60.0) -> str:
        """``ok``, or ``unreachable`` while the last delivery failed (no success since)."""
        if self.last_error_at is not None and (self.last_ok_at is None or self.last_ok_at < self.last_error_at):
            return "unreachable"
        return "ok"
