"""A node the Slurm health-check wrapper drained (``gpuwarden prolog:/epilog:/periodic:``) is
resumed by the remediator after a later passing health check on ``health``, under the same
own-reason rule: never a node someone else drained, never while a check still fails, never on
a pass older than the drain; dry-run records what it would do."""

from __future__ import annotations

import pytest

import gpuwarden.remediator.health_drains as health_drains
from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import HealthCheckResult, NodeState
from gpuwarden.sim.slurm import FakeSlurm

NOW = 1_800_000_000.0
REASON = "gpuwarden prolog: CRITICAL: ecc: GPU 2: uncorrectable ECC | 9 checks in 0.1s"


class MemProducer(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def node(name: str, reason: str | None, reason_ts: float | None = NOW - 100) -> NodeState:
    return NodeState(
        node=name, ts=NOW, state="IDLE", flags=["DRAIN"] if reason else [], reason=reason,
        reason_user="root" if reason else None, reason_ts=reason_ts if reason else None,
    )  # fmt: skip


def health(name: str, ts: float, passed: bool, check: str = "ecc") -> HealthCheckResult:
    return HealthCheckResult(node=name, ts=ts, phase="periodic", check=check, passed=passed)


@pytest.fixture(autouse=True)
def no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_drains, "HEALTH_SETTLE_S", -1.0)  # results are all in: no need to wait


async def make(enforce: bool, nodes: list[NodeState]) -> tuple[Remediator, FakeSlurm, MemProducer]:
    fake = FakeSlurm(nodes=nodes)
    fake.now = lambda: NOW
    prod = MemProducer()
    settings = RemediatorSettings(remediator_enforce=enforce)
    r = Remediator(settings, client=fake, producer=prod, now=lambda: NOW)  # type: ignore[arg-type]
    await r.seed()
    return r, fake, prod


async def test_health_drained_node_resumes_after_a_later_pass() -> None:
    r, fake, prod = await make(True, [node("gpu-node-001", REASON)])
    r.note_health(health("gpu-node-001", NOW - 100, False))  # the prolog's failing run
    assert await r.resume_due() == [] and fake.calls == []  # no pass yet
    r.note_health(health("gpu-node-001", NOW - 10, True))
    r.note_health(health("gpu-node-001", NOW - 10, True, "xid"))
    [rem] = await r.resume_due()
    assert rem.decision.value == "executed" and rem.action.value == "resume"
    assert rem.reason.startswith("resume: [rule=health-check-passed]")
    assert fake.calls == [("gpu-node-001", "RESUME", None)]
    assert not fake.nodes_map["gpu-node-001"].drained
    assert await r.resume_due() == [] and len(fake.calls) == 1  # once
    assert [v.decision.value for v in prod.of("remediations")] == ["executed"]


async def test_a_failing_check_of_the_same_run_keeps_it_drained() -> None:
    r, fake, _ = await make(True, [node("gpu-node-001", REASON)])
    r.note_health(health("gpu-node-001", NOW - 10, True, "xid"))
    r.note_health(health("gpu-node-001", NOW - 10, False, "ecc"))
    assert await r.resume_due() == [] and fake.calls == []


async def test_a_pass_older_than_the_drain_does_not_count() -> None:
    r, fake, _ = await make(True, [node("gpu-node-001", REASON, reason_ts=NOW - 5)])
    r.note_health(health("gpu-node-001", NOW - 60, True))
    assert await r.resume_due() == [] and fake.calls == []


async def test_unknown_drain_time_needs_a_known_failure_before_the_pass() -> None:
    r, fake, _ = await make(True, [node("gpu-node-001", REASON, reason_ts=None)])
    r.note_health(health("gpu-node-001", NOW - 60, True))
    assert await r.resume_due() == [] and fake.calls == []


@pytest.mark.parametrize(
    "reason",
    ["Epilog error", "root: bad DIMM", "gpuwarden: gpu-fallen-off-bus gpu=3 failure=abcd1234", "GPUWARDEN PROLOG: x"],
)
async def test_other_reasons_are_never_resumed_by_a_health_pass(reason: str) -> None:
    r, fake, _ = await make(True, [node("gpu-node-001", reason)])
    r.note_health(health("gpu-node-001", NOW - 100, False))
    r.note_health(health("gpu-node-001", NOW - 10, True))
    await r.resume_due()
    assert ("gpu-node-001", "RESUME", None) not in fake.calls


async def test_a_reason_changed_in_slurm_meanwhile_is_not_touched() -> None:
    r, fake, _ = await make(True, [node("gpu-node-001", REASON)])
    fake.nodes_map["gpu-node-001"] = node("gpu-node-001", "ops: RMA ticket 4711")  # the cached copy is stale
    r.note_health(health("gpu-node-001", NOW - 100, False))
    r.note_health(health("gpu-node-001", NOW - 10, True))
    assert await r.resume_due() == [] and fake.calls == []


@pytest.mark.parametrize("prefix", ["gpuwarden epilog:", "gpuwarden periodic:"])
async def test_dry_run_records_the_resume_it_would_make(prefix: str) -> None:
    r, fake, _ = await make(False, [node("gpu-node-002", f"{prefix} CRITICAL: processes: GPU 0 ...")])
    r.note_health(health("gpu-node-002", NOW - 100, False))
    r.note_health(health("gpu-node-002", NOW - 10, True))
    [rem] = await r.resume_due()
    assert rem.decision.value == "dry-run" and rem.dry_run and rem.argv[-1] == "state=RESUME"
    assert fake.calls == []
    assert await r.resume_due() == []  # recorded once, not every interval


async def test_a_run_still_arriving_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_drains, "HEALTH_SETTLE_S", 3600.0)
    r, fake, _ = await make(True, [node("gpu-node-001", REASON)])
    r.note_health(health("gpu-node-001", NOW - 100, False))
    r.note_health(health("gpu-node-001", NOW - 10, True))
    assert await r.resume_due() == [] and fake.calls == []


async def test_a_second_drain_with_the_same_reason_is_resumed_again() -> None:
    """The health check often drains with the same text: the drain's time tells two drains apart."""
    r, fake, _ = await make(True, [node("gpu-node-001", REASON, reason_ts=NOW - 300)])
    r.note_health(health("gpu-node-001", NOW - 290, True))
    assert len(await r.resume_due()) == 1
    again = node("gpu-node-001", REASON, reason_ts=NOW - 100)
    fake.nodes_map["gpu-node-001"] = again
    r.nodes["gpu-node-001"] = again
    r.note_health(health("gpu-node-001", NOW - 10, True))
    assert len(await r.resume_due()) == 1 and len(fake.calls) == 2
