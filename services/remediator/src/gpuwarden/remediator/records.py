"""How the remediator writes its decisions down: the :class:`Remediation` records published on
``remediations`` and the entries of its recent-decisions list (``/status``, the ledger,
``GET /failures/<id>``). Pure, apart from stamping ``decided_at`` with the wall clock."""

from __future__ import annotations

import time
from typing import Any

from gpuwarden.shared.models import Action, Failure, Remediation, RemediationDecision, stable_id

from .policy import Decision

__all__ = ["failure_remediation", "recent_entry", "resume_remediation"]


def failure_remediation(
    f: Failure,
    d: Decision,
    decision: RemediationDecision,
    reason: str,
    *,
    dry_run: bool,
    action: Action | None = None,
    argv: list[str] | None = None,
    exit_code: int | None = None,
    output: str | None = None,
    intent_id: str | None = None,
) -> Remediation:
    """The record of ``decision`` on failure ``f`` (decided as ``d``): id from action, node,
    failure, decision and rule; ``ts`` the failure's ``last_seen``; ``action`` defaults to
    ``d.action``."""
    act = action or d.action
    return Remediation(
        remediation_id=stable_id(act.value, f.node, f.failure_id, decision.value, d.rule),
        ts=f.last_seen,
        decided_at=time.time(),
        node=f.node,
        action=act,
        argv=argv or [],
        dry_run=dry_run,
        decision=decision,
        reason=reason,
        failure_ids=[f.failure_id],
        exit_code=exit_code,
        output=output,
        intent_id=intent_id,
    )


def resume_remediation(
    remediation_id: str,
    node: str,
    ts: float,
    decision: RemediationDecision,
    why: str,
    failure_ids: list[str],
    *,
    dry_run: bool,
    argv: list[str],
    exit_code: int | None,
    output: str | None,
) -> Remediation:
    """The record of a RESUME of ``node`` (or of its refusal): ``reason`` is ``resume: <why>``;
    ``ts`` is the event time that allowed it, epoch s."""
    return Remediation(
        remediation_id=remediation_id,
        ts=ts,
        decided_at=time.time(),
        node=node,
        action=Action.RESUME,
        argv=argv,
        dry_run=dry_run,
        decision=decision,
        reason=f"resume: {why}",
        failure_ids=failure_ids,
        exit_code=exit_code,
        output=output,
    )


def recent_entry(rem: Remediation, rule: str, failure: str, pattern: str) -> dict[str, Any]:
    """One entry of the recent-decisions list: ``at`` (``decided_at``), ``node``, ``decision``,
    ``action``, ``rule``, ``failure`` (failure ids, comma-separated), ``pattern``, ``reason``,
    ``argv``."""
    return {
        "at": rem.decided_at,
        "node": rem.node,
        "decision": rem.decision.value,
        "action": rem.action.value,
        "rule": rule,
        "failure": failure,
        "pattern": pattern,
        "reason": rem.reason,
        "argv": list(rem.argv),
    }
