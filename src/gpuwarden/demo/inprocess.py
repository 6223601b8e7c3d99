"""Run a scenario through the pipeline's own logic in one process, without Kafka.

The same code the services run — the simulated collector source (fake NVML + kernel-log
generator through the real parsers), the slurm-watcher over the simulated Slurm, the
correlator's message handling (attribution, allocations, job windows) and the detector —
connected by an in-memory router instead of topics. Messages are routed depth-first (a
message's outputs are handled before the next input), i.e. a pipeline without consumer
lag. Deterministic and fast: the scored scenario suite and ``gpuwarden bench detect`` use
it; ``gpuwarden simulate`` runs the real services on a broker.

At a ``health-check-fail`` fault's time the real health checks run on that node's simulated
inputs (:func:`~gpuwarden.sim.health_check.simulated_health_check`: fake NVML, kernel log and
``dcgmi``, the fault failing the node's DCGM diag) and their ``HealthCheckResult`` s go to
``health``, as the node's prolog / periodic check would publish them.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gpuwarden.correlator.core import Correlator, MemoryAllocationStore
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.jobreport import JobReporter, job_report_rows
from gpuwarden.shared.bus import MemoryPublisher, decode
from gpuwarden.shared.models import Failure, dumps
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.sim.collector import SimulatedSource
from gpuwarden.sim.health_check import simulated_health_check
from gpuwarden.sim.slurm import SimulatedSlurm
from gpuwarden.slurm_watcher.service import SlurmWatcher, SlurmWatcherSettings

from .scoring import failure_row, score

__all__ = ["InProcessResult", "SteppedClock", "run_inprocess"]

START = 1_700_000_000.0


class SteppedClock(ScenarioClock):
    """A scenario clock whose "now" is set by the runner, not read from the wall."""

    def __init__(self, start: float) -> None:
        super().__init__(start, 1.0)
        self.t = 0.0

    def scenario_s(self, wall: float | None = None) -> float:
        return self.t


@dataclass
class InProcessResult:
    scenario: Scenario
    sim_start: float
    failures: dict[str, Failure] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    job_reports: JobReporter | None = None

    def report(self) -> dict[str, Any]:
        fails = sorted(self.failures.values(), key=lambda f: (f.first_seen, f.node, f.gpu_index or -1))
        return {
            "scenario": self.scenario.name,
            "runner": "in-process",
            "failures": [failure_row(f, self.sim_start) for f in fails],
            "job_reports": job_report_rows(self.job_reports),
            "remediations": [],
            "score": score(self.scenario, fails, self.sim_start),
            "stats": {**self.counts, "cpu_s": round(self.cpu_s, 3)},
        }


class _Router:
    """Routes messages between the components by short topic name, depth-first."""

    def __init__(self, correlator: Correlator, detector: Detector, result: InProcessResult) -> None:
        self.correlator, self.detector, self.result = correlator, detector, result

    def publish(self, topic: str, value: bytes) -> None:
        self.result.counts[topic] = self.result.counts.get(topic, 0) + 1
        if topic in ("slurm.jobs", "allocations", "gpu.samples", "gpu.events", "gpu.attributed"):
            for out in self.correlator.handle(topic, value):
                self.publish(out.topic, out.value)
        if topic == "deadletter":
            raise RuntimeError(f"in-process pipeline dead-lettered a message: {value[:300]!r}")
        handlers: dict[str, Callable[[Any], list[Failure]]] = {
            "slurm.jobs": self.detector.on_job,
            "slurm.nodes": self.detector.on_node,
            "gpu.attributed": self.detector.on_sample,
            "gpu.events.attributed": self.detector.on_event,
            "job.windows": self.detector.on_window,
            "health": self.detector.on_health,
        }
        handler = handlers.get(topic)
        if handler is None:
            return
        msg = decode(topic, value)
        if self.result.job_reports is not None:
            self.result.job_reports.observe(msg)
        for f in handler(msg):
            if self.result.job_reports is not None:
                self.result.job_reports.observe(f)
            self.result.failures[f.failure_id] = f
            self.result.counts["failures"] = self.result.counts.get("failures", 0) + 1

    def publish_models(self, topic: str, values: Iterable[BaseModel]) -> None:
        for v in values:
            self.publish(topic, dumps(v))


def run_inprocess(scenario: Scenario, poll_s: float = 1.0, price: float | None = None) -> InProcessResult:
    """Run ``scenario`` tick by tick (``tick_s``) to ``duration_s``, as the services would.

    Args:
        poll_s: how often (scenario seconds) the watcher polls the simulated Slurm.
        price: USD per GPU-hour (default: the scenario's).
    """
    return asyncio.run(_run(scenario, poll_s, price))


async def _run(scenario: Scenario, poll_s: float, price: float | None) -> InProcessResult:
    cpu0 = time.process_time()
    clock = SteppedClock(START)
    result = InProcessResult(scenario, START)
    detector = Detector(load_catalog(), price if price is not None else scenario.cluster.price_usd_per_gpu_hour)
    result.job_reports = JobReporter(detector.price)
    correlator = Correlator(MemoryAllocationStore(), lambda s: s)
    router = _Router(correlator, detector, result)
    source = SimulatedSource(scenario, clock, collector_id="inprocess")
    with tempfile.TemporaryDirectory(prefix="gpuwarden-inproc-") as tmp:
        slurm = SimulatedSlurm(scenario, clock, Path(tmp) / "slurm.json")
        watch_out = MemoryPublisher()
        watcher = SlurmWatcher(
            SlurmWatcherSettings(),
            client=slurm,
            producer=watch_out,  # type: ignore[arg-type]
            now=lambda: clock.event_ts(clock.t),
        )
        health_faults = sorted((f for f in scenario.faults if f.kind == "health-check-fail"), key=lambda f: f.at_s)
        next_poll = 0.0
        t = 0.0
        while t <= scenario.duration_s:
            clock.t = t
            if t >= next_poll:
                await watcher.poll_once()
                for topic, _key, value in watch_out.sent:
                    router.publish(topic, dumps(value))
                watch_out.sent.clear()
                next_poll = t + poll_s
            while health_faults and health_faults[0].at_s <= t:
                f = health_faults.pop(0)
                router.publish_models("health", await simulated_health_check(scenario, clock, f.node, f.at_s))
            router.publish_models("gpu.samples", source.collect_sync())
            router.publish_models("gpu.events", await source.events())
            t = round(t + scenario.tick_s, 6)
        await source.close()
    result.cpu_s = time.process_time() - cpu0
    return result
