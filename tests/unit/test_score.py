"""The strict scorer of `bench detect` / `simulate`: a failure on another GPU, another node or
outside the expectation's window is a false positive, not a "repeat"; `allow` may name a node."""

from __future__ import annotations

from typing import Any

from gpuwarden.demo.scoring import score
from gpuwarden.shared.models import Action, Category, CostEstimate, Failure, Severity
from gpuwarden.shared.scenario import Scenario

T0 = 1_700_000_000.0


def scenario(**kw: Any) -> Scenario:
    base: dict[str, Any] = {
        "name": "s",
        "duration_s": 600,
        "cluster": {"nodes": 2},
        "faults": [{"at_s": 100, "kind": "xid", "xid": 79, "node": "gpu-node-002", "gpu": 3}],
        "expect": [{"pattern": "gpu-fallen-off-bus", "node": "gpu-node-002", "gpu": 3, "within_s": 30}],
    }
    base.update(kw)
    return Scenario.model_validate(base)


def failure(pattern: str, node: str, gpu: int | None, at_s: float, fid: str) -> Failure:
    return Failure(
        failure_id=fid,
        pattern=pattern,
        rule_id=pattern,
        category=Category.HARDWARE,
        severity=Severity.CRITICAL,
        node=node,
        gpu_index=gpu,
        first_seen=T0 + at_s,
        last_seen=T0 + at_s,
        verdict="v",
        recommended_action=Action.DRAIN,
        cost=CostEstimate(affected_gpus=1, usd_per_hour=3.26, gpu_hours_lost=0.0),
    )


def test_the_expected_failure_is_found_with_its_delay() -> None:
    sc = score(scenario(), [failure("gpu-fallen-off-bus", "gpu-node-002", 3, 101.5, "a")], T0)
    assert sc["passed"] and sc["found"][0]["delay_s"] == 1.5


def test_the_same_pattern_on_another_gpu_node_or_time_is_a_false_positive() -> None:
    fails = [
        failure("gpu-fallen-off-bus", "gpu-node-002", 3, 101, "hit"),
        failure("gpu-fallen-off-bus", "gpu-node-002", 5, 101, "other-gpu"),
        failure("gpu-fallen-off-bus", "gpu-node-001", 3, 101, "other-node"),
        failure("gpu-fallen-off-bus", "gpu-node-002", 3, 400, "later-episode"),
    ]
    sc = score(scenario(), fails, T0)
    assert not sc["passed"] and not sc["missed"]
    assert {f["failure_id"] for f in sc["false_positives"]} == {"other-gpu", "other-node", "later-episode"}


def test_allow_by_pattern_applies_everywhere_and_by_node_only_there() -> None:
    fails = [
        failure("gpu-fallen-off-bus", "gpu-node-002", 3, 101, "hit"),
        failure("gpu-missing", "gpu-node-002", None, 110, "missing-here"),
        failure("gpu-missing", "gpu-node-001", None, 110, "missing-elsewhere"),
        failure("thermal-throttle", "gpu-node-001", 2, 50, "thermal"),
    ]
    sc = score(scenario(allow=[{"pattern": "gpu-missing", "node": "gpu-node-002"}, "thermal-throttle"]), fails, T0)
    assert [f["failure_id"] for f in sc["false_positives"]] == ["missing-elsewhere"]


def test_bare_allow_strings_still_load() -> None:
    sc = scenario(allow=["gpu-missing"])
    assert sc.allowed("gpu-missing", "any-node") and not sc.allowed("gpu-fallen-off-bus", "gpu-node-002")
