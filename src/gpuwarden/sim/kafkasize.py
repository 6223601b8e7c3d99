"""Measured message sizes for ``gpuwarden topics plan``: what the collector, the correlator and
its changelog put on Kafka for one simulated node, encoded by gpuwarden's own codec.

One node of ``gpus_per_node`` simulated H100 GPUs runs a training job for ``ticks`` seconds
through the collector's real NVML source (:class:`~gpuwarden.sim.collector.SimulatedSource`,
NVLink state and counters every ``nvlink_every``-th tick as the collector's
``GPUWARDEN_COLLECTOR_NVLINK_EVERY`` reads them: 1, every tick, is the NVML collector's default)
and the correlator's window code.
"""

from __future__ import annotations

import asyncio
import gzip
import statistics
from typing import Any

import orjson

from gpuwarden.shared.models import AttributedSample, GpuAttribution, dumps
from gpuwarden.shared.scenario import ScenarioClock

__all__ = ["measure_sizes"]

START = 1_750_000_000.0


def measure_sizes(gpus_per_node: int = 8, ticks: int = 60, nvlink_every: int = 1) -> dict[str, float]:
    """Mean encoded bytes per message of ``gpu.samples``, ``gpu.attributed``, ``job.windows``
    and ``correlator.windows`` (one node's changelog snapshot) for one node of ``gpus_per_node``
    GPUs over ``ticks`` 1 s ticks with NVLinks read every ``nvlink_every``-th tick, and
    ``gzip_ratio``: raw / gzip (level 6) bytes of a batch of the last 50 samples (Kafka
    compresses per record batch; one node's batch is the worst case, a batch of many nodes
    compresses better).

    Raises:
        ValueError: ``gpus_per_node``, ``ticks`` or ``nvlink_every`` < 1.
    """
    if gpus_per_node < 1 or ticks < 1 or nvlink_every < 1:
        raise ValueError("gpus_per_node, ticks and nvlink_every must be >= 1")
    from gpuwarden.correlator.windows import close_due, fold_sample

    from .collector import SimulatedSource, training_scenario

    sc = training_scenario("sizes", 1, gpus_per_node, ticks, job_id=4242)
    src = SimulatedSource(sc, ScenarioClock(START), nvlink_every=nvlink_every)
    samples: list[bytes] = []
    attributed: list[bytes] = []
    links: list[bool] = []  # per sample: it carries the NVLink counters
    windows: list[bytes] = []
    snapshots: list[int] = []
    state: dict[str, Any] | None = None

    async def run() -> None:
        nonlocal state
        for _ in range(ticks):
            for s in await src.collect():
                jobs = [
                    GpuAttribution(gpu_index=g.index, job_id="4242", user="alice", partition="gpu",
                                   job_start_ts=START, job_gpus=gpus_per_node)
                    for g in s.gpus
                ]  # fmt: skip
                samples.append(dumps(s))
                links.append(any(g.nvlinks is not None for g in s.gpus))
                attributed.append(dumps(AttributedSample(sample=s, jobs=jobs)))
                step = fold_sample(state, s, jobs, in_place=True)
                state = step.state
                windows.extend(dumps(w) for w in step.closed)
                if state is not None:
                    step = close_due(state, 5.0, in_place=True)
                    state = step.state
                    windows.extend(dumps(w) for w in step.closed)
                    snapshots.append(len(orjson.dumps(state)))
        await src.close()

    asyncio.run(run())

    def mean(sizes: list[bytes]) -> float:
        # exactly one sample in nvlink_every with the counters (the ticks a logger gap skips
        # would otherwise shift the share)
        full = [len(b) for b, has in zip(sizes, links, strict=True) if has]
        lean = [len(b) for b, has in zip(sizes, links, strict=True) if not has]
        if not full or not lean:
            return statistics.fmean(map(len, sizes))
        return (statistics.fmean(full) + (nvlink_every - 1) * statistics.fmean(lean)) / nvlink_every

    batch = b"".join(samples[-50:])
    return {
        "gzip_ratio": len(batch) / len(gzip.compress(batch, compresslevel=6)),
        "gpu.samples": mean(samples),
        "gpu.attributed": mean(attributed),
        "job.windows": statistics.fmean(map(len, windows)) if windows else 0.0,
        "correlator.windows": statistics.fmean(snapshots) if snapshots else 0.0,
    }
