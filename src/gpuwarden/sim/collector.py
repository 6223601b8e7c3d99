"""The simulated fleet's collector source: :class:`SimulatedSource`, every GPU of a scenario's
nodes through one :class:`~gpuwarden.sim.nvml.FakeNvml` per node and the real
:class:`~gpuwarden.collector.sources.NvmlSource`, plus the nodes' kernel-log lines
(:class:`~gpuwarden.sim.kernel_log.KernelLogGenerator`) through the real parser.

:func:`simulated_source` is what ``GPUWARDEN_COLLECTOR_SOURCE=simulated`` runs (entry point
``gpuwarden.collector_sources: simulated``, looked up by the collector service).
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import hostlist

from gpuwarden.collector.settings import CollectorSettings
from gpuwarden.collector.sources import NvmlSource, default_collector_id
from gpuwarden.shared.models import GpuEvent, NodeSample
from gpuwarden.shared.scenario import Cluster, Scenario, ScenarioClock, load_scenario

from .kernel_log import KernelLogGenerator
from .nvml import FakeNvml

log = logging.getLogger(__name__)

__all__ = ["SIM_NVLINK_EVERY", "SimulatedSource", "logger_gaps", "simulated_source", "training_scenario"]


def training_scenario(name: str, nodes: int, gpus: int, duration_s: int, job_id: int = 1) -> Scenario:
    """``nodes`` nodes (``gpu-node-001`` ...) of ``gpus`` H100 GPUs, all in one training job
    (``job_id``, user ``alice``) from second 0 to ``duration_s`` (s), no fault, seed 1: the
    healthy busy node whose samples the collector and pipeline benchmarks and the Kafka plan's
    sizes measure."""
    return Scenario.model_validate(
        {
            "name": name,
            "seed": 1,
            "duration_s": duration_s,
            "cluster": {"nodes": nodes, "gpus_per_node": gpus},
            "jobs": [
                {
                    "id": job_id,
                    "nodes": hostlist.collect_hostlist(Cluster(nodes=nodes, gpus_per_node=gpus).node_names()),
                    "gpus_per_node": gpus,
                    "start_s": 0,
                    "end_s": duration_s,
                    "profile": "training",
                    "user": "alice",
                }
            ],
        }
    )


def logger_gaps(seed: int, node: str, duration_s: float) -> list[tuple[float, float]]:
    """Scenario-second intervals ``[start, end)`` in which ``node``'s collector skips its ticks (a
    busy or descheduled logger, as real recordings show): half the nodes (by seed) have none; the
    others a 1-7 s gap every 30-60 s. Deterministic; far below telemetry-silent's 30 s."""
    r = random.Random(f"{seed}/{node}/gaps")
    if r.random() < 0.5:
        return []
    out = []
    t = r.uniform(30, 60)
    while t < duration_s:
        length = float(r.randint(1, 7))
        out.append((t, t + length))
        t += length + r.uniform(30, 60)
    return out


#: Default ``nvlink_every`` of the simulated collector: NVLink (90 of the ~130 fake NVML calls
#: per GPU per tick) is read every 5th tick, which keeps a node-tick well under 1 ms.
SIM_NVLINK_EVERY = 5


class SimulatedSource:
    """All GPUs of the scenario's nodes (or ``nodes``), one :class:`FakeNvml` per node read
    through :class:`NvmlSource`, plus the nodes' kernel-log lines through the real parser.

    Each ``collect()`` is one tick: scenario second ``t`` = 0, tick_s, 2*tick_s, ... with
    event time ``clock.event_ts(t)``; ``next_due()`` gives its wall time, None after
    ``duration_s``. A node under ``telemetry-silent`` produces no sample while it lasts, and a
    node skips the ticks inside its :func:`logger_gaps` (no sample; its kernel-log lines still
    come, as the kernel log is read separately).
    """

    name = "simulated"

    def __init__(
        self,
        scenario: Scenario,
        clock: ScenarioClock,
        nodes: list[str] | None = None,
        collector_id: str | None = None,
        nvlink_every: int = SIM_NVLINK_EVERY,
        resume: bool = False,
    ) -> None:
        """``nvlink_every``: NVLink state and counters are read every this many ticks
        (:class:`~gpuwarden.collector.sources.NvmlSource`); raises ValueError if < 1.

        ``resume``: a collector (re)started while the scenario runs takes its first sample at the
        scenario's current tick on ``clock`` (as a real collector samples "now": the ticks while it
        was down are never taken), not at second 0 (a burst replaying every tick so far). The
        kernel log is still read from its start, as a collector without a saved ``/dev/kmsg``
        position reads the ring buffer: events repeat with their own ids (consumers dedupe)."""
        self.scenario = scenario
        self.clock = clock
        all_nodes = scenario.cluster.node_names()
        if nodes is not None:
            unknown = sorted(set(nodes) - set(all_nodes))
            if unknown:
                raise ValueError(f"nodes not in scenario {scenario.name!r}: {unknown}")
        self.nodes = [n for n in all_nodes if nodes is None or n in set(nodes)]
        self.t = 0.0
        if resume:
            now = clock.scenario_s()
            if now > 0:
                self.t = min(math.ceil(now / scenario.tick_s) * scenario.tick_s, scenario.duration_s + scenario.tick_s)
                log.info("simulated source resumes at scenario second %.0f (not taken while down: before it)", self.t)
        self._prev = -1.0
        cid = collector_id or default_collector_id()
        self.fakes = {n: FakeNvml(scenario, clock, n) for n in self.nodes}
        self.logs = {n: KernelLogGenerator(scenario, clock, n) for n in self.nodes}
        self.sources = {
            n: NvmlSource(
                self.fakes[n],
                n,
                self._event_ts,
                collector_id=cid,
                sample_source="simulated",
                event_source="simulated",
                nvlink_every=nvlink_every,
            )
            for n in self.nodes
        }
        self._pending: list[GpuEvent] = []
        self.gaps = {n: logger_gaps(scenario.seed, n, scenario.duration_s) for n in self.nodes}
        silent = [f for f in scenario.faults if f.kind == "telemetry-silent"]
        self._silent = {n: [f for f in silent if f.node == n] for n in self.nodes}

    @classmethod
    def for_hostlist(cls, scenario: Scenario, clock: ScenarioClock, expr: str | None, **kw: Any) -> SimulatedSource:
        """Build for the nodes of a Slurm hostlist expression (``gpu-node-[001-004]``), all if None."""
        nodes = list(hostlist.expand_hostlist(expr)) if expr else None
        return cls(scenario, clock, nodes, **kw)

    def _event_ts(self) -> float:
        return self.clock.event_ts(self.t)

    def next_due(self) -> float | None:
        if self.t > self.scenario.duration_s:
            return None
        return self.clock.wall_of(self.t)

    async def collect(self) -> list[NodeSample]:
        return self.collect_sync()

    def collect_sync(self) -> list[NodeSample]:
        t = self.t
        out = []
        for n in self.nodes:
            src = self.sources[n]
            if not any(a <= t < b for a, b in self.gaps[n]):
                fake = self.fakes[n]
                fake.t = t
                sample = src.collect_sync()
                if not any(f.active(t) for f in self._silent[n]):
                    out.append(sample)
            self._pending.extend(src.parse_lines(self.logs[n].lines(self._prev, t)))
        self._prev = t
        self.t = t + self.scenario.tick_s
        return out

    async def events(self) -> list[GpuEvent]:
        out, self._pending = self._pending, []
        for src in self.sources.values():
            out.extend(await src.events())
        out.sort(key=lambda e: e.ts)
        return out

    async def close(self) -> None:
        for src in self.sources.values():
            await src.close()


def simulated_source(settings: CollectorSettings) -> SimulatedSource:
    """The collector's ``simulated`` source: :class:`SimulatedSource` of ``collector_scenario``
    (YAML path) for the nodes of ``collector_nodes`` (a Slurm hostlist, all if unset) on
    ``ScenarioClock.from_env()``; ``collector_nvlink_every`` when set, else
    :data:`SIM_NVLINK_EVERY`.

    Raises:
        FileNotFoundError: the scenario file does not exist.
        ValueError: the scenario is invalid, or names no such nodes.
    """
    assert settings.collector_scenario is not None  # checked by the settings validator
    scenario = load_scenario(settings.collector_scenario)
    kw: dict[str, Any] = {"nvlink_every": settings.collector_nvlink_every} if settings.collector_nvlink_every else {}
    return SimulatedSource.for_hostlist(
        scenario, ScenarioClock.from_env(), settings.collector_nodes, resume=settings.collector_sim_resume, **kw
    )
