"""Run the six services as separate processes on a simulated fleet and collect the outcome.

:class:`Pipeline` starts (or reuses) a broker, creates the topics, starts the consumers
first (correlator, detector, otlp-bridge, remediator), waits until each answers
``/healthz``, then fixes the scenario's start time and starts the simulated sources
(collector, slurm-watcher). A reader in this process follows ``failures``,
``remediations`` and ``deadletter`` (and counts the sample topics) to build the run
report (docs/architecture.md#scenarios). Every child gets PR_SET_PDEATHSIG, so nothing outlives the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer
from pydantic import ValidationError

from gpuwarden.detector.jobreport import job_report_rows
from gpuwarden.shared.bus import Producer, kafka_consumer
from gpuwarden.shared.models import Failure, Remediation
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.shared.settings import BusSettings
from gpuwarden.shared.topics import create_topics
from gpuwarden.sim.brokers import TansuBroker, die_with_parent, free_port
from gpuwarden.sim.health_check import simulated_health_check

from .scoring import RunResult, score
from .virtual import Drain, reader_at_end, source_finished

__all__ = [
    "SERVICES",
    "Pipeline",
    "RunResult",
    "ServiceProc",
    "job_report_rows",
    "score",
    "spawn_service",
    "stop_services",
    "wait_healthy",
]

# (service name, python module); consumers first, simulated sources last
CONSUMERS = [
    ("correlator", "gpuwarden.correlator"),
    ("detector", "gpuwarden.detector"),
    ("otlp-bridge", "gpuwarden.otlp_bridge"),
    ("remediator", "gpuwarden.remediator"),
]
SOURCES = [("slurm-watcher", "gpuwarden.slurm_watcher"), ("collector", "gpuwarden.collector")]
SERVICES = [n for n, _ in CONSUMERS + SOURCES]
#: Event time (epoch s) of scenario second 0 in every run, whatever its wall time or speed (the
#: in-process runner's too), so a scenario gives the same event times and failure ids each run.
EVENT_ORIGIN = 1_700_000_000.0


@dataclass
class ServiceProc:
    name: str
    module: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    ready_s: float | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=0.5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Pipeline:
    """The six services, a broker and a reader, for one scenario run.

    Args:
        scenario_path: the scenario YAML (already validated into ``scenario``).
        speed: scenario seconds per wall second.
        bootstrap_servers: an existing Kafka; None starts the embedded Tansu broker.
        partitions: partitions per topic when this run creates the topics.
        workdir: logs and the simulated Slurm state (default: a temp dir).
        enforce: the remediator drains in the simulated Slurm (never a real one here).
    """

    def __init__(
        self,
        scenario_path: Path,
        scenario: Scenario,
        speed: float = 1.0,
        bootstrap_servers: str | None = None,
        partitions: int = 2,
        workdir: Path | None = None,
        enforce: bool = True,
        log_level: str = "INFO",
    ) -> None:
        self.scenario_path = scenario_path.resolve()
        self.scenario = scenario
        self.speed = speed
        self.bootstrap = bootstrap_servers
        self.partitions = partitions
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-run-"))
        self.enforce = enforce
        self.log_level = log_level
        self.prefix = f"gpuwarden.run{os.getpid()}x{int(time.time()) % 100000}."
        self.broker: TansuBroker | None = None
        self.procs: list[ServiceProc] = []
        self.result = RunResult(scenario)
        self._reader: AIOKafkaConsumer | None = None
        hc = [f for f in scenario.faults if f.kind == "health-check-fail"]
        self._health_faults = sorted(hc, key=lambda f: f.at_s)
        self._health_producer: Producer | None = None
        self.phase = "starting"
        self.sim_t = 0.0
        self._drain: Drain | None = None
        self._drain_next = 0.0
        #: called with (short topic, partition, offset, value) of every record :meth:`poll` reads
        #: (the chaos bench's window ledger); None: nothing more than ``self.result``
        self.on_record: Callable[[str, int, int, bytes | None], None] | None = None
        #: service name -> environment variables added to its own (set before :meth:`start`)
        self.extra_env: dict[str, dict[str, str]] = {}

    # -- environment --------------------------------------------------------------------
    def _env(self, name: str, port: int) -> dict[str, str]:
        sc, state = str(self.scenario_path), str(self.workdir / "slurm-state.json")
        env = {
            **os.environ,
            "GPUWARDEN_BOOTSTRAP_SERVERS": self.bootstrap or "",
            "GPUWARDEN_TOPIC_PREFIX": self.prefix,
            "GPUWARDEN_HTTP_PORT": str(port),
            "GPUWARDEN_LOG_LEVEL": self.log_level,
            "GPUWARDEN_SIM_SPEED": str(self.speed),
            "GPUWARDEN_SIM_START": str(self.result.sim_start),
            "GPUWARDEN_SIM_WALL_START": str(self.result.wall_start),
            "PYTHONUNBUFFERED": "1",
        }
        per = {
            "collector": {"GPUWARDEN_COLLECTOR_SOURCE": "simulated", "GPUWARDEN_COLLECTOR_SCENARIO": sc},
            "slurm-watcher": {
                "GPUWARDEN_SLURM_WATCHER_BACKEND": "simulated",
                "GPUWARDEN_SLURM_WATCHER_SCENARIO": sc,
                "GPUWARDEN_SLURM_WATCHER_STATE_FILE": state,
                "GPUWARDEN_SLURM_WATCHER_POLL_S": "0.5",
            },
            "remediator": {
                "GPUWARDEN_REMEDIATOR_BACKEND": "simulated",
                "GPUWARDEN_REMEDIATOR_SCENARIO": sc,
                "GPUWARDEN_REMEDIATOR_STATE_FILE": state,
                "GPUWARDEN_REMEDIATOR_ENFORCE": "true" if self.enforce else "false",
            },
            "detector": {
                "GPUWARDEN_DETECTOR_PRICE_USD_PER_GPU_HOUR": str(self.scenario.cluster.price_usd_per_gpu_hour)
            },
            "correlator": {},
            "otlp-bridge": {},
        }
        env.update(per.get(name, {}))
        env.update(self.extra_env.get(name, {}))
        return env

    def _spawn(self, name: str, module: str) -> ServiceProc:
        port = free_port()
        sp = spawn_service(name, module, self._env(name, port), self.workdir / "logs" / f"{name}.log", port)
        self.procs.append(sp)
        return sp

    # -- run ----------------------------------------------------------------------------
    async def start(self, on_phase: Callable[[str], None] | None = None) -> None:
        """Broker, topics, consumers (wait healthy), then the simulated sources.

        Raises:
            RuntimeError: a service exited or did not become healthy within 120 s.
        """
        t0 = self.result.started_wall

        def phase(p: str) -> None:
            self.phase = p
            if on_phase:
                on_phase(p)

        if not self.bootstrap:
            phase("starting embedded broker (Tansu)")
            self.broker = TansuBroker(log_path=self.workdir / "broker.log")
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.bootstrap = await asyncio.to_thread(self.broker.start)
        phase(f"creating topics on {self.bootstrap}")
        await create_topics(self.bootstrap, self.prefix, partitions=self.partitions)
        await self._start_reader()
        phase("starting correlator, detector, otlp-bridge, remediator")
        # Event time is fixed (the same failure ids at every speed); wall time is this run's.
        self.result.sim_start = EVENT_ORIGIN
        self.result.wall_start = time.time() + 3600  # placeholder; the sources get the real start below
        for name, module in CONSUMERS:
            self._spawn(name, module)
        await self._wait_healthy(self.procs, t0)
        self.result.wall_start = time.time() + 0.5
        phase("starting slurm-watcher and collector (scenario clock running)")
        started = [self._spawn(n, m) for n, m in SOURCES]
        await self._wait_healthy(started, t0)
        phase("running")

    async def _wait_healthy(self, procs: list[ServiceProc], t0: float, timeout_s: float = 120) -> None:
        await wait_healthy(procs, timeout_s, t0)
        for sp in procs:
            self.result.ready_s[sp.name] = sp.ready_s or 0.0

    async def _start_reader(self) -> None:
        names = [
            "failures",
            "remediations",
            "deadletter",
            "gpu.samples",
            "gpu.events",
            "gpu.attributed",
            "gpu.events.attributed",
            "slurm.jobs",
            "slurm.nodes",
            "job.windows",
        ]
        self._topics = {f"{self.prefix}{n}": n for n in names}
        assert self.bootstrap is not None  # set by start() before the reader
        self._reader = kafka_consumer(
            self.bootstrap,
            *self._topics,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await self._reader.start()

    async def run_health_checks(self) -> None:
        """At each ``health-check-fail`` fault's scenario time, run the real health checks on that
        node's simulated inputs (as its prolog / periodic check would) and publish the results to
        ``health`` through a normal producer."""
        if self.phase != "running":
            return
        now_s = (time.time() - self.result.wall_start) * self.speed
        while self._health_faults and self._health_faults[0].at_s <= now_s:
            f = self._health_faults.pop(0)
            if self._health_producer is None:
                bus = BusSettings(bootstrap_servers=self.bootstrap, topic_prefix=self.prefix)
                self._health_producer = Producer(bus)
                await self._health_producer.start()
            clock = ScenarioClock(self.result.sim_start, self.speed, self.result.wall_start)
            for r in await simulated_health_check(self.scenario, clock, f.node, f.at_s):
                await self._health_producer.publish("health", r.node, r)
            await self._health_producer.flush()

    async def poll(self) -> None:
        """Read what the pipeline produced since the last call into ``self.result`` (and run the
        health checks that are due: :meth:`run_health_checks`)."""
        assert self._reader is not None
        await self.run_health_checks()
        batches = await self._reader.getmany(timeout_ms=100, max_records=5000)
        for tp, recs in batches.items():
            short = self._topics.get(tp.topic, tp.topic)
            self.result.counts[short] = self.result.counts.get(short, 0) + len(recs)
            for r in recs:
                self.result.observe(short, r.value)
                if self.on_record is not None:
                    self.on_record(short, r.partition, r.offset, r.value)
                try:
                    if short == "failures":
                        f = Failure.model_validate_json(r.value)
                        self.result.failures[f.failure_id] = f
                        self.result.failure_seen_wall.setdefault(f.failure_id, time.time())
                    elif short == "remediations":
                        self.result.remediations.append(Remediation.model_validate_json(r.value))
                    elif short == "deadletter":
                        self.result.deadletters.append(orjson.loads(r.value))
                except (ValidationError, orjson.JSONDecodeError):
                    self.result.counts["unreadable"] = self.result.counts.get("unreadable", 0) + 1

    def crashed(self) -> list[ServiceProc]:
        return [sp for sp in self.procs if not sp.alive]

    def done(self) -> bool:
        """All expectations found, and every found drain-type failure has a remediation decision."""
        sc = score(self.scenario, list(self.result.failures.values()), self.result.sim_start)
        if not self.scenario.expect or sc["missed"]:
            return False
        decided = {fid for r in self.result.remediations for fid in r.failure_ids}
        needs = [
            f["failure_id"]
            for f in sc["found"]
            if self.result.failures[f["failure_id"]].recommended_action.value in ("drain", "reboot", "rma", "reset-gpu")
        ]
        # and the job verdicts have their windows up to the failures they count (no verdict taken
        # before the XID it must include)
        return all(fid in decided for fid in needs) and self.result.verdicts_settled()

    async def finished(self) -> bool:
        """The run is over, in virtual time (:mod:`.virtual`): the collector published the
        scenario's last tick, every consumer group of the pipeline committed everything (health
        checks due included) and the reader has read all ``failures`` and ``remediations``.
        Checked at most once a second; never a wall-clock deadline."""
        now = time.monotonic()
        if now < self._drain_next or self.phase != "running" or self.bootstrap is None:
            return False
        self._drain_next = now + 1.0
        collector = next((sp for sp in self.procs if sp.name == "collector"), None)
        if collector is None or not await asyncio.to_thread(source_finished, collector.port):
            return False
        if any(f.at_s <= self.scenario.duration_s for f in self._health_faults):
            return False  # still due: run_health_checks publishes them on the next poll
        if self._drain is None:
            self._drain = Drain(self.bootstrap, self.prefix)
            await self._drain.start()
        if not await self._drain.done():
            return False
        assert self._reader is not None
        return await reader_at_end(self._reader, [f"{self.prefix}failures", f"{self.prefix}remediations"])

    def drain_lags(self) -> dict[str, int]:
        """Consumer group -> uncommitted messages, as last seen by :meth:`finished` (empty
        before the collector finished)."""
        return dict(self._drain.last) if self._drain is not None else {}

    async def stop(self) -> None:
        """SIGTERM every service (sources first), wait, SIGKILL stragglers, stop the broker."""
        if self._drain is not None:
            with contextlib.suppress(Exception):
                await self._drain.stop()
            self._drain = None
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader.stop()
            self._reader = None
        if self._health_producer is not None:
            with contextlib.suppress(Exception):
                await self._health_producer.stop()
            self._health_producer = None
        await stop_services(list(reversed(self.procs)))
        if self.broker is not None:
            await asyncio.to_thread(self.broker.stop)
            self.broker = None


def spawn_service(name: str, module: str, env: dict[str, str], log: Path, port: int) -> ServiceProc:
    """Start ``python -m module`` with ``env`` (its /healthz on ``port``), output to ``log``.

    The child gets PR_SET_PDEATHSIG: it is terminated if this process dies.
    """
    sp = ServiceProc(name, module, port, log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        sp.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            env={**env, "GPUWARDEN_HTTP_PORT": str(port)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    return sp


async def wait_healthy(procs: list[ServiceProc], timeout_s: float = 120, t0: float | None = None) -> None:
    """Wait until every process answers /healthz with 200.

    Raises:
        RuntimeError: one exited (its log tail is in the message) or the timeout passed.
    """
    t0 = t0 if t0 is not None else time.time()
    end = time.monotonic() + timeout_s
    pending = list(procs)
    while pending:
        for sp in list(pending):
            if not sp.alive:
                raise RuntimeError(f"{sp.name} exited during start-up:\n{sp.log_tail()}")
            if await asyncio.to_thread(sp.healthy):
                sp.ready_s = round(time.time() - t0, 2)
                pending.remove(sp)
        if time.monotonic() > end:
            raise RuntimeError(f"not healthy within {timeout_s}s: {[p.name for p in pending]}")
        await asyncio.sleep(0.2)


async def stop_services(procs: list[ServiceProc], grace_s: float = 15) -> None:
    """SIGTERM each process in order, wait up to ``grace_s`` in all, then SIGKILL what is left."""
    for sp in procs:
        if sp.alive and sp.proc is not None:
            sp.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for sp in procs:
        if sp.proc is None:
            continue
        try:
            await asyncio.to_thread(sp.proc.wait, max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            sp.proc.kill()
            await asyncio.to_thread(sp.proc.wait, 5)
