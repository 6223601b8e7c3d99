"""Single publisher per cluster: a lease the slurm-watcher must hold to publish.

:class:`KafkaGroupLease`: every watcher of a cluster joins the consumer group
``{prefix}slurm-watcher.{cluster}`` on a dedicated one-partition topic
``{prefix}slurm-watcher.lease.{cluster}``. Kafka assigns that partition to exactly one group
member: the holder. When it stops or stops heartbeating (``session_timeout_ms``), the group
rebalances and the partition, so the lease, moves to a standby (which then publishes a full
snapshot). :class:`MemoryLease` is the in-memory equivalent for tests.

Limit: Kafka revokes the partition from a member that missed its session timeout, but cannot
stop a paused process from publishing once more when it resumes before it sees the revocation
(no fencing token on ``slurm.jobs``); consumers are idempotent per key (latest state wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

__all__ = ["KafkaGroupLease", "Lease", "MemoryLease", "MemoryLeaseBoard"]

log = logging.getLogger(__name__)


class Lease(Protocol):
    """Held by at most one watcher per cluster at a time."""

    @property
    def held(self) -> bool:
        """True while this instance may publish."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class NoLease:
    """Always held (``slurm_watcher_lease=none``: the operator guarantees a single watcher)."""

    held = True

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class MemoryLeaseBoard:
    """In-memory group of lease candidates: the earliest started live member holds it."""

    def __init__(self) -> None:
        self.members: list[MemoryLease] = []


class MemoryLease:
    """:class:`Lease` on a :class:`MemoryLeaseBoard` (tests)."""

    def __init__(self, board: MemoryLeaseBoard) -> None:
        self.board = board

    @property
    def held(self) -> bool:
        return bool(self.board.members) and self.board.members[0] is self

    async def start(self) -> None:
        if self not in self.board.members:
            self.board.members.append(self)

    async def stop(self) -> None:
        if self in self.board.members:
            self.board.members.remove(self)


class KafkaGroupLease:
    """:class:`Lease` on Kafka group membership (aiokafka).

    Args:
        bootstrap: Kafka bootstrap servers.
        prefix: topic prefix (``GPUWARDEN_TOPIC_PREFIX``).
        cluster: cluster name (``[A-Za-z0-9._-]+``); one lease per cluster.
        session_timeout_ms: how long a dead holder keeps the lease, ms.

    Raises:
        ValueError: bad cluster name.
    """

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        cluster: str,
        session_timeout_ms: int = 10_000,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        import re

        if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", cluster):
            raise ValueError(f"invalid cluster name {cluster!r}")
        self.bootstrap = bootstrap
        self._kw = {k: v for k, v in (client_kwargs or {}).items() if k != "bootstrap_servers"}
        self.topic = f"{prefix}slurm-watcher.lease.{cluster}"
        self.group = f"{prefix}slurm-watcher.{cluster}"
        self.session_timeout_ms = session_timeout_ms
        self._held = False
        self._consumer: object | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        return self._held

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self._kw)
        await admin.start()
        try:
            if self.topic not in await admin.list_topics():
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics([NewTopic(self.topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

        await self._ensure_topic()
        lease = self
        tp = TopicPartition(self.topic, 0)

        class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: object) -> None:
                if lease._held:
                    log.warning("slurm-watcher lease %s lost: standing by", lease.topic)
                lease._held = False

            async def on_partitions_assigned(self, assigned: object) -> None:
                lease._held = tp in set(assigned)  # type: ignore[call-overload]
                if lease._held:
                    log.info("slurm-watcher lease %s acquired: publishing", lease.topic)

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            **self._kw,
            group_id=self.group,
            enable_auto_commit=False,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(100, self.session_timeout_ms // 5),
        )
        consumer.subscribe([self.topic], listener=_Listener())
        await consumer.start()
        self._consumer = consumer
        self._task = asyncio.create_task(self._pump(), name="slurm-watcher-lease")

    async def _pump(self) -> None:
        consumer = self._consumer
        while True:  # keeps the member polling; the lease topic carries no messages
            await consumer.getmany(timeout_ms=500)  # type: ignore[union-attr]

    async def stop(self) -> None:
        self._held = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()  # type: ignore[attr-defined]
            self._consumer = None
