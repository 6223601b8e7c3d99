"""One active remediator per cluster: a lease, behind the narrow :class:`Lease` protocol.

* :class:`NoLease` — always held (a single replica; the default).
* :class:`KafkaLease` — Kafka consumer-group membership on a **single-partition** topic
  (``<prefix>remediator.lease``): the group coordinator assigns that one partition to exactly
  one member, so exactly one replica holds the lease; when it dies or leaves, the broker
  reassigns it to a standby after the session timeout. Membership is only revoked at a
  rebalance, so a holder that stops polling loses it within ``max_poll_interval``.
* :class:`MemoryLease` — in-process (tests, and several remediators in one process).

The lease is not the only guard: before every drain the node is read from Slurm again and
a node already drained with a ``gpuwarden:`` reason is skipped — Slurm's drain reason is the
final arbiter, so a redelivery, a restart mid-decision or a lease hand-over gives one drain.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

__all__ = ["KafkaLease", "Lease", "LeaseBoard", "MemoryLease", "NoLease"]

log = logging.getLogger(__name__)


class Lease(Protocol):
    """A lease this replica may hold. Act only while :meth:`held` is True."""

    async def start(self) -> None:
        """Start competing for the lease."""
        ...

    async def stop(self) -> None:
        """Give the lease up."""
        ...

    def held(self) -> bool:
        """True while this replica is the active one."""
        ...


class NoLease:
    """Always held: one replica, nothing to coordinate."""

    async def start(self) -> None:
        """Nothing to do."""

    async def stop(self) -> None:
        """Nothing to do."""

    def held(self) -> bool:
        """Always True."""
        return True


class LeaseBoard:
    """Shared state of :class:`MemoryLease` instances: who holds the lease."""

    def __init__(self) -> None:
        self.holder: object | None = None


class MemoryLease:
    """In-process lease: the first started instance on a :class:`LeaseBoard` holds it until it stops."""

    def __init__(self, board: LeaseBoard) -> None:
        self.board = board

    async def start(self) -> None:
        """Take the lease if free."""
        if self.board.holder is None:
            self.board.holder = self

    async def stop(self) -> None:
        """Release it (the next :meth:`start` or :meth:`held` of another instance may take it)."""
        if self.board.holder is self:
            self.board.holder = None

    def held(self) -> bool:
        """True if this instance holds the lease (takes a free one)."""
        if self.board.holder is None:
            self.board.holder = self
        return self.board.holder is self


class KafkaLease:
    """Lease = owning partition 0 of a one-partition topic in a consumer group.

    Args:
        bootstrap_servers: Kafka bootstrap servers.
        topic: the lease topic (created with one partition if missing).
        group: consumer group shared by all replicas of this cluster's remediator.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        group: str,
        session_timeout_ms: int = 10000,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._kw = {k: v for k, v in (client_kwargs or {}).items() if k != "bootstrap_servers"}
        self.topic = topic
        self.group = group
        self.session_timeout_ms = session_timeout_ms
        self._owned = False
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers, **self._kw)
        await admin.start()
        try:
            if self.topic not in await admin.list_topics():
                try:
                    await admin.create_topics([NewTopic(self.topic, 1, 1)])
                except TopicAlreadyExistsError:
                    pass
        finally:
            await admin.close()

    async def start(self) -> None:
        """Create the topic if needed, join the group and keep polling (membership)."""
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

        lease = self

        class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                if lease._owned:
                    log.warning("lease %s lost: standing by", lease.topic)
                lease._owned = False

            async def on_partitions_assigned(self, assigned: Any) -> None:
                lease._owned = any(tp.topic == lease.topic for tp in assigned)
                if lease._owned:
                    log.warning("lease %s acquired: this remediator is active", lease.topic)

        await self._ensure_topic()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            **self._kw,
            group_id=self.group,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(self.session_timeout_ms // 5, 100),
            enable_auto_commit=False,
        )
        self._consumer.subscribe([self.topic], listener=_Listener())
        await self._consumer.start()
        self._task = asyncio.create_task(self._poll(), name="remediator:lease")

    async def _poll(self) -> None:
        while True:
            await self._consumer.getmany(timeout_ms=500)

    async def stop(self) -> None:
        """Leave the group (the broker hands the lease to a standby)."""
        self._owned = False
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    def held(self) -> bool:
        """True while partition 0 of the lease topic is assigned to this replica."""
        return self._owned
