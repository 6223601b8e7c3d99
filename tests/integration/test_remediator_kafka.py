"""Remediator on a real broker: malformed messages on each input topic are dead-lettered, the
service keeps running and still decides on the next good failure (audit on ``remediations``)."""

from __future__ import annotations

import asyncio
import base64
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from kafkatools import read

from factories import make_failure
from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.shared.models import Failure, NodeState, Remediation, Severity
from gpuwarden.sim.slurm import FakeSlurm

pytestmark = pytest.mark.integration


def failure() -> Failure:
    return make_failure(rule_id="xid-79-fallen-off-bus", severity=Severity.FATAL, node="gpu-node-001", gpu_index=0,
                        verdict="v", affected_gpus=1, usd_per_hour=3.26)  # fmt: skip


async def test_remediator_dead_letters_and_survives(bus_env: dict[str, str]) -> None:
    bs, prefix = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"]
    nodes = [NodeState(node=f"gpu-node-00{i}", ts=1.0, state="IDLE") for i in range(1, 5)]
    svc = Remediator(RemediatorSettings(remediator_enforce=False), client=FakeSlurm(nodes=nodes))
    await svc.start()
    p = AIOKafkaProducer(bootstrap_servers=bs)
    await p.start()
    try:
        await p.send_and_wait(f"{prefix}failures", b"\xff\xfe", key=b"gpu-node-001")
        await p.send_and_wait(f"{prefix}slurm.nodes", orjson.dumps({"node": "x", "state": 5}), key=b"x")
        await p.send_and_wait(f"{prefix}failures", failure().to_json(), key=b"gpu-node-001")
        dls = [orjson.loads(v) for v in await read(bs, f"{prefix}deadletter", 1)]
        # slurm.nodes' edge service is the detector (TopicSpec.edge): the remediator drops its bad
        # record and counts it, so it is dead-lettered once, not by every reader
        assert sorted(d["source_topic"] for d in dls) == [f"{prefix}failures"]
        assert any(base64.b64decode(d["value_b64"]) == b"\xff\xfe" for d in dls)
        [r] = [Remediation.model_validate_json(v) for v in await read(bs, f"{prefix}remediations", 1)]
        assert r.dry_run and r.decision.value == "dry-run" and r.node == "gpu-node-001" and r.failure_ids == ["f1"]
        labels = {"topic": "slurm.nodes", "rule": "schema"}
        deadline = time.monotonic() + 20
        while svc.metrics.registry.get_sample_value("gpuwarden_rejected_records_total", labels) != 1.0:
            assert time.monotonic() < deadline, "the bad slurm.nodes record was not counted"
            await asyncio.sleep(0.1)
        assert svc.health()["status"] == "ok"
    finally:
        await p.stop()
        await svc.stop()
