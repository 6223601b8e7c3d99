"""100 restarts and rebalances of correlator workers on a real broker, with 0 readings and 0
events lost.

One consumer group of correlator workers (in-process :class:`CorrelatorService` instances for
the bulk, and a few ``python -m gpuwarden.correlator`` processes that are SIGKILLed after they
committed) is churned while a producer feeds samples (12 nodes x 3 GPUs at 1 Hz of event time,
20x faster than real time) and XID events. Every operation waits for the group to settle again
and to commit progress, so each one is its own rebalance. At the end the last workers drain
everything and the outputs are checked: every reading on ``gpu.attributed`` and every event on
``gpu.events.attributed`` at least once, attributed to the job; every ``job.windows`` window
there, each with all 10 readings; duplicates counted, and a duplicated window must be explained
by a hard crash (emitted by the killed process after its last commit, so emitted again).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from gpuwarden.correlator.service import CorrelatorService
from gpuwarden.correlator.settings import CorrelatorSettings
from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, JobState, JobWindow, NodeSample, SlurmWatermark
from gpuwarden.shared.topics import TOPICS, create_topics

pytestmark = pytest.mark.integration

T0 = float(int(time.time()) // 10 * 10 - 3600)  # event time: an hour ago, window-aligned
PARTITIONS = 4  # of every topic (gpu.samples and its changelog correlator.windows alike)
NODES_PER_PARTITION = 3  # 12 nodes
GPUS = 3
JOB = "7001"
TICK_WALL_S = 0.05  # wall seconds per event-time second of the feed (20x real time: 240 readings/s)
EVENT_EVERY = 5  # each node has an XID every 5 s of event time
WINDOW_S = 10
FLUSH_AHEAD_S = 100  # the last tick: this far ahead of the feed, it closes every window before it
OPS = 100
MAX_POOL = 3  # in-process workers at most (members <= partitions when subprocesses join)
CRASH_PLAN = {30: 1, 64: 2}  # before operation n: spawn this many worker processes, SIGKILL them
COMMIT_INTERVAL_S = 0.2


def _nodes() -> dict[str, int]:
    """Node name -> partition, NODES_PER_PARTITION on each (the producer's murmur2 partitioner)."""
    part = DefaultPartitioner()
    per: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while min(len(v) for v in per.values()) < NODES_PER_PARTITION:
        n = f"rst-node-{i:03d}"
        p = part(n.encode(), list(range(PARTITIONS)), list(range(PARTITIONS)))
        if len(per[p]) < NODES_PER_PARTITION:
            per[p].append(n)
        i += 1
    return {n: p for p, v in per.items() for n in v}


PARTITION_OF = _nodes()
NODES = sorted(PARTITION_OF)


@dataclass
class Bus:
    bootstrap: str
    prefix: str
    group: str
    env: dict[str, str]

    def t(self, short: str) -> str:
        return f"{self.prefix}{short}"


@pytest.fixture
async def bus(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bus]:
    """Every registered topic with PARTITIONS partitions under a fresh prefix, and the workers'
    environment (also set in this process, for the in-process workers)."""
    prefix = f"r{uuid.uuid4().hex[:8]}."
    await create_topics(kafka_bootstrap, prefix, partitions=PARTITIONS)
    await _wait_for_leaders(kafka_bootstrap, [spec.full(prefix) for spec in TOPICS.values()])
    group = f"gpuwarden-correlator-{prefix.rstrip('.')}"
    env = {
        "GPUWARDEN_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GPUWARDEN_TOPIC_PREFIX": prefix,
        "GPUWARDEN_CONSUMER_GROUP": group,
        "GPUWARDEN_CORRELATOR_COMMIT_INTERVAL_S": str(COMMIT_INTERVAL_S),
        "GPUWARDEN_CORRELATOR_WINDOW_S": str(WINDOW_S),
        "GPUWARDEN_CORRELATOR_WINDOW_GRACE_S": "5",
        "GPUWARDEN_HTTP_PORT": "0",
        "GPUWARDEN_LOG_LEVEL": "INFO",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield Bus(kafka_bootstrap, prefix, group, env)


async def _wait_for_leaders(bootstrap: str, topics: list[str], timeout_s: float = 30.0) -> None:
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            md = await client.fetch_all_metadata()
            if all(
                (parts := md.partitions_for_topic(name))
                and len(parts) == PARTITIONS
                and all(md.leader_for_partition(TopicPartition(name, p)) not in (None, -1) for p in parts)
                for name in topics
            ):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"no leaders for the topics of the test after {timeout_s}s")
    finally:
        await client.close()


# -- the feed -------------------------------------------------------------------------------------
class Feed:
    """Samples of every node at 1 Hz of event time (every TICK_WALL_S of wall clock) and an
    XID per node every EVENT_EVERY s, until asked to stop; it then completes the current window
    and sends one tick FLUSH_AHEAD_S ahead (closing every window before it). ``samples`` and
    ``events`` hold what the broker acknowledged."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.samples: set[tuple[str, int]] = set()
        self.events: dict[str, tuple[str, int, int]] = {}  # event id -> (node, t, gpu)
        self.last_tick = -1
        self.flush_tick: int | None = None
        self._stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bus.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        await self._producer.start()
        await self._slurm()
        self.task = asyncio.create_task(self._run(), name="feed")

    async def _slurm(self) -> None:
        """The job holding every GPU, then a watermark far in the future naming its offset."""
        job = JobState(
            job_id=JOB,
            ts=T0 - 30,
            state="RUNNING",
            user="alice",
            partition="gpu",
            nodes=NODES,
            gpus={n: list(range(GPUS)) for n in NODES},
            start_ts=T0 - 60,
        )
        md = await self._producer.send_and_wait(self.bus.t("slurm.jobs"), value=job.to_json(), key=JOB.encode())
        wm = SlurmWatermark(cluster="test", ts=T0 + 10**7, jobs_offsets={md.partition: md.offset + 1})
        await self._producer.send_and_wait(self.bus.t("slurm.watermarks"), value=wm.to_json(), key=b"test")

    async def _tick(self, t: int, with_events: bool = True) -> None:
        futs: list[tuple[Any, tuple[str, Any]]] = []
        for i, node in enumerate(NODES):
            s = NodeSample(
                node=node,
                ts=T0 + t,
                collector_id="test",
                source="simulated",
                gpus=[
                    GpuSample(index=g, utilization_gpu_pct=float(t % 100), memory_used_mib=float(t))
                    for g in range(GPUS)
                ],
            )
            f = await self._producer.send(self.bus.t("gpu.samples"), value=s.to_json(), key=node.encode())
            futs.append((f, ("s", (node, t))))
            if with_events and t % EVENT_EVERY == i % EVENT_EVERY:
                gpu = t % GPUS
                eid = f"ev-{node}-{t}"
                e = GpuEvent(
                    event_id=eid,
                    node=node,
                    ts=T0 + t + 0.5,
                    kind=EventKind.XID,
                    code=79,
                    gpu_index=gpu,
                    message="GPU has fallen off the bus.",
                    raw=f"NVRM: Xid (PCI:0000:{gpu:02x}:00): 79, tick {t}",
                    source="simulated",
                )
                f = await self._producer.send(self.bus.t("gpu.events"), value=e.to_json(), key=node.encode())
                futs.append((f, ("e", (eid, (node, t, gpu)))))
        for f, (kind, what) in futs:
            await f  # raises if the broker did not take it: the test fails, nothing is miscounted
            if kind == "s":
                self.samples.add(what)
            else:
                self.events[what[0]] = what[1]
        if with_events:
            self.last_tick = t

    async def _run(self) -> None:
        start = time.monotonic()
        t = 0
        while True:
            await self._tick(t)
            if self._stop.is_set() and t % WINDOW_S == WINDOW_S - 1:
                break
            t += 1
            await asyncio.sleep(max(0.0, start + t * TICK_WALL_S - time.monotonic()))  # pacing only
        self.flush_tick = t + FLUSH_AHEAD_S + 1  # window-aligned: its own window stays open
        await self._tick(self.flush_tick, with_events=False)
        await self._producer.flush()

    async def finish(self) -> None:
        self._stop.set()
        assert self.task is not None
        await self.task

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self._producer.stop()


# -- the workers and the group --------------------------------------------------------------------
@dataclass
class Op:
    n: int
    kind: str  # join, leave, spawn, crash
    worker: str
    started: float
    took_s: float = 0.0
    members_after: int = 0


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Group:
    bus: Bus
    tmp: Path
    admin: AIOKafkaAdminClient
    inproc: dict[str, CorrelatorService] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    crashes: list[tuple[float, str, set[int]]] = field(default_factory=list)  # (wall time, name, partitions)
    stopped: list[CorrelatorService] = field(default_factory=list)
    seq: int = 0

    def _name(self, kind: str) -> str:
        self.seq += 1
        return f"{kind}{self.seq:03d}"

    @property
    def members(self) -> int:
        return len(self.inproc) + len(self.procs)

    def check_alive(self) -> None:
        for name, w in self.inproc.items():
            assert w.failed is None, f"in-process worker {name} crashed: {w.failed!r}"
        for name, p in self.procs.items():
            assert p.proc.poll() is None, f"worker process {name} exited {p.proc.returncode}:\n{_tail(p.log)}"

    async def describe(self) -> tuple[str, dict[str, set[TopicPartition]]]:
        """The group's state and client id -> assigned partitions of each member."""
        [resp] = await self.admin.describe_consumer_groups([self.bus.group])
        g = resp.groups[0]
        out: dict[str, set[TopicPartition]] = {}
        for m in g[5]:
            client_id, raw = m[1], m[-1]
            tps = set(ConsumerProtocolMemberAssignment.decode(raw).partitions()) if raw else set()
            out[client_id] = tps
        return g[2], out

    async def committed(self) -> dict[TopicPartition, int]:
        offsets = await self.admin.list_consumer_group_offsets(self.bus.group)
        return {tp: o.offset for tp, o in offsets.items() if o.offset >= 0}

    async def settle(self, what: str, timeout: float = 45.0) -> dict[str, set[TopicPartition]]:
        """Wait until the group is Stable with exactly the live members, then until it commits
        progress under that assignment (so every operation is a rebalance of its own)."""
        want = {f"{n}-correlator" for n in (*self.inproc, *self.procs)}
        state, members = "?", dict[str, set[TopicPartition]]()

        async def stable() -> bool:
            nonlocal state, members
            state, members = await self.describe()
            return state == "Stable" and set(members) == want

        def describe() -> str:
            return f"{what}: group Stable with {sorted(want)} (now {state} {sorted(members)})"

        await poll(stable, describe, self, timeout)
        before = await self.committed()
        samples = self.bus.t("gpu.samples")

        async def progress() -> bool:
            now = await self.committed()
            return any(o > before.get(tp, -1) for tp, o in now.items() if tp.topic == samples)

        await poll(progress, lambda: f"{what}: a commit after the rebalance", self, timeout)
        return members

    async def drained(self, timeout: float = 60.0) -> None:
        """Wait until the group committed every record of gpu.samples and gpu.events written so far."""
        ends_of: dict[TopicPartition, int] = {}
        cons = AIOKafkaConsumer(bootstrap_servers=self.bus.bootstrap, group_id=None)
        await cons.start()
        try:
            for short in ("gpu.samples", "gpu.events"):
                tps = [TopicPartition(self.bus.t(short), p) for p in range(PARTITIONS)]
                ends_of.update(await cons.end_offsets(tps))
        finally:
            await cons.stop()

        async def done() -> bool:
            now = await self.committed()
            return all(now.get(tp, -1) >= end for tp, end in ends_of.items() if end > 0)

        await poll(done, lambda: f"the group to commit every input {ends_of}", self, timeout)

    async def committed_by(self, names: list[str]) -> dict[str, set[int]]:
        """Wait until each of these workers committed an offset of a gpu.samples partition it
        holds; returns name -> those partitions."""
        members = await self.settle(f"{names} in the group")
        samples = self.bus.t("gpu.samples")
        owned = {nm: {tp for tp in members[f"{nm}-correlator"] if tp.topic == samples} for nm in names}
        assert all(owned.values()), f"a worker process holds no gpu.samples partition: {owned}"
        before = await self.committed()

        async def all_committed() -> bool:
            now = await self.committed()
            return all(any(now.get(tp, -1) > before.get(tp, -1) for tp in tps) for tps in owned.values())

        await poll(all_committed, lambda: f"a commit by each of {names}", self, 30)
        return {nm: {tp.partition for tp in tps} for nm, tps in owned.items()}

    async def join(self) -> str:
        name = self._name("w")
        w = CorrelatorService(CorrelatorSettings(client_id=name))
        self.inproc[name] = w
        await w.start()
        return name

    async def leave(self, name: str) -> None:
        w = self.inproc.pop(name)
        await w.stop()
        self.stopped.append(w)

    async def spawn(self) -> str:
        name = self._name("p")
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwarden.correlator"],
                env={**os.environ, **self.bus.env, "GPUWARDEN_CLIENT_ID": name},
                start_new_session=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = Proc(name, proc, log)
        return name

    async def kill(self, partitions: dict[str, set[int]]) -> None:
        """SIGKILL these worker processes at once (name -> the gpu.samples partitions it holds)."""
        for name, parts in partitions.items():
            p = self.procs.pop(name)
            os.killpg(p.proc.pid, signal.SIGKILL)  # no LeaveGroup, no final checkpoint or commit
            self.crashes.append((time.time(), name, parts))
            p.proc.wait(10)

    async def close(self) -> None:
        for name in list(self.inproc):
            await self.leave(name)
        for p in self.procs.values():
            if p.proc.poll() is None:
                os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait(10)
        self.procs.clear()


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


async def poll(cond: Callable[[], Awaitable[bool]], what: Callable[[], str], group: Group, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        group.check_alive()
        try:
            if await cond():
                return
        except KafkaError as exc:  # e.g. the group coordinator not there yet on a fresh broker
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what()} (last error: {last!r})")
        await asyncio.sleep(0.1)


# -- reading the outputs --------------------------------------------------------------------------
async def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its end offsets now."""
    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=8 << 20,
    )
    await c.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        deadline = time.monotonic() + 60
        while todo:
            assert time.monotonic() < deadline, f"could not read {topic} to its end {ends}"
            for recs in (await c.getmany(*todo, timeout_ms=500, max_records=10000)).values():
                out += recs
            for tp in list(todo):
                if await c.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await c.stop()
    return out


async def read_outputs(bus: Bus) -> tuple[list[Any], list[Any], list[Any]]:
    """Every record of gpu.attributed, gpu.events.attributed and job.windows now."""
    return (
        await read_all(bus.bootstrap, bus.t("gpu.attributed")),
        await read_all(bus.bootstrap, bus.t("gpu.events.attributed")),
        await read_all(bus.bootstrap, bus.t("job.windows")),
    )


def _first(items: Any, n: int = 8) -> list[Any]:
    return sorted(items)[:n]


# -- the test -------------------------------------------------------------------------------------
async def test_100_restarts_and_rebalances_lose_no_reading_and_no_event(bus: Bus, tmp_path: Path) -> None:
    t_start, wall0 = time.monotonic(), time.time()
    rng = random.Random(20240611)
    logfile = tmp_path / "inprocess-workers.log"
    handler = logging.FileHandler(logfile)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    gw_log = logging.getLogger("gpuwarden")
    old_level = gw_log.level
    gw_log.setLevel(logging.INFO)
    gw_log.addHandler(handler)

    admin = AIOKafkaAdminClient(bootstrap_servers=bus.bootstrap)
    await admin.start()
    group = Group(bus, tmp_path, admin)
    feed = Feed(bus)
    kinds: collections.Counter[str] = collections.Counter()
    try:
        await feed.start()

        async def op(kind: str, workers: list[str], action: Awaitable[Any]) -> None:
            """Do the operation (one per worker), then wait until the group settled on it."""
            t = time.monotonic()
            await action
            await group.settle(f"op {len(group.ops) + 1} ({kind} {workers})")
            for w in workers:
                group.ops.append(Op(len(group.ops) + 1, kind, w, t - t_start, time.monotonic() - t, group.members))
                kinds[kind] += 1

        while len(group.ops) < OPS:
            n = len(group.ops)
            if n in CRASH_PLAN:
                # hard crashes: worker processes join, commit at least once, and are SIGKILLed
                # together (one session timeout for all of them)
                names = []
                for _ in range(CRASH_PLAN[n]):
                    names.append(f"p{group.seq + 1:03d}")
                    await op("spawn", names[-1:], group.spawn())
                partitions = await group.committed_by(names)
                await op("crash", names, group.kill(partitions))
                continue
            size = len(group.inproc)
            limit = MAX_POOL - (CRASH_PLAN.get(n + 1, 0))  # room for the worker processes next
            if size <= 1:
                kind = "join"
            elif size >= limit:
                kind = "leave"
            else:
                kind = rng.choice(("join", "leave"))
            if kind == "join":
                await op("join", [f"w{group.seq + 1:03d}"], group.join())
            else:
                name = rng.choice(sorted(group.inproc))
                await op("leave", [name], group.leave(name))
        churn_s = time.monotonic() - t_start

        # the last workers drain everything: the feed completes its window and sends the flush tick
        await feed.finish()
        await group.drained()
        final_workers = sorted(group.inproc)
        # the hold's clock runs while the broker answers the Slurm reader (it stands still in an outage)
        ages = {nm: w.health()["slurm_fetch_age_s"] for nm, w in group.inproc.items()}
        assert all(a is not None and a < 3.0 for a in ages.values()), ages
        await group.close()
        drain_s = time.monotonic() - t_start - churn_s

        attributed, events_out, windows_out = await read_outputs(bus)
    finally:
        await group.close()
        await feed.close()
        await admin.close()
        gw_log.removeHandler(handler)
        gw_log.setLevel(old_level)
        handler.close()

    # ---- the checks ----------------------------------------------------------------------------
    logs = f"(logs: {tmp_path})"
    late = sum(w.core.late_samples for w in group.stopped)
    restored = sum(w.restored for w in group.stopped)
    checkpoints = sum(w.checkpoints for w in group.stopped)

    # readings: every produced (node, t) on gpu.attributed, with the job on every GPU
    seen: collections.Counter[tuple[str, int]] = collections.Counter()
    unattributed: list[tuple[str, int]] = []
    for r in attributed:
        d = orjson.loads(r.value)
        k = (d["sample"]["node"], round(d["sample"]["ts"] - T0))
        seen[k] += 1
        jobs = {(j["job_id"], j["gpu_index"]) for j in d["jobs"]}
        if d.get("attribution", "known") != "known" or jobs != {(JOB, g) for g in range(GPUS)}:
            unattributed.append(k)
    dup_samples = sum(c - 1 for c in seen.values() if c > 1)
    missing = feed.samples - set(seen)

    # events: every produced event on gpu.events.attributed, attributed to the job
    ev_seen: collections.Counter[str] = collections.Counter()
    ev_wrong: list[tuple[str, Any, Any]] = []
    for r in events_out:
        d = orjson.loads(r.value)
        eid = d["event"]["event_id"]
        ev_seen[eid] += 1
        job = d.get("job") or {}
        if d.get("attribution", "known") != "known" or job.get("job_id") != JOB:
            ev_wrong.append((eid, d.get("attribution"), job.get("job_id")))
    dup_events = sum(c - 1 for c in ev_seen.values() if c > 1)
    ev_missing = set(feed.events) - set(ev_seen)

    # windows: every (job, node, gpu, start) before the flush tick, each copy with all its readings
    expected = {
        (JOB, node, g, T0 + s): sum(1 for t in range(s, s + WINDOW_S) if (node, t) in feed.samples)
        for node in NODES
        for g in range(GPUS)
        for s in range(0, feed.last_tick + 1, WINDOW_S)
    }
    copies: dict[tuple[str, str, int, float], list[tuple[int, int]]] = collections.defaultdict(list)
    for r in windows_out:
        w = JobWindow.model_validate_json(r.value)
        copies[(w.job_id, w.node, w.gpu_index, w.window_start)].append((w.samples, r.timestamp))
    w_missing = set(expected) - set(copies)
    w_short = sorted(
        (k[1], k[2], k[3] - T0, [(s, round(ts / 1000 - wall0, 1)) for s, ts in cs], expected[k])
        for k, cs in copies.items()
        if k in expected and any(s != expected[k] for s, _ in cs)
    )
    w_extra = sorted((k[1], k[2], k[3] - T0) for k in set(copies) - set(expected))
    duplicated = {k: cs for k, cs in copies.items() if len(cs) > 1}

    def crash_of(node: str, cs: list[tuple[int, int]]) -> str | None:
        """The SIGKILLed worker process that explains a window emitted twice: it held the node's
        partition and emitted the first copy in the last 5 s before it was killed (so after its
        last commit: the next owner folded the same readings again from the changelog)."""
        first_s = min(ts for _, ts in cs) / 1000
        for crash_t, name, parts in group.crashes:
            if PARTITION_OF[node] in parts and crash_t - 5.0 <= first_s <= crash_t:
                return name
        return None

    explained = collections.Counter(crash_of(k[1], cs) for k, cs in duplicated.items())
    unexplained = sorted(
        (k[1], k[2], k[3] - T0, [(s, round(ts / 1000 - wall0, 1)) for s, ts in cs])
        for k, cs in duplicated.items()
        if crash_of(k[1], cs) is None
    )
    report = (
        f"ops {dict(kinds)} ({len(group.ops)}), churn {churn_s:.0f}s, drain {drain_s:.0f}s, total "
        f"{time.monotonic() - t_start:.0f}s; ticks {feed.last_tick + 1} (+ flush at {feed.flush_tick}); readings "
        f"{len(feed.samples)} produced, {len(attributed)} attributed ({dup_samples} duplicates); events "
        f"{len(feed.events)} produced, {len(events_out)} attributed ({dup_events} duplicates); windows "
        f"{len(expected)} expected, {len(windows_out)} emitted ({len(duplicated)} duplicated: by crash "
        f"{dict(explained)}); late readings {late}; restored nodes {restored}; checkpoints "
        f"{checkpoints}; crashes at s {[(round(t - wall0, 1), n, sorted(p)) for t, n, p in group.crashes]}; "
        f"final workers {final_workers}; slowest ops "
        f"{[(o.n, o.kind, o.worker, round(o.took_s, 1)) for o in sorted(group.ops, key=lambda o: -o.took_s)[:4]]}"
    )
    print(f"\n{report}")

    assert len(group.ops) == OPS and sum(kinds.values()) == OPS, (len(group.ops), kinds, report)
    assert kinds["crash"] == sum(CRASH_PLAN.values()) and kinds["join"] > 30 and kinds["leave"] > 30, kinds
    # every tick of every node, plus the flush tick
    assert len(feed.samples) == len(NODES) * (feed.last_tick + 2), report
    assert not missing, (
        f"{len(missing)} of {len(feed.samples)} readings lost (not on gpu.attributed), first (node, s): "
        f"{_first(missing)}; {report} {logs}"
    )
    assert not unattributed, (
        f"{len(unattributed)} readings on gpu.attributed without job {JOB} on all GPUs (unknown attribution), "
        f"first: {_first(unattributed)}; {report} {logs}"
    )
    assert not set(seen) - feed.samples, f"readings never produced: {_first(set(seen) - feed.samples)}"
    assert not ev_missing, (
        f"{len(ev_missing)} of {len(feed.events)} events lost (not on gpu.events.attributed), first: "
        f"{_first(ev_missing)}; {report} {logs}"
    )
    assert not ev_wrong, f"{len(ev_wrong)} events not attributed to job {JOB}: {_first(ev_wrong)}; {report} {logs}"
    assert not set(ev_seen) - set(feed.events), f"events never produced: {_first(set(ev_seen) - set(feed.events))}"
    assert not w_missing, (
        f"{len(w_missing)} of {len(expected)} windows missing from job.windows, first (node, gpu, start-T0): "
        f"{_first((k[1], k[2], k[3] - T0) for k in w_missing)}; {report} {logs}"
    )
    assert not w_short, (
        f"{len(w_short)} windows with readings lost (node, gpu, start-T0, [(samples, emitted at s) per copy], "
        f"expected samples): {w_short[:8]}; {report} {logs}"
    )
    assert not w_extra, f"windows never produced: {w_extra[:8]}"
    assert not unexplained, (
        f"{len(unexplained)} windows emitted twice without a hard crash to explain it (node, gpu, start-T0, "
        f"[(samples, emitted at s) per copy]): {unexplained[:8]}; {report} {logs}"
    )


# -- outputs the broker never confirmed -----------------------------------------------------------
LOSSES_AT_S = (3.0, 7.0, 11.0)  # wall seconds into the feed when a worker's outputs start to be lost
FEED_S = 15.0


async def test_outputs_lost_in_flight_are_read_again_and_windows_counted_once(bus: Bus, tmp_path: Path) -> None:
    """A worker whose outputs the broker did not confirm (from some moment until its next
    confirm, which reports the failure once) reads every partition handled since its last commit
    again, with its state put back to what that commit covers. Checked on the outputs: every
    reading and event attributed, every window there, and every copy of a window with exactly
    its readings (before, the records read again were folded into their open windows a second
    time, and partitions of earlier uncommitted batches were not read again at all: their lost
    outputs were covered by the next commit)."""
    from gpuwarden.shared.bus import DeliveryError

    admin = AIOKafkaAdminClient(bootstrap_servers=bus.bootstrap)
    await admin.start()
    group = Group(bus, tmp_path, admin)
    feed = Feed(bus)
    dropped: collections.Counter[str] = collections.Counter()
    losses = 0
    try:
        await feed.start()
        name = await group.join()
        w = group.inproc[name]
        prod = w.producer
        real_queue, real_flush = prod.queue, prod.flush
        lossy = False

        def queue(topic: str, key: str | None, value: bytes) -> None:
            if lossy:
                dropped[topic] += 1  # never reaches the broker
                return
            real_queue(topic, key, value)

        async def flush() -> None:
            nonlocal lossy, losses
            if lossy:
                lossy = False
                losses += 1
                await real_flush()
                raise DeliveryError([("gpu.attributed", TimeoutError("Batch expired (injected)"))])
            await real_flush()

        prod.queue = queue  # type: ignore[method-assign]
        prod.flush = flush  # type: ignore[method-assign]

        async def reported() -> bool:
            return not lossy

        await group.settle("one worker")
        t0 = time.monotonic()
        for at in LOSSES_AT_S:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            lossy = True
            await poll(reported, lambda: "the lossy confirm", group, 30)
        await asyncio.sleep(max(0.0, t0 + FEED_S - time.monotonic()))
        await feed.finish()
        await group.drained()
        rewinds, consumer_rewinds = w.rewinds, w._consumer.rewinds
        await group.close()
        attributed, events_out, windows_out = await read_outputs(bus)
    finally:
        await group.close()
        await feed.close()
        await admin.close()

    seen = {
        (d["sample"]["node"], round(d["sample"]["ts"] - T0)) for d in map(orjson.loads, (r.value for r in attributed))
    }
    ev_seen = {orjson.loads(r.value)["event"]["event_id"] for r in events_out}
    expected = {
        (node, g, T0 + s): sum(1 for t in range(s, s + WINDOW_S) if (node, t) in feed.samples)
        for node in NODES
        for g in range(GPUS)
        for s in range(0, feed.last_tick + 1, WINDOW_S)
    }
    copies: dict[tuple[str, int, float], list[int]] = collections.defaultdict(list)
    for r in windows_out:
        jw = JobWindow.model_validate_json(r.value)
        copies[(jw.node, jw.gpu_index, jw.window_start)].append(jw.samples)
    wrong = sorted((k[0], k[1], k[2] - T0, cs, expected[k]) for k, cs in copies.items()
                   if k in expected and any(s != expected[k] for s in cs))  # fmt: skip
    report = (f"losses {losses} (outputs dropped {dict(dropped)}), rewinds {rewinds} (consumer {consumer_rewinds}); "
              f"readings {len(feed.samples)} produced, {len(seen)} attributed; events {len(feed.events)} produced, "
              f"{len(ev_seen)} attributed; windows {len(expected)} expected, {len(windows_out)} emitted")  # fmt: skip
    print(f"\n{report}")
    assert losses == len(LOSSES_AT_S) and consumer_rewinds == losses and rewinds == losses, report
    assert sum(dropped.values()) > 0, report
    assert not feed.samples - seen, f"readings lost: {_first(feed.samples - seen)}; {report}"
    assert not set(feed.events) - ev_seen, f"events lost: {_first(set(feed.events) - ev_seen)}; {report}"
    assert not set(expected) - set(copies), f"windows lost: {_first(set(expected) - set(copies))}; {report}"
    assert not wrong, (
        f"windows with a reading counted twice or lost (node, gpu, start, copies, expected): {wrong[:8]}; {report}"
    )
