"""``gpuwarden analyze``: a recording people already have, through the detector, in event time.

A recording (``nvidia-smi --query-gpu`` CSV logs, ``nvidia-smi dmon``, dcgm-exporter scrapes,
``nvidia-smi -q -x`` captures, kernel logs; read by :mod:`gpuwarden.collector.recordings`)
runs through the same correlator and detector code as the services, connected in memory:
the recording is one Slurm job holding every GPU it names, from its first to its last
sample (unless ``--job-id``/``--no-job`` say otherwise). Only sample timestamps drive the
detector, so the verdicts do not depend on how fast this runs.

What a recording lacks stays absent. ``--gpu-model`` fills the power limit, maximum SM clock
and memory size from the model's spec sheet where the recording has none; the report lists
every value so assumed, and each finding whose evidence needs a field the recording lacks
says so in ``cannot_determine``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.correlator.core import Correlator, MemoryAllocationStore
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.jobreport import JobReporter
from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import (
    Failure,
    GpuEvent,
    JobState,
    NodeSample,
    dumps,
)

from .scoring import failure_row

__all__ = [
    "AnalyzeResult",
    "analyze_recording",
    "fill_from_spec",
    "index_by_pci",
    "missing_inputs",
    "recording_job",
    "span",
    "with_missing_inputs",
]

#: What each condition signal type needs from the recording to decide, and what the finding
#: cannot tell when the field is absent (GpuSample field names).
_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "straggler-gpu": (("sm_clock_mhz", "the recording has no SM clocks: GPUs were compared by power only"),),
    "straggler-node": (("sm_clock_mhz", "the recording has no SM clocks: nodes were compared by power only"),),
    "hang": (("power_limit_w", "the recording has no power limit: idle power was judged from the model's spec"),),
    "pauses": (("power_w", "the recording has no power draw: a collective wait cannot be told from a busy GPU"),),
    "clock-low": (
        ("throttle_reasons", "the recording has no throttle reasons: a power or thermal cap cannot be told apart"),
    ),
    "idle": (("memory_used_mib", "the recording has no memory use: whether a process holds the GPU is unknown"),),
    "partial-idle": (
        ("memory_used_mib", "the recording has no memory use: whether a process holds the GPU is unknown"),
    ),
}


def missing_inputs(signal_type: str, fields: frozenset[str]) -> list[str]:
    """``cannot_determine`` lines for a condition of ``signal_type`` on a recording with ``fields``."""
    return [why for f, why in _NEEDS.get(signal_type, ()) if f not in fields]


def fill_from_spec(
    samples: Sequence[NodeSample], fields: frozenset[str], spec: Any | None
) -> tuple[list[NodeSample], dict[str, float]]:
    """Fill the power limit (W), max SM clock (MHz) and memory total (MiB) a recording lacks
    from a GPU spec (an object with ``power_limit_w``, ``max_sm_clock_mhz``, ``memory_total_mib``).

    Returns:
        The samples (new objects where something was filled) and ``{field: assumed value}``.
    """
    if spec is None:
        return list(samples), {}
    assumed: dict[str, float] = {}
    for f in ("power_limit_w", "max_sm_clock_mhz", "memory_total_mib"):
        v = getattr(spec, f, None)
        if f not in fields and v:
            assumed[f] = float(v)
    if not assumed:
        return list(samples), {}
    out = []
    for s in samples:
        gpus = [g.model_copy(update={k: v for k, v in assumed.items() if getattr(g, k) is None}) for g in s.gpus]
        out.append(s.model_copy(update={"gpus": gpus}))
    return out, assumed


@dataclass
class AnalyzeResult:
    """Failures (latest version of each) and what was read."""

    start_ts: float
    end_ts: float
    job: JobState | None
    failures: dict[str, Failure] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    reporter: JobReporter | None = None

    def sorted_failures(self) -> list[Failure]:
        return sorted(self.failures.values(), key=lambda f: (f.first_seen, f.node, f.gpu_index or -1, f.pattern))

    def rows(self) -> list[dict[str, Any]]:
        return [failure_row(f, self.start_ts) for f in self.sorted_failures()]


class _Pipe:
    """Correlator -> detector in memory, depth-first (a pipeline without consumer lag)."""

    def __init__(self, correlator: Correlator, detector: Detector, result: AnalyzeResult) -> None:
        self.correlator, self.detector, self.result = correlator, detector, result

    def publish(self, topic: str, value: bytes) -> None:
        c = self.result.counts
        c[topic] = c.get(topic, 0) + 1
        if topic in ("slurm.jobs", "allocations", "gpu.samples", "gpu.events"):
            for out in self.correlator.handle(topic, value):
                self.publish(out.topic, out.value)
        if topic == "deadletter":
            raise ValueError(f"the recording produced an invalid message: {value[:300]!r}")
        handler = {
            "slurm.jobs": self.detector.on_job,
            "gpu.attributed": self.detector.on_sample,
            "gpu.events.attributed": self.detector.on_event,
            "job.windows": self.detector.on_window,
        }.get(topic)
        if handler is None:
            return
        msg = decode(topic, value)
        if self.result.reporter is not None and topic in ("slurm.jobs", "job.windows"):
            self.result.reporter.observe(msg)
        for f in handler(msg):  # type: ignore[operator]
            self.result.failures[f.failure_id] = f
            c["failures"] = c.get("failures", 0) + 1
            if self.result.reporter is not None:
                self.result.reporter.observe(f)


def analyze_recording(
    samples: Sequence[NodeSample],
    events: Sequence[GpuEvent],
    *,
    fields: frozenset[str],
    job_id: str | None = "recording",
    user: str | None = None,
    price_usd_per_gpu_hour: float = 3.26,
    window_s: float = 10.0,
) -> AnalyzeResult:
    """Run ``samples`` (ascending ts, one node or several) and kernel-log ``events`` through
    the correlator and detector in event time.

    Args:
        fields: GpuSample fields the recording carries (drives ``cannot_determine``).
        job_id: the Slurm job the recording is treated as (all GPUs of every node, first to
            last sample); None: no job (GPUs unallocated: zombie and memory checks only).
        price_usd_per_gpu_hour: cost model price, USD per GPU-hour.

    Raises:
        ValueError: no samples and no events, or a sample the message schema rejects.
    """
    if not samples and not events:
        raise ValueError("the recording holds no samples and no events")
    cpu0 = time.process_time()
    events = index_by_pci(samples, events)
    start, end = span(samples, events)
    job = recording_job(samples, events, job_id, user)
    result = AnalyzeResult(start, end, job, reporter=JobReporter(price_usd_per_gpu_hour))
    detector = Detector(load_catalog(), price_usd_per_gpu_hour)
    correlator = Correlator(
        MemoryAllocationStore(), lambda s: s, retention_s=max(3600.0, end - start + 3600.0), window_s=window_s
    )
    pipe = _Pipe(correlator, detector, result)
    if job is not None:
        pipe.publish("slurm.jobs", dumps(job))
    ei = 0
    evs = sorted(events, key=lambda e: e.ts)
    for s in samples:
        while ei < len(evs) and evs[ei].ts <= s.ts:
            pipe.publish("gpu.events", dumps(evs[ei]))
            ei += 1
        pipe.publish("gpu.samples", dumps(s))
    for e in evs[ei:]:
        pipe.publish("gpu.events", dumps(e))
    for out in correlator.flush():
        pipe.publish(out.topic, out.value)
    for f in detector.flush():
        result.failures[f.failure_id] = f
        if result.reporter is not None:
            result.reporter.observe(f)
    if job is not None:
        done = job.model_copy(update={"ts": end, "state": "COMPLETED", "end_ts": end})
        pipe.publish("slurm.jobs", dumps(done))
    result.failures = with_missing_inputs(result.failures, fields)
    result.cpu_s = time.process_time() - cpu0
    return result


def span(samples: Sequence[NodeSample], events: Sequence[GpuEvent]) -> tuple[float, float]:
    """First and last timestamp of a recording, epoch s."""
    ts_all = [s.ts for s in samples] + [e.ts for e in events]
    return min(ts_all), max(ts_all)


def recording_job(
    samples: Sequence[NodeSample], events: Sequence[GpuEvent], job_id: str | None, user: str | None = None
) -> JobState | None:
    """The Slurm job a recording is treated as: every GPU it names, from its first sample on
    (RUNNING); None when ``job_id`` is None."""
    if job_id is None or (not samples and not events):
        return None
    start, _ = span(samples, events)
    gpus: dict[str, set[int]] = {}
    for s in samples:
        gpus.setdefault(s.node, set()).update(g.index for g in s.gpus)
    for e in events:
        gpus.setdefault(e.node, set())  # a node known from its kernel log only: GPUs unknown
        if e.gpu_index is not None:
            gpus[e.node].add(e.gpu_index)
    return JobState(
        job_id=job_id,
        ts=start,
        state="RUNNING",
        user=user,
        nodes=sorted(gpus),
        gpus={n: sorted(v) for n, v in gpus.items()},
        start_ts=start,
    )


def index_by_pci(samples: Sequence[NodeSample], events: Sequence[GpuEvent]) -> list[GpuEvent]:
    """Events whose GPU index is unknown get it from the samples' PCI bus ids (a kernel log
    next to telemetry of the same node); without telemetry the index stays unknown and the
    event is the node's (its PCI bus id and UUID still name the GPU)."""
    known: dict[tuple[str, str], int] = {}
    for s in samples:
        for g in s.gpus:
            if g.pci_bus_id:
                known.setdefault((s.node, g.pci_bus_id), g.index)
    out = []
    for e in events:
        idx = known.get((e.node, e.pci_bus_id or ""))
        out.append(e.model_copy(update={"gpu_index": idx}) if e.gpu_index is None and idx is not None else e)
    return out


def with_missing_inputs(failures: dict[str, Failure], fields: frozenset[str]) -> dict[str, Failure]:
    """Add to each condition failure's ``cannot_determine`` what the recording's missing fields hide."""
    rules = {c.id: c for c in load_catalog().conditions}
    out = {}
    for fid, f in failures.items():
        rule = rules.get(f.rule_id)
        extra = [m for m in missing_inputs(rule.signal.type, fields) if m not in f.cannot_determine] if rule else []
        out[fid] = f.model_copy(update={"cannot_determine": [*f.cannot_determine, *extra]}) if extra else f
    return out


def gpu_summary(samples: Sequence[NodeSample]) -> list[dict[str, Any]]:
    """Per (node, GPU): samples and the mean/max of utilisation (%), power (W), memory used (MiB)."""
    acc: dict[tuple[str, int], dict[str, list[float]]] = {}
    for s in samples:
        for g in s.gpus:
            a = acc.setdefault((s.node, g.index), {})
            for f in ("utilization_gpu_pct", "power_w", "memory_used_mib", "temperature_c", "sm_clock_mhz"):
                v = getattr(g, f)
                if v is not None:
                    a.setdefault(f, []).append(float(v))
    rows = []
    for (node, idx), a in sorted(acc.items()):
        row: dict[str, Any] = {"node": node, "gpu_index": idx}
        for f, xs in a.items():
            row[f"{f}_mean"] = round(sum(xs) / len(xs), 2)
            row[f"{f}_max"] = round(max(xs), 2)
        rows.append(row)
    return rows


# -- the command -----------------------------------------------------------------------------
def recording_summary(rec: Any, assumed: dict[str, float]) -> dict[str, Any]:
    """The ``recording`` section of the report: what was read and what was assumed."""
    return {
        "files": {str(k): v for k, v in rec.formats.items()},
        "node": rec.node,
        "gpus": list(rec.gpu_indices),
        "start_ts": rec.start_ts,
        "end_ts": rec.end_ts,
        "duration_s": round(rec.end_ts - rec.start_ts, 3) if rec.start_ts is not None and rec.end_ts else 0.0,
        "interval_s": rec.interval_s,
        "rows": rec.rows,
        "ticks": len(rec.samples),
        "events": len(rec.events),
        "fields": sorted(rec.fields),
        "gaps": [{"start_s": round(a - rec.start_ts, 3), "length_s": round(b - a, 3)} for a, b in rec.gaps],
        "assumed": assumed,
        "notes": list(rec.notes),
    }


def job_summary(result: AnalyzeResult, samples: Sequence[NodeSample], price: float) -> dict[str, Any]:
    """GPU-hours the recording's job held (first to last sample, every GPU) and per-GPU means."""
    gpus = sum(len(v) for v in result.job.gpus.values()) if result.job else 0
    hours = (result.end_ts - result.start_ts) / 3600.0 * gpus
    return {
        "job_id": result.job.job_id if result.job else None,
        "gpus": gpus,
        "gpu_hours": round(hours, 4),
        "usd": round(hours * price, 2),
        "price_usd_per_gpu_hour": price,
        "per_gpu": gpu_summary(samples),
    }
