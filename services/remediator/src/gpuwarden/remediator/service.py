"""The remediator service: ``failures`` -> policy -> ``scontrol update`` -> ``remediations``.

Drains on open failures (policy file, safety limits of DESIGN §7), resumes a node it drained
once every failure behind the drain has resolved and the hold-down has passed, alerts
on-call, and records every decision (taken or refused, with the rule) on ``remediations``,
in the log and — if configured — in a ledger file that ``gpuwarden remediator status`` and
``reset-breaker`` read and write.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from aiokafka import ConsumerRecord
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field, SecretStr

from gpuwarden.shared.bus import Consumer, Producer
from gpuwarden.shared.models import (
    Action,
    Failure,
    FailureState,
    HealthCheckResult,
    NodeState,
    Remediation,
    RemediationDecision,
    stable_id,
)
from gpuwarden.shared.service import Service
from gpuwarden.shared.settings import ServiceSettings
from gpuwarden.shared.slurm import DEFAULT_SIM_STATE_FILE, SlurmClient, SlurmError, build_client, drain_argv

from .alerts import RUNBOOK_BASE_URL, Alerter, AlertmanagerSink, AlertSink, JsonWebhookSink, SlackSink
from .intents import intended_reason, open_intents, read_remediations
from .lease import KafkaLease, Lease, NoLease
from .policy import (
    REASON_PREFIX,
    Decision,
    DrainRecord,
    FailureNote,
    History,
    PolicyConfig,
    decide,
    decide_resume,
    id8,
    is_ours,
    is_out,
)
from .policy_file import PolicyFile, load_policy

__all__ = ["HEALTH_REASON_PREFIXES", "Ledger", "Remediator", "RemediatorSettings", "make_client", "resume_node"]

#: Drain reasons the Slurm health-check wrapper (deploy/slurm/prolog-gpuwarden.sh) sets. A node
#: drained with one of them is resumed by the remediator after a later passing health check,
#: under the same own-reason rule as its own drains (an operator's reason is never touched).
HEALTH_REASON_PREFIXES = ("gpuwarden prolog:", "gpuwarden epilog:", "gpuwarden periodic:")
#: A health-check run publishes one result per check; a pass counts once no result of the node
#: has arrived for this long (so a failing check of the same run is not missed), wall s.
HEALTH_SETTLE_S = 2.0

log = logging.getLogger(__name__)

D = RemediationDecision


class RemediatorSettings(ServiceSettings):
    """Settings of the remediator (``GPUWARDEN_REMEDIATOR_*`` plus the common ones)."""

    remediator_enforce: bool = Field(False, description="Really drain (False = dry-run: decide and record only)")
    remediator_backend: Literal["cli", "simulated"] = Field("cli", description="cli = scontrol; simulated = scenario")
    remediator_scenario: Path | None = Field(None, description="Scenario YAML (backend=simulated)")
    remediator_state_file: Path = Field(
        DEFAULT_SIM_STATE_FILE, description="Drain state file shared with the watcher (backend=simulated)"
    )
    remediator_policy_file: Path | None = Field(None, description="Policy YAML (default: built-in policy)")
    remediator_ledger_file: Path | None = Field(
        None, description="JSON ledger: history, breaker, drained nodes, recent actions (None = memory only)"
    )
    remediator_cluster: str = Field("default", min_length=1, description="Cluster name (alert label, lease topic)")
    remediator_lease: Literal["none", "kafka"] = Field(
        "none", description="none = single replica; kafka = consumer-group lease on a one-partition topic"
    )
    remediator_max_drain_fraction: float = Field(
        0.10, ge=0, le=1, description="Breaker: max share of known nodes drained/down, 0-1"
    )
    remediator_min_drain_allowance: int = Field(1, ge=0, description="Nodes that may always be drained, count")
    remediator_max_drains_per_window: int = Field(5, ge=0, description="Breaker: max drains per window, count")
    remediator_window_s: float = Field(3600.0, gt=0, description="Breaker window, s")
    remediator_max_per_node_per_week: int = Field(3, ge=0, description="Max drains of one node per 7 days, count")
    remediator_command_timeout_s: float = Field(10.0, gt=0, description="Timeout of one scontrol call, s")
    remediator_command_retries: int = Field(2, ge=0, description="Retries after a timeout or transient error")
    remediator_retry_backoff_s: float = Field(0.5, ge=0, description="First retry backoff (doubles), s")
    remediator_resume_interval_s: float = Field(5.0, gt=0, description="How often resumes are checked, s")
    remediator_cluster_refresh_s: float = Field(
        0.0,
        ge=0,
        description="Max age of the node list read from Slurm for the breaker's share (0 = read at "
        "every drain decision), s",
    )
    remediator_alertmanager_url: SecretStr | None = Field(None, description="Alertmanager base URL")
    remediator_slack_webhook_url: SecretStr | None = Field(None, description="Slack-compatible webhook URL")
    remediator_webhook_url: SecretStr | None = Field(None, description="Generic JSON webhook URL")
    remediator_webhook_token: SecretStr | None = Field(None, description="Bearer token of the JSON webhook")
    remediator_alert_repeat_s: float = Field(60.0, gt=0, description="Re-send interval to Alertmanager, s")
    remediator_console_url: str | None = Field(
        None, description="Base URL of a console: an alert's generatorURL is <base>/failures/<failure_id>"
    )
    remediator_external_url: str | None = Field(
        None,
        description="How people reach this remediator's HTTP port (e.g. http://central:9402); without a console, "
        "generatorURL is <this>/failures/<failure_id> (the remediator's decisions on that failure, JSON)",
    )
    remediator_runbook_base_url: str = Field(
        RUNBOOK_BASE_URL, description="Base of the per-pattern runbooks: runbook_url is <base>/<pattern>.md"
    )

    def generator_url(self, failure_id: str) -> str | None:
        """The ``generatorURL`` of an alert about ``failure_id`` (None: neither URL is set)."""
        base = self.remediator_console_url or self.remediator_external_url
        return f"{base.rstrip('/')}/failures/{failure_id}" if base else None

    def policy(self) -> PolicyConfig:
        """The safety limits as a :class:`PolicyConfig`."""
        return PolicyConfig(
            enforce=self.remediator_enforce,
            max_drain_fraction=self.remediator_max_drain_fraction,
            min_drain_allowance=self.remediator_min_drain_allowance,
            max_drains_per_window=self.remediator_max_drains_per_window,
            window_s=self.remediator_window_s,
            max_per_node_per_week=self.remediator_max_per_node_per_week,
        )

    def alert_sinks(self) -> list[AlertSink]:
        """The configured alert sinks."""
        sinks: list[AlertSink] = []
        if self.remediator_alertmanager_url:
            sinks.append(AlertmanagerSink(self.remediator_alertmanager_url))
        if self.remediator_slack_webhook_url:
            sinks.append(SlackSink(self.remediator_slack_webhook_url))
        if self.remediator_webhook_url:
            sinks.append(
                JsonWebhookSink(
                    self.remediator_webhook_url,
                    self.remediator_webhook_token,
                    external_url=self.remediator_external_url or "",
                )
            )
        return sinks


def make_client(s: RemediatorSettings) -> tuple[SlurmClient, Callable[[], float]]:
    """The configured Slurm client and its clock (see ``build_client``)."""
    return build_client(
        s.remediator_backend,
        scenario=s.remediator_scenario,
        state_file=s.remediator_state_file,
        timeout_s=s.remediator_command_timeout_s,
        retries=s.remediator_command_retries,
    )


class Ledger:
    """The remediator's persisted state: a JSON file written atomically (tmp + rename).

    Holds the :class:`History`, the recent decisions and ``breaker_reset_at`` (set by
    ``gpuwarden remediator reset-breaker --ledger``; the running service picks it up)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        """The file's content (``{}`` if it does not exist).

        Raises:
            ValueError: the file is not a JSON object.
        """
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"ledger {self.path} is not a JSON object")
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Replace the file atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def request_breaker_reset(self, now: float) -> str | None:
        """Close the breaker in the file (and tell a running service); returns what it was."""
        data = self.read()
        hist = data.setdefault("history", {})
        was = hist.get("breaker_reason")
        hist["breaker_reason"] = None
        data["breaker_reset_at"] = now
        self.write(data)
        return was


class Remediator(Service):
    """Consumes ``failures``, ``slurm.nodes`` and ``health``; for each failure reads the node
    from Slurm, applies :func:`~gpuwarden.remediator.policy.decide`, drains (enforcing) or
    alerts, and publishes one :class:`Remediation` (key: node) per decision. Resolved
    failures lead to a RESUME of nodes it drained (:meth:`resume_due`). Decisions are
    serialised (one at a time) and taken only while this replica holds the lease.

    HTTP: ``POST /breaker/reset`` closes a tripped breaker; ``GET /status``; ``/healthz``.

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

    name = "remediator"

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
        super().__init__(settings, producer)
        self.settings: RemediatorSettings = settings
        self.policy_file = policy or load_policy(settings.remediator_policy_file)
        if client is None:
            client, default_now = make_client(settings)
            now = now or default_now
        self.client = client
        self.now = now or time.time
        self.cfg = settings.policy()
        self.history = History()
        self.nodes: dict[str, NodeState] = {}
        """Last known node states from ``slurm.nodes`` (the bus): used to find health-check
        drains to look at, never to decide (every decision re-reads Slurm)."""
        self.slurm_nodes: dict[str, NodeState] = {}
        """Every node as Slurm itself listed it (``sinfo``, at most ``remediator_cluster_refresh_s``
        old): the breaker's cluster. Never filled from bus messages, so forged ``slurm.nodes``
        records cannot raise its denominator."""
        self._slurm_nodes_at = float("-inf")
        self.intents: dict[str, Remediation] = {}
        """Intents published whose outcome is not recorded yet (also in the ledger)."""
        self.decisions: dict[str, int] = {}
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        self.alerter = alerter or Alerter(
            settings.alert_sinks(),
            labels={"cluster": settings.remediator_cluster, "service": "gpuwarden-remediator"},
            repeat_s=settings.remediator_alert_repeat_s,
            runbook_base=settings.remediator_runbook_base_url,
        )
        if lease is None:
            lease = (
                KafkaLease(
                    settings.bootstrap_servers,
                    # not a registered data topic (no schema): named here, created by the lease
                    f"{settings.topic_prefix}remediator.lease.{settings.remediator_cluster}",
                    f"{settings.consumer_group or 'gpuwarden-remediator'}-lease",
                    client_kwargs=settings.kafka_kwargs(),
                )
                if settings.remediator_lease == "kafka"
                else NoLease()
            )
        self.lease = lease
        self.ledger = Ledger(settings.remediator_ledger_file) if settings.remediator_ledger_file else None
        self._reset_seen = 0.0
        self._health_seen: dict[str, float] = {}  # node -> wall time of its last health result
        # (node, reason, drain time) already resumed / dry-run: a later drain with the same text is a new one
        self._health_done: set[tuple[str, str, float]] = set()
        self._lock = asyncio.Lock()
        self.failures_consumer: Consumer | None = None
        """The ``failures`` consumer while this replica holds a (non-trivial) lease."""
        self.http.extra_routes.append(web.post("/breaker/reset", self._reset_view))
        self.http.extra_routes.append(web.get("/status", self._status_view))
        self.http.extra_routes.append(web.get("/failures/{failure_id}", self._failure_view))
        self.metrics.registry.register(_RemediatorCollector(self))

    # -- lifecycle -----------------------------------------------------------------
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
            self.spawn(self._follow_lease(group), "lease")
        self.spawn(self._periodic(), "resume")

    async def _follow_lease(self, group: str, check_s: float = 0.5) -> None:
        """Consume ``failures`` while the lease is held: join the group when it is acquired,
        leave it (committing what was handled) when it is lost or the service stops."""
        consumer: Consumer | None = None
        task: asyncio.Task[Any] | None = None
        try:
            while True:
                held = self.lease.held()
                if held and consumer is None:
                    consumer = Consumer(
                        self.settings,
                        self.name,
                        ["failures"],
                        group,
                        self._on_message,
                        self.producer,
                        self.metrics,
                        self.settings.auto_offset_reset,
                    )
                    await consumer.start()
                    self.failures_consumer = consumer
                    task = self.spawn(consumer.run(), "consume:failures")
                    log.warning("lease held: consuming failures")
                elif not held and consumer is not None:
                    await self._stop_failures(consumer, task)
                    consumer, task, self.failures_consumer = None, None, None
                    log.warning("lease lost: stopped consuming failures")
                await asyncio.sleep(check_s)
        finally:
            if consumer is not None:
                await self._stop_failures(consumer, task)
                self.failures_consumer = None

    @staticmethod
    async def _stop_failures(consumer: Consumer, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await consumer.stop()

    async def on_stop(self) -> None:
        """Leave the lease."""
        await self.lease.stop()

    async def seed(self) -> None:
        """Load the ledger (if any), learn the nodes from Slurm and adopt gpuwarden's own
        drains still in place (so a restart keeps the caps and can resume them). A Slurm
        error is logged, not raised."""
        if self.ledger is not None:
            try:
                data = self.ledger.read()
            except ValueError as exc:
                log.error("ignoring unreadable ledger: %s", exc)
                data = {}
            if data.get("history"):
                self.history = History.from_json(data["history"])
            self.recent.extend(data.get("recent", []))
            self._reset_seen = float(data.get("breaker_reset_at") or 0.0)
            for raw in data.get("intents", []):
                try:
                    r = Remediation.model_validate(raw)
                except ValueError as exc:
                    log.error("ignoring an unreadable intent in the ledger: %s", exc)
                    continue
                self.intents[r.remediation_id] = r
        try:
            nodes = await self.client.nodes()
        except (SlurmError, OSError, ValueError) as exc:
            log.warning("cannot read nodes from Slurm at start: %s", exc)
            return
        self.slurm_nodes = {n.node: n for n in nodes}
        self._slurm_nodes_at = time.monotonic()
        for n in nodes:
            self.nodes[n.node] = n
            if is_out(n) and is_ours(n.reason) and n.node not in self.history.drained:
                if not any(x == n.node for x, _ in self.history.drains):
                    self.history.record_drain(n.node, n.reason_ts or self.now())
                self.history.drained[n.node] = _adopt(n)
        self._save()

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

    def note_health(self, result: HealthCheckResult) -> None:
        """Remember a health check result of the ``health`` topic (for ``require_health_check``
        and for resuming nodes the health check drained)."""
        self.history.note_health(result.node, result.ts, result.passed)
        self._health_seen[result.node] = time.monotonic()

    # -- failures -> decisions ------------------------------------------------------
    async def handle_failure(self, f: Failure) -> Remediation:
        """Decide (and act) on one failure; publish, log and return the :class:`Remediation`."""
        async with self._lock:
            now = self.now()
            self._sync_breaker()
            if not self.lease.held():
                d = Decision(
                    D.SKIPPED,
                    "[rule=standby] not the active remediator (lease held by another replica)",
                    Action.NONE,
                    rule="standby",
                )
                return await self._finish(f, d, await self._plain(f, d))
            if f.state == FailureState.RESOLVED:
                return await self._finish(f, *await self._on_resolved(f, now))
            node: NodeState | None = None
            read_error: str | None = None
            try:
                node = await self.client.node(f.node)
            except ValueError:
                node = None  # invalid name: decide() refuses it
            except (SlurmError, OSError) as exc:
                read_error = str(exc)
            if read_error is not None:
                d = Decision(
                    D.FAILED,
                    f"[rule=slurm-read] cannot read node state from Slurm: {read_error}",
                    f.recommended_action,
                    rule="slurm-read",
                    alert=True,
                )
                await self._alert(f, d)
                return await self._finish(f, d, await self._plain(f, d))
            if node is not None:
                self.nodes[node.node] = node
            try:
                cluster = await self._cluster()
            except (SlurmError, OSError, ValueError) as exc:
                d = Decision(
                    D.FAILED,
                    f"[rule=slurm-read] cannot list the nodes from Slurm (the breaker needs them): {exc}",
                    f.recommended_action,
                    rule="slurm-read",
                    alert=True,
                )
                await self._alert(f, d)
                return await self._finish(f, d, await self._plain(f, d))
            d = decide(f, node, cluster, self.history, self.cfg, now, self.policy_file)
            self.history.note_seen(f, now, self.policy_file.confirm_window_s)
            return await self._finish(f, d, await self._carry_out(f, d, node, now))

    async def _cluster(self) -> list[NodeState]:
        """Every node as Slurm lists it (cached up to ``remediator_cluster_refresh_s``).

        Raises:
            SlurmError, OSError, ValueError: Slurm could not be read and there is no fresh list.
        """
        if time.monotonic() - self._slurm_nodes_at > self.settings.remediator_cluster_refresh_s:
            nodes = await self.client.nodes()
            self.slurm_nodes = {n.node: n for n in nodes}
            self._slurm_nodes_at = time.monotonic()
        return list(self.slurm_nodes.values())

    async def reconcile(self) -> list[Remediation]:
        """Give every open intent (published before a drain command whose outcome was never
        recorded: the remediator died in between) its outcome, from the node as Slurm shows it
        now: drained with the intended reason -> ``executed`` (the drain is adopted, so it is
        resumed later); out with another reason -> ``refused`` (never gpuwarden's, never
        resumed); not drained -> ``failed`` (the failure is decided again when it is
        redelivered). A node Slurm cannot be asked about stays open for the next try.
        Returns the outcomes published."""
        out: list[Remediation] = []
        async with self._lock:
            for key, intent in list(self.intents.items()):
                reason = intended_reason(intent)
                try:
                    node = await self.client.node(intent.node)
                except (SlurmError, OSError, ValueError) as exc:
                    log.warning("cannot reconcile the intent on %s yet: %s", intent.node, exc)
                    continue
                if node is not None and is_out(node) and reason is not None and node.reason == reason:
                    decision, why = D.EXECUTED, "[rule=reconciled] the drain landed before the remediator stopped"
                    rec = DrainRecord(intent.node, reason, node.reason_ts or intent.ts)
                    for fid in intent.failure_ids:
                        rec.failures[id8(fid)] = FailureNote(fid, reason[len(REASON_PREFIX) :].split()[0])
                        self.history.handled.add(fid)
                    self.history.drained[intent.node] = rec
                    if not any(n == intent.node and t >= intent.ts for n, t in self.history.drains):
                        self.history.record_drain(intent.node, intent.ts)
                elif node is not None and is_out(node):
                    decision = D.REFUSED
                    why = (f"[rule=foreign-reason] reconciled: {intent.node} has reason {node.reason!r}, not the "
                           f"intended {reason!r}; never gpuwarden's, never resumed")  # fmt: skip
                    self.history.handled.update(intent.failure_ids)
                else:
                    decision = D.FAILED
                    why = "[rule=reconciled] interrupted before the drain took effect; decided again on redelivery"
                rem = intent.model_copy(
                    update={
                        "remediation_id": stable_id("reconcile", intent.remediation_id, decision.value),
                        "decided_at": time.time(),
                        "decision": decision,
                        "reason": why,
                        "intent_id": intent.remediation_id,
                    }
                )
                await self.publish("remediations", intent.node, rem)
                await self.producer.flush()
                del self.intents[key]
                self.decisions[decision.value] = self.decisions.get(decision.value, 0) + 1
                log.warning("reconciled intent on %s: %s %s", intent.node, decision.value, why)
                out.append(rem)
            self._save()
        return out

    async def _finish(self, f: Failure, d: Decision, rem: Remediation) -> Remediation:
        self.decisions[rem.decision.value] = self.decisions.get(rem.decision.value, 0) + 1
        self.recent.append(
            {
                "at": rem.decided_at,
                "node": rem.node,
                "decision": rem.decision.value,
                "action": rem.action.value,
                "rule": d.rule,
                "failure": f.failure_id,
                "pattern": f.pattern,
                "reason": rem.reason,
                "argv": rem.argv,
            }
        )
        self._save()
        await self.publish("remediations", f.node, rem)
        level = logging.WARNING if rem.decision in (D.REFUSED, D.FAILED) else logging.INFO
        log.log(
            level,
            "%s %s on %s (rule %s, failure %s): %s",
            rem.decision.value,
            rem.action.value,
            rem.node,
            d.rule,
            f.failure_id,
            rem.reason,
        )
        return rem

    def _remediation(
        self,
        f: Failure,
        d: Decision,
        decision: RemediationDecision,
        reason: str,
        *,
        action: Action | None = None,
        argv: list[str] | None = None,
        exit_code: int | None = None,
        output: str | None = None,
        intent_id: str | None = None,
    ) -> Remediation:
        act = action or d.action
        return Remediation(
            remediation_id=stable_id(act.value, f.node, f.failure_id, decision.value, d.rule),
            ts=f.last_seen,
            decided_at=time.time(),
            node=f.node,
            action=act,
            argv=argv or [],
            dry_run=not self.cfg.enforce,
            decision=decision,
            reason=reason,
            failure_ids=[f.failure_id],
            exit_code=exit_code,
            output=output,
            intent_id=intent_id,
        )

    async def _plain(self, f: Failure, d: Decision) -> Remediation:
        return self._remediation(f, d, d.decision, d.reason)

    async def _fire(
        self, name: str, f: Failure, summary: str, severity: str | None = None, description: str | None = None
    ) -> bool:
        """Fire an alert about ``f``: its GPU, job, episode start, failure id, dry-run flag,
        runbook and generatorURL."""
        return await self.alerter.fire(
            name,
            f.node,
            f.pattern,
            severity or f.severity.value,
            summary,
            description or f.verdict,
            gpu=f.gpu_index,
            job_id=f.job_id,
            dry_run=not self.cfg.enforce,
            starts_at=f.first_seen,
            failure_id=f.failure_id,
            generator_url=self.settings.generator_url(f.failure_id),
        )

    async def _alert(self, f: Failure, d: Decision, name: str = "GpuwardenRemediationRefused") -> None:
        await self._fire(name, f, f"{f.node}: {d.reason}")

    async def _carry_out(self, f: Failure, d: Decision, node: NodeState | None, now: float) -> Remediation:
        argv: list[str] = []
        if d.slurm_reason:
            try:
                argv = drain_argv(f.node, "DRAIN", d.slurm_reason)
            except ValueError:
                argv = []
        decision, reason = d.decision, d.reason
        exit_code: int | None = None
        output: str | None = None
        if d.trips_breaker and self.history.breaker_reason is None:
            self.history.breaker_reason = d.reason
            self.metrics.errors.labels("breaker").inc()
            log.error("circuit breaker tripped: %s (gpuwarden remediator reset-breaker to close)", d.reason)
            await self.alerter.fire(
                "GpuwardenCircuitBreakerOpen",
                "-",
                "breaker",
                "critical",
                f"remediator stopped draining: {d.reason}",
                "Stays open until a person runs `gpuwarden remediator reset-breaker`.",
            )
        intent_id: str | None = None
        if d.kind == "drain" and decision == D.EXECUTED:
            assert d.slurm_reason is not None
            # the intent is on the broker (confirmed) before the command runs: a crash in
            # between leaves an intent without an outcome, reconciled at the next start.
            # A DeliveryError here propagates: the failure is not handled and is read again.
            intent = self._remediation(f, d, D.INTENT, f"{reason} (intent: about to run the command)", argv=argv)
            self.intents[intent.remediation_id] = intent
            self._save()
            await self.publish("remediations", f.node, intent)
            await self.producer.flush()
            intent_id = intent.remediation_id
            status, argv2, exit_code, output, err = await self._drain_with_retries(f.node, d.slurm_reason)
            argv = argv2 or argv
            self.intents.pop(intent_id, None)
            if status == "foreign":
                decision = D.REFUSED
                reason = f"[rule=foreign-reason] {err}; never overwriting someone else's reason"
                self.history.handled.add(f.failure_id)
                await self._fire("GpuwardenRemediationRefused", f, f"{f.node}: {reason}")
            elif status != "ok":
                decision, reason = D.FAILED, f"[rule=command] drain failed after retries: {err}"
                self.history.handled.add(f.failure_id)  # never loop on it: a person looks (alerted)
                await self._fire("GpuwardenRemediationFailed", f, f"drain of {f.node} failed: {err}", "critical")
        if d.kind == "drain" and decision in (D.EXECUTED, D.DRY_RUN):
            self.history.handled.add(f.failure_id)
            self.history.record_drain(f.node, now)
            if decision == D.EXECUTED:
                assert d.slurm_reason is not None
                rec = DrainRecord(f.node, d.slurm_reason, now)
                rec.failures[id8(f.failure_id)] = FailureNote(f.failure_id, f.pattern)
                self.history.drained[f.node] = rec
                for known in (self.nodes, self.slurm_nodes):
                    if f.node in known:
                        cur = known[f.node]
                        known[f.node] = cur.model_copy(
                            update={"flags": [*cur.flags, "DRAIN"], "reason": d.slurm_reason}
                        )
            # a dry run alerts exactly as a drain does (same name and labels, dry_run="true"):
            # a team evaluating gpuwarden before enforcing hears what it would have done
            gpu = "" if f.gpu_index is None else f" GPU {f.gpu_index}"
            what = "drained" if decision == D.EXECUTED else "would drain (dry-run, not drained)"
            await self._fire(
                "GpuwardenNodeDrained",
                f,
                f"gpuwarden {what} {f.node}: {f.pattern}{gpu} (failure {id8(f.failure_id)})",
            )
        elif d.kind == "alert" and decision == D.EXECUTED:
            self.history.handled.add(f.failure_id)
            await self._fire("GpuwardenFailure", f, f"{f.pattern} on {f.node} (alert only, not drained)")
        elif d.rule == "already-drained" and node is not None:
            held = self.history.drained.get(f.node)
            if held is None and node.reason:
                held = self.history.drained[f.node] = _adopt(node)
            if held is not None and node.reason == held.reason:
                held.failures.setdefault(id8(f.failure_id), FailureNote(f.failure_id, f.pattern))
            if "for this failure" in reason:
                self.history.handled.add(f.failure_id)
        elif d.alert and decision == D.REFUSED and d.rule != "breaker-window" and d.rule != "breaker-fraction":
            await self._alert(f, d)
        return self._remediation(
            f, d, decision, reason, argv=argv, exit_code=exit_code, output=output, intent_id=intent_id
        )

    async def _drain_with_retries(self, name: str, reason: str) -> tuple[str, list[str], int | None, str | None, str]:
        """Drain with retries and exponential backoff, never blindly: before every attempt the
        node is read again and the own-reason rule re-applied. Returns ``(status, argv, exit
        code, output, error)``; status ``ok`` (drained with ``reason``: by this call, or an
        earlier attempt that landed despite its error), ``foreign`` (meanwhile out with a
        reason that is not this drain's: left alone, ``error`` says whose), ``failed``."""
        tries = 1 + self.settings.remediator_command_retries
        err = ""
        argv: list[str] = []
        code: int | None = None
        out: str | None = None
        for attempt in range(tries):
            if attempt:
                await asyncio.sleep(self.settings.remediator_retry_backoff_s * 2 ** (attempt - 1))
            try:
                cur = await self.client.node(name)
            except (SlurmError, OSError, ValueError) as exc:
                err = f"cannot re-read {name} before the attempt (no blind write): {exc}"
                log.warning("drain of %s: %s (try %d/%d)", name, err, attempt + 1, tries)
                continue
            if cur is None:
                return "failed", argv, code, out, f"{name} is no longer known to Slurm"
            if is_out(cur):
                if cur.reason == reason:
                    return "ok", argv, code, out, ""
                who = f" by {cur.reason_user}" if cur.reason_user else ""
                return "foreign", argv, code, out, f"{name} is now {cur.state}{who} with reason {cur.reason!r}"
            try:
                res = await self.client.update_node(name, "DRAIN", reason)
            except (SlurmError, OSError, ValueError) as exc:
                err = str(exc)
                log.warning("drain of %s failed (try %d/%d): %s", name, attempt + 1, tries, err)
                continue
            argv, code, out = list(res.argv), res.exit_code, res.output() or None
            if res.ok:
                return "ok", argv, code, out, ""
            err = f"scontrol exit {res.exit_code}: {res.output(300)}"
            log.warning("drain of %s failed (try %d/%d): %s", name, attempt + 1, tries, err)
        # the last attempt may have landed after all (a timeout): the node decides
        try:
            cur = await self.client.node(name)
        except (SlurmError, OSError, ValueError):
            cur = None
        if cur is not None and is_out(cur) and cur.reason == reason:
            return "ok", argv, code, out, ""
        if cur is not None and is_out(cur):
            return "foreign", argv, code, out, f"{name} is now {cur.state} with reason {cur.reason!r}"
        return "failed", argv, code, out, err

    # -- resolution -> resume ----------------------------------------------------------
    async def _on_resolved(self, f: Failure, now: float) -> tuple[Decision, Remediation]:
        """Note a resolved failure behind a drain; resolve its alerts (every alert about this
        node, pattern and GPU, ``endsAt`` = the episode's last signal)."""
        await self.alerter.resolve(f.node, pattern=f.pattern, gpu=f.gpu_index, ends_at=f.last_seen)
        rec = self.history.drained.get(f.node)
        note = rec.failures.get(id8(f.failure_id)) if rec else None
        if rec is None or note is None:
            why = "failure resolved; gpuwarden holds no drain for it"
        else:
            if note.open:
                note.open, note.resolved_at = False, now
            left = [k for k, n in rec.failures.items() if n.open]
            why = (
                f"failure resolved; {len(left)} other failure(s) behind the drain still open"
                if left
                else f"failure resolved; {f.node} resumes after the {self.policy_file.hold_down_s:g}s hold-down"
            )
        d = Decision(D.SKIPPED, f"[rule=resolved] {why}", Action.NONE, rule="resolved")
        return d, self._remediation(f, d, D.SKIPPED, d.reason)

    async def resume_due(self) -> list[Remediation]:
        """Resume every node gpuwarden drained whose failures have all resolved and whose
        hold-down has passed; stop tracking drains someone else took over. Returns the
        published remediations (resumes and refusals)."""
        out: list[Remediation] = []
        async with self._lock:
            if not self.lease.held():
                return out
            for name, rec in list(self.history.drained.items()):
                try:
                    node = await self.client.node(name)
                except (SlurmError, OSError, ValueError) as exc:
                    log.warning("cannot read %s for resume: %s", name, exc)
                    continue
                rd = decide_resume(node, rec, self.policy_file, self.history, self.now())
                if rd.verdict == "wait":
                    continue
                fids = [n.failure_id for n in rec.failures.values()]
                argv: list[str] = []
                code: int | None = None
                output: str | None = None
                decision = D.SKIPPED
                reason = f"[rule={rd.rule}] {rd.reason}"
                if rd.verdict == "resume":
                    if not self.cfg.enforce:
                        decision, argv = D.DRY_RUN, drain_argv(name, "RESUME", None)
                        reason += " (dry-run)"
                    else:
                        ok, argv, code, output, err = await self._resume_with_retries(name, rec.reason)
                        decision = D.EXECUTED if ok else D.FAILED
                        if not ok:
                            reason = f"[rule=command] resume failed after retries: {err}"
                            await self.alerter.fire(
                                "GpuwardenRemediationFailed",
                                name,
                                "resume",
                                "warning",
                                f"resume of {name} failed: {err}",
                            )
                    if decision in (D.EXECUTED, D.DRY_RUN):
                        await self.alerter.resolve(name)
                del self.history.drained[name]
                rem = Remediation(
                    remediation_id=stable_id("resume", name, *fids, decision.value, rd.rule),
                    ts=self.now(),
                    decided_at=time.time(),
                    node=name,
                    action=Action.RESUME,
                    argv=argv,
                    dry_run=not self.cfg.enforce,
                    decision=decision,
                    reason=f"resume: {reason}",
                    failure_ids=fids,
                    exit_code=code,
                    output=output,
                )
                self.decisions[decision.value] = self.decisions.get(decision.value, 0) + 1
                self.recent.append(
                    {
                        "at": rem.decided_at,
                        "node": name,
                        "decision": decision.value,
                        "action": "resume",
                        "rule": rd.rule,
                        "failure": ",".join(fids),
                        "pattern": "",
                        "reason": rem.reason,
                        "argv": argv,
                    }
                )
                await self.publish("remediations", name, rem)
                log.warning("%s resume of %s (rule %s): %s", decision.value, name, rd.rule, rem.reason)
                out.append(rem)
            out.extend(await self._resume_health_drains())
            self._save()
        return out

    async def _resume_health_drains(self) -> list[Remediation]:
        """Resume nodes the Slurm health-check wrapper drained (reason starting with one of
        :data:`HEALTH_REASON_PREFIXES`) once a health check of that node passed after the drain
        and after its last failed check, with no failed check since (the same rule as
        ``require_health_check``). The node is re-read from Slurm first and resumed only while its
        reason is still the health check's: a reason someone else set is never touched."""
        out: list[Remediation] = []
        settled = time.monotonic() - HEALTH_SETTLE_S
        for name, cached in list(self.nodes.items()):
            reason = cached.reason or ""
            if not is_out(cached) or not reason.startswith(HEALTH_REASON_PREFIXES):
                continue
            since = max(cached.reason_ts or 0.0, self.history.health_fail.get(name, 0.0))
            if (name, reason, since) in self._health_done or self._health_seen.get(name, float("inf")) > settled:
                continue
            if since <= 0.0 or not self.history.health_ok_since(name, since) or self.history.health_pass[name] <= since:
                continue  # no pass after the drain (a drain of unknown time needs a known failed check)
            try:
                node = await self.client.node(name)
            except (SlurmError, OSError, ValueError) as exc:
                log.warning("cannot read %s for a health-check resume: %s", name, exc)
                continue
            if node is None or not is_out(node) or node.reason != reason:
                if node is not None:
                    self.nodes[name] = node
                continue  # resumed or re-drained by someone else meanwhile: not ours to touch
            self._health_done.add((name, reason, since))
            why = (
                f"[rule=health-check-passed] drained by the health check ({reason[:80]!r}); "
                f"a health check passed at {self.history.health_pass[name]:.0f}, after the drain and the last failure"
            )
            argv, code, output = drain_argv(name, "RESUME", None), None, None
            if not self.cfg.enforce:
                decision, why = D.DRY_RUN, why + " (dry-run)"
            else:
                ok, argv, code, output, err = await self._resume_with_retries(name, reason)
                decision = D.EXECUTED if ok else D.FAILED
                if not ok:
                    why = f"[rule=command] resume failed after retries: {err}"
                    await self.alerter.fire(
                        "GpuwardenRemediationFailed", name, "resume", "warning", f"resume of {name} failed: {err}"
                    )
                else:
                    self.nodes[name] = node.model_copy(update={"flags": [], "reason": None, "state": "IDLE"})
            rem = Remediation(
                remediation_id=stable_id("resume-health", name, reason, decision.value),
                ts=self.history.health_pass[name],
                decided_at=time.time(),
                node=name,
                action=Action.RESUME,
                argv=argv,
                dry_run=not self.cfg.enforce,
                decision=decision,
                reason=f"resume: {why}",
                failure_ids=[],
                exit_code=code,
                output=output,
            )
            self.decisions[decision.value] = self.decisions.get(decision.value, 0) + 1
            self.recent.append(
                {"at": rem.decided_at, "node": name, "decision": decision.value, "action": "resume",
                 "rule": "health-check-passed", "failure": "", "pattern": "health-check-failed",
                 "reason": rem.reason, "argv": argv}
            )  # fmt: skip
            await self.publish("remediations", name, rem)
            log.warning("%s resume of %s (rule health-check-passed): %s", decision.value, name, rem.reason)
            out.append(rem)
        return out

    async def _resume_with_retries(
        self, name: str, expect_reason: str | None = None
    ) -> tuple[bool, list[str], int | None, str | None, str]:
        """Resume with retries, never blindly: before every attempt the node is read again and
        resumed only while it is still out with ``expect_reason`` (gpuwarden's own). Returns
        ``(resumed, argv, exit code, output, error)``; a node resumed meanwhile counts as done."""
        tries = 1 + self.settings.remediator_command_retries
        err, code, out = "", None, None
        argv: list[str] = []
        for attempt in range(tries):
            if attempt:
                await asyncio.sleep(self.settings.remediator_retry_backoff_s * 2 ** (attempt - 1))
            if expect_reason is not None:
                try:
                    cur = await self.client.node(name)
                except (SlurmError, OSError, ValueError) as exc:
                    err = f"cannot re-read {name} before the attempt (no blind write): {exc}"
                    continue
                if cur is None or not is_out(cur):
                    return (attempt > 0), argv, code, out, "" if attempt else f"{name} is no longer out"
                if cur.reason != expect_reason:
                    return False, argv, code, out, f"{name} now has reason {cur.reason!r}: not gpuwarden's, not resumed"
            try:
                res = await self.client.update_node(name, "RESUME", None)
            except (SlurmError, OSError, ValueError) as exc:
                err = str(exc)
                continue
            argv, code, out = list(res.argv), res.exit_code, res.output() or None
            if res.ok:
                return True, argv, code, out, ""
            err = f"scontrol exit {res.exit_code}: {res.output(300)}"
        return False, argv, code, out, err

    # -- breaker, status, persistence --------------------------------------------------
    def reset_breaker(self, by: str) -> str | None:
        """Close a tripped breaker; returns what it was."""
        was = self.history.breaker_reason
        self.history.reset_breaker()
        log.warning("circuit breaker reset by %s (was: %s)", by, was)
        self._save()
        return was

    def _sync_breaker(self) -> None:
        """Pick up a ``reset-breaker --ledger`` made while running."""
        if self.ledger is None or self.history.breaker_reason is None:
            return
        try:
            at = float(self.ledger.read().get("breaker_reset_at") or 0.0)
        except (OSError, ValueError):
            return
        if at > self._reset_seen:
            self._reset_seen = at
            self.reset_breaker("the ledger file (gpuwarden remediator reset-breaker)")

    def status(self) -> dict[str, Any]:
        """Breaker state, recent actions, drained nodes with their failures."""
        return {
            "enforce": self.cfg.enforce,
            "cluster": self.settings.remediator_cluster,
            "active": self.lease.held(),
            "breaker": {"open": self.history.breaker_reason is not None, "reason": self.history.breaker_reason},
            "drained": {
                n: {
                    "reason": r.reason,
                    "drained_at": r.drained_at,
                    "failures": [vars(x) for x in r.failures.values()],
                }
                for n, r in self.history.drained.items()
            },
            "decisions": dict(self.decisions),
            "recent": list(self.recent),
            "alerts_active": len(self.alerter.active),
        }

    def _save(self) -> None:
        if self.ledger is None:
            return
        try:
            data = {
                "history": self.history.to_json(),
                "recent": list(self.recent),
                "status": self.status(),
                "breaker_reset_at": self._reset_seen,
                "intents": [r.model_dump(mode="json") for r in self.intents.values()],
                "updated_at": time.time(),
            }
            self.ledger.write(data)
        except (OSError, ValueError) as exc:
            log.error("cannot write the ledger %s: %s", self.ledger.path, exc)

    async def _reset_view(self, _: web.Request) -> web.Response:
        was = self.reset_breaker("HTTP POST /breaker/reset")
        return web.json_response({"breaker": "closed", "was": was})

    async def _status_view(self, _: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _failure_view(self, req: web.Request) -> web.Response:
        """``GET /failures/<id>``: this remediator's recent decisions on one failure (an
        alert's generatorURL without a console); 404 when it has none."""
        fid = req.match_info["failure_id"]
        seen = [r for r in self.recent if fid in str(r.get("failure", "")).split(",")]
        if not seen:
            return web.json_response({"failure_id": fid, "error": "no recent decision on this failure"}, status=404)
        return web.json_response({"failure_id": fid, "decisions": seen})

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


class _RemediatorCollector(Collector):
    """The remediator's own series on its ``/metrics``, read at scrape time:
    ``gpuwarden_remediator_breaker_open`` (1 open), ``gpuwarden_remediator_enforce`` (1 enforcing,
    0 dry-run), ``gpuwarden_remediator_lease_held``, ``gpuwarden_remediator_drained_nodes`` (drains
    gpuwarden holds), ``gpuwarden_remediator_decisions_total{decision}``,
    ``gpuwarden_remediator_alerts_active``, ``gpuwarden_remediator_alerts_delivered_total``,
    ``gpuwarden_remediator_alerts_failed_total`` (deliveries that failed after retries)."""

    def __init__(self, r: Remediator) -> None:
        self.r = r

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> list[Metric]:  # type: ignore[override]
        r = self.r

        def gauge(name: str, help_: str, v: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_, value=v)

        out: list[Metric] = [
            gauge("gpuwarden_remediator_breaker_open", "1 while the circuit breaker is open (no drains)",
                  1.0 if r.history.breaker_reason is not None else 0.0),
            gauge("gpuwarden_remediator_enforce", "1 = drains for real, 0 = dry-run", 1.0 if r.cfg.enforce else 0.0),
            gauge("gpuwarden_remediator_lease_held", "1 while this replica is the active remediator",
                  1.0 if r.lease.held() else 0.0),
            gauge("gpuwarden_remediator_drained_nodes", "Nodes drained by gpuwarden and not yet resumed",
                  float(len(r.history.drained))),
            gauge("gpuwarden_remediator_alerts_active", "Alerts firing (sent, not yet resolved)",
                  float(len(r.alerter.active))),
        ]  # fmt: skip
        dec = CounterMetricFamily("gpuwarden_remediator_decisions", "Decisions by outcome", labels=["decision"])
        for k in ("executed", "dry-run", "skipped", "refused", "failed"):
            dec.add_metric([k], float(r.decisions.get(k, 0)))
        out.append(dec)
        delivered, failed = float(r.alerter.delivered), float(r.alerter.failed)
        out.append(
            CounterMetricFamily(
                "gpuwarden_remediator_alerts_delivered", "Alert deliveries that succeeded", value=delivered
            )
        )
        out.append(
            CounterMetricFamily(
                "gpuwarden_remediator_alerts_failed", "Alert deliveries that failed after retries", value=failed
            )
        )
        return out


def _adopt(n: NodeState) -> DrainRecord:
    """A record for a gpuwarden drain found on a node (after a restart without ledger):
    the failure is known by its short id from the reason."""
    reason = n.reason or ""
    parts = dict(p.split("=", 1) for p in reason[len(REASON_PREFIX) :].split() if "=" in p)
    fid = parts.get("failure", "")
    pattern = reason[len(REASON_PREFIX) :].split()[0] if reason[len(REASON_PREFIX) :].split() else ""
    rec = DrainRecord(n.node, reason, n.reason_ts or 0.0)
    if fid:
        rec.failures[id8(fid)] = FailureNote(fid, pattern)
    return rec


async def resume_node(client: SlurmClient, name: str, dry_run: bool = False) -> tuple[int, str]:
    """Resume ``name`` only if gpuwarden drained it (its reason starts with ``gpuwarden:``).

    Returns:
        ``(exit code, message)``: 0 resumed / would resume / nothing to do; 1 refused or the
        command failed; 2 unknown node or invalid name.
    """
    try:
        node = await client.node(name)
    except ValueError as exc:
        return 2, f"error: {exc}"
    if node is None:
        return 2, f"error: node {name} is not known to Slurm"
    if not node.drained and not node.state.startswith("DOWN"):
        return 0, f"{name} is {node.state}, not drained: nothing to do"
    if not is_ours(node.reason):
        who = node.reason_user or "someone else"
        return 1, (
            f"refused: {name} was drained/downed by {who} with reason {node.reason!r}, not by gpuwarden "
            f"(its reason does not start with 'gpuwarden:'). Resume it with scontrol yourself if intended."
        )
    if dry_run:
        return 0, f"dry-run: would resume {name} (reason {node.reason!r})"
    res = await client.update_node(name, "RESUME", None)
    if not res.ok:
        return 1, f"resume of {name} failed (exit {res.exit_code}): {res.output(300)}"
    return 0, f"resumed {name} (was drained by gpuwarden: {node.reason!r})"
