"""Small helpers for integration tests that read topics directly."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer


async def read(bootstrap: str, topic: str, n: int, timeout_s: float = 20) -> list[bytes]:
    """Up to ``n`` values of ``topic`` from the beginning (no consumer group), within ``timeout_s``."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    await c.start()
    out: list[bytes] = []
    try:
        end = asyncio.get_running_loop().time() + timeout_s
        while len(out) < n and asyncio.get_running_loop().time() < end:
            for recs in (await c.getmany(timeout_ms=200)).values():
                out.extend(r.value for r in recs)
    finally:
        await c.stop()
    return out
