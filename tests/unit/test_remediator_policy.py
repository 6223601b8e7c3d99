"""Remediation policy, table-driven: dry-run, enforce, redelivery, others' reasons, breakers."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from factories import make_failure, node_states
from gpuwarden.remediator.policy import (
    REASON_PREFIX,
    History,
    PolicyConfig,
    decide,
    drain_reason,
)
from gpuwarden.shared.models import (
    Action,
    Failure,
    FailureState,
    NodeState,
    Severity,
)
from gpuwarden.shared.models import (
    RemediationDecision as D,
)
from gpuwarden.shared.slurm import MAX_REASON_LEN, check_reason

NOW = 2_000_000.0


def failure(node: str = "gpu-node-002", fid: str = "f1", **kw: object) -> Failure:
    return make_failure(failure_id=fid, node=node, first_seen=NOW - 5, last_seen=NOW - 1, gpu_hours_lost=0.1, **kw)


def nodes(n: int, drained: dict[str, str] | None = None) -> list[NodeState]:
    return node_states(n, NOW, drained)


@dataclass
class Case:
    id: str
    expect: D
    why: str  # a substring of the decision's reason
    f: dict[str, object] = field(default_factory=dict)
    cluster: int = 8
    drained: dict[str, str] = field(default_factory=dict)
    cfg: dict[str, object] = field(default_factory=dict)
    handled: tuple[str, ...] = ()
    drains: tuple[tuple[str, float], ...] = ()
    breaker: str | None = None
    unknown_node: bool = False


CASES = [
    Case("dry-run by default", D.DRY_RUN, "dry-run"),
    Case("enforce", D.EXECUTED, "drain", cfg={"enforce": True}),
    Case("reboot means drain", D.EXECUTED, "drain", f={"recommended_action": Action.REBOOT}, cfg={"enforce": True}),
    Case("rma means drain", D.DRY_RUN, "drain", f={"recommended_action": Action.RMA}),
    Case("reset-gpu means drain", D.DRY_RUN, "drain", f={"recommended_action": Action.RESET_GPU}),
    Case("fatal", D.DRY_RUN, "drain", f={"severity": Severity.FATAL}),
    Case("alert only", D.EXECUTED, "alert only", f={"recommended_action": Action.ALERT}, cfg={"enforce": True}),
    Case("restart-job: alert, no drain", D.EXECUTED, "alert only", f={"recommended_action": Action.RESTART_JOB}),
    Case("warning severity", D.SKIPPED, "policy says none", f={"severity": Severity.WARNING}, cfg={"enforce": True}),
    Case("resolved", D.SKIPPED, "resolved", f={"state": FailureState.RESOLVED}, cfg={"enforce": True}),
    Case("redelivery (in memory)", D.SKIPPED, "already handled", handled=("f1",), cfg={"enforce": True}),
    Case(
        "redelivery (drained by us for it)",
        D.SKIPPED,
        "for this failure",
        drained={"gpu-node-002": "gpuwarden: xid-79 gpu=3 failure=f1"},
        cfg={"enforce": True},
    ),
    Case(
        "drained by us for another failure",
        D.SKIPPED,
        "already drained by gpuwarden",
        drained={"gpu-node-002": "gpuwarden: xid-48 gpu=1 failure=f0"},
        cfg={"enforce": True},
    ),
    Case(
        "someone else's reason",
        D.REFUSED,
        "never overwriting",
        drained={"gpu-node-002": "maintenance: PSU swap"},
        cfg={"enforce": True},
    ),
    Case("invalid node name", D.REFUSED, "invalid node name", f={"node": "gpu-node-002;reboot"}, cfg={"enforce": True}),
    Case("node unknown to slurm", D.REFUSED, "not known", unknown_node=True, cfg={"enforce": True}),
    Case("4-node cluster may drain one", D.EXECUTED, "drain", cluster=4, cfg={"enforce": True}),
    Case(
        "4-node cluster: second drain trips fraction breaker",
        D.REFUSED,
        "1 of 4 nodes",
        cluster=4,
        drained={"gpu-node-001": "gpuwarden: x gpu=0 failure=f0"},
        cfg={"enforce": True},
    ),
    Case("min allowance 0 on 8 nodes", D.REFUSED, "allowed 0", cfg={"enforce": True, "min_drain_allowance": 0}),
    Case(
        "20 nodes, 10% = 2, one drained",
        D.EXECUTED,
        "drain",
        cluster=20,
        drained={"gpu-node-010": "maintenance"},
        cfg={"enforce": True},
    ),
    Case(
        "20 nodes, 10% = 2, two drained",
        D.REFUSED,
        "2 of 20",
        cluster=20,
        drained={"gpu-node-010": "maintenance", "gpu-node-011": "bios"},
        cfg={"enforce": True},
    ),
    Case(
        "dry-run counts the drains it would have made",
        D.REFUSED,
        "of 4 nodes",
        cluster=4,
        drains=(("gpu-node-001", NOW - 60),),
    ),
    Case(
        "window breaker",
        D.REFUSED,
        "drains in the last",
        cluster=100,
        drains=tuple((f"gpu-node-{i:03d}", NOW - 60 * i) for i in range(10, 15)),
        cfg={"enforce": True},
    ),
    Case(
        "window passed",
        D.EXECUTED,
        "drain",
        cluster=100,
        drains=tuple((f"gpu-node-{i:03d}", NOW - 4000) for i in range(10, 15)),
        cfg={"enforce": True},
    ),
    Case(
        "per-node weekly cap",
        D.REFUSED,
        "times in 7 days",
        cluster=100,
        drains=tuple(("gpu-node-002", NOW - 86400 * d) for d in (1, 2, 3)),
        cfg={"enforce": True},
    ),
    Case(
        "per-node cap: older than a week",
        D.EXECUTED,
        "drain",
        cluster=100,
        drains=tuple(("gpu-node-002", NOW - 86400 * d) for d in (8, 9, 10)),
        cfg={"enforce": True},
    ),
    Case("latched breaker", D.REFUSED, "circuit breaker open", breaker="5 drains in 3600s", cfg={"enforce": True}),
]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_policy(c: Case) -> None:
    f = failure(**c.f)
    cluster = nodes(c.cluster, c.drained)
    by = {n.node: n for n in cluster}
    node = None if c.unknown_node else by.get(f.node)
    h = History(handled=set(c.handled), drains=list(c.drains), breaker_reason=c.breaker)
    d = decide(f, node, cluster, h, PolicyConfig(**c.cfg), NOW)  # type: ignore[arg-type]
    assert d.decision == c.expect, d.reason
    assert c.why in d.reason
    assert d.reason.startswith(f"[rule={d.rule}] ") and d.rule
    if d.act and d.kind == "drain":
        assert d.slurm_reason == f"{REASON_PREFIX} {f.pattern} gpu={f.gpu_index} failure={f.failure_id[:8]}"
        assert d.action == Action.DRAIN
    elif d.act:
        assert d.kind == "alert" and d.action == Action.ALERT and d.alert and d.slurm_reason is None
    else:
        assert d.slurm_reason is None
    assert d.trips_breaker == ("breaker:" in d.reason)


def test_drain_reason_is_bounded_and_valid() -> None:
    f = failure(pattern="p" * 500, gpu_index=None, fid="abcdef0123456789")
    r = drain_reason(f)
    assert r.startswith("gpuwarden: p") and r.endswith(" gpu=- failure=abcdef01")
    assert len(r) <= MAX_REASON_LEN and check_reason(r) == r
