"""``gpuwarden bench collector``: CPU cost of one collector tick on a node with 8 GPUs.

Reads the fake NVML (:class:`~gpuwarden.sim.nvml.FakeNvml`, HGX H100 values, training job,
18 NVLinks per GPU) through the real :class:`~gpuwarden.collector.sources.NvmlSource`, serialises
each sample to JSON as the publisher does, and prints CPU time per tick, ticks per second,
messages/s and bytes per sample, and the process's peak RSS, against the targets
(<= 1 % of one core at 1 Hz, i.e. <= 10 ms CPU per tick, and <= 80 MiB RSS).
Prints figures only; asserts nothing.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Annotated

import typer

__all__ = ["bench_collector"]


def bench_collector(
    ticks: Annotated[int, typer.Option(min=1, help="Ticks to measure")] = 300,
    gpus: Annotated[int, typer.Option(min=1, max=64, help="GPUs on the node")] = 8,
    nodes: Annotated[int, typer.Option(min=1, help="Simulated nodes read per tick (fleet simulator cost)")] = 1,
) -> None:
    """Print CPU time per tick, messages/s and RSS of the collector reading fake NVML."""
    from gpuwarden.shared.models import dumps
    from gpuwarden.shared.scenario import ScenarioClock
    from gpuwarden.sim.collector import SimulatedSource, training_scenario

    sc = training_scenario("bench", nodes, gpus, ticks + 10)
    src = SimulatedSource(sc, ScenarioClock(1_700_000_000.0), collector_id="bench")
    src.collect_sync()  # first tick: init, NVLink probe
    nbytes = 0
    msgs = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(ticks):
        for s in src.collect_sync():
            nbytes += len(dumps(s))
            msgs += 1
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    per_tick_ms = cpu / ticks * 1000
    per_node_ms = per_tick_ms / nodes
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_mib = rss_kib / 1024 if sys.platform != "darwin" else rss_kib / 1024 / 1024
    calls = sum(f.calls for f in src.fakes.values())
    print(f"collector bench: {nodes} node(s) x {gpus} GPUs, {ticks} ticks, fake NVML ({calls} NVML calls)")
    print(
        f"  CPU per tick (per node):  {per_node_ms:.3f} ms  = {per_node_ms / 10:.3f} % of one core at 1 Hz "
        f"(target <= 1 %: {'OK' if per_node_ms <= 10 else 'OVER'})"
    )
    print(f"  CPU per tick (all nodes): {per_tick_ms:.3f} ms")
    print(f"  messages/s (CPU-bound):   {msgs / cpu if cpu else float('inf'):.0f}  (wall {msgs / wall:.0f})")
    print(f"  bytes per NodeSample:     {nbytes / max(msgs, 1):.0f}")
    print(f"  peak RSS:                 {rss_mib:.1f} MiB (target <= 80 MiB: {'OK' if rss_mib <= 80 else 'OVER'})")
