"""``gpuwarden analyze --bootstrap-servers``: the recording through the real services on a Kafka.

The recording's job, samples and events are produced to fresh topics (a prefix of this run's
own) of the given Kafka, in event-time order; the correlator and detector run as the services
do (separate processes); the failures are read back from ``failures`` until it has been quiet
for a while. Differences from the in-process run: the last window of the recording (up to
window + grace, 15 s) stays open, as it would in a live pipeline, and folded updates of an
episode are published at most every 30 s of event time.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from gpuwarden.demo.runner import spawn_service, stop_services, wait_healthy
from gpuwarden.shared.bus import Producer, kafka_consumer
from gpuwarden.shared.models import Failure, GpuEvent, JobState, NodeSample, SlurmWatermark
from gpuwarden.shared.settings import BusSettings
from gpuwarden.shared.slurm_progress import JobsOffsets
from gpuwarden.shared.topics import create_topics
from gpuwarden.sim.brokers import free_port

__all__ = ["analyze_via_kafka"]

SERVICES = [("correlator", "gpuwarden.correlator"), ("detector", "gpuwarden.detector")]
#: Cluster name of the watermarks this run publishes (the slurm-watcher's default).
CLUSTER = "default"


async def analyze_via_kafka(
    samples: Sequence[NodeSample],
    events: Sequence[GpuEvent],
    job: JobState | None,
    bootstrap_servers: str,
    *,
    price_usd_per_gpu_hour: float = 3.26,
    quiet_s: float = 8.0,
    timeout_s: float = 600.0,
) -> dict[str, Failure]:
    """Produce the recording to ``bootstrap_servers`` and collect the detector's failures.

    Args:
        job: the JobState the recording is treated as (RUNNING; a COMPLETED copy is sent at the end).
        quiet_s: wall seconds without a new failure, after everything was produced, that end the run.
        timeout_s: wall-clock limit of the whole run, s.

    Returns:
        The latest version of each failure, by ``failure_id``.

    Raises:
        RuntimeError: a service exited or did not become healthy.
        TimeoutError: the run exceeded ``timeout_s``.
    """
    prefix = f"gpuwarden.analyze{os.getpid()}x{int(time.time()) % 100000}."
    workdir = Path(tempfile.mkdtemp(prefix="gpuwarden-analyze-"))
    await create_topics(bootstrap_servers, prefix, partitions=1)
    procs = []
    for name, module in SERVICES:
        port = free_port()
        env = {
            **os.environ,
            "GPUWARDEN_BOOTSTRAP_SERVERS": bootstrap_servers,
            "GPUWARDEN_TOPIC_PREFIX": prefix,
            "GPUWARDEN_HTTP_PORT": str(port),
            "GPUWARDEN_DETECTOR_PRICE_USD_PER_GPU_HOUR": str(price_usd_per_gpu_hour),
            "PYTHONUNBUFFERED": "1",
        }
        procs.append(spawn_service(name, module, env, workdir / "logs" / f"{name}.log", port))
    reader = kafka_consumer(bootstrap_servers, f"{prefix}failures", group_id=None, auto_offset_reset="earliest")
    failures: dict[str, Failure] = {}
    deadline = time.monotonic() + timeout_s
    try:
        await wait_healthy(procs, 120)
        await reader.start()
        producer = Producer(BusSettings(bootstrap_servers=bootstrap_servers, topic_prefix=prefix))
        await producer.start()
        try:
            # Slurm's view as the correlator needs it: the job, then a watermark saying the view is
            # complete through the recording (the job holds its GPUs until its end, at ``end``)
            end = max([s.ts for s in samples] + [e.ts for e in events], default=job.ts if job else 0.0)
            offsets = JobsOffsets()
            if job is not None:
                offsets.note(await (await producer.send("slurm.jobs", job.job_id, job)))
            await producer.publish(
                "slurm.watermarks", CLUSTER, SlurmWatermark(cluster=CLUSTER, ts=end, jobs_offsets=offsets.offsets)
            )
            evs = sorted(events, key=lambda e: e.ts)
            ei = 0
            for s in samples:
                while ei < len(evs) and evs[ei].ts <= s.ts:
                    await producer.publish("gpu.events", evs[ei].node, evs[ei])
                    ei += 1
                await producer.publish("gpu.samples", s.node, s)
            for e in evs[ei:]:
                await producer.publish("gpu.events", e.node, e)
            if job is not None:
                done = job.model_copy(update={"ts": end, "state": "COMPLETED", "end_ts": end})
                offsets.note(await (await producer.send("slurm.jobs", job.job_id, done)))
            # the end is in the view too: complete up to 1 s past the recording
            wm = SlurmWatermark(cluster=CLUSTER, ts=end + 1.0, jobs_offsets=offsets.offsets)
            await producer.publish("slurm.watermarks", CLUSTER, wm)
            await producer.flush()
        finally:
            await producer.stop()
        last_new = time.monotonic()
        while time.monotonic() - last_new < quiet_s:
            if time.monotonic() > deadline:
                raise TimeoutError(f"analyze through Kafka took more than {timeout_s:.0f} s")
            dead = [p for p in procs if not p.alive]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited:\n{dead[0].log_tail()}")
            batches = await reader.getmany(timeout_ms=500, max_records=1000)
            for recs in batches.values():
                for r in recs:
                    try:
                        f = Failure.model_validate_json(r.value)
                    except ValidationError:
                        continue
                    failures[f.failure_id] = f
                    last_new = time.monotonic()
    finally:
        await reader.stop()
        await stop_services(procs)
    return failures


def run(
    samples: Sequence[NodeSample],
    events: Sequence[GpuEvent],
    job: JobState | None,
    bootstrap_servers: str,
    price_usd_per_gpu_hour: float,
) -> dict[str, Failure]:
    """:func:`analyze_via_kafka` from synchronous code."""
    return asyncio.run(
        analyze_via_kafka(samples, events, job, bootstrap_servers, price_usd_per_gpu_hour=price_usd_per_gpu_hour)
    )
