"""``gpuwarden bench correlator``: GPU samples/s through attribution + windowing on a real broker.

For each worker count: a fresh topic prefix and consumer group, a backlog of ``nodes x ticks``
``NodeSample`` messages (``gpus`` GPUs each, all held by one job) produced before the workers
start, then ``python -m gpuwarden.correlator`` worker processes. The clock runs from the first
consumed sample to the moment every sample has been attributed and windowed (both happen in
the sample handler; ``gpuwarden_messages_out_total{topic="gpu.attributed"}``, counted after
it, summed over the workers' ``/metrics``), so start-up is not counted. Prints GPU samples/s
per worker count and the ratio.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Annotated

import typer
from aiokafka import AIOKafkaProducer

from gpuwarden.shared.brokers import ApacheKafka, free_port
from gpuwarden.shared.models import GpuSample, JobState, NodeSample
from gpuwarden.shared.topics import create_topics

__all__ = ["bench_correlator"]


def _metric(port: int, name: str, topic: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    want = f'{name}{{topic="{topic}"}} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(want)), 0.0)


async def _backlog(bootstrap: str, prefix: str, nodes: int, ticks: int, gpus: int) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks=1, linger_ms=20)
    await p.start()
    t0 = float(int(time.time()) // 10 * 10 - 7200)
    names = [f"bench-node-{i:04d}" for i in range(nodes)]
    try:
        job = JobState(
            job_id="9001",
            ts=t0 - 30,
            state="RUNNING",
            nodes=names,
            gpus={n: list(range(gpus)) for n in names},
            start_ts=t0 - 60,
        )
        await p.send_and_wait(f"{prefix}slurm.jobs", job.to_json(), key=b"9001")
        await asyncio.sleep(0.5)
        for t in range(ticks):
            for n in names:
                s = NodeSample(
                    node=n,
                    ts=t0 + t,
                    collector_id="bench",
                    source="simulated",
                    gpus=[
                        GpuSample(
                            index=i,
                            utilization_gpu_pct=90.0,
                            power_w=600.0,
                            sm_clock_mhz=1980.0,
                            memory_used_mib=40000.0 + t,
                            memory_total_mib=81559.0,
                            temperature_c=65.0,
                            throttle_reasons=["sw_power_cap"] if t % 7 == 0 else [],
                        )
                        for i in range(gpus)
                    ],
                )
                await p.send(f"{prefix}gpu.samples", s.to_json(), key=n.encode())
        await p.flush()
    finally:
        await p.stop()


def _run(bootstrap: str, workers: int, nodes: int, ticks: int, gpus: int, partitions: int, timeout: float) -> float:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    asyncio.run(create_topics(bootstrap, prefix, partitions=partitions))
    asyncio.run(_backlog(bootstrap, prefix, nodes, ticks, gpus))
    env = {
        **os.environ,
        "GPUWARDEN_BOOTSTRAP_SERVERS": bootstrap,
        "GPUWARDEN_TOPIC_PREFIX": prefix,
        "GPUWARDEN_CONSUMER_GROUP": f"bench-correlator-{prefix.rstrip('.')}",
        "GPUWARDEN_LOG_LEVEL": "WARNING",
    }
    procs: list[tuple[subprocess.Popen[bytes], int]] = []
    total = nodes * ticks
    try:
        for _ in range(workers):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwarden.correlator"],
                env={**env, "GPUWARDEN_HTTP_PORT": str(port)},
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append((proc, port))
        deadline = time.monotonic() + timeout
        started: float | None = None
        while time.monotonic() < deadline:
            if started is None and any(
                _metric(port, "gpuwarden_messages_in_total", "gpu.samples") > 0 for _, port in procs
            ):
                started = time.monotonic()
            done = sum(_metric(port, "gpuwarden_messages_out_total", "gpu.attributed") for _, port in procs)
            if done >= total and started is not None:
                return total * gpus / (time.monotonic() - started)
            if any(p.poll() is not None for p, _ in procs):
                raise RuntimeError("a correlator worker exited")
            time.sleep(0.1)
        raise RuntimeError(f"timed out: {done}/{total} samples windowed")
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def bench_correlator(
    nodes: Annotated[int, typer.Option(help="Nodes (one NodeSample per node per tick)")] = 40,
    ticks: Annotated[int, typer.Option(help="Ticks (s of event time) per node")] = 120,
    gpus: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    workers: Annotated[list[int], typer.Option(help="Worker counts to run, one run each")] = [1, 2],  # noqa: B006
    partitions: Annotated[int, typer.Option(help="Partitions of the topics")] = 6,
    bootstrap: Annotated[
        str | None,
        typer.Option(help="Kafka bootstrap servers; default $GPUWARDEN_BOOTSTRAP_SERVERS, else deploy/kafka.sh"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Give up a run after this long, s")] = 300.0,
) -> None:
    """GPU samples/s through the correlator (decode, join, attributed publish, windowing) on a
    real broker, from a backlog; one run per worker count, then the ratio to the first."""
    bootstrap = bootstrap or os.environ.get("GPUWARDEN_BOOTSTRAP_SERVERS")
    kafka: ApacheKafka | None = None
    if not bootstrap:
        script = Path("deploy/kafka.sh").resolve()
        if not ApacheKafka.available(script):
            raise typer.BadParameter("no --bootstrap and deploy/kafka.sh cannot start Kafka (run from the repo root)")
        kafka = ApacheKafka(script)
        bootstrap = kafka.start()
    try:
        rates: dict[int, float] = {}
        for w in workers:
            rates[w] = _run(bootstrap, w, nodes, ticks, gpus, partitions, timeout)
            typer.echo(
                f"workers={w}: {rates[w]:,.0f} GPU samples/s ({rates[w] / gpus:,.0f} NodeSamples/s; "
                f"{nodes * ticks * gpus} GPU samples, {partitions} partitions)"
            )
        first = workers[0]
        for w in workers[1:]:
            typer.echo(f"ratio workers={w} / workers={first}: {rates[w] / rates[first]:.2f}")
    finally:
        if kafka is not None:
            kafka.stop()
