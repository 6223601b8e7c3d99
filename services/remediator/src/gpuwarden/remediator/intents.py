"""Intents without an outcome: what a remediator that died mid-command left behind.

Before a drain command runs, the remediator publishes (and the broker confirms) a
:class:`~gpuwarden.shared.models.Remediation` with decision ``intent``; the outcome that
follows carries the intent's id in ``intent_id``. At start, :func:`read_remediations` reads
the ``remediations`` topic and :func:`open_intents` finds the intents no outcome answered;
the remediator reconciles each against Slurm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from aiokafka import TopicPartition
from pydantic import ValidationError

from gpuwarden.shared.bus import decode, kafka_consumer
from gpuwarden.shared.models import NodeState, Remediation, RemediationDecision
from gpuwarden.shared.settings import BusSettings

from .policy import is_out

__all__ = ["intended_reason", "open_intents", "read_remediations", "reconciled"]

log = logging.getLogger(__name__)


def open_intents(records: Iterable[Remediation]) -> list[Remediation]:
    """The intents (decision ``intent``) that no later record names in ``intent_id``, in order. Pure."""
    intents: dict[str, Remediation] = {}
    answered: set[str] = set()
    for r in records:
        if r.decision == RemediationDecision.INTENT:
            intents.setdefault(r.remediation_id, r)
        elif r.intent_id:
            answered.add(r.intent_id)
    return [r for k, r in intents.items() if k not in answered]


def intended_reason(intent: Remediation) -> str | None:
    """The drain reason an intent's argv sets (``reason=...``), or None."""
    for a in intent.argv:
        if a.startswith("reason="):
            return a[len("reason=") :]
    return None


def reconciled(intent: Remediation, node: NodeState | None) -> tuple[RemediationDecision, str]:
    """The outcome of an open intent, from ``node`` as Slurm shows it now, and its reason:
    out with the intended reason -> ``executed`` (the drain landed); out with another reason ->
    ``refused`` (never gpuwarden's); not out or unknown -> ``failed`` (decided again on
    redelivery). Pure."""
    reason = intended_reason(intent)
    if node is not None and is_out(node) and reason is not None and node.reason == reason:
        return RemediationDecision.EXECUTED, "[rule=reconciled] the drain landed before the remediator stopped"
    if node is not None and is_out(node):
        return RemediationDecision.REFUSED, (
            f"[rule=foreign-reason] reconciled: {intent.node} has reason {node.reason!r}, not the "
            f"intended {reason!r}; never gpuwarden's, never resumed"
        )
    return (
        RemediationDecision.FAILED,
        "[rule=reconciled] interrupted before the drain took effect; decided again on redelivery",
    )


async def read_remediations(settings: BusSettings, timeout_s: float = 30.0) -> list[Remediation]:
    """Every record of ``remediations`` (all partitions, from the start to the current end; no
    consumer group). Records that do not parse are skipped (they were dead-lettered by their
    readers).

    Raises:
        aiokafka.errors.KafkaError: the broker is unreachable; TimeoutError after ``timeout_s``.
    """
    topic = settings.topic("remediations")
    c = kafka_consumer(settings, enable_auto_commit=False, group_id=None)
    await c.start()
    out: list[Remediation] = []
    try:
        await c.topics()  # fetch the cluster's metadata
        parts = c.partitions_for_topic(topic) or set()
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        left = {tp for tp in tps if ends[tp] > 0}

        async def drain() -> None:
            while left:
                batch = await c.getmany(*left, timeout_ms=500)
                for recs in batch.values():
                    for rec in recs:
                        try:
                            v = decode("remediations", rec.value)
                        except (ValueError, ValidationError):
                            continue
                        if isinstance(v, Remediation):
                            out.append(v)
                for tp in list(left):
                    if await c.position(tp) >= ends[tp]:
                        left.discard(tp)

        await asyncio.wait_for(drain(), timeout_s)
    finally:
        await c.stop()
    return out
