"""slurm-watcher's jobcomp/kafka source on a real broker: the service reads a site topic the way
slurmctld's ``jobcomp/kafka`` plugin fills it (records of tests/fixtures/slurm/synthetic/
jobcomp-kafka-records.txt, produced as the plugin does: one JSON value per job), publishes the
end on ``slurm.jobs`` long before its next poll (poll period 1 h), with the poller's GPU
indices, and dead-letters a record that is not one."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from gpuwarden.shared.models import DeadLetter, JobState, NodeState
from gpuwarden.sim.slurm import FakeSlurm
from gpuwarden.slurm_watcher import SlurmWatcher, SlurmWatcherSettings

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "synthetic" / "jobcomp-kafka-records.txt"


async def _records(bootstrap: str, topic: str, want: int, timeout_s: float = 60.0) -> list[bytes]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    await c.start()
    out: list[bytes] = []
    try:
        end = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < end:
            for recs in (await c.getmany(timeout_ms=500)).values():
                out += [r.value for r in recs if r.value is not None]
        return out
    finally:
        await c.stop()


async def test_a_jobcomp_end_reaches_slurm_jobs_before_the_next_poll(
    bus_env: dict[str, str], kafka_bootstrap: str, topic_prefix: str
) -> None:
    site_topic = f"jobcomp-{uuid.uuid4().hex[:6]}"  # the site's topic: no gpuwarden prefix
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(site_topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    lines = [x for x in FIXTURE.read_text().splitlines() if x.startswith("{")]
    end_5001 = lines[1]
    assert orjson.loads(end_5001)["state"] == "FAILED"
    running = JobState(job_id="5001", ts=1.0, state="RUNNING", user="user01", nodes=["gpu-01", "gpu-02"],
                       gpus={"gpu-01": [0, 1, 2, 3], "gpu-02": [4, 5, 6, 7]})  # fmt: skip
    fake = FakeSlurm(nodes=[NodeState(node="gpu-01", ts=1.0, state="ALLOCATED")], jobs=[running])
    s = SlurmWatcherSettings(
        slurm_watcher_lease="none",
        slurm_watcher_poll_s=3600.0,
        slurm_watcher_jobcomp_topic=site_topic,
        slurm_watcher_cluster="jc1",
        http_port=0,
    )
    w = SlurmWatcher(s, client=fake)
    await w.start()
    try:
        assert w.jobcomp is not None
        await asyncio.wait_for(w.jobcomp.ready.wait(), 90)

        async def first_poll() -> None:  # the first poll (RUNNING) is out: the poller knows the GPUs
            while not w.polls:
                await asyncio.sleep(0.1)

        await asyncio.wait_for(first_poll(), 90)
        p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await p.start()
        try:
            await p.send_and_wait(site_topic, end_5001.encode())
            await p.send_and_wait(site_topic, b"jobcomp says hello")  # not a record
        finally:
            await p.stop()

        async def both_read() -> None:
            assert w.jobcomp is not None
            while not (w.jobcomp_published and w.jobcomp.bad):
                await asyncio.sleep(0.1)

        await asyncio.wait_for(both_read(), 90)
        assert w.polls == 1  # no second poll (1 h period): the end came from jobcomp
    finally:
        await w.stop()
    jobs = [JobState.model_validate_json(v) for v in await _records(kafka_bootstrap, f"{topic_prefix}slurm.jobs", 2)]
    assert [(j.job_id, j.state) for j in jobs] == [("5001", "RUNNING"), ("5001", "FAILED")], jobs
    assert jobs[1].gpus == {"gpu-01": [0, 1, 2, 3], "gpu-02": [4, 5, 6, 7]} and jobs[1].confirmed
    [dl] = [DeadLetter.model_validate_json(v) for v in await _records(kafka_bootstrap, f"{topic_prefix}deadletter", 1)]
    assert dl.source_topic == site_topic and dl.service == "slurm-watcher" and "not JSON" in dl.error
