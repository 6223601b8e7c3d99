"""Remediator safety rules on the real local Slurm 22.05 (nodes gpu-node-003/002 only;
gpu-node-004 is left to other test runs).

Each test drains at most those two nodes and resumes whatever it drained."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuwarden.remediator import MemoryAlertSink, Remediator, RemediatorSettings
from gpuwarden.remediator.alerts import Alerter
from gpuwarden.remediator.policy_file import PolicyAction, PolicyFile, PolicyRule
from gpuwarden.shared.lease import LeaseBoard, MemoryLease
from gpuwarden.shared.models import (
    Action,
    Category,
    CostEstimate,
    Failure,
    FailureState,
    Remediation,
    Severity,
)
from gpuwarden.shared.models import RemediationDecision as D
from gpuwarden.shared.slurm import CliSlurm

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

A, B = "gpu-node-003", "gpu-node-002"
POLICY = PolicyFile(
    hold_down_s=1.0,
    rules=(
        PolicyRule(id="bus", pattern="gpu-fallen-off-bus", action=PolicyAction.DRAIN),
        PolicyRule(id="thermal", pattern="thermal-throttle", action=PolicyAction.ALERT),
    ),
)


def scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True, timeout=30).stdout


def field(node: str, name: str) -> str:
    for tok in scontrol("show", "node", node).replace("\n", " ").split(" "):
        if tok.startswith(f"{name}="):
            return tok.split("=", 1)[1]
    return ""


def reason(node: str) -> str:
    out = scontrol("show", "node", node)
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            return line[len("Reason=") :].rsplit(" [", 1)[0]
    return ""


def resume(node: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=RESUME"], capture_output=True, timeout=30)


class Prod:
    def __init__(self) -> None:
        self.sent: list[Remediation] = []

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def flush(self) -> None: ...

    async def publish(self, topic: str, key: str | None, value: Any) -> None:
        assert topic == "remediations"
        self.sent.append(value)


@pytest.fixture
def nodes(slurm_cluster: list[str]) -> Iterator[None]:
    assert A in slurm_cluster and B in slurm_cluster
    for n in (A, B):
        assert "DRAIN" not in field(n, "State"), f"{n} is drained before the test: {reason(n)}"
    try:
        yield
    finally:
        for n in (A, B):
            resume(n)


def failure(node: str = A, pattern: str = "gpu-fallen-off-bus", **kw: Any) -> Failure:
    now = time.time()
    base: dict[str, Any] = dict(
        failure_id=f"{abs(hash((node, pattern, now))):016x}"[:16],
        pattern=pattern,
        rule_id="xid-79",
        category=Category.HARDWARE,
        severity=Severity.FATAL,
        node=node,
        gpu_index=2,
        first_seen=now,
        last_seen=now,
        verdict="GPU 2 fell off the bus",
        recommended_action=Action.DRAIN,
        cost=CostEstimate(affected_gpus=8, usd_per_hour=26.0, gpu_hours_lost=0.0),
    )
    base.update(kw)
    return Failure.model_validate(base)


def make(**kw: Any) -> tuple[Remediator, Prod, MemoryAlertSink]:
    s = RemediatorSettings(
        remediator_enforce=True,
        remediator_min_drain_allowance=kw.pop("allowance", 4),  # 001/002 belong to another test run
        remediator_retry_backoff_s=0.05,
        **kw,
    )
    prod, sink = Prod(), MemoryAlertSink()
    r = Remediator(s, client=CliSlurm(timeout_s=15), producer=prod, alerter=Alerter([sink]), policy=POLICY)  # type: ignore[arg-type]
    return r, prod, sink


async def test_drain_on_critical_failure_then_resume_after_hold_down(nodes: None) -> None:
    r, _prod, sink = make()
    await r.seed()
    f = failure()
    rem = await r.handle_failure(f)
    assert rem.decision == D.EXECUTED and rem.exit_code == 0, rem.reason
    assert rem.argv == [
        "scontrol",
        "update",
        f"nodename={A}",
        "state=DRAIN",
        f"reason=gpuwarden: gpu-fallen-off-bus gpu=2 failure={f.failure_id[:8]}",
    ]
    assert "DRAIN" in field(A, "State") and reason(A) == rem.argv[-1][len("reason=") :]
    assert [b[0].labels["alertname"] for b in sink.sent] == ["GpuwardenNodeDrained"]
    # a second failure on the drained node joins the drain: both must resolve before RESUME
    f2 = failure(pattern="gpu-fallen-off-bus", gpu_index=5)
    assert (await r.handle_failure(f2)).decision == D.SKIPPED
    assert await r.resume_due() == []
    await r.handle_failure(f.model_copy(update={"state": FailureState.RESOLVED}))
    assert await r.resume_due() == [] and "DRAIN" in field(A, "State")  # f2 still open
    res = await r.handle_failure(f2.model_copy(update={"state": FailureState.RESOLVED}))
    assert "hold-down" in res.reason
    assert await r.resume_due() == [] and "DRAIN" in field(A, "State")  # hold-down not over
    time.sleep(1.1)
    [resumed] = await r.resume_due()
    assert resumed.decision == D.EXECUTED and resumed.argv[-1] == "state=RESUME", resumed.reason
    assert sorted(resumed.failure_ids) == sorted([f.failure_id, f2.failure_id])
    assert "DRAIN" not in field(A, "State")
    assert sink.sent[-1][0].status == "resolved"
    st = r.status()
    assert st["drained"] == {} and [x["decision"] for x in st["recent"]][-1] == "executed"


async def test_resume_waits_for_a_passed_health_check(nodes: None) -> None:
    """``require_health_check``: the node stays drained in Slurm until a ``health`` pass after
    the resolution arrives, then it is resumed."""
    from gpuwarden.shared.models import HealthCheckResult

    s = RemediatorSettings(remediator_enforce=True, remediator_min_drain_allowance=4)
    prod, sink = Prod(), MemoryAlertSink()
    policy = POLICY.model_copy(update={"require_health_check": True, "hold_down_s": 0.0})
    r = Remediator(s, client=CliSlurm(timeout_s=15), producer=prod, alerter=Alerter([sink]), policy=policy)  # type: ignore[arg-type]
    await r.seed()
    f = failure()
    assert (await r.handle_failure(f)).decision == D.EXECUTED
    await r.handle_failure(f.model_copy(update={"state": FailureState.RESOLVED}))
    assert await r.resume_due() == [] and "DRAIN" in field(A, "State")  # no health check yet
    r.note_health(HealthCheckResult(node=A, ts=time.time(), phase="epilog", check="nvidia-smi", passed=False))
    assert await r.resume_due() == [] and "DRAIN" in field(A, "State")
    r.note_health(HealthCheckResult(node=A, ts=time.time() + 0.01, phase="periodic", check="nvidia-smi", passed=True))
    [resumed] = await r.resume_due()
    assert resumed.decision == D.EXECUTED and resumed.argv[-1] == "state=RESUME", resumed.reason
    assert "DRAIN" not in field(A, "State")


async def test_alert_only_pattern_never_drains(nodes: None) -> None:
    r, _prod, sink = make()
    await r.seed()
    rem = await r.handle_failure(failure(B, "thermal-throttle"))
    assert rem.decision == D.EXECUTED and rem.action == Action.ALERT and rem.argv == []
    assert "DRAIN" not in field(B, "State")
    assert sink.sent[0][0].labels["alertname"] == "GpuwardenFailure"


async def test_operator_drain_is_left_alone_and_never_resumed(nodes: None) -> None:
    scontrol("update", f"nodename={B}", "state=DRAIN", "reason=operator: PSU swap")
    r, _prod, _sink = make()
    await r.seed()
    f = failure(B)
    rem = await r.handle_failure(f)
    assert rem.decision == D.REFUSED and "[rule=foreign-reason]" in rem.reason and rem.argv == []
    await r.handle_failure(f.model_copy(update={"state": FailureState.RESOLVED}))
    time.sleep(1.1)
    assert await r.resume_due() == []
    assert "DRAIN" in field(B, "State") and reason(B) == "operator: PSU swap"
    # gpuwarden drains A; an operator then takes the drain over with their own reason
    f2 = failure(A)
    assert (await r.handle_failure(f2)).decision == D.EXECUTED
    scontrol("update", f"nodename={A}", "state=DRAIN", "reason=operator: keep out")
    await r.handle_failure(f2.model_copy(update={"state": FailureState.RESOLVED}))
    time.sleep(1.1)
    [forgot] = await r.resume_due()
    assert forgot.decision == D.SKIPPED and "[rule=foreign-reason]" in forgot.reason and forgot.argv == []
    assert "DRAIN" in field(A, "State") and reason(A) == "operator: keep out"
    assert await r.resume_due() == []  # no longer tracked: never resumed


async def test_breaker_trips_at_threshold_and_holds_until_reset(nodes: None) -> None:
    t = [time.time()]
    r, _prod, sink = make(remediator_max_drains_per_window=1, remediator_window_s=600)
    r.now = lambda: t[0]
    await r.seed()
    assert (await r.handle_failure(failure(A))).decision == D.EXECUTED
    tripped = await r.handle_failure(failure(B))
    assert tripped.decision == D.REFUSED and "[rule=breaker-window]" in tripped.reason
    t[0] += 3600  # the window has passed, but the breaker is latched
    held = await r.handle_failure(failure(B))
    assert held.decision == D.REFUSED and "[rule=breaker-open]" in held.reason
    assert "DRAIN" not in field(B, "State")
    assert "GpuwardenCircuitBreakerOpen" in [b[0].labels["alertname"] for b in sink.sent]
    assert r.status()["breaker"]["open"]
    r.reset_breaker("test")
    assert (await r.handle_failure(failure(B))).decision == D.EXECUTED
    assert "DRAIN" in field(B, "State")


@pytest.mark.parametrize(
    "bad", ["gpu-node-003;reboot", "$(touch /tmp/x)", "gpu-node-003 nodename=gpu-node-004", "gpu-node-999"]
)
async def test_bad_node_name_is_refused_and_audited(nodes: None, bad: str) -> None:
    r, prod, sink = make()
    await r.seed()
    rem = await r.handle_failure(failure(bad))
    assert rem.decision == D.REFUSED and rem.argv == [], rem.reason
    assert ("[rule=node-name]" in rem.reason) or ("[rule=unknown-node]" in rem.reason and bad == "gpu-node-999")
    assert prod.sent == [rem] and sink.sent  # audited and alerted
    assert "DRAIN" not in field(A, "State") and "DRAIN" not in field(B, "State")


async def test_redelivery_and_two_replicas_give_one_drain(nodes: None) -> None:
    board = LeaseBoard()
    r1, p1, _ = make()
    r2, p2, _ = make()
    r1.lease, r2.lease = MemoryLease(board), MemoryLease(board)
    await r1.lease.start()
    await r2.lease.start()
    for r in (r1, r2):
        await r.seed()
    f = failure(A)
    decided = [await r1.handle_failure(f), await r2.handle_failure(f), await r1.handle_failure(f)]
    assert [d.decision for d in decided] == [D.EXECUTED, D.SKIPPED, D.SKIPPED]
    assert "[rule=standby]" in decided[1].reason and "[rule=redelivery]" in decided[2].reason
    # the active replica goes away: the standby takes over; Slurm's reason is the final arbiter
    await r1.lease.stop()
    again = await r2.handle_failure(f)
    assert again.decision == D.SKIPPED and "for this failure" in again.reason
    # a third replica with no lease at all (misconfigured) still does not drain twice
    r3, _, _ = make()
    await r3.seed()
    assert (await r3.handle_failure(f)).decision == D.SKIPPED
    executed = [x for x in p1.sent + p2.sent if x.decision == D.EXECUTED]
    assert len(executed) == 1
