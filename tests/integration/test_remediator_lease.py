"""Two remediators with GPUWARDEN_REMEDIATOR_LEASE=kafka on a real broker: one acts, the other
takes over when it stops, one drain in total (FakeSlurm shared by both, not a real Slurm)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer
from kafkatools import read

from factories import make_failure
from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.shared.models import Failure, NodeState, Remediation, Severity
from gpuwarden.sim.slurm import FakeSlurm

pytestmark = pytest.mark.integration


def failure(fid: str = "f-lease-1") -> Failure:
    return make_failure(failure_id=fid, rule_id="xid-79-fallen-off-bus", severity=Severity.FATAL,
                        node="gpu-node-002", gpu_index=1, verdict="GPU 1 fell off the bus")  # fmt: skip


async def _until(pred, timeout_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        await asyncio.sleep(0.1)
    return bool(pred())


def _consuming(r: Remediator) -> bool:
    return r.lease.held() and r.failures_consumer is not None and r.failures_consumer.assigned.is_set()


async def test_kafka_lease_one_active_standby_takes_over_one_drain(bus_env: dict[str, str]) -> None:
    bs, prefix = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"]
    fake = FakeSlurm(nodes=[NodeState(node=f"gpu-node-{i:03d}", ts=1.0, state="IDLE") for i in range(1, 5)])
    settings = RemediatorSettings(
        remediator_enforce=True,
        remediator_lease="kafka",
        remediator_cluster="it",
        consumer_group=f"{prefix}remediator",
        remediator_resume_interval_s=3600,
    )
    a = Remediator(settings, client=fake)
    b = Remediator(settings, client=fake)
    p = AIOKafkaProducer(bootstrap_servers=bs)
    await a.start()
    await p.start()
    try:
        assert await _until(lambda: a.lease.held())  # a alone in the lease group: a is active
        await b.start()
        # b's joining rebalances the lease group: Kafka may hand the lease to either; exactly one holds it
        assert await _until(lambda: a.lease.held() != b.lease.held() and _consuming(a) != _consuming(b))
        await asyncio.sleep(3)  # stable (no rebalance pending)
        leader, standby = (a, b) if a.lease.held() else (b, a)
        assert leader.lease.held() and not standby.lease.held()
        assert _consuming(leader) and standby.failures_consumer is None
        # the leased consumer offers the assignor every gpuwarden consumer offers (one protocol per group)
        assert leader.failures_consumer is not None and leader.failures_consumer.worker_id == leader.worker_id
        await p.send_and_wait(f"{prefix}failures", failure().to_json(), key=b"gpu-node-002")
        # the intent is recorded before the command runs, then the outcome (issue 13)
        intent, first = [Remediation.model_validate_json(v) for v in await read(bs, f"{prefix}remediations", 2)]
        assert intent.decision.value == "intent" and intent.node == "gpu-node-002"
        assert first.decision.value == "executed" and first.node == "gpu-node-002"
        assert [c[:2] for c in fake.calls] == [("gpu-node-002", "DRAIN")]
        assert standby.decisions == {} and leader.decisions.get("executed") == 1  # the standby decided nothing

        t0 = time.monotonic()
        await leader.stop()  # the active replica goes away: the standby takes the lease
        assert await _until(lambda: _consuming(standby), 40)
        took = time.monotonic() - t0
        # the same failure again (redelivery after the hand-over): the new holder decides, no 2nd drain
        await p.send_and_wait(f"{prefix}failures", failure().to_json(), key=b"gpu-node-002")
        rems = [Remediation.model_validate_json(v) for v in await read(bs, f"{prefix}remediations", 3)]
        assert len(rems) == 3, rems
        second = rems[2]
        assert second.decision.value == "skipped" and "[rule=already-drained]" in second.reason
        assert [c[:2] for c in fake.calls] == [("gpu-node-002", "DRAIN")]  # one drain in total
        assert standby.status()["active"] and standby.decisions == {"skipped": 1}
        print(f"lease hand-over: {took:.1f} s")
    finally:
        await p.stop()
        await b.stop()
        await a.stop()


async def test_a_missing_lease_topic_is_named_when_services_may_not_create_topics(
    bus_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GPUWARDEN_CREATE_TOPICS=false``: the lease creates nothing and names the command; with
    the default it creates the topic (as many replicas as the data topics get)."""
    from gpuwarden.remediator.lease_consumer import make_lease
    from gpuwarden.shared.lease import LeaseTopicMissing

    monkeypatch.setenv("GPUWARDEN_REMEDIATOR_LEASE", "kafka")
    monkeypatch.setenv("GPUWARDEN_REMEDIATOR_CLUSTER", "nocreate")
    monkeypatch.setenv("GPUWARDEN_CREATE_TOPICS", "false")
    lease = make_lease(RemediatorSettings())
    with pytest.raises(LeaseTopicMissing, match=r"kafka-topics\.sh --create --topic \S+remediator\.lease\.nocreate"):
        await lease.start()
    await lease.stop()
    monkeypatch.setenv("GPUWARDEN_CREATE_TOPICS", "true")
    lease = make_lease(RemediatorSettings())
    await lease.start()
    try:
        assert await _until(lease.held)
    finally:
        await lease.stop()
