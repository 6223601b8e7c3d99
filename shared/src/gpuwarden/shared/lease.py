"""One active replica per cluster: a lease behind the narrow :class:`Lease` protocol.

The remediator (one replica drains) and the slurm-watcher (one replica publishes) use it.

**What** :meth:`Lease.held` **means** (the same for every implementation): True only while
this replica *can show* it holds the lease now — it was started and not stopped, it was
granted the lease, and (Kafka) the broker answered it recently. Anything it cannot show
(never started, stopped, the membership task died, the broker silent) reads False: a replica
that cannot prove it holds the lease must not act. A False may come late by at most the
staleness window below, never early enough for two replicas to both read True for long.

* :class:`NoLease` — always held (one replica, the operator guarantees it; the default).
* :class:`MemoryLease` on a :class:`LeaseBoard` — in-process: the earliest started member
  that has not stopped holds it (tests, several replicas in one process).
* :class:`KafkaLease` — membership of a Kafka consumer group on a **one-partition** topic: the
  group coordinator assigns that partition to exactly one member, the holder. When it stops
  or stops heartbeating (``session_timeout_ms``), the group rebalances and the partition (so
  the lease) moves to a standby. The holder reads the lease as held only while its last fetch
  answer from the partition's leader is younger than half the session timeout, so a holder cut
  off from the brokers stops acting before the broker can expire it and hand the lease over.

Limit: Kafka has no fencing token here: a process paused longer than the session timeout may
act once more when it resumes, before its next :meth:`held`; the remediator re-reads the node
from Slurm before every drain (Slurm's drain reason is the final arbiter) and the slurm-watcher's
consumers are idempotent per key, so a hand-over gives one drain and one state per key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["KafkaLease", "Lease", "LeaseBoard", "LeaseTopicMissing", "MemoryLease", "NoLease"]

log = logging.getLogger(__name__)


class Lease(Protocol):
    """A lease this replica may hold. Act only while :meth:`held` is True (see the module)."""

    async def start(self) -> None:
        """Start competing for the lease."""
        ...

    async def stop(self) -> None:
        """Give the lease up (and stop competing)."""
        ...

    def held(self) -> bool:
        """True only while this replica can show it holds the lease now."""
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
    """Shared state of :class:`MemoryLease` instances: the started members, oldest first."""

    def __init__(self) -> None:
        self.members: list[MemoryLease] = []


class MemoryLease:
    """In-process :class:`Lease` on a :class:`LeaseBoard`: the earliest started member that has
    not stopped holds it. A member that was never started, or has stopped, never holds it."""

    def __init__(self, board: LeaseBoard) -> None:
        self.board = board

    async def start(self) -> None:
        """Join the board (at the end of the queue)."""
        if self not in self.board.members:
            self.board.members.append(self)

    async def stop(self) -> None:
        """Leave the board (the next member in line holds the lease)."""
        if self in self.board.members:
            self.board.members.remove(self)

    def held(self) -> bool:
        """True while this instance is the first member of the board."""
        return bool(self.board.members) and self.board.members[0] is self


class LeaseTopicMissing(RuntimeError):
    """The lease topic is missing and this service may not create topics."""


class KafkaLease:
    """:class:`Lease` = owning partition 0 of a one-partition topic in a consumer group (aiokafka).

    Args:
        bootstrap_servers: Kafka bootstrap servers.
        topic: the lease topic (created with one partition if missing; carries no messages).
        group: consumer group shared by all replicas competing for this lease.
        session_timeout_ms: how long the broker keeps a silent holder in the group, ms; a
            holder reads :meth:`held` False once the broker has not answered it for half of it.
        client_kwargs: extra aiokafka client arguments (security settings).
        name: what the log calls the holder (``remediator``, ``slurm-watcher``).
        clock: wall clock, epoch s (tests pass a fake).
        create: create the topic when it is missing (``GPUWARDEN_CREATE_TOPICS``); False: a
            missing topic is a ``LeaseTopicMissing`` naming the ``kafka-topics.sh`` command.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        group: str,
        session_timeout_ms: int = 10_000,
        client_kwargs: dict[str, Any] | None = None,
        *,
        name: str = "replica",
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        self.create = create
        self.bootstrap_servers = bootstrap_servers
        self._kw = {k: v for k, v in (client_kwargs or {}).items() if k != "bootstrap_servers"}
        self.topic = topic
        self.group = group
        self.session_timeout_ms = session_timeout_ms
        self.name = name
        self.clock = clock
        self._owned = False
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def stale_after_s(self) -> float:
        """A holder not answered by the broker for this long no longer holds the lease, s."""
        return self.session_timeout_ms / 2000.0

    def _connection(self) -> dict[str, Any]:
        """The clients' connection: :attr:`bootstrap_servers` with the security of ``client_kwargs``."""
        return {**self._kw, "bootstrap_servers": self.bootstrap_servers}

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        from .bus.clients import kafka_admin
        from .topics import replication_plan

        admin = kafka_admin(self._connection())
        await admin.start()
        try:
            if self.topic in await admin.list_topics():
                return
            cluster = await admin.describe_cluster()
            rf, isr = replication_plan(len(cluster.get("brokers", [])) or 1)
            if not self.create:
                raise LeaseTopicMissing(
                    f"lease topic {self.topic} does not exist and GPUWARDEN_CREATE_TOPICS=false: create it with "
                    f"kafka-topics.sh --create --topic {self.topic} --partitions 1 --replication-factor {rf} "
                    "(gpuwarden topics plan prints it)"
                )
            configs = {"min.insync.replicas": str(isr)} if rf > 1 else {}
            with contextlib.suppress(TopicAlreadyExistsError):
                # as many replicas as the data topics: the lease must survive a broker going down
                await admin.create_topics(
                    [NewTopic(self.topic, num_partitions=1, replication_factor=rf, topic_configs=configs)]
                )
        finally:
            await admin.close()

    async def start(self) -> None:
        """Create the topic if needed, join the group and keep polling (membership)."""
        from aiokafka import ConsumerRebalanceListener, TopicPartition

        from .bus.clients import kafka_consumer

        lease = self
        tp = TopicPartition(self.topic, 0)

        class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                if lease._owned:
                    log.warning("lease %s lost: this %s stands by", lease.topic, lease.name)
                lease._owned = False

            async def on_partitions_assigned(self, assigned: Any) -> None:
                lease._owned = tp in set(assigned)
                if lease._owned:
                    log.warning("lease %s acquired: this %s is active", lease.topic, lease.name)

        await self._ensure_topic()
        self._consumer = kafka_consumer(
            self._connection(),
            group_id=self.group,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(self.session_timeout_ms // 5, 100),
            enable_auto_commit=False,
        )
        self._consumer.subscribe([self.topic], listener=_Listener())
        await self._consumer.start()
        self._task = asyncio.create_task(self._poll(), name=f"{self.name}:lease")

    async def _poll(self) -> None:
        try:
            while True:  # keeps the member polling; the fetch answers prove the broker hears it
                await self._consumer.getmany(timeout_ms=500)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("lease %s: membership poll died: this %s no longer holds the lease", self.topic, self.name)
            raise

    def _last_answer_ms(self) -> int | None:
        """Wall time of the last fetch answer for the lease partition, epoch ms (None: none yet)."""
        from aiokafka import TopicPartition

        try:
            ts = self._consumer.last_poll_timestamp(TopicPartition(self.topic, 0))
        except (AssertionError, AttributeError, KeyError):  # not assigned (any more)
            return None
        return int(ts) if ts is not None else None

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
        """True while partition 0 of the lease topic is assigned to this member, the membership
        task runs, and the broker answered within :attr:`stale_after_s`."""
        if not self._owned or self._task is None or self._task.done() or self._consumer is None:
            return False
        at = self._last_answer_ms()
        return at is not None and self.clock() * 1000.0 - at <= self.stale_after_s * 1000.0
