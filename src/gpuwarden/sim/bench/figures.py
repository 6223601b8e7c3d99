"""The figures of ``gpuwarden bench pipeline``: pure helpers (percentiles, rates, lag series,
per-process CPU and RSS from ``/proc``), the run's result and its printed report lines.

Kept apart from :mod:`gpuwarden.sim.bench.pipeline` (which starts the broker, the services and
the load) so they are unit-tested without a broker.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CPU_MULTIPLE_TARGETS",
    "BenchResult",
    "LagSeries",
    "cpu_budget",
    "cpu_ms_per_1000",
    "cpu_multiples",
    "cpu_seconds",
    "machine_cores",
    "percentile",
    "rate",
    "ratio",
    "raw_cpu_line",
    "raw_floor_line",
    "report",
    "rss_mib",
    "stage_cpu_ms",
    "summarise_latencies",
]


# -- pure helpers (unit-tested) ------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} not in [0, 100]")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def rate(points: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Growth per second of a monotonic counter sampled as ``(time, value)`` between the last
    point at or before ``t0`` and the last point at or before ``t1``; None without two points."""
    before = [p for p in points if p[0] <= t0]
    upto = [p for p in points if p[0] <= t1]
    if not before or not upto or upto[-1][0] <= before[-1][0]:
        return None
    (ta, va), (tb, vb) = before[-1], upto[-1]
    return (vb - va) / (tb - ta)


def summarise_latencies(sent: dict[str, float], seen: dict[str, float]) -> dict[str, Any]:
    """Latencies (s) of the keys of ``sent`` that were ``seen``: count, missing, p50, p99, max."""
    lat = [seen[k] - sent[k] for k in sent if k in seen]
    return {
        "n": len(lat),
        "missing": len(sent) - len(lat),
        "p50_s": percentile(lat, 50),
        "p99_s": percentile(lat, 99),
        "max_s": max(lat) if lat else None,
    }


@dataclass
class LagSeries:
    """Committed offsets of one consumer group on one topic, and its lag, over time."""

    committed: list[tuple[float, float]] = field(default_factory=list)
    lag: list[tuple[float, float]] = field(default_factory=list)

    def add(self, t: float, end: int, committed: int) -> None:
        self.committed.append((t, float(committed)))
        self.lag.append((t, float(max(0, end - committed))))

    def max_lag(self, t0: float = -math.inf, t1: float = math.inf) -> float | None:
        xs = [v for t, v in self.lag if t0 <= t <= t1]
        return max(xs) if xs else None

    def lag_at(self, t: float) -> float | None:
        xs = [v for tt, v in self.lag if tt <= t]
        return xs[-1] if xs else None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far, s (``utime + stime`` of
    ``/proc/<pid>/stat``, Linux); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def rss_mib(pid: int) -> float | None:
    """Resident set size of process ``pid`` (``VmRSS`` of ``/proc/<pid>/status``, Linux), MiB;
    None when the process is gone or the field is absent."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class BenchResult:
    nodes: int
    gpus: int
    hz: float
    services: list[str]
    #: the load's NVLink cadence: the 18 NVLinks' counters in every this many ticks' samples
    #: (the collector's ``GPUWARDEN_COLLECTOR_NVLINK_EVERY``)
    nvlink_every: int = 1
    offered_node_samples: int = 0
    producer_behind_s: float = 0.0
    t_measure: tuple[float, float] = (0.0, 0.0)
    series: dict[str, LagSeries] = field(default_factory=dict)
    xid_sent: dict[str, float] = field(default_factory=dict)
    xid_sent_node: dict[str, float] = field(default_factory=dict)
    failure_seen: dict[str, float] = field(default_factory=dict)
    drain_seen: dict[str, float] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    drained_after_s: float | None = None
    raw_rate: float | None = None
    raw_json_rate: float | None = None
    raw_messages: int = 0
    #: CPU of the raw consume (aiokafka + ``orjson.loads`` of every value, a process of its own)
    #: per 1,000 GPU samples it consumed, ms (:func:`cpu_ms_per_1000`); None when not measured.
    raw_cpu_ms: float | None = None
    profile: str | None = None
    #: service -> largest resident set size seen during the run, MiB (sampled every second).
    rss_mib: dict[str, float] = field(default_factory=dict)
    #: process (a service's worker, "load", "broker") -> (time, CPU s used so far), sampled every second.
    cpu: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: process name -> the service it is a worker of ("correlator-2" -> "correlator"); a name
    #: missing here is its own service.
    kinds: dict[str, str] = field(default_factory=dict)
    #: cores this process may run on (None: unknown).
    cores: int | None = None

    def kind(self, process: str) -> str:
        return self.kinds.get(process, process)


def machine_cores() -> int | None:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


#: Services whose work grows with the GPU samples they commit (the ones scaled to the offered rate
#: by :func:`cpu_budget`); the others (events lane, remediator, load, broker) count as measured.
SAMPLE_STAGES = ("correlator", "detector", "otlp-bridge")

#: Each sample stage's CPU per 1,000 GPU samples at most this multiple of the raw consume's (the
#: issue "the benchmark says where each stage stands"): what :func:`raw_cpu_line` compares with.
CPU_MULTIPLE_TARGETS: dict[str, float] = {"correlator": 8.0, "detector": 6.0, "otlp-bridge": 4.0}


def cpu_ms_per_1000(cpu_s: float | None, gpu_samples: int) -> float | None:
    """CPU ms per 1,000 GPU samples: ``cpu_s`` CPU-seconds spent on ``gpu_samples`` GPU samples;
    None when either is missing or nothing was consumed."""
    if cpu_s is None or gpu_samples <= 0:
        return None
    return cpu_s / gpu_samples * 1e6


def _cores_used(res: BenchResult) -> tuple[dict[str, float], dict[str, int]]:
    """Cores each service (all its workers together) used in the measured window, and its workers."""
    t0, t1 = res.t_measure
    used: dict[str, float] = {}
    workers: dict[str, int] = {}
    for proc, points in res.cpu.items():
        c = rate(points, t0, t1)
        if c is None:
            continue
        k = res.kind(proc)
        used[k] = used.get(k, 0.0) + c
        workers[k] = workers.get(k, 0) + 1
    return used, workers


def stage_cpu_ms(res: BenchResult) -> dict[str, float]:
    """Each sample stage's CPU per 1,000 GPU samples it committed in the measured window, ms (all
    its workers together); a stage whose CPU or committed offsets have no rate is left out."""
    t0, t1 = res.t_measure
    used, _ = _cores_used(res)
    out: dict[str, float] = {}
    for k in SAMPLE_STAGES:
        r = rate(res.series[k].committed, t0, t1) if k in res.series else None
        if k in used and r:
            out[k] = used[k] / (r * res.gpus) * 1e6
    return out


def cpu_multiples(raw_ms: float | None, stage_ms: dict[str, float]) -> dict[str, float | None]:
    """Each stage's CPU per 1,000 GPU samples as a multiple of the raw consume's (None when
    the raw consume's is missing or not positive)."""
    return {k: ratio(v, raw_ms) for k, v in stage_ms.items()}


def raw_cpu_line(raw_ms: float | None, stage_ms: dict[str, float], stages: Sequence[str]) -> str:
    """The raw consume's CPU per 1,000 GPU samples and each of ``stages`` as a multiple of it,
    with its target (:data:`CPU_MULTIPLE_TARGETS`); ``n/a`` for a stage without a cost."""
    mult = cpu_multiples(raw_ms, stage_ms)
    parts = []
    for i, k in enumerate(stages):
        t = CPU_MULTIPLE_TARGETS.get(k)
        target = "" if t is None else f" ({'target ' if i == 0 else ''}<= {t:g}x)"
        parts.append(f"{k} {_fmt(mult.get(k), 'x', '.1f')}{target}")
    return (
        f"raw consume CPU per 1,000 GPU samples: {_fmt(raw_ms, ' ms', '.2f')} (aiokafka + orjson); "
        f"stages as a multiple of it: {', '.join(parts) or 'n/a'}"
    )


def raw_floor_line(raw_ms: float | None, stages: Sequence[str], offered: float, cores: int | None) -> str | None:
    """The least CPU the sample path can cost at the offered rate: each of ``stages`` reads every
    GPU sample, so each costs at least one raw consume (``raw_ms`` per 1,000 GPU samples) with
    no work of its own, before the broker and the load generator. ``offered``: GPU samples/s.
    None without a raw figure or a stage."""
    if raw_ms is None or raw_ms <= 0 or not stages or offered <= 0:
        return None
    each = raw_ms / 1000 / 1000 * offered  # cores: raw CPU-s per GPU sample x GPU samples/s
    have = "n/a" if cores is None else str(cores)
    return (
        f"floor at the offered {offered:,.0f} GPU samples/s: {len(stages)} sample stage"
        f"{'s' if len(stages) != 1 else ''} that each read every sample need >= {each * len(stages):.2f} cores "
        f"for the raw consume alone ({each:.2f} each), before any work of their own, the broker and the load; "
        f"this machine has {have}"
    )


def cpu_budget(res: BenchResult) -> list[str]:
    """Two lines: each sample stage's CPU per 1,000 GPU samples it committed in the measured
    window (ms, all its workers together), and the cores the path needs at the offered rate:
    the sample stages scaled from that cost, everything else (events lane, remediator, load
    generator, broker) as measured, so the total is a lower bound (the broker's work grows with
    the samples too). Empty when the CPU or the committed offsets were not sampled."""
    t0, t1 = res.t_measure
    used, workers = _cores_used(res)
    committed = {svc: rate(s.committed, t0, t1) for svc, s in res.series.items()}
    offered = res.nodes * res.gpus * res.hz
    costs: list[str] = []
    need: dict[str, float] = {}
    stalled: list[str] = []
    for k, cores in used.items():
        r = committed.get(k)
        if k in SAMPLE_STAGES and r:
            per_sample = cores / (r * res.gpus)  # CPU-s per GPU sample
            n = workers[k]
            costs.append(f"{k} {per_sample * 1e6:.1f} ms ({n} worker{'s' if n != 1 else ''})")
            need[k] = per_sample * offered
        else:
            if k in SAMPLE_STAGES:
                stalled.append(k)  # committed nothing: no cost to scale, so counted as measured
            need[k] = cores
    if not costs:
        return []
    total = sum(need.values())
    have = "n/a" if res.cores is None else str(res.cores)
    parts = ", ".join(
        f"{k} {v:.2f}{' (committed nothing: as measured)' if k in stalled else ''}" for k, v in need.items()
    )
    return [
        f"cpu per 1,000 GPU samples committed (measured window): {', '.join(costs)}",
        f"cores needed at the offered {offered:,.0f} GPU samples/s: {parts}; total >= {total:.2f} "
        f"(sample stages scaled by their cost, the rest as measured), this machine has {have}",
    ]


def _fmt(x: float | None, unit: str = "", spec: str = ",.0f") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def report(res: BenchResult) -> list[str]:
    """The figures as printable lines."""
    t0, t1 = res.t_measure
    g = res.gpus
    lines = [f"services in the path: load generator (stands in for collectors) -> {' -> '.join(res.services)}"]
    offered = res.nodes * g * res.hz
    lines.append(
        f"offered: {offered:,.0f} GPU samples/s ({res.nodes} nodes x {g} GPUs x {res.hz} Hz); "
        f"produced {res.offered_node_samples:,} NodeSamples, producer worst lateness {res.producer_behind_s:.2f} s"
    )
    rates: dict[str, float | None] = {}
    for svc, s in res.series.items():
        r = rate(s.committed, t0, t1)
        rates[svc] = r * g if r is not None else None
        lines.append(
            f"  {svc:<11} {_fmt(rates[svc])} GPU samples/s committed during the measured window; "
            f"max lag {_fmt(s.max_lag(t0, t1))} msgs (window), {_fmt(s.max_lag())} msgs (whole run), "
            f"lag at end of load {_fmt(s.lag_at(t1))}"
        )
    core = [v for k, v in rates.items() if k in ("correlator", "detector")]
    pipe = min((v for v in core if v is not None), default=None)
    lines.append(f"pipeline (min of correlator, detector): {_fmt(pipe)} GPU samples/s   [target >= 25,000]")
    if "otlp-bridge" in rates:
        lines.append(f"  with otlp-bridge: {_fmt(min((v for v in rates.values() if v is not None), default=None))}")
    lines.append(
        f"drained (all lag 0, all drains decided) {_fmt(res.drained_after_s, ' s', '.1f')} after the load ended"
    )
    f = summarise_latencies(res.xid_sent, res.failure_seen)
    d = summarise_latencies(res.xid_sent_node, res.drain_seen)
    lines.append(
        f"XID -> failures: n={f['n']} missing={f['missing']} p50 {_fmt(f['p50_s'], ' s', '.3f')} "
        f"p99 {_fmt(f['p99_s'], ' s', '.3f')} max {_fmt(f['max_s'], ' s', '.3f')}   [target p99 <= 1 s]"
    )
    lines.append(
        f"XID -> remediations: n={d['n']} missing={d['missing']} p50 {_fmt(d['p50_s'], ' s', '.3f')} "
        f"p99 {_fmt(d['p99_s'], ' s', '.3f')} max {_fmt(d['max_s'], ' s', '.3f')} decisions {res.decisions}"
        "   [target p99 <= 2 s]"
    )
    raw = res.raw_rate * g if res.raw_rate else None
    rawj = res.raw_json_rate * g if res.raw_json_rate else None
    lines.append(
        f"raw aiokafka consume of gpu.samples ({res.raw_messages:,} msgs): {_fmt(raw)} GPU samples/s bytes only, "
        f"{_fmt(rawj)} with orjson.loads"
    )
    r1, r2 = ratio(pipe, raw), ratio(pipe, rawj)
    lines.append(f"ratio pipeline/raw: {_fmt(r1, '', '.3f')} (bytes), {_fmt(r2, '', '.3f')} (orjson)")
    if res.cpu:
        cores = {k: rate(v, t0, t1) for k, v in res.cpu.items()}
        used = ", ".join(f"{k} {v:.2f}" for k, v in cores.items() if v is not None)
        lines.append(f"cpu (cores used during the measured window, of {res.cores or os.cpu_count()}): {used}")
        lines += cpu_budget(res)
    if res.raw_cpu_ms is not None:
        stages = [s for s in SAMPLE_STAGES if s in res.services]
        lines.append(raw_cpu_line(res.raw_cpu_ms, stage_cpu_ms(res), stages))
        floor = raw_floor_line(res.raw_cpu_ms, stages, offered, res.cores)
        if floor:
            lines.append(floor)
    if res.rss_mib:
        mem = ", ".join(f"{k} {v:,.0f} MiB" for k, v in res.rss_mib.items())
        lines.append(f"memory (largest RSS during the run, {res.nodes:,} nodes): {mem}")
    return lines
