"""The remediator service: ``failures`` -> policy -> ``scontrol update`` -> ``remediations``.

Drains on open failures (policy file, docs/architecture.md#remediation-safety), resumes a node it drained
once every failure behind the drain has resolved and the hold-down has passed, alerts
on-call, and records every decision (taken or refused, with the rule) on ``remediations``,
in the log and — if configured — in a ledger file that ``gpuwarden remediator status`` and
``reset-breaker`` read and write.

This file is the service shell: :class:`Remediator` builds the Slurm client, alerter, lease
and policy from the settings, consumes the topics (``failures`` only while it holds the lease,
:mod:`.lease_consumer`), runs the periodic reconcile/resume loop and serves its HTTP views
(:mod:`.views`) and metrics (:mod:`.metrics`). The decisions are :mod:`.core`'s; settings are
in :mod:`.settings`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiokafka import ConsumerRecord
from pydantic import BaseModel

from gpuwarden.shared.bus import Consumer, Producer
from gpuwarden.shared.lease import Lease, NoLease
from gpuwarden.shared.models import Failure, HealthCheckResult, NodeState
from gpuwarden.shared.slurm import SlurmClient

from .actuation import make_client
from .alerts import Alerter
from .core import RemediatorCore
from .intents import open_intents, read_remediations
from .lease_consumer import LeasedConsumer, make_lease
from .metrics import RemediatorCollector
from .policy_file import PolicyFile, load_policy
from .settings import RemediatorSettings
from .views import RemediatorViews

__all__ = ["Remediator"]

log = logging.getLogger(__name__)


class Remediator(RemediatorCore):
    """Consumes ``failures``, ``slurm.nodes`` and ``health``; for each failure reads the node
    from Slurm, applies :func:`~gpuwarden.remediator.policy.decide`, drains (enforcing) or
    alerts, and publishes one :class:`~gpuwarden.shared.models.Remediation` (key: node) per
    decision. Resolved failures lead to a RESUME of nodes it drained (:meth:`resume_due`).
    Decisions are serialised (one at a time) and taken only while this replica holds the lease.

    HTTP (:mod:`.views`): ``POST /breaker/reset`` closes a tripped breaker; ``GET /status``;
    ``GET /failures/<id>``; ``/healthz``.

    Args:
        settings: service settings.
        client: Slurm client (default: from settings); tests pass ``FakeSlurm``.
        producer: bus producer (default: Kafka).
        now: decision clock, epoch s (default: the client's clock: event time in simulation).
        alerter: alert delivery (default: the sinks in settings).
        lease: one-active-replica lease (default: from ``remediator_lease``).
        policy: the policy (default: ``remediator_policy_file`` or the built-in one).

    Raises:
        PolicyError: the policy file is invalid.
    """

    def __init__(
        self,
        settings: RemediatorSettings,
        client: SlurmClient | None = None,
        producer: Producer | None = None,
        now: Callable[[], float] | None = None,
        alerter: Alerter | None = None,
        lease: Lease | None = None,
        policy: PolicyFile | None = None,
    ) -> None:
        policy_file = policy or load_policy(settings.remediator_policy_file)
        if client is None:
            client, default_now = make_client(settings)
            now = now or default_now
        alerter = alerter or Alerter(
            settings.alert_sinks(),
            labels={"cluster": settings.remediator_cluster, "service": "gpuwarden-remediator"},
            repeat_s=settings.remediator_alert_repeat_s,
            runbook_base=settings.remediator_runbook_base_url,
        )
        lease = lease if lease is not None else make_lease(settings)
        super().__init__(settings, client, producer, now or time.time, alerter, lease, policy_file)
        self._leased: LeasedConsumer | None = None
        self.views = RemediatorViews(self)
        self.http.extra_routes.extend(self.views.routes())
        self.metrics.registry.register(RemediatorCollector(self))

    @property
    def failures_consumer(self) -> Consumer | None:
        """The ``failures`` consumer while this replica holds a (non-trivial) lease."""
        return self._leased.consumer if self._leased is not None else None

    async def on_start(self) -> None:
        """Load the ledger, learn the nodes, take part in the lease, start consuming.

        Without a lease (:class:`NoLease`) one consumer reads ``failures``, ``slurm.nodes`` and
        ``health`` in the service's group. With a lease, ``failures`` are consumed **only while
        this replica holds the lease** (in the service's group, so the active replica gets every
        partition and a new holder resumes from the committed offsets: failures that arrive
        during a hand-over wait for it instead of being skipped by a standby), and every replica
        reads ``slurm.nodes`` and ``health`` completely, in a group of its own, so a replica that
        takes over already knows the nodes and the passed health checks."""
        await self.seed()
        if isinstance(self.producer, Producer):
            try:
                for r in open_intents(await read_remediations(self.settings)):
                    self.intents.setdefault(r.remediation_id, r)
            except Exception as exc:
                log.error("cannot read remediations to reconcile open intents: %s: %s", type(exc).__name__, exc)
        await self.lease.start()
        if isinstance(self.lease, NoLease):
            self.consume(["failures", "slurm.nodes", "health"], self._on_message)
        else:
            group = self.settings.consumer_group or f"gpuwarden-{self.name}"
            self.consume(["slurm.nodes", "health"], self._on_message, group=f"{group}-state-{uuid.uuid4().hex[:12]}")

            def failures() -> Consumer:
                s = self.settings
                # the same assignor as every gpuwarden consumer (a replica without a lease, in
                # the same group, would otherwise be refused: INCONSISTENT_GROUP_PROTOCOL)
                return Consumer(
                    s, self.name, ["failures"], group, self._on_message, self.producer, self.metrics,
                    s.auto_offset_reset, worker_id=self.worker_id,
                )  # fmt: skip

            self._leased = LeasedConsumer(self.lease, failures, self.spawn)
            self.spawn(self._leased.run(), "lease")
        self.spawn(self._periodic(), "resume")

    async def on_stop(self) -> None:
        """Leave the lease."""
        await self.lease.stop()

    async def _periodic(self) -> None:
        while True:
            if self.intents and self.lease.held():
                await self.reconcile()
            await asyncio.sleep(self.settings.remediator_resume_interval_s)
            await self.resume_due()
            await self.alerter.tick()

    async def _on_message(self, short: str, value: BaseModel, _rec: ConsumerRecord) -> None:
        if isinstance(value, Failure):
            await self.handle_failure(value)
        elif isinstance(value, NodeState):
            self.nodes[value.node] = value
        elif isinstance(value, HealthCheckResult):
            self.note_health(value)

    def health(self) -> dict[str, Any]:
        """Health plus enforcement, breaker, decisions and known nodes."""
        h = super().health()
        h.update(
            enforce=self.cfg.enforce,
            breaker=self.history.breaker_reason or "closed",
            decisions=dict(self.decisions),
            known_nodes=len(self.nodes),
            active=self.lease.held(),
        )
        return h
