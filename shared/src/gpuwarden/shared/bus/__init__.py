"""Kafka bus helpers on aiokafka: an orjson producer, a validating consumer with a
dead-letter path, and the narrow :class:`Publisher` protocol services depend on.

A consumed message that is not JSON, fails its topic's schema, or makes the handler
raise is published to ``deadletter`` (original bytes, error, source topic/partition/offset)
and the consumer moves on: the service keeps running and nothing is silently lost.

Modules: :mod:`.producer` (:class:`Publisher`, :class:`MemoryPublisher`, :class:`Producer`),
:mod:`.consumer` (:class:`Consumer`), :mod:`.clients` (the only place aiokafka clients are
built: :func:`kafka_consumer`, :func:`kafka_producer`, :func:`kafka_admin`, :func:`kafka_client`),
:mod:`.codec` (:func:`decode`), :mod:`.deadletter` (:func:`dead_letter_of` and the size limits),
:mod:`.assignor` (the partition assignor that gives one worker the same partition numbers in all
of its consumer groups), :mod:`.errors`.
"""

from __future__ import annotations

from .clients import kafka_admin, kafka_client, kafka_consumer, kafka_producer
from .codec import decode
from .consumer import Consumer, Handler
from .deadletter import DEAD_LETTER_MAX_BYTES, DEAD_LETTER_PREFIX_BYTES, MAX_MESSAGE_BYTES, dead_letter_of
from .errors import DeliveryError, NotAuthorizedError, not_authorized
from .producer import MemoryPublisher, Producer, ProducerLike, Publisher, supports_idempotence

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "DEAD_LETTER_PREFIX_BYTES",
    "MAX_MESSAGE_BYTES",
    "Consumer",
    "DeliveryError",
    "Handler",
    "MemoryPublisher",
    "NotAuthorizedError",
    "Producer",
    "ProducerLike",
    "Publisher",
    "dead_letter_of",
    "decode",
    "kafka_admin",
    "kafka_client",
    "kafka_consumer",
    "kafka_producer",
    "not_authorized",
    "supports_idempotence",
]
