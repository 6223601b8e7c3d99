"""Kafka bus helpers on aiokafka: an orjson producer, a validating consumer with a
dead-letter path, and the narrow :class:`Publisher` protocol services depend on.

A consumed message that is not JSON, fails its topic's schema, or makes the handler
raise is published to ``deadletter`` (original bytes, error, source topic/partition/offset)
and the consumer moves on: the service keeps running and nothing is silently lost.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError, OutOfOrderSequenceNumber, UnknownProducerId
from pydantic import BaseModel, ValidationError

from .metrics import ServiceMetrics
from .models import DeadLetter, dumps
from .settings import BusSettings
from .topics import TOPICS

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "MAX_MESSAGE_BYTES",
    "Consumer",
    "DeliveryError",
    "Handler",
    "MemoryPublisher",
    "NotAuthorizedError",
    "Producer",
    "Publisher",
    "dead_letter_of",
    "decode",
    "not_authorized",
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

    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        self.sent.append((topic, key, value))

    def of(self, topic: str) -> list[Any]:
        """Values sent to ``topic``, in order."""
        return [v for t, _, v in self.sent if t == topic]


#: Largest value a producer sends (the broker's default ``message.max.bytes`` is 1 MiB).
MAX_MESSAGE_BYTES = 1_000_000
#: A dead letter carries the original bytes up to this size (base64 of it stays well under
#: :data:`MAX_MESSAGE_BYTES`); a larger original is dead-lettered by reference: topic,
#: partition, offset, size and its first :data:`DEAD_LETTER_PREFIX_BYTES` bytes.
DEAD_LETTER_MAX_BYTES = 256 * 1024
DEAD_LETTER_PREFIX_BYTES = 4096


def dead_letter_of(
    service: str,
    source_topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    error: str,
    ts: float,
) -> DeadLetter:
    """The ``deadletter`` record of one rejected record (every service builds it here). Pure.

    ``value`` (``None``: a tombstone, carried as empty) up to :data:`DEAD_LETTER_MAX_BYTES`
    is carried whole (base64); a larger one goes by reference: ``value_size`` (bytes), its
    first :data:`DEAD_LETTER_PREFIX_BYTES` bytes and ``truncated``, so the dead letter stays
    far under :data:`MAX_MESSAGE_BYTES` whatever the input. The key is cut to 1,024 bytes
    (decoded, invalid UTF-8 replaced), ``error`` to 2,000 characters; ``ts`` is epoch s.
    """
    raw = value or b""
    big = len(raw) > DEAD_LETTER_MAX_BYTES
    return DeadLetter(
        service=service,
        source_topic=source_topic,
        partition=partition,
        offset=offset,
        key=key[:1024].decode(errors="replace") if key is not None else None,
        value_b64=base64.b64encode(raw[:DEAD_LETTER_PREFIX_BYTES] if big else raw).decode(),
        error=error[:2000],
        ts=ts,
        value_size=len(raw),
        truncated=big,
    )


class NotAuthorizedError(RuntimeError):
    """The broker refuses this client's principal an operation (an ACL is missing, e.g. WRITE
    on a topic): not transient, so a consumer stops with this error instead of retrying."""


#: aiokafka errors that mean "this principal may not": retrying cannot help.
_NOT_AUTHORIZED = (
    "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "TransactionalIdAuthorizationFailed",
)


def not_authorized(exc: BaseException) -> BaseException | None:
    """The authorization error in ``exc`` (itself, or one of a :class:`DeliveryError`'s), else None."""
    causes = [e for _, e in exc.failed] if isinstance(exc, DeliveryError) else [exc]
    return next((e for e in causes if type(e).__name__ in _NOT_AUTHORIZED), None)


class DeliveryError(RuntimeError):
    """The broker did not confirm some published messages (unreachable, timed out, refused).

    ``failed``: ``(short topic, exception)`` per message that was not delivered."""

    def __init__(self, failed: list[tuple[str, BaseException]]) -> None:
        first = failed[0][1] if failed else None
        super().__init__(
            f"{len(failed)} message(s) not delivered"
            + (f", first on {failed[0][0]}: {type(first).__name__}: {first}" if first is not None else "")
        )
        self.failed = failed


async def supports_idempotence(settings: BusSettings, timeout_s: float = 10.0) -> bool:
    """True if the cluster grants a producer id (``InitProducerId``, Kafka >= 0.11): the
    idempotent producer works there. False for brokers without it (the embedded Tansu broker
    answers with an error).

    Raises:
        aiokafka.errors.KafkaError: no broker answers.
    """
    from aiokafka import AIOKafkaClient
    from aiokafka.protocol.transaction import InitProducerIdRequest

    client = AIOKafkaClient(**settings.kafka_kwargs(), request_timeout_ms=int(timeout_s * 1000))
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
        p = AIOKafkaProducer(
            **s.kafka_kwargs(),
            client_id=f"{s.client_id}-producer",
            linger_ms=self._linger_ms,
            acks="all" if s.producer_acks == "all" else 1,
            enable_idempotence=idem,
            request_timeout_ms=int(self._timeout_s * 1000),
            max_batch_size=1 << 20,
            max_request_size=MAX_MESSAGE_BYTES + 4096,
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
        fut = await client.send(self._settings.topic(topic), value=raw, key=key.encode() if key is not None else None)
        fut.add_done_callback(lambda f, t=topic, c=client: self._done(t, f, c))
        self._pending.append((topic, fut))
        if len(self._pending) > 4096:
            self._pending = [(t, f) for t, f in self._pending if not f.done() or f.exception() is not None]
        return fut

    def _done(self, topic: str, fut: asyncio.Future[Any], client: AIOKafkaProducer | None = None) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()  # retrieved here: never "Future exception was never retrieved"
        if exc is None:
            self.delivered += 1
            self.last_ok_at = time.time()
            if self._metrics:
                self._metrics.messages_out.labels(topic).inc()
            return
        self.failed += 1
        self.last_error_at = time.time()
        self.last_error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OutOfOrderSequenceNumber | UnknownProducerId) and client is self._producer:
            self._renew = True  # this client cannot deliver to that partition again: replace it
        if self._metrics:
            self._metrics.errors.labels("delivery").inc()

    async def confirm(self) -> None:
        """Wait for every message queued so far. Raises :class:`DeliveryError` listing those the
        broker did not confirm (each is counted once, then forgotten)."""
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


def decode(topic: str, value: bytes | None) -> BaseModel:
    """Parse a message value of a registered topic into its model.

    Fields unknown to this version (added by a newer producer) are dropped with a warning
    instead of rejecting the message, so a rolling upgrade loses nothing; every other
    schema violation is an error.

    Raises:
        ValueError: not JSON, or no value.
        pydantic.ValidationError: JSON that does not match the topic's schema.
    """
    if value is None:
        raise ValueError("empty value (tombstone)")
    spec = TOPICS[topic]
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if spec.model is None:
        raise ValueError(f"topic {topic} has no schema")
    try:
        return spec.model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors or any(e["type"] != "extra_forbidden" for e in errors):
            raise
        # Only fields this version does not know: a newer producer of the same schema
        # version (a rolling upgrade). Drop them and keep the message; warn once per field.
        for e in errors:
            _drop(data, e["loc"])
            path = f"{topic}:{'.'.join(str(p) for p in e['loc'] if not isinstance(p, int))}"
            if path not in _IGNORED_FIELDS:
                _IGNORED_FIELDS.add(path)
                log.warning("ignoring unknown field %s (newer producer? upgrade this service)", path)
        return spec.model.model_validate(data)


_IGNORED_FIELDS: set[str] = set()


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    for part in loc[:-1]:
        data = data[part]
    if isinstance(data, dict):
        data.pop(loc[-1], None)


Handler = Callable[[str, BaseModel, ConsumerRecord], Awaitable[None]]


class Consumer:
    """Consume short-named topics in a consumer group, validate, hand to ``handler``.

    At-least-once, and nothing skipped: after each batch the producer's deliveries are
    confirmed, then only the offsets of records that were handled are committed (a record
    dead-lettered counts as handled). Bad messages and handler errors go to ``deadletter``
    and do not stop the loop; a record too large to carry is dead-lettered by reference
    (:data:`DEAD_LETTER_MAX_BYTES`). When the broker does not confirm the outputs, nothing is
    committed and the uncommitted records are read again (after ``retry_s``). A graceful stop
    (:meth:`request_stop`) finishes the record in hand and hands the rest of the batch back
    uncommitted (the next owner of the partition reads it).
    """

    def __init__(
        self,
        settings: BusSettings,
        service: str,
        topics: Iterable[str],
        group_id: str,
        handler: Handler,
        producer: ProducerLike,
        metrics: ServiceMetrics,
        auto_offset_reset: str = "earliest",
        max_records: int = 500,
        retry_s: float = 1.0,
    ) -> None:
        self._settings = settings
        self.service = service
        self.topics = list(topics)
        self._group_id = group_id
        self._handler = handler
        self._producer = producer
        self._metrics = metrics
        self._reset = auto_offset_reset
        self._max_records = max_records
        self._retry_s = retry_s
        self._consumer: AIOKafkaConsumer | None = None
        self._short = {settings.topic(t): t for t in self.topics}
        self._handled: dict[TopicPartition, int] = {}  # next offset after the last handled record
        self._committed: dict[TopicPartition, int] = {}
        self._stopping = False
        self.before_commit: Callable[[bool], Awaitable[bool]] | None = None
        """Called before offsets are committed (``force`` on stop); False defers the commit."""
        self.handled = 0
        self.handed_back = 0
        self.assigned = asyncio.Event()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        c = AIOKafkaConsumer(
            *self._short,
            **self._settings.kafka_kwargs(),
            client_id=f"{self._settings.client_id}-{self.service}",
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset=self._reset,
            session_timeout_ms=10000,
            heartbeat_interval_ms=1000,
            max_poll_interval_ms=300000,
            fetch_max_wait_ms=100,
        )
        try:
            await c.start()
        except BaseException:
            await c.stop()
            raise
        self._consumer = c
        self._stopping = False

    def request_stop(self) -> None:
        """Ask :meth:`run` to return after the record in hand (the rest is handed back)."""
        self._stopping = True

    async def stop(self) -> None:
        """Commit what was handled (only that) and leave the group; safe twice and before ``start``."""
        c, self._consumer = self._consumer, None
        if c is not None:
            try:
                await self._commit(c, force=True)
            except Exception as exc:
                log.warning(
                    "%s: final commit failed (the uncommitted records will be read again): %s", self.service, exc
                )
            await c.stop()

    async def stop_gracefully(self, task: asyncio.Task[Any] | None, grace_s: float = 10.0) -> None:
        """Stop ``task`` (this consumer's :meth:`run`): let it finish the record in hand (up to
        ``grace_s``, then cancel it), then :meth:`stop` (commit the handled records only)."""
        self.request_stop()
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), grace_s)
            except TimeoutError:
                log.warning("%s: the record in hand took over %gs; cancelled (it will be read again)", self.service,
                            grace_s)  # fmt: skip
                task.cancel()
            except Exception:
                pass  # its crash is reported by the service's task guard
            await asyncio.gather(task, return_exceptions=True)
        await self.stop()

    async def _commit(self, c: AIOKafkaConsumer, force: bool = False) -> None:
        """Confirm the outputs, then commit the handled positions of the assigned partitions.

        Raises:
            DeliveryError: outputs not confirmed (nothing committed).
        """
        if not self._handled:
            return
        await self._producer.flush()
        if self.before_commit is not None and not await self.before_commit(force):
            return
        assigned = c.assignment()
        offsets = {tp: o for tp, o in self._handled.items() if tp in assigned and self._committed.get(tp) != o}
        self._handled = {}
        if offsets:
            await c.commit(offsets)
            self._committed.update(offsets)

    async def lag(self) -> dict[str, int]:
        """Consumer lag per short topic name (messages), summed over assigned partitions."""
        c = self._consumer
        if c is None:
            return {}
        parts = list(c.assignment())
        if not parts:
            return {}
        ends = await c.end_offsets(parts)
        out: dict[str, int] = {}
        for tp in parts:
            pos = await c.position(tp)
            short = self._short.get(tp.topic, tp.topic)
            out[short] = out.get(short, 0) + max(0, ends[tp] - pos)
        return out

    async def run(self) -> None:
        """Consume until cancelled or :meth:`request_stop`."""
        c = self._consumer
        if c is None:
            raise RuntimeError("consumer not started")
        while not self._stopping:
            batches: dict[TopicPartition, list[ConsumerRecord]] = await c.getmany(
                timeout_ms=200, max_records=self._max_records
            )
            if c.assignment():
                self.assigned.set()
            if not batches:
                continue
            first = {tp: recs[0].offset for tp, recs in batches.items() if recs}
            try:
                for tp, records in batches.items():
                    short = self._short.get(tp.topic, tp.topic)
                    for i, rec in enumerate(records):
                        if self._stopping:
                            self._hand_back(c, tp, rec.offset, len(records) - i)
                            break
                        await self._one(short, rec)
                        self._handled[tp] = rec.offset + 1
                        self.handled += 1
                await self._commit(c)
            except (DeliveryError, KafkaError) as exc:
                denied = not_authorized(exc)
                if denied is not None:  # an ACL is missing: retrying would hang, stop loudly
                    self._handled = {}  # its outputs are not on the broker: stop() must not commit it
                    raise NotAuthorizedError(
                        f"{self.service}: Kafka refuses this principal: {type(denied).__name__}: {denied} "
                        "(grant the missing ACL; nothing of this batch was committed)"
                    ) from exc
                # outputs not confirmed: commit nothing, read the uncommitted records again
                self._metrics.errors.labels("delivery").inc()
                log.warning("%s: outputs not delivered (%s); re-reading from the last commit", self.service, exc)
                for tp, off in first.items():
                    back = self._committed.get(tp, off)
                    if tp in c.assignment():
                        c.seek(tp, min(back, off))
                self._handled = {}
                await asyncio.sleep(self._retry_s)
                continue
            lag = c.highwater  # per partition highwater: cheap lag estimate from fetch responses
            for tp in batches:
                hw = lag(tp)
                if hw is not None and tp in c.assignment():
                    pos = await c.position(tp)
                    self._metrics.consumer_lag.labels(self._short.get(tp.topic, tp.topic), str(tp.partition)).set(
                        max(0, hw - pos)
                    )

    def _hand_back(self, c: AIOKafkaConsumer, tp: TopicPartition, offset: int, n: int) -> None:
        self.handed_back += n
        log.info("%s: stopping: %d record(s) of %s[%s] from %s handed back uncommitted", self.service, n,
                 tp.topic, tp.partition, offset)  # fmt: skip

    async def _one(self, short: str, rec: ConsumerRecord) -> None:
        self._metrics.messages_in.labels(short).inc()
        if rec.value is not None and len(rec.value) > MAX_MESSAGE_BYTES:
            await self.dead_letter(short, rec, f"oversize: {len(rec.value)} bytes (max {MAX_MESSAGE_BYTES})")
            return
        try:
            value = decode(short, rec.value)
        except (ValueError, ValidationError) as exc:
            await self.dead_letter(short, rec, f"schema: {_short_error(exc)}")
            return
        try:
            await self._handler(short, value, rec)
        except (asyncio.CancelledError, DeliveryError, KafkaError):
            raise  # not the record's fault: it is not handled, and read again
        except Exception as exc:
            log.exception("%s: handler failed on %s[%s]@%s", self.service, short, rec.partition, rec.offset)
            self._metrics.errors.labels("handler").inc()
            await self.dead_letter(short, rec, f"handler: {type(exc).__name__}: {exc}")

    async def dead_letter(self, short: str, rec: ConsumerRecord, error: str) -> None:
        """Publish ``rec`` to ``deadletter`` with ``error``; logs and counts it. A value over
        :data:`DEAD_LETTER_MAX_BYTES` goes by reference: its size and first bytes, ``truncated``.

        Raises:
            DeliveryError: the broker did not confirm the dead letter (the record stays unhandled).
        """
        log.warning("%s: dead-lettering %s[%s]@%s: %s", self.service, short, rec.partition, rec.offset, error[:300])
        self._metrics.dead_lettered.labels(short).inc()
        topic = self._settings.topic(short)
        dl = dead_letter_of(self.service, topic, rec.partition, rec.offset, rec.key, rec.value, error, time.time())
        await self._producer.publish("deadletter", topic, dl)
        await self._producer.flush()


def _short_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors()[:5]
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errs)
    return str(exc)
