"""Policy file: the example validates and routes failures; every bad example fails clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from factories import make_failure
from gpuwarden.remediator.policy import History, PolicyConfig, decide
from gpuwarden.remediator.policy_file import DEFAULT_POLICY, PolicyAction, PolicyError, PolicyRule, load_policy
from gpuwarden.shared.models import (
    Action,
    Evidence,
    Failure,
    NodeState,
    Severity,
)
from gpuwarden.shared.models import RemediationDecision as D

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "remediator"

NOW = 2_000_000.0


def failure(pattern: str = "gpu-fallen-off-bus", fid: str = "f1", **kw: object) -> Failure:
    return make_failure(
        failure_id=fid, pattern=pattern, rule_id="r", node="gpu-node-003", gpu_index=1, first_seen=NOW - 5,
        last_seen=NOW - 1, verdict="v", affected_gpus=1, usd_per_hour=3.0, **kw,
    )  # fmt: skip


def cluster(partition: str = "gpu") -> list[NodeState]:
    return [NodeState(node=f"gpu-node-{i:03d}", ts=NOW, state="IDLE", partitions=[partition]) for i in range(1, 21)]


BAD_POLICIES = sorted(p.name for p in FIX.glob("bad-*.yaml"))


def test_bad_policy_examples_exist() -> None:
    assert len(BAD_POLICIES) >= 3, f"bad-*.yaml examples missing in {FIX}"


@pytest.mark.parametrize("name", BAD_POLICIES)
def test_bad_policy_files_fail_with_a_clear_error(name: str) -> None:
    with pytest.raises(PolicyError, match=name.replace(".", r"\.")) as ei:
        load_policy(FIX / name)
    assert "invalid" in str(ei.value) or "YAML" in str(ei.value) or "mapping" in str(ei.value)


@pytest.mark.parametrize(
    ("name", "bad", "hint"),
    [
        ("bad-unknown-pattern.yaml", "'ecc-*'", "correctable-ecc-storm"),
        ("bad-unknown-partition-pattern.yaml", "'gpu-falen-off-bus'", ""),
    ],
)
def test_a_rule_matching_no_known_pattern_is_an_error_at_load(name: str, bad: str, hint: str) -> None:
    with pytest.raises(PolicyError) as ei:
        load_policy(FIX / name)
    msg = str(ei.value)
    assert bad in msg and "matches no known failure pattern" in msg, msg
    assert hint in msg


def test_every_glob_that_matches_a_known_pattern_loads() -> None:
    from gpuwarden.shared.models import PATTERNS

    for pat in [*sorted(PATTERNS), "*", "*ecc*", "xid-*", "straggler-????"]:
        assert PolicyRule(id="r", pattern=pat, action=PolicyAction.ALERT).pattern == pat
    with pytest.raises(ValueError, match="matches no known"):
        PolicyRule(id="r", pattern="ecc-*", action=PolicyAction.DRAIN)


def test_missing_policy_file() -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(FIX / "does-not-exist.yaml")


def test_example_in_the_service_dir_is_valid() -> None:
    ex = Path(__file__).resolve().parents[2] / "services" / "remediator" / "policy.example.yaml"
    assert load_policy(ex) == load_policy(FIX / "good.yaml")


@pytest.mark.parametrize(
    ("pattern", "severity", "partition", "kw", "expect", "rule"),
    [
        ("gpu-fallen-off-bus", Severity.CRITICAL, "gpu", {}, D.EXECUTED, "policy:fallen-off-bus"),
        ("gpu-fallen-off-bus", Severity.WARNING, "gpu", {}, D.SKIPPED, "policy:default"),
        ("thermal-throttle", Severity.CRITICAL, "gpu", {}, D.EXECUTED, "policy:thermal"),
        ("unknown-thing", Severity.FATAL, "gpu", {}, D.SKIPPED, "policy:default"),
        ("gpu-fallen-off-bus", Severity.FATAL, "debug", {}, D.EXECUTED, "policy:debug-never-drain"),
        # confirmation: one signal is not enough, two occurrences / two signals are
        ("uncorrectable-ecc", Severity.CRITICAL, "gpu", {}, D.SKIPPED, "policy:ecc:confirm"),
        ("uncorrectable-ecc", Severity.CRITICAL, "gpu", {"occurrences": 2}, D.EXECUTED, "policy:ecc"),
    ],
)
def test_rules_severity_partition_and_confirmation(
    pattern: str, severity: Severity, partition: str, kw: dict[str, object], expect: D, rule: str
) -> None:
    pol = load_policy(FIX / "good.yaml")
    f = failure(pattern, severity=severity, **kw)
    nodes = cluster(partition)
    node = next(n for n in nodes if n.node == f.node)
    d = decide(f, node, nodes, History(), PolicyConfig(enforce=True), NOW, pol)
    assert (d.decision, d.rule) == (expect, rule), d.reason
    assert d.reason.startswith(f"[rule={rule}]")
    if rule in ("policy:thermal", "policy:debug-never-drain"):
        assert d.kind == "alert" and d.slurm_reason is None
    if rule in ("policy:fallen-off-bus", "policy:ecc"):
        assert d.kind == "drain" and d.slurm_reason


def test_confirmation_by_a_second_failure_or_second_signal() -> None:
    pol = load_policy(FIX / "good.yaml")
    nodes = cluster()
    node = nodes[2]
    h = History()
    h.note_seen(failure("xid-13", fid="other"), NOW - 10, pol.confirm_window_s)
    d = decide(failure("uncorrectable-ecc"), node, nodes, h, PolicyConfig(enforce=True), NOW, pol)
    assert d.decision == D.EXECUTED and d.kind == "drain"
    ev = [Evidence(signal=s, value=1, ts=NOW, source="t") for s in ("xid", "ecc_dbe")]
    d2 = decide(failure("uncorrectable-ecc", evidence=ev), node, nodes, History(), PolicyConfig(enforce=True), NOW, pol)
    assert d2.decision == D.EXECUTED
    old = History()
    old.note_seen(failure("xid-13", fid="other"), NOW - 1000, pol.confirm_window_s)
    d3 = decide(failure("uncorrectable-ecc"), node, nodes, old, PolicyConfig(enforce=True), NOW, pol)
    assert d3.decision == D.SKIPPED and "second signal" in d3.reason


def test_default_policy() -> None:
    assert DEFAULT_POLICY.rule_for(failure()).action == PolicyAction.DRAIN
    assert DEFAULT_POLICY.rule_for(failure(recommended_action=Action.ALERT)).action == PolicyAction.ALERT
    assert DEFAULT_POLICY.rule_for(failure(severity=Severity.INFO)).action == PolicyAction.NONE
