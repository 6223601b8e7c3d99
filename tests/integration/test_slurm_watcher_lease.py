"""Single publisher per cluster on a real Kafka: the consumer-group lease moves on stop."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from gpuwarden.slurm_watcher.service import kafka_lease

pytestmark = [pytest.mark.integration]


async def _until(pred, timeout_s: float = 60.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout_s, "lease state not reached"
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def test_kafka_group_lease_one_holder_then_failover(kafka_bootstrap: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    a = kafka_lease(kafka_bootstrap, prefix, "c1", session_timeout_ms=6000)
    b = kafka_lease(kafka_bootstrap, prefix, "c1", session_timeout_ms=6000)
    other = kafka_lease(kafka_bootstrap, prefix, "c2", session_timeout_ms=6000)
    try:
        await a.start()
        t = await _until(lambda: a.held())
        print(f"first holder after {t:.1f}s")
        await b.start()
        await other.start()
        await _until(lambda: other.held())  # another cluster has its own lease
        await asyncio.sleep(2.0)
        assert [a.held(), b.held()].count(True) == 1
        holder, standby = (a, b) if a.held() else (b, a)
        await holder.stop()
        t = await _until(lambda: standby.held())
        print(f"failover after stop: {t:.1f}s")
        assert not holder.held()
    finally:
        for lease in (a, b, other):
            await lease.stop()
