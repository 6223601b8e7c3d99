"""The remediator service: ``failures`` -> policy -> ``scontrol update`` -> ``remediations``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from aiokafka import ConsumerRecord
from pydantic import BaseModel, Field

from gpuwarden.shared.bus import Producer
from gpuwarden.shared.models import Failure, NodeState, Remediation, RemediationDecision, stable_id
from gpuwarden.shared.service import Service
from gpuwarden.shared.settings import ServiceSettings
from gpuwarden.shared.slurm import DEFAULT_SIM_STATE_FILE, SlurmClient, SlurmError, build_client, drain_argv

from .policy import Decision, History, PolicyConfig, decide, is_ours

__all__ = ["Remediator", "RemediatorSettings", "make_client", "resume_node"]

log = logging.getLogger(__name__)


class RemediatorSettings(ServiceSettings):
    """Settings of the remediator (``GPUWARDEN_REMEDIATOR_*`` plus the common ones)."""

    remediator_enforce: bool = Field(False, description="Really drain (False = dry-run: decide and record only)")
    remediator_backend: Literal["cli", "simulated"] = Field("cli", description="cli = scontrol; simulated = scenario")
    remediator_scenario: Path | None = Field(None, description="Scenario YAML (backend=simulated)")
    remediator_state_file: Path = Field(
        DEFAULT_SIM_STATE_FILE, description="Drain state file shared with the watcher (backend=simulated)"
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

    def policy(self) -> PolicyConfig:
        return PolicyConfig(
            enforce=self.remediator_enforce,
            max_drain_fraction=self.remediator_max_drain_fraction,
            min_drain_allowance=self.remediator_min_drain_allowance,
            max_drains_per_window=self.remediator_max_drains_per_window,
            window_s=self.remediator_window_s,
            max_per_node_per_week=self.remediator_max_per_node_per_week,
        )


def make_client(s: RemediatorSettings) -> tuple[SlurmClient, Callable[[], float]]:
    """The configured Slurm client and its clock (see ``build_client``)."""
    return build_client(
        s.remediator_backend,
        scenario=s.remediator_scenario,
        state_file=s.remediator_state_file,
        timeout_s=s.remediator_command_timeout_s,
        retries=s.remediator_command_retries,
    )


class Remediator(Service):
    """Consumes ``failures`` and ``slurm.nodes``; for each failure reads the node from Slurm,
    applies :func:`~gpuwarden.remediator.policy.decide`, drains when enforcing, and publishes
    one :class:`Remediation` (key: node) per decision. Decisions are serialised (one at a time).

    HTTP: ``POST /breaker/reset`` closes a tripped circuit breaker; ``/healthz`` shows it.

    Args:
        settings: service settings.
        client: Slurm client (default: from settings); tests pass ``FakeSlurm``.
        producer: bus producer (default: Kafka).
        now: decision clock, epoch s (default: the client's clock: event time in simulation).
    """

    name = "remediator"

    def __init__(
        self,
        settings: RemediatorSettings,
        client: SlurmClient | None = None,
        producer: Producer | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(settings, producer)
        self.settings: RemediatorSettings = settings
        if client is None:
            client, default_now = make_client(settings)
            now = now or default_now
        self.client = client
        self.now = now or time.time
        self.cfg = settings.policy()
        self.history = History()
        self.nodes: dict[str, NodeState] = {}
        self.decisions: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self.http.extra_routes.append(web.post("/breaker/reset", self._reset_view))

    async def on_start(self) -> None:
        await self.seed()
        self.consume(["failures", "slurm.nodes"], self._on_message)

    async def seed(self) -> None:
        """Learn the nodes from Slurm and count gpuwarden's own drains still in place
        (so a restart keeps the caps). A Slurm error is logged, not raised."""
        try:
            nodes = await self.client.nodes()
        except (SlurmError, OSError, ValueError) as exc:
            log.warning("cannot read nodes from Slurm at start: %s", exc)
            return
        for n in nodes:
            self.nodes[n.node] = n
            if n.drained and is_ours(n.reason):
                self.history.record_drain(n.node, n.reason_ts or self.now())

    async def _on_message(self, short: str, value: BaseModel, _rec: ConsumerRecord) -> None:
        if isinstance(value, Failure):
            await self.handle_failure(value)
        elif isinstance(value, NodeState):
            self.nodes[value.node] = value

    async def handle_failure(self, f: Failure) -> Remediation:
        """Decide (and act) on one failure; publish and return the :class:`Remediation`."""
        async with self._lock:
            now = self.now()
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
                    RemediationDecision.FAILED, f"cannot read node state from Slurm: {read_error}", f.recommended_action
                )
            else:
                if node is not None:
                    self.nodes[node.node] = node
                d = decide(f, node, self.nodes.values(), self.history, self.cfg, now)
            rem = await self._carry_out(f, d, now)
            self.decisions[rem.decision.value] = self.decisions.get(rem.decision.value, 0) + 1
            await self.publish("remediations", f.node, rem)
            log.info("%s %s on %s: %s", rem.decision.value, rem.action.value, rem.node, rem.reason)
            return rem

    async def _carry_out(self, f: Failure, d: Decision, now: float) -> Remediation:
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
            log.error("circuit breaker tripped: %s (POST /breaker/reset to close)", d.reason)
        if decision == RemediationDecision.EXECUTED:
            try:
                res = await self.client.update_node(f.node, "DRAIN", d.slurm_reason)
            except (SlurmError, OSError, ValueError) as exc:
                decision, reason = RemediationDecision.FAILED, f"drain command failed: {exc}"
            else:
                argv, exit_code, output = list(res.argv), res.exit_code, res.output() or None
                if not res.ok:
                    decision = RemediationDecision.FAILED
                    reason = f"scontrol exit {res.exit_code}: {res.output(300)}"
        if decision in (RemediationDecision.EXECUTED, RemediationDecision.DRY_RUN):
            self.history.handled.add(f.failure_id)
            self.history.record_drain(f.node, now)
            if decision == RemediationDecision.EXECUTED and f.node in self.nodes:
                cur = self.nodes[f.node]
                self.nodes[f.node] = cur.model_copy(update={"flags": [*cur.flags, "DRAIN"], "reason": d.slurm_reason})
        elif decision == RemediationDecision.SKIPPED and "for this failure" in reason:
            self.history.handled.add(f.failure_id)
        return Remediation(
            remediation_id=stable_id(d.action.value, f.node, f.failure_id, decision.value),
            ts=f.last_seen,
            decided_at=time.time(),
            node=f.node,
            action=d.action,
            argv=argv,
            dry_run=not self.cfg.enforce,
            decision=decision,
            reason=reason,
            failure_ids=[f.failure_id],
            exit_code=exit_code,
            output=output,
        )

    async def _reset_view(self, _: web.Request) -> web.Response:
        was = self.history.breaker_reason
        self.history.reset_breaker()
        log.warning("circuit breaker reset by request (was: %s)", was)
        return web.json_response({"breaker": "closed", "was": was})

    def health(self) -> dict[str, Any]:
        h = super().health()
        h.update(
            enforce=self.cfg.enforce,
            breaker=self.history.breaker_reason or "closed",
            decisions=dict(self.decisions),
            known_nodes=len(self.nodes),
        )
        return h


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
