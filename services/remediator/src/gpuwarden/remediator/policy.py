"""The remediation policy: pure decisions over a failure, the node's state and history.

No I/O here; :class:`~gpuwarden.remediator.service.Remediator` gathers the inputs, calls
:func:`decide` (drain / alert / nothing) or :func:`decide_resume`, runs the command and
records the outcome in :class:`History`. Every :class:`Decision` names the ``rule`` that
produced it, so a refusal is auditable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuwarden.shared.models import Action, Failure, FailureState, NodeState, RemediationDecision
from gpuwarden.shared.slurm import MAX_REASON_LEN, validate_node_name

from .policy_file import DEFAULT_POLICY, PolicyAction, PolicyFile

__all__ = [
    "REASON_PREFIX",
    "WEEK_S",
    "Decision",
    "DrainRecord",
    "FailureNote",
    "History",
    "PolicyConfig",
    "ResumeDecision",
    "adopt_drain",
    "confirmed",
    "decide",
    "decide_resume",
    "drain_reason",
    "id8",
    "is_ours",
    "is_out",
]

REASON_PREFIX = "gpuwarden:"
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


def id8(failure_id: str) -> str:
    """The short failure id written into drain reasons (first 8 characters)."""
    return failure_id[:8]


@dataclass
class FailureNote:
    """A failure behind a drain: open until its ``resolved`` Failure arrives."""

    failure_id: str
    pattern: str
    open: bool = True
    resolved_at: float | None = None


@dataclass
class DrainRecord:
    """A drain gpuwarden made: the exact reason it set and every failure behind it (by id8)."""

    node: str
    reason: str
    drained_at: float
    failures: dict[str, FailureNote] = field(default_factory=dict)

    def all_resolved(self) -> bool:
        """True if every failure behind the drain has resolved."""
        return bool(self.failures) and not any(n.open for n in self.failures.values())

    def last_resolved(self) -> float:
        """When the last failure behind the drain resolved (0 if none did)."""
        return max((n.resolved_at or 0.0 for n in self.failures.values()), default=0.0)


@dataclass
class History:
    """What the policy remembers: handled failure ids, drains (node, time) taken or — in
    dry-run — that would have been taken, the breaker latch, gpuwarden's drains still in
    place with their failures, recently seen open failures (for confirmation) and the times
    of the last passed and the last failed health check per node."""

    handled: set[str] = field(default_factory=set)
    drains: list[tuple[str, float]] = field(default_factory=list)
    breaker_reason: str | None = None
    drained: dict[str, DrainRecord] = field(default_factory=dict)
    seen: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    health_pass: dict[str, float] = field(default_factory=dict)
    health_fail: dict[str, float] = field(default_factory=dict)

    def note_health(self, node: str, ts: float, passed: bool) -> None:
        """Remember a health check result (the latest pass and the latest failure per node)."""
        table = self.health_pass if passed else self.health_fail
        table[node] = max(ts, table.get(node, 0.0))

    def health_ok_since(self, node: str, since: float) -> bool:
        """A health check passed at or after ``since`` and none failed at or after that pass
        (a failed check of the same run, same time, counts against it)."""
        passed = self.health_pass.get(node)
        return passed is not None and passed >= since and self.health_fail.get(node, float("-inf")) < passed

    def record_drain(self, node: str, ts: float) -> None:
        """Count a drain (for the window breaker and the per-node cap); forget those older than 7 days."""
        self.drains.append((node, ts))
        cutoff = ts - WEEK_S
        self.drains = [(n, t) for n, t in self.drains if t >= cutoff]

    def note_drained(self, node: str, reason: str, ts: float, failure_id: str, pattern: str) -> None:
        """gpuwarden drained ``node`` with ``reason`` at ``ts`` (epoch s) for one failure: the
        drain is held (the count for the caps is :meth:`record_drain`'s)."""
        rec = DrainRecord(node, reason, ts)
        rec.failures[id8(failure_id)] = FailureNote(failure_id, pattern)
        self.drained[node] = rec

    def adopt_intent(self, node: str, reason: str, drained_at: float, failure_ids: list[str], ts: float) -> None:
        """An interrupted drain that landed (reconciled intent of time ``ts``): held as
        gpuwarden's with its failures (handled; pattern from ``reason``), counted once."""
        rec = DrainRecord(node, reason, drained_at)
        for fid in failure_ids:
            rec.failures[id8(fid)] = FailureNote(fid, reason[len(REASON_PREFIX) :].split()[0])
            self.handled.add(fid)
        self.drained[node] = rec
        if not any(n == node and t >= ts for n, t in self.drains):
            self.record_drain(node, ts)

    def note_resolved(self, node: str, failure_id: str, now: float, hold_down_s: float) -> str:
        """Failure ``failure_id`` resolved at ``now`` (epoch s): if it is behind gpuwarden's drain
        of ``node`` it is marked resolved there. Returns what that means for the drain (text of
        the ``resolved`` rule)."""
        rec = self.drained.get(node)
        note = rec.failures.get(id8(failure_id)) if rec else None
        if rec is None or note is None:
            return "failure resolved; gpuwarden holds no drain for it"
        if note.open:
            note.open, note.resolved_at = False, now
        left = [k for k, n in rec.failures.items() if n.open]
        if left:
            return f"failure resolved; {len(left)} other failure(s) behind the drain still open"
        return f"failure resolved; {node} resumes after the {hold_down_s:g}s hold-down"

    def note_seen(self, f: Failure, now: float, window_s: float) -> None:
        """Remember an open failure on its node (a possible second signal for another)."""
        keep = [(i, t) for i, t in self.seen.get(f.node, []) if t >= now - window_s and i != f.failure_id]
        self.seen[f.node] = [*keep, (f.failure_id, now)][-32:]

    def reset_breaker(self) -> None:
        """Close the circuit breaker (a person decided draining may go on)."""
        self.breaker_reason = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able snapshot (for the ledger file)."""
        return {
            "handled": sorted(self.handled)[-10000:],
            "drains": [[n, t] for n, t in self.drains],
            "breaker_reason": self.breaker_reason,
            "drained": {
                n: {
                    "reason": r.reason,
                    "drained_at": r.drained_at,
                    "failures": {k: vars(v) for k, v in r.failures.items()},
                }
                for n, r in self.drained.items()
            },
            "health_pass": self.health_pass,
            "health_fail": self.health_fail,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> History:
        """Inverse of :meth:`to_json`."""
        return cls(
            handled=set(d.get("handled", [])),
            drains=[(str(n), float(t)) for n, t in d.get("drains", [])],
            breaker_reason=d.get("breaker_reason"),
            drained={
                n: DrainRecord(
                    node=n,
                    reason=r["reason"],
                    drained_at=float(r["drained_at"]),
                    failures={k: FailureNote(**v) for k, v in r.get("failures", {}).items()},
                )
                for n, r in d.get("drained", {}).items()
            },
            health_pass={str(k): float(v) for k, v in d.get("health_pass", {}).items()},
            health_fail={str(k): float(v) for k, v in d.get("health_fail", {}).items()},
        )


Kind = Literal["drain", "alert", "none"]


@dataclass(frozen=True)
class Decision:
    """``decision`` is ``EXECUTED`` when the caller should act (``DRY_RUN`` when it should
    only record a drain); ``kind`` says what acting means (drain the node, or only alert);
    ``rule`` names the rule that decided (or refused); ``slurm_reason`` is the drain reason;
    ``trips_breaker``: latch the breaker until a person resets it; ``alert``: tell on-call."""

    decision: RemediationDecision
    reason: str
    action: Action
    slurm_reason: str | None = None
    trips_breaker: bool = False
    rule: str = ""
    kind: Kind = "none"
    alert: bool = False

    @property
    def act(self) -> bool:
        """True if the caller should drain (or record a dry-run drain) / send the alert."""
        return self.decision in (RemediationDecision.EXECUTED, RemediationDecision.DRY_RUN)


def drain_reason(f: Failure) -> str:
    """``gpuwarden: <pattern> gpu=<index|-> failure=<id8>``, at most ``MAX_REASON_LEN``
    characters (the pattern is shortened if needed; the short failure id is always kept)."""
    gpu = "-" if f.gpu_index is None else str(f.gpu_index)
    tail = f" gpu={gpu} failure={id8(f.failure_id)}"
    room = MAX_REASON_LEN - len(REASON_PREFIX) - 1 - len(tail)
    pat = "".join(c if c.isprintable() and c not in "\r\n" else "_" for c in f.pattern)[: max(room, 1)]
    return f"{REASON_PREFIX} {pat}{tail}"


def adopt_drain(n: NodeState) -> DrainRecord:
    """A record for a gpuwarden drain found on node ``n`` (after a restart without ledger): the
    failure is known by its short id and pattern from the reason :func:`drain_reason` wrote;
    drained at ``reason_ts`` (0 unknown)."""
    reason = n.reason or ""
    words = reason[len(REASON_PREFIX) :].split()
    parts = dict(p.split("=", 1) for p in words if "=" in p)
    fid = parts.get("failure", "")
    pattern = words[0] if words else ""
    rec = DrainRecord(n.node, reason, n.reason_ts or 0.0)
    if fid:
        rec.failures[id8(fid)] = FailureNote(fid, pattern)
    return rec


def is_ours(reason: str | None) -> bool:
    """True if a node reason was set by gpuwarden (fixed prefix)."""
    return bool(reason) and str(reason).startswith(REASON_PREFIX)


def is_out(n: NodeState) -> bool:
    """True if the node is drained, draining or down."""
    return n.drained or n.state.startswith("DOWN") or "DOWN" in n.flags


def confirmed(f: Failure, history: History, window_s: float, now: float) -> bool:
    """A second signal: two occurrences folded, two different evidence signals, or another
    open failure on the same node within ``window_s``."""
    if f.occurrences >= 2 or len({e.signal for e in f.evidence}) >= 2:
        return True
    return any(i != f.failure_id and t >= now - window_s for i, t in history.seen.get(f.node, []))


def decide(
    f: Failure,
    node: NodeState | None,
    cluster: Iterable[NodeState],
    history: History,
    cfg: PolicyConfig,
    now: float,
    policy: PolicyFile = DEFAULT_POLICY,
) -> Decision:
    """Decide what to do about one failure.

    Args:
        f: the failure (possibly a redelivery or an episode update).
        node: the node's current state read from Slurm just now (``None``: unknown to Slurm).
        cluster: the last known state of every node (for the drained-share breaker).
        history: handled ids, drains in the last week, breaker latch (not modified here).
        cfg: limits.
        now: decision time, epoch s.
        policy: pattern/severity/partition rules (default: :data:`DEFAULT_POLICY`).

    Returns:
        SKIPPED (resolved, already handled, policy says nothing, awaiting confirmation, node
        already drained by gpuwarden), REFUSED (bad/unknown node, someone else's reason,
        caps, breaker), EXECUTED with kind ``alert`` (alert only), or DRY_RUN / EXECUTED with
        kind ``drain`` meaning "drain it" (the caller runs or only records it).
    """
    drain_action = Action.DRAIN

    def mk(
        d: RemediationDecision,
        rule: str,
        why: str,
        *,
        kind: Kind = "none",
        slurm_reason: str | None = None,
        trips: bool = False,
        alert: bool = False,
        action: Action = drain_action,
    ) -> Decision:
        return Decision(d, f"[rule={rule}] {why}", action, slurm_reason, trips, rule, kind, alert)

    if f.state != FailureState.OPEN:
        return mk(RemediationDecision.SKIPPED, "resolved", "failure is resolved", action=Action.NONE)
    if f.failure_id in history.handled:
        return mk(RemediationDecision.SKIPPED, "redelivery", "failure already handled (redelivery or episode update)")
    try:
        validate_node_name(f.node)
    except ValueError as exc:
        return mk(RemediationDecision.REFUSED, "node-name", f"{exc}; no command run", alert=True)
    if node is None:
        return mk(
            RemediationDecision.REFUSED,
            "unknown-node",
            f"node {f.node} is not known to Slurm; no command run",
            alert=True,
        )
    prule = policy.rule_for(f, node.partitions)
    rid = f"policy:{prule.id}"
    if prule.action == PolicyAction.NONE:
        return mk(
            RemediationDecision.SKIPPED,
            rid,
            f"{f.pattern} ({f.severity.value}, recommends {f.recommended_action.value}): policy says none",
            action=Action.NONE,
        )
    if prule.action == PolicyAction.ALERT:
        return mk(
            RemediationDecision.EXECUTED,
            rid,
            f"{f.pattern} ({f.severity.value}) on {f.node}: alert only, no drain",
            kind="alert",
            alert=True,
            action=Action.ALERT,
        )
    if prule.confirm and not confirmed(f, history, policy.confirm_window_s, now):
        return mk(
            RemediationDecision.SKIPPED,
            f"{rid}:confirm",
            f"{f.pattern} on {f.node} needs a second signal within {policy.confirm_window_s:g}s before draining",
        )
    if is_out(node):
        if is_ours(node.reason):
            if f"failure={id8(f.failure_id)}" in (node.reason or ""):
                return mk(
                    RemediationDecision.SKIPPED, "already-drained", "node already drained by gpuwarden for this failure"
                )
            return mk(
                RemediationDecision.SKIPPED, "already-drained", f"node already drained by gpuwarden: {node.reason}"
            )
        who = f" by {node.reason_user}" if node.reason_user else ""
        return mk(
            RemediationDecision.REFUSED,
            "foreign-reason",
            f"node is {node.state}{'+' + '+'.join(node.flags) if node.flags else ''}{who} with reason "
            f"{node.reason!r}; never overwriting someone else's reason",
        )
    if history.breaker_reason:
        return mk(
            RemediationDecision.REFUSED, "breaker-open", f"circuit breaker open: {history.breaker_reason}", alert=True
        )
    week = [t for n, t in history.drains if n == f.node and t > now - WEEK_S]
    if len(week) >= cfg.max_per_node_per_week:
        return mk(
            RemediationDecision.REFUSED,
            "node-cap",
            f"node {f.node} drained {len(week)} times in 7 days (cap {cfg.max_per_node_per_week}); alerting instead",
            alert=True,
        )
    recent = [t for _, t in history.drains if t > now - cfg.window_s]
    if len(recent) >= cfg.max_drains_per_window:
        return mk(
            RemediationDecision.REFUSED,
            "breaker-window",
            f"circuit breaker: {len(recent)} drains in the last {cfg.window_s:g}s (max {cfg.max_drains_per_window})",
            trips=True,
            alert=True,
        )
    nodes = {n.node: n for n in cluster}
    nodes[node.node] = node
    drained = {name for name, n in nodes.items() if is_out(n)}
    if not cfg.enforce:  # dry-run mirrors enforcement: count the drains it would have made
        drained |= {n for n, t in history.drains if t > now - WEEK_S and n in nodes}
    allowed = max(cfg.min_drain_allowance, math.floor(cfg.max_drain_fraction * len(nodes)))
    if len(drained | {f.node}) > allowed:
        return mk(
            RemediationDecision.REFUSED,
            "breaker-fraction",
            f"circuit breaker: {len(drained)} of {len(nodes)} nodes already drained/down, "
            f"allowed {allowed} (max fraction {cfg.max_drain_fraction:g}, "
            f"min allowance {cfg.min_drain_allowance})",
            trips=True,
            alert=True,
        )
    return mk(
        RemediationDecision.EXECUTED if cfg.enforce else RemediationDecision.DRY_RUN,
        rid,
        f"{f.pattern} ({f.severity.value}) on {f.node}: drain" + ("" if cfg.enforce else " (dry-run)"),
        kind="drain",
        slurm_reason=drain_reason(f),
        alert=True,
    )


@dataclass(frozen=True)
class ResumeDecision:
    """``verdict``: ``resume`` now, ``wait`` (not yet), ``forget`` (stop tracking: the drain
    is gone or no longer gpuwarden's — never resumed), or ``refuse`` (not gpuwarden's drain)."""

    verdict: Literal["resume", "wait", "forget", "refuse"]
    rule: str
    reason: str


def decide_resume(
    node: NodeState | None,
    record: DrainRecord | None,
    policy: PolicyFile,
    history: History,
    now: float,
) -> ResumeDecision:
    """May gpuwarden resume this node now? Only a drain it made itself (``record``), whose
    reason on the node is still exactly the one it set, once every failure behind it has
    resolved, ``hold_down_s`` has passed since the last resolution and (if required) a health
    check passed after it, with no failed check since that pass."""
    if record is None:
        return ResumeDecision("refuse", "not-ours", "gpuwarden did not drain this node; never resuming it")
    if node is None:
        return ResumeDecision("forget", "unknown-node", f"node {record.node} is no longer known to Slurm")
    if not is_out(node):
        return ResumeDecision("forget", "not-drained", f"{node.node} is {node.state}: resumed by someone else")
    if node.reason != record.reason:
        return ResumeDecision(
            "forget",
            "foreign-reason",
            f"{node.node} now has reason {node.reason!r} (not gpuwarden's {record.reason!r}); never resuming it",
        )
    open_ids = [k for k, n in record.failures.items() if n.open]
    if open_ids or not record.failures:
        return ResumeDecision("wait", "failures-open", f"failures still open: {', '.join(open_ids) or 'unknown'}")
    due = record.last_resolved() + policy.hold_down_s
    if now < due:
        return ResumeDecision("wait", "hold-down", f"hold-down until {due:.0f} ({due - now:.0f}s left)")
    if policy.require_health_check and not history.health_ok_since(node.node, record.last_resolved()):
        return ResumeDecision(
            "wait", "health-check", "no passed health check (and none failed after it) since the last failure resolved"
        )
    return ResumeDecision(
        "resume",
        "all-resolved",
        f"all {len(record.failures)} failure(s) resolved, hold-down {policy.hold_down_s:g}s passed",
    )
