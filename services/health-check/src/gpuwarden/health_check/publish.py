"""Publish check results to ``health`` as :class:`HealthCheckResult`, best effort, within a budget.

The check never waits on Kafka: connecting, sending and flushing together get at most
``budget_s`` seconds; a broker that is down or slow is logged (WARNING) and the run's exit code
is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from gpuwarden.shared.bus import ProducerLike
from gpuwarden.shared.models import MAX_LINE_CHARS, HealthCheckResult

from .checks import CheckResult, Context, Status

__all__ = ["publish_results", "to_models"]

log = logging.getLogger(__name__)


def to_models(results: Sequence[CheckResult], ctx: Context, ts: float) -> list[HealthCheckResult]:
    """One :class:`HealthCheckResult` per check. ``passed`` is True for OK and WARNING (a warning
    does not fail a node); ``detail`` is ``"<STATUS>: <reason>"``, cut to the topic's 4,096 characters."""
    return [
        HealthCheckResult(
            node=ctx.node,
            ts=ts,
            phase=ctx.phase,
            check=r.check,
            passed=r.status in (Status.OK, Status.WARNING),
            job_id=ctx.job_id,
            gpu_index=r.gpu_index,
            detail=f"{r.status.name}: {r.reason}"[:MAX_LINE_CHARS],  # the topic's bound (a tool's long output)
            duration_s=r.duration_s,
        )
        for r in results
    ]


async def publish_results(
    models: Sequence[HealthCheckResult],
    make_producer: Callable[[], ProducerLike],
    budget_s: float = 1.5,
) -> bool:
    """Send ``models`` to ``health`` keyed by node; True when all were delivered within
    ``budget_s`` seconds, False (logged, never raised) otherwise."""
    t0 = time.monotonic()
    producer = make_producer()

    async def send() -> None:
        await producer.start()
        for m in models:
            await producer.publish("health", m.node, m)
        await producer.flush()

    ok = False
    try:
        await asyncio.wait_for(send(), budget_s)
        ok = True
    except TimeoutError:
        log.warning("health results not published: Kafka did not answer within %.1fs", budget_s)
    except Exception as exc:
        log.warning("health results not published: %s: %s", type(exc).__name__, exc)
    finally:
        left = max(0.2, budget_s - (time.monotonic() - t0))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), left)
    return ok
