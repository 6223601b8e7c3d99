"""slurm-watcher's watermarks on a real broker: the delivered slurm.jobs offsets (2 partitions)
and a heartbeat, with the watcher's real Producer and a FakeSlurm (no Slurm needed)."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from gpuwarden.shared.models import JobState, NodeState, SlurmWatermark
from gpuwarden.sim.slurm import FakeSlurm
from gpuwarden.slurm_watcher import SlurmWatcher, SlurmWatcherSettings

pytestmark = pytest.mark.integration


def job(jid: str) -> JobState:
    return JobState(job_id=jid, ts=100.0, state="RUNNING", nodes=["gpu-node-001"], gpus={"gpu-node-001": [0]})


async def _read_all(bootstrap: str, topic: str) -> tuple[list[bytes], dict[int, int]]:
    """Every record of ``topic`` and its end offsets (partitions written only)."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]
        ends = await c.end_offsets(tps)
        values: list[bytes] = []
        for _ in range(30):
            if len(values) >= sum(ends.values()):
                break
            for recs in (await c.getmany(timeout_ms=1000)).values():
                values.extend(r.value for r in recs if r.value is not None)
        return values, {tp.partition: o for tp, o in ends.items() if o > 0}
    finally:
        await c.stop()


async def test_watermarks_cover_the_delivered_jobs(
    bus_env: dict[str, str], kafka_bootstrap: str, topic_prefix: str
) -> None:
    clock = {"t": 1000.0}
    fake = FakeSlurm(
        nodes=[NodeState(node="gpu-node-001", ts=100.0, state="IDLE")], jobs=[job(str(i)) for i in range(8)]
    )
    s = SlurmWatcherSettings(slurm_watcher_lease="none", slurm_watcher_cluster="it1", http_port=0)
    w = SlurmWatcher(s, client=fake, now=lambda: clock["t"])
    await w.producer.start()  # the producer only: the polls are this test's, not the service loop's
    try:
        await w.poll_once()
        clock["t"] = 1002.0
        await w.poll_once()  # nothing changed: a heartbeat
    finally:
        await w.producer.stop()
    _, jobs_ends = await _read_all(kafka_bootstrap, f"{topic_prefix}slurm.jobs")
    raw, _ = await _read_all(kafka_bootstrap, f"{topic_prefix}slurm.watermarks")
    wms = [SlurmWatermark.model_validate_json(v) for v in raw]
    assert [(m.cluster, m.ts) for m in wms] == [("it1", 1000.0), ("it1", 1002.0)]
    assert len(jobs_ends) == 2 and sum(jobs_ends.values()) == 8  # both partitions written
    assert wms[0].jobs_offsets == wms[1].jobs_offsets == jobs_ends  # covers every published job
