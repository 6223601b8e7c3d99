"""Test data builders shared by unit and integration tests (importable as ``factories``:
pytest puts this folder on ``sys.path`` because it holds the root ``conftest.py``)."""

from __future__ import annotations

from typing import Any

from gpuwarden.shared.models import Action, Category, CostEstimate, Failure, NodeState, Severity


def make_failure(**overrides: Any) -> Failure:
    """A drain-worthy ``gpu-fallen-off-bus`` Failure; every field can be overridden.

    ``affected_gpus``/``usd_per_hour``/``gpu_hours_lost`` override the cost's fields.
    """
    cost = {k: overrides.pop(k) for k in ("affected_gpus", "usd_per_hour", "gpu_hours_lost") if k in overrides}
    base: dict[str, Any] = dict(
        failure_id="f1",
        pattern="gpu-fallen-off-bus",
        rule_id="xid-79",
        category=Category.HARDWARE,
        severity=Severity.CRITICAL,
        node="gpu-node-002",
        gpu_index=3,
        first_seen=10.0,
        last_seen=10.0,
        verdict="GPU 3 fell off the bus",
        recommended_action=Action.DRAIN,
        cost=CostEstimate(**{"affected_gpus": 8, "usd_per_hour": 26.08, "gpu_hours_lost": 0.0, **cost}),
    )
    base.update(overrides)
    return Failure.model_validate(base)


def node_states(n: int, ts: float, drained: dict[str, str] | None = None) -> list[NodeState]:
    """``gpu-node-001..n`` IDLE; those in ``drained`` (node -> reason) carry DRAIN, set by root."""
    drained = drained or {}
    return [
        NodeState(
            node=name,
            ts=ts,
            state="IDLE",
            flags=["DRAIN"] if name in drained else [],
            reason=drained.get(name),
            reason_user="root" if name in drained else None,
        )
        for name in (f"gpu-node-{i:03d}" for i in range(1, n + 1))
    ]
