# Over 500 lines: one benchmark run; its steps (services, load process, offsets monitor, XID injection,
# output reader, raw consume) share the run's state in _Bench. The figures are in figures.py.
"""``gpuwarden bench pipeline``: sustained GPU samples/s and XID latency through the real services.

One run on one broker (Apache Kafka by default, ``--broker tansu`` for the embedded one):

1. topics under a fresh prefix; correlator, detector, remediator (dry-run, simulated Slurm of
   a generated scenario) and, unless ``--no-bridge``, the otlp-bridge start as processes;
2. one ``JobState`` per job of ``--job-nodes`` nodes, so every GPU sample is attributed;
3. a load process (standing in for the fleet's collectors) produces one ``NodeSample``
   (``--gpus`` GPUs) per node per tick at ``--hz`` ticks/s in real time (event time = wall
   time) for ``--warmup`` + ``--seconds``: the sample the NVML collector sends for an HGX H100
   node (:func:`collector_gpus`), its NVLinks' counters every ``--nvlink-every`` ticks;
4. during the measured ``--seconds``, an XID 79 (``gpu-fallen-off-bus``, action reboot ->
   drain) is produced on ``gpu.events`` every ``--xid-every`` s, each on a fresh (node, GPU),
   with its wall time; a reader in this process times the first matching ``Failure`` on
   ``failures`` and the first ``Remediation`` of that node on ``remediations``;
5. every second the consumer groups' committed offsets are compared with the end offsets:
   throughput = committed offsets gained over the measured window, lag = end - committed;
6. after the load, a raw aiokafka consume of the same ``gpu.samples`` topic (bytes only,
   and bytes + ``orjson.loads``) gives the ceiling the pipeline is compared with; one more, in a
   process of its own (:func:`raw_consume_cpu`), gives its process CPU per 1,000 GPU samples,
   and each sample stage's CPU per 1,000 GPU samples is printed as a multiple of it.

Everything started is stopped at the end (services, load process, broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import pstats
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from enum import StrEnum
from io import StringIO
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from aiokafka import TopicPartition

from gpuwarden.demo.runner import ServiceProc, stop_services, wait_healthy
from gpuwarden.shared.bus import kafka_admin, kafka_consumer, kafka_producer
from gpuwarden.shared.models import EventKind, GpuEvent, JobState, NodeSample
from gpuwarden.shared.scenario import Cluster
from gpuwarden.shared.slurm_progress import JobsOffsets, publish_watermark
from gpuwarden.shared.topics import create_topics
from gpuwarden.sim.bench.figures import (
    BenchResult,
    LagSeries,
    cpu_ms_per_1000,
    cpu_seconds,
    machine_cores,
    percentile,
    rate,
    ratio,
    report,
    rss_mib,
    summarise_latencies,
)
from gpuwarden.sim.brokers import (
    ApacheKafka,
    TansuBroker,
    bench_broker_errors,
    bootstrap_option,
    die_with_parent,
    free_port,
)

#: The figures are in :mod:`gpuwarden.sim.bench.figures`; re-exported for callers of this module.
__all__ = [
    "BenchResult",
    "LagSeries",
    "collector_gpus",
    "cpu_seconds",
    "node_template",
    "percentile",
    "pipeline",
    "rate",
    "ratio",
    "raw_consume_cpu",
    "report",
    "rss_mib",
    "summarise_latencies",
]

XID_CODE = 79
XID_PATTERN = "gpu-fallen-off-bus"


# -- the load (a separate process, so it does not delay this process's timing) -------------
def collector_gpus(gpus: int) -> list[dict[str, Any]]:
    """The GPUs of one node's ``NodeSample`` as the NVML collector sends them for an HGX H100
    node running a training job: one tick of the real
    :class:`~gpuwarden.collector.sources.NvmlSource` over the fake NVML
    (:class:`~gpuwarden.sim.collector.SimulatedSource`), NVLinks read (every field the collector
    fills: clocks, power, ECC, remapped rows, PCIe, 18 NVLinks' counters, a compute process,
    GPM), as JSON values (``exclude_none``, as the collector publishes)."""
    from gpuwarden.shared.scenario import ScenarioClock
    from gpuwarden.sim.collector import SimulatedSource, training_scenario

    sc = training_scenario("bench-load", 1, gpus, 60)
    src = SimulatedSource(sc, ScenarioClock(1_700_000_000.0), collector_id="bench", nvlink_every=1)
    samples: list[NodeSample] = []
    for _ in range(3):  # the first tick has no GPM figures yet (they need two readings)
        samples = src.collect_sync()
    return [g.model_dump(mode="json", exclude_none=True) for g in samples[0].gpus]


def node_template(node: str, gpus: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """(the node's sample as JSON values, its GPUs with NVLinks, the same GPUs without): the
    collector's GPUs (:func:`collector_gpus`) with this node's GPU UUIDs."""
    full = []
    for g in gpus:
        name = f"{node}-{g['index']}"
        full.append(dict(g, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, name)}"))
    lean = [{k: v for k, v in g.items() if k != "nvlinks"} for g in full]
    sample = {"schema_version": 1, "node": node, "ts": time.time(), "collector_id": f"bench-{node}",
              "source": "simulated", "gpus": full}  # fmt: skip
    return sample, full, lean


def _load_main(
    bootstrap: str,
    topic: str,
    nodes: list[str],
    base: list[dict[str, Any]],
    hz: float,
    until: float,
    sent: Any,
    behind: Any,
    wm_topic: str = "",
    jobs_offsets: dict[int, int] | None = None,
    nvlink_every: int = 1,
) -> None:
    """Produce one NodeSample per node per tick until wall time ``until`` (the collector's GPUs
    ``base``, :func:`collector_gpus`, NVLinks every ``nvlink_every`` ticks); ``sent`` counts them,
    ``behind`` holds the worst lateness of a tick (s) when the producer could not keep pace.
    After each tick's samples (and once more at ``until``), a Slurm watermark on ``wm_topic``
    (when given) at the tick's event time with ``jobs_offsets`` (the delivered JobStates), so the
    correlator attributes the samples at once."""

    async def go() -> None:
        p = kafka_producer(bootstrap, acks=1, linger_ms=5, max_batch_size=256 * 1024, enable_idempotence=False)
        await p.start()
        templates = [(n, n.encode(), *node_template(n, base)) for n in nodes]
        offsets = dict(jobs_offsets or {})
        period = 1.0 / hz
        t_next = time.time()
        tick = 0
        try:
            while t_next < until:
                now = time.time()
                if now < t_next:
                    await asyncio.sleep(t_next - now)
                else:
                    behind.value = max(behind.value, now - t_next)
                ts = time.time()
                links = tick % nvlink_every == 0
                for _, key, tpl, full, lean in templates:
                    tpl["ts"] = ts = time.time()
                    tpl["gpus"] = full if links else lean
                    for g in tpl["gpus"]:
                        g["memory_used_mib"] = 60000.0 + tick % 100
                    await p.send(topic, orjson.dumps(tpl), key=key)
                if wm_topic:
                    await publish_watermark(p.send, "default", ts, offsets, wm_topic)
                sent.value += len(templates)
                tick += 1
                t_next += period
            if wm_topic:  # the XIDs injected up to ``until`` attribute too
                await asyncio.sleep(max(0.0, until - time.time()))
                await publish_watermark(p.send, "default", time.time(), offsets, wm_topic)
            await p.flush()
        finally:
            await p.stop()

    asyncio.run(go())


# -- the raw consume's CPU (a process of its own, so nothing else of this process is counted) --
def _raw_consume_cpu_main(bootstrap: str, topic: str, conn: Any) -> None:
    """Read all of ``topic`` from its beginning offsets with one aiokafka consumer and
    ``orjson.loads`` every value; send ``(messages, CPU s, wall s)`` of the consume on ``conn``
    (or the error, as text). The clock starts after the consumer's start-up and the offset
    look-ups, before the partitions are assigned (so no fetch happens before it); the CPU is this
    process's (``process_time``)."""

    async def go() -> tuple[int, float, float]:
        c = kafka_consumer(bootstrap, group_id=None, auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            await c._client.force_metadata_update()  # no subscription: the metadata of every topic
            tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
            if not tps:
                raise RuntimeError(f"topic {topic} not found")
            begin, end = await c.beginning_offsets(tps), await c.end_offsets(tps)
            total = sum(end[tp] - begin[tp] for tp in tps)
            cpu0, t0 = time.process_time(), time.perf_counter()
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            n = 0
            while n < total:
                batches = await c.getmany(timeout_ms=1000, max_records=10000)
                for recs in batches.values():
                    n += len(recs)
                    for r in recs:
                        orjson.loads(r.value)
            return n, time.process_time() - cpu0, time.perf_counter() - t0
        finally:
            await c.stop()

    try:
        conn.send(asyncio.run(go()))
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def raw_consume_cpu(bootstrap: str, topic: str, timeout_s: float = 300.0) -> tuple[int, float, float]:
    """``(messages, CPU s, wall s)`` of a raw consume of all of ``topic`` (aiokafka +
    ``orjson.loads`` of every value) in a process of its own: its process CPU over the consume
    only (not its interpreter start-up, imports or consumer start-up), nothing of this process.
    Blocking (run it in a thread from async code); RuntimeError when it fails or times out."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_raw_consume_cpu_main, args=(bootstrap, topic, send), daemon=True)
    proc.start()
    send.close()
    try:
        if not recv.poll(timeout_s):
            raise RuntimeError(f"raw consume of {topic} took more than {timeout_s:.0f} s")
        try:
            got = recv.recv()
        except EOFError:
            proc.join(10)
            raise RuntimeError(f"raw consume of {topic} failed (exit code {proc.exitcode})") from None
        if isinstance(got, str):
            raise RuntimeError(f"raw consume of {topic} failed: {got}")
        n, cpu_s, wall_s = got
        return int(n), float(cpu_s), float(wall_s)
    finally:
        recv.close()
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join(10)


# -- the run -------------------------------------------------------------------------------
class ProfiledStage(StrEnum):
    correlator = "correlator"
    detector = "detector"
    otlp_bridge = "otlp-bridge"


class BrokerKind(StrEnum):
    kafka = "kafka"
    tansu = "tansu"


def _service_env(
    base: dict[str, str],
    name: str,
    group: str,
    workdir: Path,
    scenario: Path,
    lanes: bool = False,
    process: str | None = None,
) -> dict[str, str]:
    """``lanes``: the correlator runs as a samples worker and an events worker; ``process``: the
    worker's name (``correlator-2``), default ``name``."""
    env = {**base, "GPUWARDEN_CONSUMER_GROUP": group}
    if name == "correlator-events":
        # the events lane: same group name, its app id (and Kafka group) is "<group>-events"
        env["GPUWARDEN_CORRELATOR_LANE"] = "events"
    elif name == "correlator" and lanes:
        env["GPUWARDEN_CORRELATOR_LANE"] = "samples"
    if name == "remediator":
        env.update(
            {
                "GPUWARDEN_REMEDIATOR_BACKEND": "simulated",
                "GPUWARDEN_REMEDIATOR_SCENARIO": str(scenario),
                "GPUWARDEN_REMEDIATOR_STATE_FILE": str(workdir / "slurm-state.json"),
                "GPUWARDEN_REMEDIATOR_ENFORCE": "false",
                "GPUWARDEN_REMEDIATOR_MAX_DRAINS_PER_WINDOW": "1000000",
                "GPUWARDEN_REMEDIATOR_MAX_DRAIN_FRACTION": "1.0",
            }
        )
    return env


def _spawn(name: str, argv: list[str], env: dict[str, str], log: Path) -> ServiceProc:
    port = free_port()
    sp = ServiceProc(name, argv[-1], port, log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        sp.proc = subprocess.Popen(
            [sys.executable, *argv],
            env={**env, "GPUWARDEN_HTTP_PORT": str(port)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    return sp


class _Bench:
    def __init__(
        self,
        bootstrap: str,
        res: BenchResult,
        workdir: Path,
        job_nodes: int,
        profile: str | None,
        workers: dict[str, int] | None = None,
        broker_pid: int | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        #: service -> how many processes run it (one consumer group: its partitions are split).
        self.workers = workers or {}
        self.broker_pid = broker_pid
        self.res = res
        self.workdir = workdir
        self.job_nodes = job_nodes
        self.profile = profile
        tag = uuid.uuid4().hex[:6]
        self.prefix = f"benchpipe{tag}."
        self.groups = {s: f"benchpipe-{tag}-{s}" for s in res.services}
        if "correlator-events" in self.groups:
            self.groups["correlator-events"] = self.groups["correlator"]  # its lane appends "-events"
        self.cluster = Cluster(nodes=res.nodes, gpus_per_node=res.gpus)
        self.node_names = self.cluster.node_names()
        self.procs: list[ServiceProc] = []
        self.stop_monitor = asyncio.Event()
        self.load_pid: int | None = None
        #: slurm.jobs partition -> offset after the last job published (publish_jobs)
        self.jobs_offsets: dict[int, int] = {}

    def t(self, short: str) -> str:
        return f"{self.prefix}{short}"

    # services
    def _scenario(self) -> Path:
        path = self.workdir / "bench-scenario.yaml"
        path.write_text(
            orjson.dumps(
                {
                    "name": "bench-pipeline",
                    "duration_s": 86400,
                    "cluster": {"nodes": self.res.nodes, "gpus_per_node": self.res.gpus},
                }
            ).decode()
        )
        return path

    async def start_services(self) -> None:
        base = {
            **os.environ,
            "GPUWARDEN_BOOTSTRAP_SERVERS": self.bootstrap,
            "GPUWARDEN_TOPIC_PREFIX": self.prefix,
            "GPUWARDEN_LOG_LEVEL": "WARNING",
            "GPUWARDEN_SIM_START": str(time.time()),
            "GPUWARDEN_SIM_SPEED": "1",
            "PYTHONUNBUFFERED": "1",
        }
        scenario = self._scenario()
        modules = {
            "correlator": "gpuwarden.correlator",
            "correlator-events": "gpuwarden.correlator",
            "detector": "gpuwarden.detector",
            "otlp-bridge": "gpuwarden.otlp_bridge",
            "remediator": "gpuwarden.remediator",
        }
        lanes = "correlator-events" in self.res.services
        for name in self.res.services:
            for i in range(self.workers.get(name, 1)):
                proc = name if i == 0 else f"{name}-{i + 1}"
                self.res.kinds[proc] = name
                argv = ["-m", modules[name]]
                if proc == self.profile:
                    argv = ["-m", "cProfile", "-o", str(self.workdir / f"{proc}.prof"), "-m", modules[name]]
                env = _service_env(base, name, self.groups[name], self.workdir, scenario, lanes, proc)
                self.procs.append(_spawn(proc, argv, env, self.workdir / "logs" / f"{proc}.log"))
        await wait_healthy(self.procs, 180)

    async def publish_jobs(self) -> None:
        """Publish the jobs; their delivered offsets go to :attr:`jobs_offsets` (for the load's watermarks)."""
        p = kafka_producer(self.bootstrap, acks=1, enable_idempotence=False)
        await p.start()
        offsets = JobsOffsets()
        futures = []
        try:
            now = time.time()
            for j, i in enumerate(range(0, len(self.node_names), self.job_nodes)):
                nodes = self.node_names[i : i + self.job_nodes]
                job = JobState(
                    job_id=str(50000 + j),
                    ts=now,
                    state="RUNNING",
                    user="bench",
                    partition="gpu",
                    nodes=nodes,
                    gpus={n: list(range(self.res.gpus)) for n in nodes},
                    start_ts=now - 600,
                    end_ts=now + 86400,
                )
                futures.append(await p.send(self.t("slurm.jobs"), job.to_json(), key=job.job_id.encode()))
            await p.flush()
            for fut in futures:
                offsets.note(await fut)
        finally:
            await p.stop()
        self.jobs_offsets = offsets.offsets

    # monitoring
    async def monitor(self) -> None:
        """Every second: end offsets vs committed offsets of each group on the topic it reads."""
        watch = {"correlator": "gpu.samples", "detector": "gpu.attributed", "otlp-bridge": "gpu.attributed"}
        admin = kafka_admin(self.bootstrap)
        ends = kafka_consumer(self.bootstrap, group_id=None)
        await admin.start()
        await ends.start()
        try:
            parts: dict[str, list[TopicPartition]] = {}
            for short in set(watch.values()):
                ps = ends.partitions_for_topic(self.t(short))
                if not ps:
                    await ends._client.force_metadata_update()
                    ps = ends.partitions_for_topic(self.t(short)) or set()
                parts[short] = [TopicPartition(self.t(short), p) for p in sorted(ps)]
            while not self.stop_monitor.is_set():
                now = time.time()
                for sp in self.procs:
                    mib = rss_mib(sp.proc.pid) if sp.proc is not None else None
                    if mib is not None:
                        self.res.rss_mib[sp.name] = max(mib, self.res.rss_mib.get(sp.name, 0.0))
                    cpu = cpu_seconds(sp.proc.pid) if sp.proc is not None else None
                    if cpu is not None:
                        self.res.cpu.setdefault(sp.name, []).append((now, cpu))
                for extra, pid in (("load", self.load_pid), ("broker", self.broker_pid)):
                    cpu = cpu_seconds(pid) if pid else None
                    if cpu is not None:
                        self.res.cpu.setdefault(extra, []).append((now, cpu))
                end_by_topic = {}
                for short, tps in parts.items():
                    eo = await ends.end_offsets(tps)
                    end_by_topic[short] = sum(eo.values())
                for svc, short in watch.items():
                    if svc not in self.groups:
                        continue
                    offs = await admin.list_consumer_group_offsets(self.groups[svc], partitions=parts[short])
                    committed = sum(max(0, o.offset) for o in offs.values() if o is not None)
                    self.res.series.setdefault(svc, LagSeries()).add(now, end_by_topic[short], committed)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_monitor.wait(), 1.0)
        finally:
            await ends.stop()
            await admin.close()

    async def read_outputs(self, ready: asyncio.Event) -> None:
        """Time the first Failure per injected (node, GPU) and the first Remediation per node."""
        c = kafka_consumer(
            self.bootstrap,
            self.t("failures"),
            self.t("remediations"),
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
        )
        await c.start()
        ready.set()
        try:
            while not self.stop_monitor.is_set():
                batches = await c.getmany(timeout_ms=50, max_records=2000)
                now = time.time()
                for tp, recs in batches.items():
                    for r in recs:
                        try:
                            d = orjson.loads(r.value)
                        except orjson.JSONDecodeError:
                            continue
                        if tp.topic == self.t("failures"):
                            if d.get("pattern") == XID_PATTERN:
                                self.res.failure_seen.setdefault(f"{d.get('node')}/{d.get('gpu_index')}", now)
                        else:
                            key = str(d.get("node"))
                            if key in self.res.xid_sent_node and key not in self.res.drain_seen:
                                self.res.drain_seen[key] = now
                                dec = str(d.get("decision"))
                                self.res.decisions[dec] = self.res.decisions.get(dec, 0) + 1
        finally:
            await c.stop()

    async def inject_xids(self, until: float, every: float) -> None:
        p = kafka_producer(self.bootstrap, acks=1, linger_ms=0, enable_idempotence=False)
        await p.start()
        rng = random.Random(7)
        order = list(range(len(self.node_names)))
        rng.shuffle(order)
        try:
            i = 0
            t_next = time.time()
            while time.time() < until and i < len(order):
                await asyncio.sleep(max(0.0, t_next - time.time()))
                node, gpu = self.node_names[order[i]], rng.randrange(self.res.gpus)
                now = time.time()
                pci = f"0000:{0x18 + gpu:02x}:00.0"
                raw = f"NVRM: Xid (PCI:{pci}): {XID_CODE}, pid=0, GPU has fallen off the bus."
                ev = GpuEvent(
                    event_id=uuid.uuid4().hex,
                    node=node,
                    ts=now,
                    kind=EventKind.XID,
                    code=XID_CODE,
                    gpu_index=gpu,
                    pci_bus_id=pci,
                    message="GPU has fallen off the bus.",
                    raw=raw,
                    source="simulated",
                )
                self.res.xid_sent[f"{node}/{gpu}"] = now
                self.res.xid_sent_node[node] = now
                await p.send_and_wait(self.t("gpu.events"), ev.to_json(), key=node.encode())
                i += 1
                t_next += every
        finally:
            await p.stop()

    async def raw_consume(self, decode: bool) -> tuple[float, int]:
        """Messages/s of one aiokafka consumer reading all of ``gpu.samples`` from the start."""
        c = kafka_consumer(
            self.bootstrap,
            self.t("gpu.samples"),
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        try:
            tps = [
                TopicPartition(self.t("gpu.samples"), p) for p in c.partitions_for_topic(self.t("gpu.samples")) or []
            ]
            total = sum((await c.end_offsets(tps)).values())
            n, t0 = 0, time.perf_counter()
            while n < total:
                batches = await c.getmany(timeout_ms=1000, max_records=10000)
                for recs in batches.values():
                    n += len(recs)
                    if decode:
                        for r in recs:
                            orjson.loads(r.value)
            return n / (time.perf_counter() - t0), n
        finally:
            await c.stop()

    async def stop(self) -> None:
        await stop_services(list(reversed(self.procs)), grace_s=30)


async def _run(
    bootstrap: str,
    res: BenchResult,
    workdir: Path,
    warmup: float,
    seconds: float,
    xid_every: float,
    job_nodes: int,
    profile: str | None,
    echo: Any,
    workers: dict[str, int] | None = None,
    broker_pid: int | None = None,
) -> None:
    b = _Bench(bootstrap, res, workdir, job_nodes, profile, workers, broker_pid)
    await create_topics(bootstrap, b.prefix)
    many = ", ".join(f"{n} x{k}" for n, k in (workers or {}).items() if k > 1)
    echo(f"topics {b.prefix}*; starting {', '.join(res.services)}" + (f" ({many} workers)" if many else ""))
    ctx = mp.get_context("spawn")
    load: Any = None
    sent, behind = ctx.Value("q", 0), ctx.Value("d", 0.0)
    try:
        await b.start_services()
        await b.publish_jobs()
        await asyncio.sleep(2)
        ready = asyncio.Event()
        tasks = [asyncio.create_task(b.monitor()), asyncio.create_task(b.read_outputs(ready))]
        await ready.wait()
        t_start = time.time() + 1.0
        t_measure0, t_end = t_start + warmup, t_start + warmup + seconds
        base = collector_gpus(res.gpus)
        load = ctx.Process(
            target=_load_main,
            args=(
                bootstrap,
                b.t("gpu.samples"),
                b.node_names,
                base,
                res.hz,
                t_end,
                sent,
                behind,
                b.t("slurm.watermarks"),
                b.jobs_offsets,
                res.nvlink_every,
            ),
            daemon=True,
        )
        load.start()
        b.load_pid = load.pid
        tpl, _full, lean = node_template("gpu-node-0001", base)
        size_full = len(orjson.dumps(tpl))
        size_lean = len(orjson.dumps({**tpl, "gpus": lean}))
        mean = (size_full + (res.nvlink_every - 1) * size_lean) / res.nvlink_every
        echo(
            f"load: {res.nodes} nodes x {res.gpus} GPUs at {res.hz} Hz; warm-up {warmup:.0f} s, "
            f"measure {seconds:.0f} s; "
            f"the NVML collector's H100 samples: {size_full:,} bytes with NVLinks (every {res.nvlink_every} "
            f"tick(s)), {size_lean:,} without, {mean * res.nodes * res.hz / 1e6:.1f} MB/s on gpu.samples"
        )
        await asyncio.sleep(max(0.0, t_measure0 - time.time()))
        await b.inject_xids(t_end, xid_every)
        await asyncio.sleep(max(0.0, t_end - time.time()))
        res.t_measure = (t_measure0, t_end)
        await asyncio.to_thread(load.join, 60)
        res.offered_node_samples, res.producer_behind_s = int(sent.value), float(behind.value)
        # drain: wait (bounded) until every group caught up and XIDs were answered
        deadline = time.time() + 60
        while time.time() < deadline:
            await asyncio.sleep(1)
            lags = [s.lag[-1][1] for s in res.series.values() if s.lag]
            if lags and max(lags) == 0 and len(res.drain_seen) >= len(res.xid_sent_node):
                res.drained_after_s = time.time() - t_end
                break
        b.stop_monitor.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        echo("raw aiokafka consume of the same gpu.samples topic ...")
        res.raw_rate, res.raw_messages = await b.raw_consume(decode=False)
        res.raw_json_rate, _ = await b.raw_consume(decode=True)
        echo("raw consume CPU (aiokafka + orjson, a process of its own) ...")
        try:
            n_raw, cpu_raw, _ = await asyncio.to_thread(raw_consume_cpu, bootstrap, b.t("gpu.samples"))
            res.raw_cpu_ms = cpu_ms_per_1000(cpu_raw, n_raw * res.gpus)
        except RuntimeError as exc:
            echo(f"note: no raw consume CPU: {exc}")
    finally:
        b.stop_monitor.set()
        if load is not None and load.is_alive():
            load.terminate()
            load.join(10)
        await b.stop()
        dead = [p.name for p in b.procs if p.proc is not None and p.proc.returncode not in (0, None)]
        if dead:
            echo(f"note: exit codes != 0: {dead} (logs in {workdir / 'logs'})")
    prof = workdir / f"{profile}.prof"
    if profile and prof.exists():
        out = StringIO()
        st = pstats.Stats(str(prof), stream=out)
        st.sort_stats("tottime").print_stats(25)
        st.sort_stats("cumulative").print_stats(40)
        res.profile = out.getvalue()


def pipeline(
    nodes: Annotated[int, typer.Option(min=1, max=1_000_000, help="Nodes, one NodeSample per node per tick")] = 3125,
    gpus: Annotated[int, typer.Option(min=1, max=64, help="GPUs per node")] = 8,
    hz: Annotated[float, typer.Option(min=0.01, max=100, help="Ticks per second per node")] = 1.0,
    nvlink_every: Annotated[
        int,
        typer.Option(
            min=1,
            help="The samples carry the 18 NVLinks' counters every this many ticks (the collector's "
            "GPUWARDEN_COLLECTOR_NVLINK_EVERY: 1 with NVML, the default)",
        ),
    ] = 1,
    seconds: Annotated[
        float, typer.Option(min=1, max=86_400, help="Measured window, s (XIDs injected during it)")
    ] = 60.0,
    warmup: Annotated[float, typer.Option(min=0, max=86_400, help="Load before the measured window, s")] = 15.0,
    xid_every: Annotated[
        float, typer.Option(min=0.01, max=86_400, help="One XID every this many s during the window")
    ] = 0.5,
    job_nodes: Annotated[int, typer.Option(min=1, help="Nodes per job (one JobState each)")] = 16,
    broker: Annotated[
        BrokerKind, typer.Option(help="kafka (deploy/kafka.sh or --bootstrap) or tansu")
    ] = BrokerKind.kafka,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            help="Existing Kafka, host:port[,...]; default $GPUWARDEN_BOOTSTRAP_SERVERS, else deploy/kafka.sh",
            callback=bootstrap_option,
        ),
    ] = None,
    bridge: Annotated[bool, typer.Option(help="Run the otlp-bridge in the path too")] = True,
    events_lane: Annotated[
        bool,
        typer.Option(
            help="Correlator as a samples worker and an events worker (own consumer group, XIDs never "
            "wait behind samples); --no-events-lane: one worker for everything"
        ),
    ] = True,
    correlator_workers: Annotated[
        int,
        typer.Option(
            min=1, help="Correlator (samples) workers, one consumer group: the partitions are split between them"
        ),
    ] = 1,
    detector_workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Detector workers, one consumer group: the partitions are split between them, the event "
            "lane's too (each worker sees part of slurm.jobs and gpu.events, as several detector "
            "instances do): for the CPU figures",
        ),
    ] = 1,
    profile: Annotated[
        ProfiledStage | None,
        typer.Option(help="Run this stage (its first worker) under cProfile and print the top"),
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the work dir (logs, profile)")] = False,
) -> None:
    """Sustained GPU samples/s through correlator -> detector (-> otlp-bridge) with consumer lag,
    XID -> failure and XID -> drain-decision latency under that load, and a raw aiokafka consume
    of the same topic in the same run (docs/architecture.md#performance-targets)."""
    if broker is BrokerKind.tansu and bootstrap:
        raise typer.BadParameter(
            "--broker tansu starts its own broker: leave --bootstrap out", param_hint="--bootstrap"
        )
    workdir = Path(tempfile.mkdtemp(prefix="gpuwarden-bench-pipeline-"))
    services = [
        "correlator",
        *(["correlator-events"] if events_lane else []),
        "detector",
        *(["otlp-bridge"] if bridge else []),
        "remediator",
    ]
    res = BenchResult(
        nodes=nodes, gpus=gpus, hz=hz, services=services, cores=machine_cores(), nvlink_every=nvlink_every
    )
    workers = {"correlator": correlator_workers, "detector": detector_workers}
    kafka: ApacheKafka | None = None
    tansu: TansuBroker | None = None
    try:
        if broker is BrokerKind.tansu:
            tansu = TansuBroker(log_path=workdir / "broker.log")
            bs = tansu.start()
        else:
            bs = bootstrap or bootstrap_option(os.environ.get("GPUWARDEN_BOOTSTRAP_SERVERS") or None) or ""
            if not bs:
                script = Path(__file__).resolve().parents[4] / "deploy" / "kafka.sh"
                if not ApacheKafka.available(script):
                    raise typer.BadParameter("no --bootstrap, and deploy/kafka.sh cannot start Kafka (java missing?)")
                kafka = ApacheKafka(script, workdir / "kafka")
                typer.echo("starting Apache Kafka (deploy/kafka.sh) ...")
                bs = kafka.start()
        typer.echo(f"broker {broker.value} at {bs}; work dir {workdir}")
        # the broker's CPU is counted when this run started it (an external one is not measured)
        broker_pid = kafka.pid() if kafka else tansu.proc.pid if tansu and tansu.proc else None
        with bench_broker_errors(bs, started_here=kafka is not None or tansu is not None):
            asyncio.run(
                _run(bs, res, workdir, warmup, seconds, xid_every, job_nodes, profile, typer.echo, workers, broker_pid)
            )
        for line in report(res):
            typer.echo(line)
        if res.profile:
            typer.echo(f"--- {profile} cProfile ---")
            typer.echo(res.profile)
    finally:
        if kafka is not None:
            kafka.stop()
        if tansu is not None:
            tansu.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
