"""Remediator service against FakeSlurm and an in-memory bus; the resume command."""

from __future__ import annotations

import pytest

from factories import make_failure, node_states
from gpuwarden.remediator import Remediator, RemediatorSettings, resume_node
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import (
    Action,
    Failure,
    NodeState,
)
from gpuwarden.shared.models import (
    RemediationDecision as D,
)
from gpuwarden.shared.slurm import SlurmError
from gpuwarden.sim.slurm import FakeSlurm

NOW = 2_000_000.0


def failure(node: str = "gpu-node-002", fid: str = "f1", **kw: object) -> Failure:
    return make_failure(failure_id=fid, node=node, first_seen=NOW - 5, last_seen=NOW - 1, gpu_hours_lost=0.1, **kw)


def nodes(n: int, drained: dict[str, str] | None = None) -> list[NodeState]:
    return node_states(n, NOW, drained)


class MemProducer(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def make(n: int = 4, enforce: bool = True, **kw: object) -> tuple[Remediator, FakeSlurm, MemProducer]:
    fake = FakeSlurm(nodes=nodes(n))
    fake.now = lambda: NOW
    prod = MemProducer()
    s = RemediatorSettings(remediator_enforce=enforce, **kw)  # type: ignore[arg-type]
    return Remediator(s, client=fake, producer=prod, now=lambda: NOW), fake, prod  # type: ignore[arg-type]


async def test_enforce_drains_once_and_is_idempotent_under_redelivery() -> None:
    r, fake, prod = make()
    await r.seed()
    rem = await r.handle_failure(failure())
    assert rem.decision == D.EXECUTED and rem.exit_code == 0 and not rem.dry_run
    assert rem.argv == [
        "scontrol",
        "update",
        "nodename=gpu-node-002",
        "state=DRAIN",
        "reason=gpuwarden: gpu-fallen-off-bus gpu=3 failure=f1",
    ]
    assert fake.calls == [("gpu-node-002", "DRAIN", "gpuwarden: gpu-fallen-off-bus gpu=3 failure=f1")]
    assert fake.nodes_map["gpu-node-002"].drained
    again = await r.handle_failure(failure())
    assert again.decision == D.SKIPPED and len(fake.calls) == 1
    # a restarted remediator (empty memory) sees gpuwarden's reason on the node and skips too
    r2, _, _ = make()
    r2.client = fake
    assert (await r2.handle_failure(failure())).decision == D.SKIPPED and len(fake.calls) == 1
    # intent (before the command), its outcome, the redelivery's skip; the restarted one's skip
    # went to its own producer
    assert [v.decision for v in prod.of("remediations")] == [D.INTENT, D.EXECUTED, D.SKIPPED]
    intent, outcome = prod.of("remediations")[:2]
    assert outcome.intent_id == intent.remediation_id and intent.argv == outcome.argv
    assert [k for t, k, _ in prod.sent] == ["gpu-node-002"] * 3


async def test_dry_run_never_calls_slurm() -> None:
    r, fake, _prod = make(enforce=False)
    rem = await r.handle_failure(failure())
    assert rem.decision == D.DRY_RUN and rem.dry_run and rem.argv[-1].startswith("reason=gpuwarden:")
    assert fake.calls == [] and not fake.nodes_map["gpu-node-002"].drained


async def test_someone_elses_reason_is_never_overwritten() -> None:
    r, fake, _ = make()
    fake.nodes_map["gpu-node-002"] = fake.nodes_map["gpu-node-002"].model_copy(
        update={"flags": ["DRAIN"], "reason": "waiting for RMA", "reason_user": "admin"}
    )
    rem = await r.handle_failure(failure())
    assert rem.decision == D.REFUSED and "admin" in rem.reason and fake.calls == []


async def test_fraction_breaker_latches_until_reset() -> None:
    r, fake, _ = make(n=4)
    await r.seed()
    assert (await r.handle_failure(failure("gpu-node-001", "a"))).decision == D.EXECUTED
    second = await r.handle_failure(failure("gpu-node-003", "b"))
    assert second.decision == D.REFUSED and "breaker" in second.reason
    fake.nodes_map["gpu-node-001"] = nodes(4)[0]  # a person resumed node 1
    r.nodes["gpu-node-001"] = nodes(4)[0]
    third = await r.handle_failure(failure("gpu-node-003", "c"))
    assert third.decision == D.REFUSED and "breaker open" in third.reason
    assert r.health()["breaker"] != "closed"
    r.history.reset_breaker()
    assert (await r.handle_failure(failure("gpu-node-003", "d"))).decision == D.EXECUTED


async def test_failed_command_and_unreadable_node() -> None:
    r, fake, _ = make()
    fake.fail_with = 1
    rem = await r.handle_failure(failure())
    assert rem.decision == D.FAILED and rem.exit_code == 1 and "simulated failure" in (rem.output or "")
    fake.fail_with = None
    fake.raise_on_read = SlurmError("scontrol show node failed (exit 124)")
    rem2 = await r.handle_failure(failure(fid="f2"))
    assert rem2.decision == D.FAILED and "cannot read node state" in rem2.reason


async def test_seed_counts_existing_gpuwarden_drains() -> None:
    r, fake, _ = make(n=4)
    fake.nodes_map["gpu-node-004"] = fake.nodes_map["gpu-node-004"].model_copy(
        update={"flags": ["DRAIN"], "reason": "gpuwarden: x gpu=0 failure=old", "reason_ts": NOW - 10}
    )
    await r.seed()
    assert r.history.drains == [("gpu-node-004", NOW - 10)]
    assert (await r.handle_failure(failure())).decision == D.REFUSED  # 1 of 4 already drained


@pytest.mark.parametrize(
    ("reason", "flags", "rc", "resumed", "msg"),
    [
        ("gpuwarden: gpu-fallen-off-bus gpu=3 failure=f1", ["DRAIN"], 0, True, "resumed"),
        ("maintenance", ["DRAIN"], 1, False, "refused"),
        (None, [], 0, False, "nothing to do"),
    ],
)
async def test_resume_only_our_drains(reason: str | None, flags: list[str], rc: int, resumed: bool, msg: str) -> None:
    fake = FakeSlurm(nodes=[NodeState(node="gpu-node-002", ts=NOW, state="IDLE", flags=flags, reason=reason)])
    got_rc, text = await resume_node(fake, "gpu-node-002")
    assert got_rc == rc and msg in text
    assert (fake.calls == [("gpu-node-002", "RESUME", None)]) is resumed


async def test_resume_unknown_and_invalid() -> None:
    fake = FakeSlurm(nodes=[])
    assert (await resume_node(fake, "gpu-node-009"))[0] == 2
    assert (await resume_node(fake, "bad name"))[0] == 2


async def test_require_health_check_gates_the_resume() -> None:
    """RESUME only after a health check passed after the failure resolved, with none failing since."""
    from gpuwarden.remediator.policy_file import DEFAULT_POLICY
    from gpuwarden.shared.models import FailureState, HealthCheckResult

    clock = [NOW]
    fake = FakeSlurm(nodes=nodes(4))
    fake.now = lambda: clock[0]
    prod = MemProducer()
    policy = DEFAULT_POLICY.model_copy(update={"hold_down_s": 60.0, "require_health_check": True})
    r = Remediator(
        RemediatorSettings(remediator_enforce=True),
        client=fake,  # type: ignore[arg-type]
        producer=prod,  # type: ignore[arg-type]
        now=lambda: clock[0],
        policy=policy,
    )
    await r.seed()

    def health(ts: float, passed: bool, check: str = "gpu-burn") -> HealthCheckResult:
        return HealthCheckResult(node="gpu-node-002", ts=ts, phase="periodic", check=check, passed=passed)

    assert (await r.handle_failure(failure())).decision == D.EXECUTED
    r.note_health(health(NOW + 1, True))  # a pass while the failure is still open: does not count
    clock[0] = NOW + 10
    await r.handle_failure(failure(state=FailureState.RESOLVED))
    clock[0] = NOW + 100  # hold-down (60 s) over
    assert await r.resume_due() == []
    r.note_health(health(NOW + 50, True))
    r.note_health(health(NOW + 50, False, "dcgm-diag"))  # same run, one check failed
    assert await r.resume_due() == []
    r.note_health(health(NOW + 90, False))
    assert await r.resume_due() == []
    assert [c[1] for c in fake.calls] == ["DRAIN"] and fake.nodes_map["gpu-node-002"].drained
    r.note_health(health(NOW + 95, True))
    [rem] = await r.resume_due()
    assert rem.action == Action.RESUME and rem.decision == D.EXECUTED and "[rule=all-resolved]" in rem.reason
    assert [c[1] for c in fake.calls] == ["DRAIN", "RESUME"] and not fake.nodes_map["gpu-node-002"].drained
    assert r.history.to_json()["health_fail"] == {"gpu-node-002": NOW + 90}


async def test_without_health_check_requirement_resume_follows_the_hold_down() -> None:
    from gpuwarden.remediator.policy_file import DEFAULT_POLICY
    from gpuwarden.shared.models import FailureState

    clock = [NOW]
    fake = FakeSlurm(nodes=nodes(4))
    fake.now = lambda: clock[0]
    r = Remediator(
        RemediatorSettings(remediator_enforce=True),
        client=fake,  # type: ignore[arg-type]
        producer=MemProducer(),  # type: ignore[arg-type]
        now=lambda: clock[0],
        policy=DEFAULT_POLICY.model_copy(update={"hold_down_s": 60.0}),
    )
    await r.seed()
    await r.handle_failure(failure())
    clock[0] = NOW + 10
    await r.handle_failure(failure(state=FailureState.RESOLVED))
    clock[0] = NOW + 69
    assert await r.resume_due() == []  # hold-down not over
    clock[0] = NOW + 71
    [rem] = await r.resume_due()
    assert rem.decision == D.EXECUTED and [c[1] for c in fake.calls] == ["DRAIN", "RESUME"]
