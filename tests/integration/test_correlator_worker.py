"""The correlator worker (``python -m gpuwarden.correlator``) against a real broker."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    DeadLetter,
    EventKind,
    GpuEvent,
    GpuSample,
    JobState,
    NodeSample,
    SlurmWatermark,
)
from gpuwarden.sim.brokers import free_port

pytestmark = pytest.mark.integration

NODE = "gpu-node-001"


@pytest.fixture
def correlator(bus_env: dict[str, str], topic_prefix: str) -> Iterator[tuple[subprocess.Popen[bytes], int, float]]:
    """A correlator worker process; yields (process, http port, start time). Stopped after the test."""
    port = free_port()
    env = {
        **os.environ,
        **bus_env,
        # A group of its own per test: Tansu ignores leave-group, a reused group would wait a session timeout.
        "GPUWARDEN_CONSUMER_GROUP": f"gpuwarden-correlator-{topic_prefix.rstrip('.')}",
        "GPUWARDEN_HTTP_PORT": str(port),
        "GPUWARDEN_LOG_LEVEL": "INFO",
    }
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.correlator"],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc, port, t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


async def _produce(bootstrap: str, items: list[tuple[str, bytes | None, bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks=1)
    await p.start()
    try:
        for topic, key, value in items:
            await p.send_and_wait(topic, value=value, key=key)
    finally:
        await p.stop()


def _sample(ts: float) -> NodeSample:
    return NodeSample(
        node=NODE,
        ts=ts,
        collector_id="test",
        source="simulated",
        gpus=[GpuSample(index=i, utilization_gpu_pct=90.0) for i in range(4)],
    )


def _healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return json.loads(r.read())


async def test_worker_attributes_samples_and_events_and_dead_letters(
    correlator: tuple[subprocess.Popen[bytes], int, float], kafka_bootstrap: str, topic_prefix: str
) -> None:
    proc, port, t0 = correlator
    t = lambda short: f"{topic_prefix}{short}"
    now = time.time()
    job = JobState(
        job_id="1001",
        ts=now,
        state="RUNNING",
        user="alice",
        account="ml",
        partition="gpu",
        nodes=[NODE],
        gpus={NODE: [0, 1]},
        start_ts=now - 60,
        end_ts=now + 3600,
    )
    # Produced before the worker is up: it must start from the earliest offsets.
    await _produce(
        kafka_bootstrap,
        [
            (t("slurm.jobs"), b"1001", job.to_json()),
            (t("slurm.jobs"), b"1002", b"this is not json"),
            (t("gpu.samples"), NODE.encode(), b'{"schema_version": 1, "node": "gpu-node-001"}'),
            (t("gpu.events"), NODE.encode(), b"\xff\xfe not json either"),
            # schema-shaped but hostile (issue 25): stopped at the edge, dead-lettered by the correlator
            *[(t("gpu.samples"), NODE.encode(), v) for v in _hostile_samples(now)],
            (t("gpu.events"), NODE.encode(), _poisoned_xid()),
        ],
    )
    # What slurm-watcher says after the poll that published the job: the view is complete up
    # to its time, at these slurm.jobs offsets (the samples wait for it)
    ends = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None)
    await ends.start()
    try:
        parts = [
            TopicPartition(t("slurm.jobs"), p) for p in sorted(ends.partitions_for_topic(t("slurm.jobs")) or [0, 1])
        ]
        offs = await ends.end_offsets(parts)
    finally:
        await ends.stop()
    wm = SlurmWatermark(cluster="test", ts=now + 3600, jobs_offsets={tp.partition: o for tp, o in offs.items()})
    await _produce(kafka_bootstrap, [(t("slurm.watermarks"), b"test", wm.to_json())])

    consumer = AIOKafkaConsumer(
        t("gpu.attributed"),
        t("gpu.events.attributed"),
        t("deadletter"),
        bootstrap_servers=kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    samples: list[AttributedSample] = []
    events: list[AttributedEvent] = []
    dead: list[DeadLetter] = []
    first_attributed: float | None = None
    try:
        # Samples tick like a collector (1 per 0.5 s) until one carries the job: the first ones
        # may race the allocation through the internal topic.
        tick = 0
        deadline = time.monotonic() + 120
        event_sent = False
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            if not event_sent:
                await _produce(kafka_bootstrap, [(t("gpu.samples"), NODE.encode(), _sample(now + tick).to_json())])
                tick += 1
            batches = await consumer.getmany(timeout_ms=500)
            for tp, recs in batches.items():
                for rec in recs:
                    if tp.topic == t("gpu.attributed"):
                        samples.append(AttributedSample.model_validate_json(rec.value))
                        if first_attributed is None:
                            first_attributed = time.monotonic() - t0
                    elif tp.topic == t("gpu.events.attributed"):
                        events.append(AttributedEvent.model_validate_json(rec.value))
                    else:
                        dead.append(DeadLetter.model_validate_json(rec.value))
            if not event_sent and any(s.jobs for s in samples):
                ev = GpuEvent(
                    event_id="e1",
                    node=NODE,
                    ts=now + tick,
                    kind=EventKind.XID,
                    code=79,
                    gpu_index=1,
                    message="GPU has fallen off the bus.",
                    raw="NVRM: Xid (PCI:0000:44:00): 79, ...",
                    source="simulated",
                )
                await _produce(kafka_bootstrap, [(t("gpu.events"), NODE.encode(), ev.to_json())])
                event_sent = True
            if event_sent and events and len(dead) >= 2 + HOSTILE:
                break
    finally:
        await consumer.stop()

    print(f"\ncorrelator: first attributed sample {first_attributed} s after process start")
    attributed = [s for s in samples if s.jobs]
    assert attributed, f"no sample attributed; got {len(samples)} unattributed samples"
    for s in attributed:
        assert [(a.gpu_index, a.job_id) for a in s.jobs] == [(0, "1001"), (1, "1001")]
        assert s.jobs[0].user == "alice" and s.jobs[0].job_gpus == 2
    assert len(events) == 1
    assert events[0].event.code == 79
    assert events[0].job is not None and events[0].job.job_id == "1001" and events[0].job.gpu_index == 1
    assert {a.gpu_index for a in events[0].node_jobs} == {0, 1}

    # slurm.jobs is read whole by every correlator worker: its bad records are dead-lettered
    # once, by the detector's consumer of it, not by each worker
    assert len(dead) == 2 + HOSTILE
    assert {d.source_topic for d in dead} == {t("gpu.samples"), t("gpu.events")}
    assert all(d.service == "correlator" for d in dead)
    # the ts=1e308 sample and its peers changed nothing downstream: every attributed sample is
    # one of the ticks, and the ticks after them were joined as before
    assert all(now <= s.sample.ts <= now + tick for s in samples), sorted({s.sample.ts for s in samples})[-3:]
    assert all(s.sample.node == NODE for s in samples)
    errors = " | ".join(d.error for d in dead)
    assert "ts: Input should be less than or equal to 4102444800" in errors and "contract event-time" in errors
    events_dead = [base64.b64decode(d.value_b64) for d in dead if d.source_topic == t("gpu.events")]
    assert events_dead[0] == b"\xff\xfe not json either" and b"e-poison" in events_dead[1]
    first_sample = next(d for d in dead if d.source_topic == t("gpu.samples"))
    assert "node" not in first_sample.error or "ts" in first_sample.error

    assert proc.poll() is None, "the worker died"
    health = await asyncio.to_thread(_healthz, port)
    assert health["status"] == "ok"

    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    assert rc == 0, out[-4000:]
    # No orphans: nothing is left in the worker's process group.
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


#: Hostile records of the worker test: schema-shaped, outside the contract.
HOSTILE = 5


def _hostile_samples(now: float) -> list[bytes]:
    good = orjson.loads(_sample(now).to_json())
    return [
        orjson.dumps({**good, "ts": 1e308}),  # finite, past the schema's MAX_EVENT_TS
        orjson.dumps({**good, "ts": now + 86400}),  # in the schema; a day ahead of the wall clock
        orjson.dumps({**good, "node": "gpu-node-001$(id)"}),  # not a Slurm node name
        orjson.dumps({**good, "gpus": [{**good["gpus"][0], "index": i} for i in range(65)]}),  # > 64 GPUs
    ]


def _poisoned_xid() -> bytes:
    ev = GpuEvent(
        event_id="e-poison",
        node=NODE,
        ts=1.0,
        kind=EventKind.XID,
        code=79,
        message="GPU has fallen off the bus.",
        raw="NVRM: Xid (PCI:0000:44:00): 79, ...",
        source="simulated",
    )
    return orjson.dumps({**orjson.loads(ev.to_json()), "ts": 1e308})
