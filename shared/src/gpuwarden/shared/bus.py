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
from pydantic import BaseModel, ValidationError

from .metrics import ServiceMetrics
from .models import DeadLetter, dumps
from .settings import BusSettings
from .topics import TOPICS

__all__ = ["Consumer", "Handler", "MemoryPublisher", "Producer", "Publisher", "decode"]

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


class Producer:
    """aiokafka producer that takes models and short topic names.

    ``publish`` queues and returns (batched by ``linger_ms``); ``flush`` waits for delivery.
    The idempotent producer stays off so Tansu works too.
    """

    def __init__(self, settings: BusSettings, metrics: ServiceMetrics | None = None, linger_ms: int = 5) -> None:
        self._settings = settings
        self._metrics = metrics
        self._linger_ms = linger_ms
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect to the brokers. Raises ``aiokafka.errors.KafkaConnectionError`` if none answers."""
        if self._producer is not None:
            return
        p = AIOKafkaProducer(
            bootstrap_servers=self._settings.bootstrap_servers,
            client_id=f"{self._settings.client_id}-producer",
            linger_ms=self._linger_ms,
            acks=1,
            enable_idempotence=False,
            request_timeout_ms=30000,
            max_batch_size=1 << 20,
        )
        try:
            await p.start()
        except BaseException:
            await p.stop()  # release the half-open client: no "Unclosed AIOKafkaProducer"
            raise
        self._producer = p

    async def stop(self) -> None:
        """Flush queued messages and disconnect; safe twice and before ``start``."""
        p, self._producer = self._producer, None
        if p is not None:
            try:
                await p.flush()
            finally:
                await p.stop()

    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        await self.publish_raw(topic, key, dumps(value))

    async def publish_raw(self, topic: str, key: str | None, value: bytes) -> None:
        """Queue raw bytes on a short-named topic (used by the dead-letter path and tests)."""
        if self._producer is None:
            raise RuntimeError("producer not started")
        await self._producer.send(
            self._settings.topic(topic), value=value, key=key.encode() if key is not None else None
        )
        if self._metrics:
            self._metrics.messages_out.labels(topic).inc()

    async def flush(self) -> None:
        if self._producer is not None:
            await self._producer.flush()


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

    Offsets are committed after each batch is handled (at-least-once). Bad messages
    and handler errors go to ``deadletter`` and do not stop the loop.
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
        self._consumer: AIOKafkaConsumer | None = None
        self._short = {settings.topic(t): t for t in self.topics}
        self.assigned = asyncio.Event()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        c = AIOKafkaConsumer(
            *self._short,
            bootstrap_servers=self._settings.bootstrap_servers,
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

    async def stop(self) -> None:
        """Commit what was handled and leave the group; safe twice and before ``start``."""
        c, self._consumer = self._consumer, None
        if c is not None:
            try:
                await c.commit()
            except Exception as exc:
                log.warning("%s: final commit failed: %s", self.service, exc)
            await c.stop()

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
        """Consume until cancelled."""
        c = self._consumer
        if c is None:
            raise RuntimeError("consumer not started")
        while True:
            batches: dict[TopicPartition, list[ConsumerRecord]] = await c.getmany(
                timeout_ms=200, max_records=self._max_records
            )
            if c.assignment():
                self.assigned.set()
            if not batches:
                continue
            for tp, records in batches.items():
                short = self._short.get(tp.topic, tp.topic)
                for rec in records:
                    await self._one(short, rec)
            await c.commit()
            lag = c.highwater  # per partition highwater: cheap lag estimate from fetch responses
            for tp in batches:
                hw = lag(tp)
                if hw is not None:
                    pos = await c.position(tp)
                    self._metrics.consumer_lag.labels(self._short.get(tp.topic, tp.topic), str(tp.partition)).set(
                        max(0, hw - pos)
                    )

    async def _one(self, short: str, rec: ConsumerRecord) -> None:
        self._metrics.messages_in.labels(short).inc()
        try:
            value = decode(short, rec.value)
        except (ValueError, ValidationError) as exc:
            await self.dead_letter(short, rec, f"schema: {_short_error(exc)}")
            return
        try:
            await self._handler(short, value, rec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s: handler failed on %s[%s]@%s", self.service, short, rec.partition, rec.offset)
            self._metrics.errors.labels("handler").inc()
            await self.dead_letter(short, rec, f"handler: {type(exc).__name__}: {exc}")

    async def dead_letter(self, short: str, rec: ConsumerRecord, error: str) -> None:
        """Publish ``rec`` to ``deadletter`` with ``error``; logs and counts it."""
        log.warning("%s: dead-lettering %s[%s]@%s: %s", self.service, short, rec.partition, rec.offset, error)
        self._metrics.dead_lettered.labels(short).inc()
        dl = DeadLetter(
            service=self.service,
            source_topic=self._settings.topic(short),
            partition=rec.partition,
            offset=rec.offset,
            key=rec.key.decode(errors="replace") if rec.key is not None else None,
            value_b64=base64.b64encode(rec.value or b"").decode(),
            error=error[:2000],
            ts=time.time(),
        )
        await self._producer.publish("deadletter", self._settings.topic(short), dl)
        await self._producer.flush()


def _short_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors()[:5]
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errs)
    return str(exc)
