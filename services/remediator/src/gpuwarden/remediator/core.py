"""The remediator's decision core: failures -> Slurm drains, resolutions -> resumes, every
decision recorded.

:class:`RemediatorCore` holds the state (history, drains held, open intents, known nodes,
recent decisions, ledger) and the paths that change it: the drain path (failure -> re-read ->
decide -> intent -> command -> outcome), :meth:`~RemediatorCore.reconcile` and the resume
paths. They share one lock, one history and one ledger write, which is why they stay in one
class. Everything around them has its own module: the Kafka/HTTP shell
(:mod:`.service`), the pure decisions (:mod:`.policy`), the Slurm commands with their
verification re-reads and retries (:mod:`.actuation`), the records written
(:mod:`.records`), the alerts raised (:mod:`.remediation_alerts`), the health-check drains due
for a resume (:mod:`.health_drains`), open intents (:mod:`.intents`) and the ledger file
(:mod:`.ledger`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from gpuwarden.shared.bus import Producer
from gpuwarden.shared.lease import Lease
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
from gpuwarden.shared.slurm import SlurmClient, SlurmError, drain_argv

from .actuation import SlurmActuator
from .alerts import Alerter
from .health_drains import HealthDrains
from .intents import reconciled
from .ledger import Ledger, LedgerState
from .policy import Decision, FailureNote, History, adopt_drain, decide, decide_resume, id8, is_ours, is_out
from .policy_file import PolicyFile
from .records import failure_remediation, recent_entry, resume_remediation
from .remediation_alerts import RemediationAlerts
from .settings import RemediatorSettings

__all__ = ["RemediatorCore"]

log = logging.getLogger(__name__)

D = RemediationDecision


class RemediatorCore(Service):
    """Decides and acts on failures and resumes, serialised (one at a time) and only while
    ``lease`` is held; publishes one :class:`Remediation` (key: node) per decision. The
    :class:`~gpuwarden.remediator.service.Remediator` builds its inputs from settings and feeds
    it from Kafka.

    Args:
        settings: service settings.
        client: Slurm client.
        producer: bus producer (None: Kafka).
        now: decision clock, epoch s.
        alerter: alert delivery.
        lease: one-active-replica lease.
        policy: the policy.
    """

    name = "remediator"

    def __init__(
        self,
        settings: RemediatorSettings,
        client: SlurmClient,
        producer: Producer | None,
        now: Callable[[], float],
        alerter: Alerter,
        lease: Lease,
        policy: PolicyFile,
    ) -> None:
        super().__init__(settings, producer)
        self.settings: RemediatorSettings = settings
        self.policy_file = policy
        self.actuator = SlurmActuator(client, settings)
        self.now = now
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
        self.alerts = RemediationAlerts(alerter, dry_run=not self.cfg.enforce, generator_url=settings.generator_url)
        self.lease = lease
        self.ledger = Ledger(settings.remediator_ledger_file) if settings.remediator_ledger_file else None
        self._reset_seen = 0.0
        self.health_drains = HealthDrains()
        self._lock = asyncio.Lock()

    @property
    def client(self) -> SlurmClient:
        """The Slurm client (assigning it replaces the actuator's too)."""
        return self.actuator.client

    @client.setter
    def client(self, client: SlurmClient) -> None:
        self.actuator.client = client

    @property
    def alerter(self) -> Alerter:
        """The alert delivery (assigning it replaces the one :attr:`alerts` fires on)."""
        return self.alerts.alerter

    @alerter.setter
    def alerter(self, alerter: Alerter) -> None:
        self.alerts.alerter = alerter

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
            state = LedgerState.from_json(data)
            if state.history is not None:
                self.history = state.history
            self.recent.extend(state.recent)
            self._reset_seen = state.breaker_reset_at
            self.intents.update((r.remediation_id, r) for r in state.intents)
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
                self.history.drained[n.node] = adopt_drain(n)
        self._save()

    def note_health(self, result: HealthCheckResult) -> None:
        """Remember a health check result of the ``health`` topic (for ``require_health_check``
        and for resuming nodes the health check drained)."""
        self.history.note_health(result.node, result.ts, result.passed)
        self.health_drains.note_result(result.node)

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
                return await self._finish(f, d, self._plain(f, d))
            if f.state == FailureState.RESOLVED:
                return await self._finish(f, *await self._on_resolved(f, now))
            node: NodeState | None = None
            what = "cannot read node state from Slurm"
            try:
                try:
                    node = await self.client.node(f.node)
                except ValueError:
                    node = None  # invalid name: decide() refuses it
                if node is not None:
                    self.nodes[node.node] = node
                what = "cannot list the nodes from Slurm (the breaker needs them)"
                cluster = await self._cluster()
            except (SlurmError, OSError, ValueError) as exc:
                d = Decision(
                    D.FAILED, f"[rule=slurm-read] {what}: {exc}", f.recommended_action, rule="slurm-read", alert=True
                )
                await self.alerts.refused(f, d.reason)
                return await self._finish(f, d, self._plain(f, d))
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
        now (:func:`~gpuwarden.remediator.intents.reconciled`): an ``executed`` drain is adopted,
        so it is resumed later; a ``refused`` one is never gpuwarden's, never resumed; a
        ``failed`` one is decided again when the failure is redelivered. A node Slurm cannot be
        asked about stays open for the next try. Returns the outcomes published."""
        out: list[Remediation] = []
        async with self._lock:
            for key, intent in list(self.intents.items()):
                try:
                    node = await self.client.node(intent.node)
                except (SlurmError, OSError, ValueError) as exc:
                    log.warning("cannot reconcile the intent on %s yet: %s", intent.node, exc)
                    continue
                decision, why = reconciled(intent, node)
                if decision == D.EXECUTED:
                    assert node is not None and node.reason is not None
                    drained_at = node.reason_ts or intent.ts
                    self.history.adopt_intent(intent.node, node.reason, drained_at, intent.failure_ids, intent.ts)
                elif decision == D.REFUSED:
                    self.history.handled.update(intent.failure_ids)
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
                self._count(rem)
                log.warning("reconciled intent on %s: %s %s", intent.node, decision.value, why)
                out.append(rem)
            self._save()
        return out

    def _count(self, rem: Remediation) -> None:
        self.decisions[rem.decision.value] = self.decisions.get(rem.decision.value, 0) + 1

    def _note(self, rem: Remediation, rule: str, failure: str, pattern: str) -> None:
        """Count a decision and add it to the recent ones."""
        self._count(rem)
        self.recent.append(recent_entry(rem, rule, failure, pattern))

    async def _finish(self, f: Failure, d: Decision, rem: Remediation) -> Remediation:
        self._note(rem, d.rule, f.failure_id, f.pattern)
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

    def _plain(self, f: Failure, d: Decision) -> Remediation:
        return failure_remediation(f, d, d.decision, d.reason, dry_run=not self.cfg.enforce)

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
            await self.alerts.breaker_open(d.reason)
        intent_id: str | None = None
        if d.kind == "drain" and decision == D.EXECUTED:
            assert d.slurm_reason is not None
            # the intent is on the broker (confirmed) before the command runs: a crash in
            # between leaves an intent without an outcome, reconciled at the next start.
            # A DeliveryError here propagates: the failure is not handled and is read again.
            intent = failure_remediation(
                f, d, D.INTENT, f"{reason} (intent: about to run the command)", dry_run=not self.cfg.enforce, argv=argv
            )
            self.intents[intent.remediation_id] = intent
            self._save()
            await self.publish("remediations", f.node, intent)
            await self.producer.flush()
            intent_id = intent.remediation_id
            res = await self.actuator.drain(f.node, d.slurm_reason)
            argv, exit_code, output = res.argv or argv, res.exit_code, res.output
            self.intents.pop(intent_id, None)
            if res.status == "foreign":
                decision = D.REFUSED
                reason = f"[rule=foreign-reason] {res.error}; never overwriting someone else's reason"
                self.history.handled.add(f.failure_id)
                await self.alerts.refused(f, reason)
            elif not res.ok:
                decision, reason = D.FAILED, f"[rule=command] drain failed after retries: {res.error}"
                self.history.handled.add(f.failure_id)  # never loop on it: a person looks (alerted)
                await self.alerts.drain_failed(f, res.error)
        if d.kind == "drain" and decision in (D.EXECUTED, D.DRY_RUN):
            self.history.handled.add(f.failure_id)
            self.history.record_drain(f.node, now)
            if decision == D.EXECUTED:
                assert d.slurm_reason is not None
                self.history.note_drained(f.node, d.slurm_reason, now, f.failure_id, f.pattern)
                for known in (self.nodes, self.slurm_nodes):
                    if f.node in known:
                        cur = known[f.node]
                        known[f.node] = cur.model_copy(
                            update={"flags": [*cur.flags, "DRAIN"], "reason": d.slurm_reason}
                        )
            # a dry run alerts exactly as a drain does (same name and labels, dry_run="true"):
            # a team evaluating gpuwarden before enforcing hears what it would have done
            await self.alerts.drained(f, executed=decision == D.EXECUTED)
        elif d.kind == "alert" and decision == D.EXECUTED:
            self.history.handled.add(f.failure_id)
            await self.alerts.alert_only(f)
        elif d.rule == "already-drained" and node is not None:
            held = self.history.drained.get(f.node)
            if held is None and node.reason:
                held = self.history.drained[f.node] = adopt_drain(node)
            if held is not None and node.reason == held.reason:
                held.failures.setdefault(id8(f.failure_id), FailureNote(f.failure_id, f.pattern))
            if "for this failure" in reason:
                self.history.handled.add(f.failure_id)
        elif d.alert and decision == D.REFUSED and d.rule != "breaker-window" and d.rule != "breaker-fraction":
            await self.alerts.refused(f, d.reason)
        return failure_remediation(
            f,
            d,
            decision,
            reason,
            dry_run=not self.cfg.enforce,
            argv=argv,
            exit_code=exit_code,
            output=output,
            intent_id=intent_id,
        )

    # -- resolution -> resume ----------------------------------------------------------
    async def _on_resolved(self, f: Failure, now: float) -> tuple[Decision, Remediation]:
        """Note a resolved failure behind a drain; resolve its alerts (every alert about this
        node, pattern and GPU, ``endsAt`` = the episode's last signal)."""
        await self.alerter.resolve(f.node, pattern=f.pattern, gpu=f.gpu_index, ends_at=f.last_seen)
        why = self.history.note_resolved(f.node, f.failure_id, now, self.policy_file.hold_down_s)
        d = Decision(D.SKIPPED, f"[rule=resolved] {why}", Action.NONE, rule="resolved")
        return d, self._plain(f, d)

    async def _resume(
        self, name: str, expect_reason: str, why: str
    ) -> tuple[RemediationDecision, str, list[str], int | None, str | None]:
        """Resume ``name`` (enforcing; else record a dry run) while it is out with
        ``expect_reason``; alert when the command fails. Returns ``(decision, why, argv, exit
        code, output)``."""
        if not self.cfg.enforce:
            return D.DRY_RUN, why + " (dry-run)", drain_argv(name, "RESUME", None), None, None
        res = await self.actuator.resume(name, expect_reason)
        if res.ok:
            return D.EXECUTED, why, res.argv, res.exit_code, res.output
        await self.alerts.resume_failed(name, res.error)
        return D.FAILED, f"[rule=command] resume failed after retries: {res.error}", res.argv, res.exit_code, res.output

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
                    decision, reason, argv, code, output = await self._resume(name, rec.reason, reason)
                    if decision in (D.EXECUTED, D.DRY_RUN):
                        await self.alerter.resolve(name)
                del self.history.drained[name]
                rem = resume_remediation(
                    stable_id("resume", name, *fids, decision.value, rd.rule), name, self.now(), decision, reason,
                    fids, dry_run=not self.cfg.enforce, argv=argv, exit_code=code, output=output,
                )  # fmt: skip
                self._note(rem, rd.rule, ",".join(fids), "")
                await self.publish("remediations", name, rem)
                log.warning("%s resume of %s (rule %s): %s", decision.value, name, rd.rule, rem.reason)
                out.append(rem)
            out.extend(await self._resume_health_drains())
            self._save()
        return out

    async def _resume_health_drains(self) -> list[Remediation]:
        """Resume the nodes the Slurm health-check wrapper drained that
        :meth:`HealthDrains.due <gpuwarden.remediator.health_drains.HealthDrains.due>` names.
        The node is re-read from Slurm first and resumed only while its reason is still the
        health check's: a reason someone else set is never touched."""
        out: list[Remediation] = []
        for due in self.health_drains.due(self.nodes, self.history):
            name, reason = due.node, due.reason
            try:
                node = await self.client.node(name)
            except (SlurmError, OSError, ValueError) as exc:
                log.warning("cannot read %s for a health-check resume: %s", name, exc)
                continue
            if node is None or not is_out(node) or node.reason != reason:
                if node is not None:
                    self.nodes[name] = node
                continue  # resumed or re-drained by someone else meanwhile: not ours to touch
            self.health_drains.done(due)
            decision, why, argv, code, output = await self._resume(
                name, reason, due.why(self.history.health_pass[name])
            )
            if decision == D.EXECUTED:
                self.nodes[name] = node.model_copy(update={"flags": [], "reason": None, "state": "IDLE"})
            rem = resume_remediation(
                stable_id("resume-health", name, reason, decision.value), name, self.history.health_pass[name],
                decision, why, [], dry_run=not self.cfg.enforce, argv=argv, exit_code=code, output=output,
            )  # fmt: skip
            self._note(rem, "health-check-passed", "", "health-check-failed")
            await self.publish("remediations", name, rem)
            log.warning("%s resume of %s (rule health-check-passed): %s", decision.value, name, rem.reason)
            out.append(rem)
        return out

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
            at = self.ledger.breaker_reset_at()
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
            state = LedgerState(self.history, list(self.recent), self._reset_seen, list(self.intents.values()))
            self.ledger.write(state.to_json(self.status()))
        except (OSError, ValueError) as exc:
            log.error("cannot write the ledger %s: %s", self.ledger.path, exc)
