"""``gpuwarden bench correlator``: GPU samples/s through attribution + windowing on a real broker.

For each worker count: a fresh topic prefix and consumer group, a backlog of ``nodes x ticks``
``NodeSample`` messages (``gpus`` GPUs each, all held by one job) produced before the workers
start, then ``python -m gpuwarden.correlator`` worker processes. The clock runs from the first
consumed sample to the moment every sample has been attributed and windowed (both happen in
the sample handler; ``gpuwarden_messages_out_total{topic="gpu.attributed"}``, counted after
it, summed over the workers' ``/metrics``), so start-up is not counted. Prints GPU samples/s
per worker count and the ratio, and the CPU time the workers used over the same interval
(``utime + stime`` of ``/proc/<pid>/stat``, Linux) as CPU-seconds per 1,000 GPU samples: on a
machine with fewer cores than workers + broker the rate cannot scale, the CPU cost per sample
shows the efficiency. Each worker's share of the samples shows the partitions were spread.
Then a raw consume of the first run's ``gpu.samples`` (aiokafka + ``orjson.loads``, a process
of its own) gives the raw consume's CPU per 1,000 GPU samples, and the first worker count's
CPU per 1,000 GPU samples as a multiple of it (target <= 8x). The default backlog is the fleet
of ``bench pipeline`` (3,125 nodes x 8 GPUs) and its samples (the NVML collector's H100 sample,
NVLinks every tick), 16 ticks (one window closed per node).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import orjson
import typer

from gpuwarden.shared.bus import kafka_producer
from gpuwarden.shared.models import JobState
from gpuwarden.shared.slurm_progress import JobsOffsets, publish_watermark
from gpuwarden.shared.topics import create_topics
from gpuwarden.sim.bench.figures import cpu_ms_per_1000, raw_cpu_line
from gpuwarden.sim.bench.pipeline import collector_gpus, node_template, raw_consume_cpu
from gpuwarden.sim.brokers import ApacheKafka, bench_broker_errors, bootstrap_option, free_port

__all__ = ["RunResult", "bench_correlator", "cpu_seconds"]


def _metric(port: int, name: str, topic: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    want = f'{name}{{topic="{topic}"}} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(want)), 0.0)


async def _backlog(bootstrap: str, prefix: str, nodes: int, ticks: int, gpus: int) -> None:
    p = kafka_producer(bootstrap, enable_idempotence=False, acks=1, linger_ms=20)
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
        offsets = JobsOffsets()
        offsets.note(await p.send_and_wait(f"{prefix}slurm.jobs", job.to_json(), key=b"9001"))
        # the job holds every GPU through the backlog: Slurm's view is complete past its last sample
        await publish_watermark(p.send_and_wait, "default", t0 + ticks, offsets.offsets, f"{prefix}slurm.watermarks")
        await asyncio.sleep(0.5)
        # the NVML collector's H100 sample (bench pipeline's load), NVLinks every tick
        base = collector_gpus(gpus)
        templates = [(n.encode(), node_template(n, base)[0]) for n in names]
        for t in range(ticks):
            for key, tpl in templates:
                tpl["ts"] = t0 + t
                for g in tpl["gpus"]:
                    g["memory_used_mib"] = 40000.0 + t
                    g["throttle_reasons"] = ["sw_power_cap"] if t % 7 == 0 else []
                await p.send(f"{prefix}gpu.samples", orjson.dumps(tpl), key=key)
        await p.flush()
    finally:
        await p.stop()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far, s (``/proc/<pid>/stat``, Linux); None
    when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class RunResult:
    """One run: GPU samples/s, worker CPU s over the timed interval, GPU samples per worker,
    the run's ``gpu.samples`` topic."""

    rate: float
    cpu_s: float
    per_worker: list[float]
    topic: str = ""

    def cpu_per_1000(self, gpu_samples: int) -> float:
        """CPU-seconds per 1,000 GPU samples."""
        return self.cpu_s / gpu_samples * 1000


def _run(bootstrap: str, workers: int, nodes: int, ticks: int, gpus: int, partitions: int, timeout: float) -> RunResult:
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
        cpu0 = 0.0
        while time.monotonic() < deadline:
            if started is None and any(
                _metric(port, "gpuwarden_messages_in_total", "gpu.samples") > 0 for _, port in procs
            ):
                started = time.monotonic()
                cpu0 = sum(cpu_seconds(p.pid) or 0.0 for p, _ in procs)
            per = [_metric(port, "gpuwarden_messages_out_total", "gpu.attributed") for _, port in procs]
            done = sum(per)
            if done >= total and started is not None:
                rate = total * gpus / (time.monotonic() - started)
                cpu = sum(cpu_seconds(p.pid) or 0.0 for p, _ in procs) - cpu0
                return RunResult(rate, cpu, [n * gpus for n in per], f"{prefix}gpu.samples")
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
    nodes: Annotated[
        int,
        typer.Option(min=1, help="Nodes (one NodeSample per node per tick); default: the fleet of bench pipeline"),
    ] = 3125,
    ticks: Annotated[int, typer.Option(min=1, help="Ticks (s of event time) per node")] = 16,
    gpus: Annotated[int, typer.Option(min=1, max=64, help="GPUs per node")] = 8,
    workers: Annotated[list[int], typer.Option(min=1, max=64, help="Worker counts to run, one run each")] = [1, 2],  # noqa: B006
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the topics")] = 6,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            help="Kafka bootstrap servers, host:port[,...]; default $GPUWARDEN_BOOTSTRAP_SERVERS, else deploy/kafka.sh",
            callback=bootstrap_option,
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=1, max=86_400, help="Give up a run after this long, s")] = 300.0,
) -> None:
    """GPU samples/s through the correlator (decode, join, attributed publish, windowing) on a
    real broker, from a backlog; one run per worker count, then the ratio to the first."""
    bootstrap = bootstrap or bootstrap_option(os.environ.get("GPUWARDEN_BOOTSTRAP_SERVERS") or None)
    kafka: ApacheKafka | None = None
    if not bootstrap:
        script = Path("deploy/kafka.sh").resolve()
        if not ApacheKafka.available(script):
            raise typer.BadParameter("no --bootstrap and deploy/kafka.sh cannot start Kafka (run from the repo root)")
        kafka = ApacheKafka(script)
        bootstrap = kafka.start()
    with contextlib.ExitStack() as stack:
        if kafka is not None:
            stack.callback(kafka.stop)
        stack.enter_context(bench_broker_errors(bootstrap, started_here=kafka is not None))
        rates: dict[int, float] = {}
        cpus: dict[int, float] = {}
        topics: dict[int, str] = {}
        n_gpu = nodes * ticks * gpus
        for w in workers:
            r = _run(bootstrap, w, nodes, ticks, gpus, partitions, timeout)
            topics[w] = r.topic
            rates[w], cpus[w] = r.rate, r.cpu_per_1000(n_gpu)
            typer.echo(
                f"workers={w}: {rates[w]:,.0f} GPU samples/s ({rates[w] / gpus:,.0f} NodeSamples/s; "
                f"{n_gpu} GPU samples, {partitions} partitions)"
            )
            share = ", ".join(f"{x / n_gpu:.0%}" for x in r.per_worker)
            typer.echo(
                f"  cpu: {r.cpu_s:.2f} s in the workers = {cpus[w] * 1000:.1f} ms per 1,000 GPU samples "
                f"({1000 / cpus[w]:,.0f} GPU samples/s per core); share per worker {share}"
            )
        first = workers[0]
        for w in workers[1:]:
            typer.echo(f"ratio workers={w} / workers={first}: {rates[w] / rates[first]:.2f}")
            typer.echo(
                f"cpu efficiency workers={w} vs workers={first}: {cpus[first] / cpus[w]:.2f} "
                "(CPU per sample of one worker / of these workers; 1.00 = no overhead from splitting)"
            )
        # the raw consume of the first run's backlog: the ceiling the correlator's cost is compared with
        try:
            n_raw, cpu_raw, _ = raw_consume_cpu(bootstrap, topics[first], timeout)
        except RuntimeError as exc:
            typer.echo(f"note: no raw consume CPU: {exc}")
        else:
            raw_ms = cpu_ms_per_1000(cpu_raw, n_raw * gpus)
            typer.echo(raw_cpu_line(raw_ms, {"correlator": cpus[first] * 1000}, ["correlator"]) + f" (workers={first})")
