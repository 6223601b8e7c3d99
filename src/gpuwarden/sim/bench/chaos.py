# Over 500 lines: one benchmark run; its fault schedule, pipeline and accounting share one cluster and
# one scenario (the figures it prints are pure functions above, unit-tested).
"""``gpuwarden bench chaos``: the whole pipeline on a real 3-broker KRaft cluster under faults.

A 3-node Apache Kafka cluster (combined broker+controller nodes from the jars, topics with
3 replicas and ``min.insync.replicas=2``) carries the six services, started as processes on
a simulated fleet (:class:`gpuwarden.demo.runner.Pipeline`). While the fleet's scenario runs
(XID 79 faults spread over the run), the bench injects, in order:

1. ``broker-kill``: SIGKILL of one broker mid-load, restarted after a while;
2. ``service-kill``: SIGKILL of each service mid-load, restarted at once;
3. ``service-term``: SIGTERM of each service mid-load, restarted once it has exited;
4. ``outage``: every broker stopped (60 s; ``--short``: 12 s), then started again;
5. ``fuzz``: on every input topic, non-JSON, truncated and schema-invalid records and one
   oversize record (over the services' 1,000,000-byte limit);
6. ``forged``: 100 forged ``slurm.nodes`` records of nodes Slurm does not have; then
   ``hostile``: 10,000 (``--short``: 1,000) schema-shaped hostile records on each raw input
   topic (:mod:`gpuwarden.sim.hostile`: ``ts=1e308`` and other time extremes, shell/control/bidi
   node names, 65+ GPUs, job ids with shell characters...);
7. ``foreign-drain``: a node drained by an admin before its fault (the remediator must leave
   it), and, on the same cluster in this process, a remediator whose first ``scontrol update``
   fails while an admin drains the node, 100 forged node records and 7 failures on a 20-node
   cluster (the breaker must count Slurm's 20 nodes).

Figures: ``injected`` (the scenario's expected failures), ``found`` (found in their window),
``lost`` (expected, not found), ``duplicate failures`` (another failure id for the same
pattern, node and GPU), ``duplicate drains`` (more than one executed drain of a node),
``foreign reasons overwritten`` (a drain reason not gpuwarden's that was replaced),
``fuzzed`` / ``dead-lettered`` (fuzz records injected / those that reached ``deadletter``),
``crashes`` (a service exit the bench did not cause), ``hostile`` / ``stopped at the edge`` /
``leaked`` (hostile records injected / dead-lettered exactly once, by their topic's edge service
(``TopicSpec.edge``) / dead-lettered by nobody: some reader took them as valid), ``windows lost``
(job windows the valid samples on ``gpu.samples`` closed in event time that ``job.windows`` never
carried, :mod:`gpuwarden.sim.bench.windowledger`), ``readings lost`` (readings missing from the
windows that came), ``samples lost before Kafka`` (ticks of a node with no sample on ``gpu.samples``
while its collector was up: taken, never delivered; the window ledger cannot see them), ``drains beyond the breaker``
(executed drains over the circuit breaker's bound), ``false positives`` (failures
no injected fault explains, by the scenario's scoring rules). Every count but ``injected``/``found``/
``fuzzed``/``hostile`` must be 0 (``found`` = ``injected``, ``dead-lettered`` = ``fuzzed``,
``stopped at the edge`` = ``hostile``), else the exit code is 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import yaml

from gpuwarden.demo.runner import Pipeline, ServiceProc, spawn_service, wait_healthy
from gpuwarden.shared.models import NodeState, RemediationDecision
from gpuwarden.shared.scenario import ScenarioClock, load_scenario
from gpuwarden.sim.collector import logger_gaps
from gpuwarden.sim.kafka_cluster import KRaftCluster

from .windowledger import WindowLedger

__all__ = ["ChaosFigures", "chaos", "chaos_line", "chaos_scenario", "crash_lines"]

FOREIGN_REASON = "admin: bad PSU"
#: Input topics of the services (what each consumes) that receive fuzz records.
FUZZ_TOPICS = (
    "gpu.samples",
    "gpu.events",
    "slurm.jobs",
    "slurm.nodes",
    "gpu.attributed",
    "gpu.events.attributed",
    "job.windows",
    "health",
    "failures",
    "remediations",
)
FUZZ_VALUES = (
    b"\xff\xfe not json at all",
    b'{"schema_version": 1, "node": ',
    b'{"schema_version": 1, "unexpected": true}',
    b"[1, 2, 3]",
)
OVERSIZE_BYTES = 1_010_000
#: Schema-shaped hostile records per raw input topic (gpuwarden.sim.hostile): full run, --short.
HOSTILE_PER_TOPIC = 10_000
HOSTILE_PER_TOPIC_SHORT = 1_000


@dataclass
class ChaosFigures:
    """What a chaos run counted (see the module docstring)."""

    injected: int = 0
    found: int = 0
    lost: int = 0
    duplicate_failures: int = 0
    duplicate_drains: int = 0
    foreign_overwritten: int = 0
    fuzzed: int = 0
    dead_lettered: int = 0
    crashes: int = 0
    #: executed drains beyond the breaker's bound (forged node records must not widen it)
    over_breaker: int = 0
    #: schema-shaped hostile records injected (gpuwarden.sim.hostile), those dead-lettered exactly
    #: once by their topic's edge service, and those that no service refused (passed on)
    hostile: int = 0
    stopped_at_edge: int = 0
    leaked: int = 0
    #: closed job windows the valid samples on gpu.samples imply that job.windows never carried
    #: (:mod:`gpuwarden.sim.bench.windowledger`), and readings missing from those that came
    windows_lost: int = 0
    readings_lost: int = 0
    #: ticks of a node with no sample on gpu.samples while the collector was up
    #: (:meth:`~gpuwarden.sim.bench.windowledger.WindowLedger.missing_ticks`): samples the collector
    #: took and lost before Kafka (a full outage buffer, a send that failed for good...)
    samples_lost_before_kafka: int = 0
    #: failures no injected fault explains (the scenario's scoring rules: a healthy node's finding)
    false_positives: int = 0
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def chaos_line(f: ChaosFigures) -> str:
    """The bench's last line. Pure."""
    return (
        f"chaos: injected {f.injected}, found {f.found}, lost {f.lost}, duplicate failures {f.duplicate_failures}, "
        f"duplicate drains {f.duplicate_drains}, foreign reasons overwritten {f.foreign_overwritten}, "
        f"fuzzed {f.fuzzed}, dead-lettered {f.dead_lettered}, crashes {f.crashes}, "
        f"hostile {f.hostile}, stopped at the edge {f.stopped_at_edge}, leaked {f.leaked}, "
        f"windows lost {f.windows_lost}, readings lost {f.readings_lost}, "
        f"samples lost before Kafka {f.samples_lost_before_kafka}, drains beyond the breaker {f.over_breaker}, "
        f"false positives {f.false_positives}"
    )


#: The chaos fleet's sample interval, scenario s (one NodeSample per node per tick).
TICK_S = 1.0

#: Nodes of the remediator fault check's 20 that may be down at once (max drain fraction 0.1).
BREAKER_DOWN = 2


def chaos_failed(f: ChaosFigures) -> list[str]:
    """Why the run fails (empty: it passed); every count of the line and the breaker check set the
    bench's exit code. Pure."""
    checks = [
        (f.lost, f"{f.lost} injected faults lost"),
        (f.found != f.injected, f"found {f.found} of {f.injected} injected faults"),
        (f.duplicate_failures, f"{f.duplicate_failures} duplicate failures"),
        (f.duplicate_drains, f"{f.duplicate_drains} duplicate drains"),
        (f.foreign_overwritten, f"{f.foreign_overwritten} foreign drain reasons overwritten"),
        (f.dead_lettered != f.fuzzed, f"dead-lettered {f.dead_lettered} of {f.fuzzed} fuzzed records"),
        (f.crashes, f"{f.crashes} crashes"),
        (f.over_breaker, f"{f.over_breaker} drains beyond the circuit breaker"),
        (f.leaked, f"{f.leaked} hostile records passed on by every reader"),
        (
            f.stopped_at_edge != f.hostile,
            f"{f.hostile - f.stopped_at_edge} of {f.hostile} hostile records not dead-lettered once by their edge",
        ),
        (f.windows_lost, f"{f.windows_lost} job windows lost (their samples are on gpu.samples)"),
        (f.readings_lost, f"{f.readings_lost} readings missing from the job windows that came"),
        (f.false_positives, f"{f.false_positives} false positives (failures no injected fault explains)"),
        (
            f.samples_lost_before_kafka,
            f"{f.samples_lost_before_kafka} samples lost before Kafka (ticks with no sample)",
        ),
    ]
    return [why for bad, why in checks if bad]


def chaos_scenario(fault_s: list[float], duration_s: float, nodes: int = 8) -> dict[str, Any]:
    """The chaos fleet: ``nodes`` 8-GPU nodes under one training job, an XID 79 at each of
    ``fault_s`` (scenario s) on its own node (``gpu-node-001``, ``-002``, ...), each expected as
    ``gpu-fallen-off-bus`` within 60 s. Pure; a dict in the scenario YAML format."""
    if len(fault_s) > nodes:
        raise ValueError(f"{len(fault_s)} faults need at least as many nodes, got {nodes}")
    faults, expect = [], []
    for i, at in enumerate(fault_s):
        node = f"gpu-node-{i + 1:03d}"
        faults.append({"at_s": at, "kind": "xid", "node": node, "gpu": i % 8, "xid": 79})
        expect.append({"pattern": "gpu-fallen-off-bus", "node": node, "gpu": i % 8, "job": 1001, "within_s": 60})
    return {
        "name": "chaos",
        "description": "XID 79s while brokers and services are killed, stopped and fed garbage",
        "seed": 13,
        "duration_s": duration_s,
        "tick_s": TICK_S,
        "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": "H100-SXM5-80GB", "price_usd_per_gpu_hour": 3.0},
        "jobs": [
            {
                "id": 1001,
                "user": "user1",
                "account": "ml",
                "partition": "gpu",
                "nodes": f"gpu-node-[001-{nodes:03d}]",
                "gpus_per_node": 8,
                "start_s": 0,
                "end_s": duration_s + 3600,
                "profile": "training",
                "name": "chaos-train",
            }
        ],
        "faults": faults,
        "expect": expect,
        "allow": ["telemetry-silent", "gpu-missing"],
    }


class _Chaos:
    def __init__(self, short: bool, workdir: Path, speed: float, echo: Any) -> None:
        self.short = short
        self.workdir = workdir
        self.speed = speed
        self.echo = echo
        self.fig = ChaosFigures()
        self.expected_exits: set[int] = set()  # pids the bench killed or stopped
        self.cluster: KRaftCluster | None = None
        self.pl: Pipeline | None = None
        self.drained = True  # False: the pipeline did not drain before the time limit
        self.injected: set[tuple[str, int, int]] = set()
        #: (topic, partition, offset) of each hostile record -> its short topic name
        self.hostile: dict[tuple[str, int, int], str] = {}
        self.hostile_per_topic = HOSTILE_PER_TOPIC_SHORT if short else HOSTILE_PER_TOPIC
        from gpuwarden.correlator.settings import CorrelatorSettings

        # the window the pipeline's correlator uses: its settings from the same environment
        cs = CorrelatorSettings()
        self.ledger = WindowLedger(cs.correlator_window_s, cs.correlator_window_grace_s)
        self.tick_s = TICK_S
        #: wall-clock (from, to) of each time the bench took the collector down (kill, restart, healthy)
        self.collector_down: list[tuple[float, float]] = []
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        self.echo(f"[{time.monotonic() - self.t0:6.1f} s] {msg}")

    # -- services -----------------------------------------------------------------------
    def _restart(self, sp: ServiceProc) -> None:
        assert self.pl is not None
        # the Pipeline's own environment for this service (same port, prefix, scenario clock); a
        # restarted collector samples from the scenario's current second on, as a real one samples
        # "now" (not a replay from second 0 that would hide what its death lost)
        env = self.pl._env(sp.name, sp.port)
        if sp.name == "collector":
            env["GPUWARDEN_COLLECTOR_SIM_RESUME"] = "true"
        new = spawn_service(sp.name, sp.module, env, sp.log, sp.port)
        sp.proc = new.proc

    async def _hit(self, sp: ServiceProc, sig: int) -> None:
        assert sp.proc is not None
        self.expected_exits.add(sp.proc.pid)
        # a kill -9 may interrupt the tick being taken (up to one tick: not yet spooled); a SIGTERM
        # nothing. What was handed to the producer is in the spool and replayed by the next one.
        down = time.time() - (self.tick_s / self.speed if sig == signal.SIGKILL else 0.0)
        with contextlib.suppress(ProcessLookupError):
            sp.proc.send_signal(sig)
        try:
            await asyncio.to_thread(sp.proc.wait, 30)
        except Exception:
            sp.proc.kill()
            await asyncio.to_thread(sp.proc.wait, 10)
        self._restart(sp)
        if sp.name == "collector":  # the ticks it did not take while down are not samples lost
            await wait_healthy([sp], 180)
            self.collector_down.append((down, time.time() + self.tick_s / self.speed))

    async def hit_services(self, sig: int) -> None:
        assert self.pl is not None
        t = time.monotonic()
        procs = list(self.pl.procs)
        if self.short:  # a wave: every service at once
            await asyncio.gather(*(self._hit(sp, sig) for sp in procs))
            await wait_healthy(procs, 180)
        else:
            for sp in procs:
                await self._hit(sp, sig)
                await wait_healthy([sp], 180)
                await self.run_for(5)
        name = "kill -9" if sig == signal.SIGKILL else "SIGTERM"
        self.fig.timings[f"service {name}: all healthy again (s)"] = round(time.monotonic() - t, 1)
        self.say(f"{name} of {', '.join(sp.name for sp in procs)}: all restarted and healthy")

    def check_crashes(self) -> None:
        assert self.pl is not None
        for sp in self.pl.procs:
            if sp.proc is not None and sp.proc.poll() is not None and sp.proc.pid not in self.expected_exits:
                self.fig.crashes += 1
                self.fig.notes.append(f"{sp.name} exited by itself (rc {sp.proc.returncode}):\n{sp.log_tail(8)}")
                self.say(f"CRASH: {sp.name} exited with {sp.proc.returncode}; restarting")
                self.expected_exits.add(sp.proc.pid)
                self._restart(sp)

    async def run_for(self, seconds: float) -> None:
        """Keep the pipeline's reader going (and watch for crashes) for ``seconds``."""
        assert self.pl is not None
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(Exception):  # the reader rides out broker outages
                await self.pl.poll()
            self.check_crashes()
            await asyncio.sleep(0.05)

    # -- brokers ------------------------------------------------------------------------
    async def broker_kill(self, down_s: float) -> None:
        assert self.cluster is not None
        node = self.cluster.nodes[1]
        self.say(f"kill -9 of broker {node.node_id}")
        await asyncio.to_thread(node.kill)
        await self.run_for(down_s)
        t = time.monotonic()
        node.start()
        await asyncio.to_thread(node.wait, 120)
        self.fig.timings["broker restart after kill -9 (s)"] = round(time.monotonic() - t, 1)
        self.say(f"broker {node.node_id} back")

    async def outage(self, down_s: float) -> None:
        assert self.cluster is not None
        self.say(f"outage: all {len(self.cluster.nodes)} brokers stopped for {down_s:.0f} s")
        await asyncio.to_thread(self.cluster.stop_all)
        await self.run_for(down_s)
        t = time.monotonic()
        await asyncio.to_thread(self.cluster.start_all, 180)
        self.fig.timings["cluster restart after outage (s)"] = round(time.monotonic() - t, 1)
        self.say("outage over: brokers back")

    # -- records --------------------------------------------------------------------------
    async def fuzz(self) -> None:
        from gpuwarden.shared.bus import kafka_producer

        assert self.pl is not None and self.cluster is not None
        p = kafka_producer(self.cluster.bootstrap_servers, acks="all", max_request_size=2 << 20,
                           request_timeout_ms=30000)  # fmt: skip
        await p.start()
        try:
            for short in FUZZ_TOPICS:
                topic = f"{self.pl.prefix}{short}"
                for value in (*FUZZ_VALUES, b"x" * OVERSIZE_BYTES):
                    md = await p.send_and_wait(topic, value=value, key=b"gpu-node-008")
                    self.injected.add((topic, md.partition, md.offset))
            forged = [NodeState(node=f"forged-{i:03d}", ts=time.time(), state="IDLE") for i in range(100)]
            for n in forged:
                await p.send_and_wait(f"{self.pl.prefix}slurm.nodes", value=n.to_json(), key=n.node.encode())
        finally:
            await p.stop()
        self.fig.fuzzed = len(self.injected)
        self.say(f"fuzz: {len(self.injected)} bad records on {len(FUZZ_TOPICS)} input topics; 100 forged node records")
        await self.inject_hostile()

    async def inject_hostile(self) -> None:
        """``hostile_per_topic`` schema-shaped hostile records (:mod:`gpuwarden.sim.hostile`) on
        each raw input topic, produced in batches while the pipeline runs."""
        from gpuwarden.shared.bus import kafka_producer
        from gpuwarden.sim.hostile import HOSTILE_TOPICS, hostile_records

        assert self.pl is not None and self.cluster is not None
        p = kafka_producer(self.cluster.bootstrap_servers, acks="all", linger_ms=20, max_request_size=2 << 20,
                           request_timeout_ms=30000)  # fmt: skip
        await p.start()
        t = time.monotonic()
        try:
            for short in HOSTILE_TOPICS:
                topic = f"{self.pl.prefix}{short}"
                futs = [await p.send(topic, value=v, key=b"gpu-node-008")
                        for v in hostile_records(short, self.hostile_per_topic, time.time())]  # fmt: skip
                for md in await asyncio.gather(*futs):
                    self.hostile[(topic, md.partition, md.offset)] = short
        finally:
            await p.stop()
        self.fig.hostile = len(self.hostile)
        self.say(f"hostile: {len(self.hostile)} schema-shaped records on {len(HOSTILE_TOPICS)} input topics "
                 f"in {time.monotonic() - t:.1f} s")  # fmt: skip

    def hostile_stopped(self) -> tuple[int, int, Counter[str]]:
        """(dead-lettered exactly once by the topic's edge service, dead-lettered by nobody,
        dead letters by service) of the hostile records."""
        from gpuwarden.shared.topics import TOPICS

        assert self.pl is not None
        by_record: dict[tuple[str, int, int], list[str]] = {k: [] for k in self.hostile}
        by_service: Counter[str] = Counter()
        for d in self.pl.result.deadletters:
            k = (str(d.get("source_topic")), int(d.get("partition", -1)), int(d.get("offset", -1)))
            if k in by_record:
                by_record[k].append(str(d.get("service")))
                by_service[str(d.get("service"))] += 1
        stopped = sum(1 for k, svcs in by_record.items() if svcs == [TOPICS[self.hostile[k]].edge])
        return stopped, sum(1 for svcs in by_record.values() if not svcs), by_service

    def dead_lettered(self) -> tuple[int, Counter[str]]:
        assert self.pl is not None
        hit: set[tuple[str, int, int]] = set()
        by_service: Counter[str] = Counter()
        for d in self.pl.result.deadletters:
            k = (d.get("source_topic"), d.get("partition"), d.get("offset"))
            if k in self.injected:
                hit.add(k)
                by_service[str(d.get("service"))] += 1
        return len(hit), by_service

    # -- the remediator under a failing scontrol (in this process, on the cluster) --------
    async def remediator_faults(self) -> tuple[int, int, int]:
        """Returns (foreign reasons overwritten, executed drains beyond the breaker, duplicate drains)."""
        from gpuwarden.remediator import Remediator, RemediatorSettings
        from gpuwarden.shared.bus import Producer
        from gpuwarden.shared.models import Failure as F
        from gpuwarden.shared.slurm import CommandResult, drain_argv
        from gpuwarden.sim.slurm import FakeSlurm

        assert self.cluster is not None
        now = time.time()

        class AdminDrainsDuringOutage(FakeSlurm):
            """First ``scontrol update`` of gpu-node-002 fails (slurmctld unreachable); an admin
            drains the node meanwhile."""

            failed_once = False

            async def update_node(
                self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None
            ) -> CommandResult:
                if name == "gpu-node-002" and state == "DRAIN" and not self.failed_once:
                    self.failed_once = True
                    cur = self.nodes_map[name]
                    self.nodes_map[name] = cur.model_copy(update={"flags": ["DRAIN"], "reason": FOREIGN_REASON,
                                                                  "reason_user": "root", "reason_ts": now})  # fmt: skip
                    err = "slurm_update error: Unable to contact slurm controller (connect failure)"
                    return CommandResult(drain_argv(name, state, reason), 1, "", err, 0.1)
                return await super().update_node(name, state, reason)

        nodes = [NodeState(node=f"gpu-node-{i:03d}", ts=now, state="ALLOCATED") for i in range(1, 21)]
        fake = AdminDrainsDuringOutage(nodes=nodes)
        prefix = f"chaosrem{uuid.uuid4().hex[:6]}."
        from gpuwarden.shared.topics import create_topics

        await create_topics(self.cluster.bootstrap_servers, prefix, partitions=1)
        env = {"GPUWARDEN_BOOTSTRAP_SERVERS": self.cluster.bootstrap_servers, "GPUWARDEN_TOPIC_PREFIX": prefix}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            s = RemediatorSettings(remediator_enforce=True, remediator_retry_backoff_s=0,
                                   remediator_max_drain_fraction=0.1, remediator_max_drains_per_window=100,
                                   consumer_group=f"{prefix}remediator")  # fmt: skip
            r = Remediator(s, client=fake)
            pub = Producer(s)
            await r.start()
            await pub.start()
            try:
                for i in range(100):
                    forged = NodeState(node=f"forged-{i:03d}", ts=now, state="IDLE")
                    await pub.publish("slurm.nodes", forged.node, forged)
                for i in range(2, 9):  # gpu-node-002 first: its first scontrol fails
                    node = f"gpu-node-{i:03d}"
                    f = F.model_validate(_failure_json(node, f"chaos-f{i}", now))
                    await pub.publish("failures", node, f)
                await pub.confirm()
                end = time.monotonic() + 60
                while time.monotonic() < end and sum(r.decisions.values()) < 7:
                    await asyncio.sleep(0.2)
                await r.resume_due()
            finally:
                await pub.stop()
                await r.stop()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        overwritten = int(fake.nodes_map["gpu-node-002"].reason != FOREIGN_REASON)
        drains = Counter(c[0] for c in fake.calls if c[1] == "DRAIN" and c[0] != "gpu-node-002")
        drained = sum(1 for n in fake.nodes_map.values() if n.drained and n.reason != FOREIGN_REASON)
        self.say(f"remediator faults: decisions {dict(r.decisions)}; {drained} of 20 drained by gpuwarden (breaker: "
                 f"at most {BREAKER_DOWN} of 20 down, the admin's drain included); "
                 f"gpu-node-002 reason {fake.nodes_map['gpu-node-002'].reason!r}")  # fmt: skip
        # the admin's drain of gpu-node-002 counts against the bound: gpuwarden may add BREAKER_DOWN - 1
        return overwritten, max(0, drained - (BREAKER_DOWN - 1)), sum(n - 1 for n in drains.values())

    # -- the run --------------------------------------------------------------------------
    async def run(self) -> ChaosFigures:
        short = self.short
        # wall s after the sources start: broker kill, service kill, service term, outage, fuzz
        plan = [5.0, 25.0, 50.0, 75.0, 105.0] if short else [10.0, 40.0, 120.0, 200.0, 300.0]
        outage_s = 12.0 if short else 60.0
        # one XID right after each injection starts (scenario s = wall s * speed)
        faults = [(w + 2.0) * self.speed for w in plan]
        duration = (plan[-1] + 40.0) * self.speed
        sc_path = self.workdir / "chaos-scenario.yaml"
        sc_path.write_text(yaml.safe_dump(chaos_scenario(faults, duration)))
        scenario = load_scenario(sc_path)
        self.fig.injected = len(scenario.expect)

        self.say("starting a 3-broker KRaft cluster (heap 256 MiB each)")
        self.cluster = KRaftCluster(3, self.workdir / "kafka", heap="256m")
        t = time.monotonic()
        await asyncio.to_thread(self.cluster.start)
        self.fig.timings["cluster start (s)"] = round(time.monotonic() - t, 1)
        self.say(f"cluster up at {self.cluster.bootstrap_servers}")
        # the pipeline's breaker lets every fault's node drain (8 nodes, 5 faults, one admin
        # drain): duplicate drains are then countable; the breaker itself is checked in
        # remediator_faults (100 forged node records, 20 Slurm nodes, 10 %)
        os.environ["GPUWARDEN_REMEDIATOR_MAX_DRAIN_FRACTION"] = "0.9"
        os.environ["GPUWARDEN_REMEDIATOR_MAX_DRAINS_PER_WINDOW"] = "100"
        pl = Pipeline(sc_path, scenario, speed=self.speed, bootstrap_servers=self.cluster.bootstrap_servers,
                      partitions=2, workdir=self.workdir / "run")  # fmt: skip
        self.pl = pl
        pl.on_record = self.ledger.observe  # every record the pipeline's reader sees
        # the detector as the shipped deploy files run it: its state survives a kill (GPU identities,
        # open episodes), a restart without it adopts its open failures from `failures`
        pl.extra_env["detector"] = {"GPUWARDEN_DETECTOR_STATE_FILE": str(self.workdir / "detector-state.json")}
        # the collector too: its outbox spool (written before each send) survives a kill -9
        pl.extra_env["collector"] = {"GPUWARDEN_COLLECTOR_SPOOL": str(self.workdir / "collector-outbox.jsonl")}
        # an admin's drain of the node whose fault comes last: gpuwarden must leave it as it is
        foreign_node = scenario.faults[-1].node
        (pl.workdir).mkdir(parents=True, exist_ok=True)
        state_file = pl.workdir / "slurm-state.json"
        state_file.write_text(json.dumps({"nodes": {foreign_node: {"state": "DRAIN", "reason": FOREIGN_REASON,
                                                                   "user": "root", "ts": time.time()}}}))  # fmt: skip
        try:
            t = time.monotonic()
            await pl.start(on_phase=self.say)
            self.fig.timings["services start (s)"] = round(time.monotonic() - t, 1)
            t_src = time.monotonic()

            async def until(w: float) -> None:
                await self.run_for(max(0.0, t_src + w - time.monotonic()))

            await until(plan[0])
            await self.broker_kill(10.0 if short else 30.0)
            await until(plan[1])
            await self.hit_services(signal.SIGKILL)
            await until(plan[2])
            await self.hit_services(signal.SIGTERM)
            await until(plan[3])
            await self.outage(outage_s)
            await until(plan[4])
            await self.fuzz()
            self.say("waiting for the scenario to end and the pipeline to drain")
            limit = time.monotonic() + (240 if short else 900)
            t_end = t_src + duration / self.speed
            settled = _Settling(quiet_s=30.0)
            while time.monotonic() < limit:
                await self.run_for(1.0)
                # every hostile record dead-lettered by someone (or none for 30 s): 50,000 of them
                # take the edge services a while after the scenario's own records have drained
                answered = len(self.hostile) - self.hostile_stopped()[1]
                if time.monotonic() > t_end and settled.done(answered, len(self.hostile)) and await pl.finished():
                    break
            else:
                self.drained = False
                self.fig.notes.append("the pipeline did not drain before the time limit")
            await self.run_for(2.0)
            overwritten, over_breaker, dup_inproc = await self.remediator_faults()
            self.fig.foreign_overwritten += overwritten
            self.fig.duplicate_drains += dup_inproc
            self.fig.over_breaker += over_breaker
            if over_breaker:
                self.fig.notes.append(f"breaker defeated by forged node records: {over_breaker} drains too many")
            self._figures(foreign_node, state_file)
        finally:
            await pl.stop()
            await asyncio.to_thread(self.cluster.close)
        return self.fig

    def _logs(self) -> Iterator[tuple[str, str]]:
        """(service, its log text) of every service process whose log can be read."""
        assert self.pl is not None
        for sp in self.pl.procs:
            try:
                yield sp.name, sp.log.read_text(errors="replace")
            except OSError:
                continue

    def _crashes_in_logs(self) -> None:
        """Add the in-process crashes (a task or a faust agent that crashed and was restarted
        while its process lived on) found in the services' logs."""
        for name, text in self._logs():
            lines = crash_lines(text)
            if lines:
                self.fig.crashes += len(lines)
                self.fig.notes.append(f"{name}: {len(lines)} crash(es) in its log, first: {lines[0][:400]}")

    def _reads_again_in_logs(self) -> None:
        """Note, per service, the log lines of what makes a consumer read records again or stall
        (a failed delivery, a group (re)join, an expired session): what a run that did not stop
        every hostile record once, or did not drain, needs to be understood from its output."""
        marks = {
            "outputs not delivered (read again)": "re-reading from the last commit",
            "group joins": "Joined group",
            "sessions expired": "Heartbeat session expired",
            "dead letters already on the broker": "its dead letter is already on the broker",
        }
        for name, text in self._logs():
            counts = {k: text.count(m) for k, m in marks.items()}
            if any(counts.values()):
                self.fig.notes.append(f"{name} log: {counts} (lines; rate-limited lines count once)")

    def _figures(self, foreign_node: str, state_file: Path) -> None:
        assert self.pl is not None
        from gpuwarden.demo.scoring import score

        res = self.pl.result
        fails = list(res.failures.values())
        sc = score(res.scenario, fails, res.sim_start)
        self.fig.found = len(sc["found"])
        self.fig.lost = len(sc["missed"])
        for m in sc["missed"]:
            self.fig.notes.append(f"lost: {m}")
        self.fig.false_positives = len(sc["false_positives"])
        for fp in sc["false_positives"][:5]:
            self.fig.notes.append(f"false positive: {fp}")
        expected = {e.pattern for e in res.scenario.expect}
        keys = Counter((f.pattern, f.node, f.gpu_index) for f in fails if f.pattern in expected)
        self.fig.duplicate_failures = sum(n - 1 for n in keys.values())
        executed = Counter(
            r.node
            for r in res.remediations
            if r.decision == RemediationDecision.EXECUTED and r.action.value == "drain" and not r.dry_run
        )
        self.fig.duplicate_drains += sum(n - 1 for n in executed.values())
        forged = [r.node for r in res.remediations if r.node.startswith("forged-")]
        if forged:
            self.fig.notes.append(f"remediations for forged nodes: {forged[:5]}")
        drains = json.loads(state_file.read_text()).get("nodes", {}) if state_file.exists() else {}
        if drains.get(foreign_node, {}).get("reason") != FOREIGN_REASON:
            self.fig.foreign_overwritten += 1
        self._crashes_in_logs()
        self.fig.dead_lettered, by_service = self.dead_lettered()
        self.fig.stopped_at_edge, self.fig.leaked, hostile_by = self.hostile_stopped()
        self.fig.timings["dead letters of hostile records, by service"] = dict(hostile_by)  # type: ignore[assignment]
        if self.fig.stopped_at_edge != self.fig.hostile or not self.drained:
            self._reads_again_in_logs()
        self.fig.timings["dead letters of fuzz records, by service"] = dict(by_service)  # type: ignore[assignment]
        injected = [(p, o) for (t, p, o) in (*self.injected, *self.hostile) if t == f"{self.pl.prefix}gpu.samples"]
        loss = self.ledger.loss(exclude=injected)
        self.fig.windows_lost, self.fig.readings_lost = loss.lost, loss.readings_lost
        self.fig.timings["job windows the samples closed"] = loss.expected
        self.fig.timings["readings missing from the windows that came"] = loss.readings_lost
        if loss.examples:
            self.fig.notes.append(f"job windows lost (node, GPU, start): {loss.examples}")
        for key, got, want, times in loss.short:
            self.fig.notes.append(f"job window {key} came with {got} of {want} readings (sample times in it: {times})")
        clock = ScenarioClock(res.sim_start, self.speed, res.wall_start)  # the services' own clock
        down = [(clock.event_ts(clock.scenario_s(a)), clock.event_ts(clock.scenario_s(b)))
                for a, b in self.collector_down]  # fmt: skip
        # the simulated collector skips some ticks of some nodes on purpose (a busy logger, as real
        # recordings show): those were never taken either
        scn = res.scenario
        skipped = {
            n: [(clock.event_ts(a), clock.event_ts(b)) for a, b in logger_gaps(scn.seed, n, scn.duration_s)]
            for n in scn.cluster.node_names()
        }
        self.fig.samples_lost_before_kafka, gaps = self.ledger.missing_ticks(self.tick_s, injected, down, skipped)
        if gaps:
            self.fig.notes.append(f"ticks with no sample on gpu.samples (node, event time): {gaps}")
        self.fig.timings["failures seen"] = len(fails)
        self.fig.timings["drains executed"] = sum(executed.values())


class _Settling:
    """Whether a count that should reach a total is done: it did, or it has not moved for
    ``quiet_s`` (monotonic clock)."""

    def __init__(self, quiet_s: float) -> None:
        self.quiet_s = quiet_s
        self._last = -1
        self._since = time.monotonic()

    def done(self, count: int, total: int) -> bool:
        if count >= total:
            return True
        now = time.monotonic()
        if count != self._last:
            self._last, self._since = count, now
        return now - self._since >= self.quiet_s


def crash_lines(log_text: str) -> list[str]:
    """Lines of a service log that report a crash that did not end the process: a task of a
    service (``task ... crashed``) or a faust agent (``Crashed reason=``). Pure."""
    return [ln for ln in log_text.splitlines() if _CRASH.search(ln)]


_CRASH = re.compile(r"task \S+ crashed|Crashed reason=")


def _failure_json(node: str, fid: str, now: float) -> dict[str, Any]:
    """A drain-worthy XID 79 failure of ``node`` (for the in-process remediator case)."""
    return {
        "failure_id": fid,
        "pattern": "gpu-fallen-off-bus",
        "rule_id": "xid-79",
        "category": "hardware",
        "severity": "critical",
        "node": node,
        "gpu_index": 1,
        "first_seen": now - 5,
        "last_seen": now - 1,
        "verdict": f"GPU 1 of {node} fell off the bus",
        "recommended_action": "drain",
        "cost": {"affected_gpus": 8, "usd_per_hour": 24.0, "gpu_hours_lost": 0.1},
    }


def chaos(
    short: Annotated[bool, typer.Option("--short", help="Short variant (a few minutes): 12 s outage, waves")] = False,
    speed: Annotated[float, typer.Option(min=0.5, max=5, help="Scenario s per wall s")] = 1.0,
    workdir: Annotated[Path | None, typer.Option(help="Logs and broker data (default: a temp dir)")] = None,
) -> None:
    """Kill brokers and services, stop the cluster, feed garbage and forged records to a
    real 3-broker Kafka cluster under the whole pipeline; count what was lost.

    Ends with one line: ``chaos: injected N, found N, lost 0, ..., windows lost 0, readings
    lost 0, samples lost before Kafka 0, drains beyond the breaker 0, false positives 0``.
    Exit code 1 when a fault was not found or found twice, a failure no fault explains, a node
    drained twice or beyond the circuit breaker, a foreign drain reason overwritten, a fuzz or
    hostile record not dead-lettered once by its edge, a service crashed, a job window or
    reading lost, or a sample lost before Kafka; 0 otherwise.
    """
    wd = workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-chaos-"))
    wd.mkdir(parents=True, exist_ok=True)
    typer.echo(f"bench chaos ({'short' if short else 'full'}), work dir {wd}")
    # the bench's own Kafka clients complain loudly while brokers are down: to a file
    handler = logging.FileHandler(wd / "bench-clients.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("aiokafka", "gpuwarden"):
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    c = _Chaos(short, wd, speed, typer.echo)
    fig = asyncio.run(c.run())
    typer.echo("figures:")
    for k, v in fig.timings.items():
        typer.echo(f"  {k}: {v}")
    for n in fig.notes:
        typer.echo(f"  note: {n}")
    bad = chaos_failed(fig)
    for why in bad:
        typer.echo(f"  failed: {why}")
    typer.echo(chaos_line(fig))  # the last line (parsed by tests and scripts)
    raise typer.Exit(1 if bad else 0)
