"""One active remediator per cluster: the lease, and the ``failures`` consumer that runs only
while this replica holds it (the Kafka shell around the decision core)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from gpuwarden.shared.bus import Consumer
from gpuwarden.shared.lease import KafkaLease, Lease, NoLease

from .settings import RemediatorSettings

__all__ = ["LeasedConsumer", "make_lease"]

log = logging.getLogger(__name__)


def make_lease(settings: RemediatorSettings) -> Lease:
    """The lease ``remediator_lease`` names: ``kafka`` -> a :class:`KafkaLease` on the
    one-partition topic ``<prefix>remediator.lease.<cluster>`` (group ``<group>-lease``),
    ``none`` -> :class:`NoLease` (always held)."""
    if settings.remediator_lease != "kafka":
        return NoLease()
    return KafkaLease(
        settings.bootstrap_servers,
        # not a registered data topic (no schema): named here, created by the lease
        f"{settings.topic_prefix}remediator.lease.{settings.remediator_cluster}",
        f"{settings.consumer_group or 'gpuwarden-remediator'}-lease",
        client_kwargs=settings.kafka_kwargs(),
        name="remediator",
        create=settings.create_topics,
    )


class LeasedConsumer:
    """Runs a consumer of ``topic`` only while ``lease`` is held: :meth:`run` polls the lease
    every ``check_s`` s, starts a consumer (``make()``, then ``start()``, its ``run()`` as a
    task through ``spawn``) when the lease is acquired, and stops it (committing what was
    handled) when the lease is lost or :meth:`run` is cancelled.

    Args:
        lease: the lease.
        make: a new, unstarted consumer of ``topic``.
        spawn: starts a coroutine as a named, supervised task (``Service.spawn``).
        topic: the topic's short name, for the log and the task name.
        check_s: lease poll interval, s.
    """

    def __init__(
        self,
        lease: Lease,
        make: Callable[[], Consumer],
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        topic: str = "failures",
        check_s: float = 0.5,
    ) -> None:
        self.lease = lease
        self.make = make
        self.spawn = spawn
        self.topic = topic
        self.check_s = check_s
        self.consumer: Consumer | None = None
        """The running consumer while the lease is held, else None."""
        self._task: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        """Follow the lease until cancelled."""
        try:
            while True:
                held = self.lease.held()
                if held and self.consumer is None:
                    consumer = self.make()
                    try:
                        await consumer.start()
                    except BaseException:
                        await consumer.stop()  # a half-started consumer is stopped too
                        raise
                    self.consumer = consumer
                    self._task = self.spawn(consumer.run(), f"consume:{self.topic}")
                    log.warning("lease held: consuming %s", self.topic)
                elif not held and self.consumer is not None:
                    await self._stop()
                    log.warning("lease lost: stopped consuming %s", self.topic)
                await asyncio.sleep(self.check_s)
        finally:
            if self.consumer is not None:
                await self._stop()

    async def _stop(self) -> None:
        consumer, task = self.consumer, self._task
        assert consumer is not None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await consumer.stop()
        self.consumer, self._task = None, None
