"""Dead letters and the size limits of the bus: what a rejected record becomes on ``deadletter``."""

from __future__ import annotations

import base64

from ..models import DeadLetter

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "DEAD_LETTER_PREFIX_BYTES",
    "MAX_MESSAGE_BYTES",
    "dead_letter_of",
]


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
