"""``gpuwarden analyze``: a recording people already have, through the detector, in event time.

A recording (``nvidia-smi --query-gpu`` CSV logs, ``nvidia-smi dmon``, dcgm-exporter scrapes,
``nvidia-smi -q -x`` captures, kernel logs; read by :mod:`gpuwarden.recordings`)
runs through the same correlator and detector code as the services, connected in memory:
the recording is one Slurm job holding every GPU it names, from its first to its last
sample (unless ``--job-id``/``--no-job`` say otherwise). Files that do not overlap in time
(more than :data:`RUN_GAP_S` apart) are separate runs, each its own job, so the same GPU failing
in two logs of one call counts under two jobs (``repeat-offender-gpu``). Only sample timestamps
drive the detector, so the verdicts do not depend on how fast this runs.

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
from gpuwarden.demo.reports import iso_utc
from gpuwarden.demo.scoring import failure_row
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.jobreport import JobReporter
from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import (
    Failure,
    GpuEvent,
    GpuSample,
    JobState,
    NodeSample,
    dumps,
)

__all__ = [
    "RUN_GAP_S",
    "AnalyzeResult",
    "analyze_recording",
    "failure_report_row",
    "fill_from_spec",
    "index_by_pci",
    "missing_inputs",
    "recording_job",
    "recording_jobs",
    "recording_runs",
    "span",
    "with_missing_inputs",
]

#: Files of one call whose time spans are more than this apart (s) are separate runs: separate jobs.
RUN_GAP_S = 600.0

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
    """Failures (latest version of each) and what was read. ``job``: the first of ``jobs`` (one
    per run of the recording, ascending), None without a job; ``job_ends``: epoch s each job
    ends at (default: ``end_ts``)."""

    start_ts: float
    end_ts: float
    job: JobState | None
    failures: dict[str, Failure] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    reporter: JobReporter | None = None
    jobs: list[JobState] = field(default_factory=list)
    job_ends: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.jobs and self.job is not None:
            self.jobs = [self.job]
        if not self.job_ends and self.jobs:
            self.job_ends = [self.end_ts] * len(self.jobs)

    def sorted_failures(self) -> list[Failure]:
        return sorted(self.failures.values(), key=lambda f: (f.first_seen, f.node, f.gpu_index or -1, f.pattern))

    def rows(self) -> list[dict[str, Any]]:
        """The report's ``failures``: :func:`failure_report_row` of each, by first seen."""
        return [failure_report_row(f, self.start_ts) for f in self.sorted_failures()]


def failure_report_row(f: Failure, start_ts: float) -> dict[str, Any]:
    """One failure as analyze reports it: simulate's row (``first_seen_s``, s since ``start_ts``)
    plus absolute times and the GPU's identity.

    Added keys: ``first_seen_utc``/``last_seen_utc`` (ISO-8601 UTC, :func:`~.reports.iso_utc`;
    None for seconds-since-boot stamps of a kernel log read without a boot time),
    ``last_seen_s`` (s since ``start_ts``), ``window_s`` (last - first seen, s),
    ``occurrences`` (signals folded in, count), ``pci_bus_id``, ``gpu_uuid``; each evidence item
    gets ``ts_utc``.
    """
    row = failure_row(f, start_ts)
    row.update(
        {
            "first_seen_utc": iso_utc(f.first_seen),
            "last_seen_s": round(f.last_seen - start_ts, 3),
            "last_seen_utc": iso_utc(f.last_seen),
            "window_s": round(f.last_seen - f.first_seen, 3),
            "occurrences": f.occurrences,
            "pci_bus_id": f.pci_bus_id,
            "gpu_uuid": f.gpu_uuid,
        }
    )
    for e in row["evidence"]:
        if isinstance(e.get("ts"), int | float):
            e["ts_utc"] = iso_utc(e["ts"])
    return row


class _Pipe:
    """Correlator -> detector in memory, depth-first (a pipeline without consumer lag)."""

    def __init__(self, correlator: Correlator, detector: Detector, result: AnalyzeResult) -> None:
        self.correlator, self.detector, self.result = correlator, detector, result
        self.job: JobState | None = None  # the run's job now (the verdict's view of node-wide failures)

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
                self.result.reporter.observe(_for_job(f, self.job))


def _for_job(f: Failure, job: JobState | None) -> Failure:
    """A failure on a node the recording's job holds whole, as the job's (for the verdict only:
    a kernel-log failure names no GPU index, so the detector gives it no job)."""
    if f.job_id is not None or job is None or f.node not in job.nodes:
        return f
    return f.model_copy(update={"job_id": job.job_id, "user": job.user})


def analyze_recording(
    samples: Sequence[NodeSample],
    events: Sequence[GpuEvent],
    *,
    fields: frozenset[str],
    job_id: str | None = "recording",
    user: str | None = None,
    price_usd_per_gpu_hour: float = 3.26,
    window_s: float = 10.0,
    spans: Sequence[tuple[float, float]] | None = None,
) -> AnalyzeResult:
    """Run ``samples`` (ascending ts, one node or several) and kernel-log ``events`` through
    the correlator and detector in event time.

    Args:
        fields: GpuSample fields the recording carries (drives ``cannot_determine``).
        job_id: the Slurm job the recording is treated as (all GPUs of every node, first to
            last sample; with several runs ``{job_id}-1``, ``-2``, ...); None: no job (GPUs
            unallocated: zombie and memory checks only).
        price_usd_per_gpu_hour: cost model price, USD per GPU-hour.
        spans: (first, last) epoch s of each input file (``Recording.spans``): files that
            overlap or lie within :data:`RUN_GAP_S` of each other are one run, one job each
            (:func:`recording_runs`); None: the whole recording is one run.

    Raises:
        ValueError: no samples and no events, or a sample the message schema rejects.
    """
    if not samples and not events:
        raise ValueError("the recording holds no samples and no events")
    cpu0 = time.process_time()
    events = index_by_pci(samples, events)
    start, end = span(samples, events)
    runs = recording_runs(spans or [], start, end)
    planned = recording_jobs(samples, events, job_id, user, runs)
    jobs = [j for j, _ in planned]
    ends = [e for _, e in planned]
    result = AnalyzeResult(
        start,
        end,
        jobs[0] if jobs else None,
        reporter=JobReporter(price_usd_per_gpu_hour),
        jobs=jobs,
        job_ends=ends,
    )
    detector = Detector(load_catalog(), price_usd_per_gpu_hour)
    correlator = Correlator(
        MemoryAllocationStore(), lambda s: s, retention_s=max(3600.0, end - start + 3600.0), window_s=window_s
    )
    pipe = _Pipe(correlator, detector, result)
    pipe.job = jobs[0] if jobs else None
    if jobs:
        pipe.publish("slurm.jobs", dumps(jobs[0]))
    current = 0

    def next_run(ts: float) -> None:
        # a later run's job starts when the stream reaches it; the one before ends first
        nonlocal current
        while current + 1 < len(jobs) and ts >= (jobs[current + 1].start_ts or 0.0):
            pipe.publish("slurm.jobs", dumps(_ended(jobs[current], ends[current])))
            current += 1
            pipe.job = jobs[current]
            pipe.publish("slurm.jobs", dumps(jobs[current]))

    ei = 0
    evs = sorted(events, key=lambda e: e.ts)
    for s in samples:
        while ei < len(evs) and evs[ei].ts <= s.ts:
            next_run(evs[ei].ts)
            pipe.publish("gpu.events", dumps(evs[ei]))
            ei += 1
        next_run(s.ts)
        pipe.publish("gpu.samples", dumps(s))
    for e in evs[ei:]:
        next_run(e.ts)
        pipe.publish("gpu.events", dumps(e))
    for out in correlator.flush():
        pipe.publish(out.topic, out.value)
    for f in detector.flush():
        result.failures[f.failure_id] = f
        if result.reporter is not None:
            result.reporter.observe(_for_job(f, pipe.job))
    if jobs:
        pipe.publish("slurm.jobs", dumps(_ended(jobs[current], ends[current])))
    result.failures = with_missing_inputs(result.failures, fields)
    result.cpu_s = time.process_time() - cpu0
    return result


def _ended(job: JobState, end: float) -> JobState:
    return job.model_copy(update={"ts": end, "state": "COMPLETED", "end_ts": end})


def recording_runs(
    spans: Sequence[tuple[float, float]], start: float, end: float, gap_s: float = RUN_GAP_S
) -> list[tuple[float, float]]:
    """The runs of a recording: (first, last) epoch s of each group of file ``spans`` that
    overlap or lie within ``gap_s`` (s) of each other, ascending. The first run starts at
    ``start`` and the last ends at ``end`` (the recording's span, so nothing falls outside);
    no spans: one run, (``start``, ``end``)."""
    merged: list[list[float]] = []
    for a, b in sorted((min(a, b), max(a, b)) for a, b in spans):
        if merged and a - merged[-1][1] <= gap_s:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if not merged:
        return [(start, end)]
    merged[0][0] = min(merged[0][0], start)
    merged[-1][1] = max(merged[-1][1], end)
    return [(a, b) for a, b in merged]


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
    return _job(job_id, user, samples, events, start)


def recording_jobs(
    samples: Sequence[NodeSample],
    events: Sequence[GpuEvent],
    job_id: str | None,
    user: str | None,
    runs: Sequence[tuple[float, float]],
) -> list[tuple[JobState, float]]:
    """One job per run (:func:`recording_runs`), with the epoch s it ends at: ``job_id`` for a
    single run, else ``{job_id}-1``, ``-2``, ... in time order; each RUNNING from its run's
    first second and holding the GPUs its run's samples and events name. Empty when ``job_id``
    is None or there is nothing to hold."""
    if job_id is None or (not samples and not events) or not runs:
        return []
    if len(runs) == 1:
        one = recording_job(samples, events, job_id, user)
        return [(one, runs[0][1])] if one else []
    out = []
    for k, (a, b) in enumerate(runs, start=1):
        ss = [s for s in samples if a <= s.ts <= b]
        es = [e for e in events if a <= e.ts <= b]
        if ss or es:
            out.append((_job(f"{job_id}-{k}", user, ss, es, a), b))
    return out


def _job(
    job_id: str,
    user: str | None,
    samples: Sequence[NodeSample],
    events: Sequence[GpuEvent],
    start: float,
) -> JobState:
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
    """Events whose GPU index is unknown get the index, UUID and PCI bus id of the GPU of the
    same node whose PCI bus id (any spelling: ``00000000:9B:00.0``, ``0000:9b:00``,
    ``9b:00.0``) or UUID the samples name (a kernel log next to telemetry of the same node,
    whichever file either came from); without such a GPU the index stays unknown and the event
    is the node's (its PCI bus id and UUID still name the GPU)."""
    from gpuwarden.recordings import attach_gpu_ids

    inventory: dict[str, dict[int, GpuSample]] = {}
    for s in samples:
        inv = inventory.setdefault(s.node, {})
        for g in s.gpus:
            if (g.pci_bus_id or g.uuid) and g.index not in inv:
                inv[g.index] = g
    by_node: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        if e.gpu_index is None and inventory.get(e.node):
            by_node.setdefault(e.node, []).append(i)
    out = list(events)
    for node, idx in by_node.items():
        for i, e in zip(idx, attach_gpu_ids([events[i] for i in idx], list(inventory[node].values())), strict=True):
            out[i] = e
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
    """The ``recording`` section of the report: what was read and what was assumed.

    Times: ``start_ts``/``end_ts`` epoch s and ``start_utc``/``end_utc`` ISO-8601 UTC (first and
    last reading or event of any file); ``duration_s``; each gap's ``start_s`` (s since the
    start), ``start_utc`` and ``length_s``; ``spans``: per file, its first and last time (UTC).
    """
    start, end = rec.start_ts, rec.end_ts
    spans = getattr(rec, "spans", {}) or {}
    return {
        "files": {str(k): v for k, v in rec.formats.items()},
        "node": rec.node,
        "gpus": list(rec.gpu_indices),
        "start_ts": start,
        "end_ts": end,
        "start_utc": iso_utc(start),
        "end_utc": iso_utc(end),
        "duration_s": round(end - start, 3) if start is not None and end is not None else 0.0,
        "interval_s": rec.interval_s,
        "rows": rec.rows,
        "ticks": len(rec.samples),
        "events": len(rec.events),
        "fields": sorted(rec.fields),
        "gaps": [
            {"start_s": round(a - start, 3), "start_utc": iso_utc(a), "length_s": round(b - a, 3)} for a, b in rec.gaps
        ],
        "spans": {str(k): {"start_utc": iso_utc(a), "end_utc": iso_utc(b)} for k, (a, b) in spans.items()},
        "assumed": assumed,
        "notes": list(rec.notes),
    }


def job_summary(result: AnalyzeResult, samples: Sequence[NodeSample], price: float) -> dict[str, Any]:
    """GPU-hours the recording's jobs held (each from its run's first to last second, every GPU
    it names) and per-GPU means.

    Keys: ``job_id`` (the first job's; None without a job), ``gpus`` (most GPUs of one job),
    ``gpu_hours``, ``usd``, ``price_usd_per_gpu_hour``, ``jobs`` (per job: ``job_id``,
    ``start_utc``, ``end_utc``, ``gpus``, ``gpu_hours``; several when the files form several
    runs), ``per_gpu`` (:func:`gpu_summary`).
    """
    rows = []
    hours = 0.0
    for i, job in enumerate(result.jobs):
        start = job.start_ts if job.start_ts is not None else job.ts
        end = result.job_ends[i] if i < len(result.job_ends) else result.end_ts
        n = sum(len(v) for v in job.gpus.values())
        h = (end - start) / 3600.0 * n
        hours += h
        rows.append(
            {
                "job_id": job.job_id,
                "start_utc": iso_utc(start),
                "end_utc": iso_utc(end),
                "gpus": n,
                "gpu_hours": round(h, 4),
            }
        )
    return {
        "job_id": result.job.job_id if result.job else None,
        "gpus": max((sum(len(v) for v in j.gpus.values()) for j in result.jobs), default=0),
        "gpu_hours": round(hours, 4),
        "usd": round(hours * price, 2),
        "price_usd_per_gpu_hour": price,
        "jobs": rows,
        "per_gpu": gpu_summary(samples),
    }
