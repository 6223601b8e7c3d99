"""The remediation policy: pure decisions over a failure, the node's state and history.

No I/O here; :class:`~gpuwarden.remediator.service.Remediator` gathers the inputs, calls
:func:`decide`, runs the command and records the outcome in :class:`History`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuwarden.shared.models import Action, Failure, FailureState, NodeState, RemediationDecision, Severity
from gpuwarden.shared.slurm import MAX_REASON_LEN, validate_node_name

__all__ = [
    "ACT_SEVERITIES",
    "DRAIN_ACTIONS",
    "REASON_PREFIX",
    "WEEK_S",
    "Decision",
    "History",
    "PolicyConfig",
    "decide",
    "drain_reason",
    "is_ours",
]

REASON_PREFIX = "gpuwarden:"
DRAIN_ACTIONS = frozenset({Action.DRAIN, Action.REBOOT, Action.RMA, Action.RESET_GPU})
ACT_SEVERITIES = frozenset({Severity.CRITICAL, Severity.FATAL})
WEEK_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class PolicyConfig:
    """Safety limits. Fractions are 0-1; times are seconds."""

    enforce: bool = False
    max_drain_fraction: float = 0.10
    min_drain_allowance: int = 1
    max_drains_per_window: int = 5
    window_s: float = 3600.0
    max_per_node_per_week: int = 3


@dataclass
class History:
    """What the policy remembers: handled failure ids, drains (node, time) taken or — in
    dry-run — that would have been taken, and the breaker latch."""

    handled: set[str] = field(default_factory=set)
    drains: list[tuple[str, float]] = field(default_factory=list)
    breaker_reason: str | None = None

    def record_drain(self, node: str, ts: float) -> None:
        self.drains.append((node, ts))
        cutoff = ts - WEEK_S
        self.drains = [(n, t) for n, t in self.drains if t >= cutoff]

    def reset_breaker(self) -> None:
        """Close the circuit breaker (a person decided draining may go on)."""
        self.breaker_reason = None


@dataclass(frozen=True)
class Decision:
    """``decision`` is ``EXECUTED`` when the caller should run the drain (``DRY_RUN`` when it
    should only record it); ``reason`` explains; ``slurm_reason`` is the drain reason;
    ``trips_breaker``: the refusal came from a breaker limit, latch it until a person resets."""

    decision: RemediationDecision
    reason: str
    action: Action
    slurm_reason: str | None = None
    trips_breaker: bool = False

    @property
    def act(self) -> bool:
        return self.decision in (RemediationDecision.EXECUTED, RemediationDecision.DRY_RUN)


def drain_reason(f: Failure) -> str:
    """``gpuwarden: <rule_id> gpu=<index|-> failure=<failure_id>``, at most ``MAX_REASON_LEN``
    characters (the rule id is shortened if needed; the failure id is always kept)."""
    gpu = "-" if f.gpu_index is None else str(f.gpu_index)
    tail = f" gpu={gpu} failure={f.failure_id}"
    room = MAX_REASON_LEN - len(REASON_PREFIX) - 1 - len(tail)
    rule = "".join(c if c.isprintable() and c not in "\r\n" else "_" for c in f.rule_id)[: max(room, 1)]
    return f"{REASON_PREFIX} {rule}{tail}"


def is_ours(reason: str | None) -> bool:
    """True if a node reason was set by gpuwarden (fixed prefix)."""
    return bool(reason) and str(reason).startswith(REASON_PREFIX)


def _out(n: NodeState) -> bool:
    return n.drained or n.state.startswith("DOWN") or "DOWN" in n.flags


def decide(
    f: Failure,
    node: NodeState | None,
    cluster: Iterable[NodeState],
    history: History,
    cfg: PolicyConfig,
    now: float,
) -> Decision:
    """Decide what to do about one failure.

    Args:
        f: the failure (possibly a redelivery or an episode update).
        node: the node's current state read from Slurm just now (``None``: unknown to Slurm).
        cluster: the last known state of every node (for the drained-share breaker).
        history: handled ids, drains in the last week, breaker latch (not modified here).
        cfg: limits.
        now: decision time, epoch s.

    Returns:
        SKIPPED (not a drain-worthy failure, already handled, node already drained by
        gpuwarden), REFUSED (bad/unknown node, someone else's reason, caps, breaker),
        or DRY_RUN / EXECUTED meaning "drain it" (the caller runs or only records it).
    """
    action = f.recommended_action if f.recommended_action in DRAIN_ACTIONS else Action.NONE

    def mk(d: RemediationDecision, why: str, slurm_reason: str | None = None, trips: bool = False) -> Decision:
        return Decision(d, why, Action.DRAIN if action != Action.NONE else f.recommended_action, slurm_reason, trips)

    if f.state != FailureState.OPEN:
        return mk(RemediationDecision.SKIPPED, "failure is resolved")
    if action == Action.NONE:
        return mk(RemediationDecision.SKIPPED, f"recommended action {f.recommended_action.value} does not drain")
    if f.severity not in ACT_SEVERITIES:
        return mk(RemediationDecision.SKIPPED, f"severity {f.severity.value} is below critical")
    if f.failure_id in history.handled:
        return mk(RemediationDecision.SKIPPED, "failure already handled (redelivery or episode update)")
    try:
        validate_node_name(f.node)
    except ValueError as exc:
        return mk(RemediationDecision.REFUSED, str(exc))
    if node is None:
        return mk(RemediationDecision.REFUSED, f"node {f.node} is not known to Slurm")
    if _out(node):
        if is_ours(node.reason):
            if f"failure={f.failure_id}" in (node.reason or ""):
                return mk(RemediationDecision.SKIPPED, "node already drained by gpuwarden for this failure")
            return mk(RemediationDecision.SKIPPED, f"node already drained by gpuwarden: {node.reason}")
        who = f" by {node.reason_user}" if node.reason_user else ""
        return mk(
            RemediationDecision.REFUSED,
            f"node is {node.state}{'+' + '+'.join(node.flags) if node.flags else ''}{who} with reason "
            f"{node.reason!r}; never overwriting someone else's reason",
        )
    if history.breaker_reason:
        return mk(RemediationDecision.REFUSED, f"circuit breaker open: {history.breaker_reason}")
    week = [t for n, t in history.drains if n == f.node and t > now - WEEK_S]
    if len(week) >= cfg.max_per_node_per_week:
        return mk(
            RemediationDecision.REFUSED,
            f"node {f.node} drained {len(week)} times in 7 days (cap {cfg.max_per_node_per_week})",
        )
    recent = [t for _, t in history.drains if t > now - cfg.window_s]
    if len(recent) >= cfg.max_drains_per_window:
        return mk(
            RemediationDecision.REFUSED,
            f"circuit breaker: {len(recent)} drains in the last {cfg.window_s:g}s (max {cfg.max_drains_per_window})",
            trips=True,
        )
    nodes = {n.node: n for n in cluster}
    nodes[node.node] = node
    drained = {name for name, n in nodes.items() if _out(n)}
    if not cfg.enforce:  # dry-run mirrors enforcement: count the drains it would have made
        drained |= {n for n, t in history.drains if t > now - WEEK_S and n in nodes}
    allowed = max(cfg.min_drain_allowance, math.floor(cfg.max_drain_fraction * len(nodes)))
    if len(drained | {f.node}) > allowed:
        return mk(
            RemediationDecision.REFUSED,
            f"circuit breaker: {len(drained)} of {len(nodes)} nodes already drained/down, "
            f"allowed {allowed} (max fraction {cfg.max_drain_fraction:g}, "
            f"min allowance {cfg.min_drain_allowance})",
            trips=True,
        )
    return mk(
        RemediationDecision.EXECUTED if cfg.enforce else RemediationDecision.DRY_RUN,
        f"{f.pattern} ({f.severity.value}) on {f.node}: drain" + ("" if cfg.enforce else " (dry-run)"),
        drain_reason(f),
    )
