"""The job verdict: where a job's allocated GPU-hours went, why, and what it cost.

:func:`build_job_report` is pure: a job's Slurm state, its ``job.windows`` (10 s summaries per
node and GPU, from the correlator) and its failures in, a :class:`~gpuwarden.shared.models.JobReport`
out. Every GPU of the job, from the job's start to its end (or the last window while it runs),
falls into exactly one share of the breakdown, so the shares add up to the allocated GPU-hours:

* ``lost-to-failure``: from the onset of a failure that costs the job its work (a GPU that fell
  off the bus, an uncorrectable memory error, a hung GSP, a failed health check: severity critical
  or fatal with a drain, reset, reboot, RMA or restart action) to the job's end or requeue, on
  the GPUs the failure's cost covers (every GPU of the job for a job-scope rule);
* ``hung``: windows inside a ``collective-hang`` episode;
* ``checkpoint-stall``: inside a ``checkpoint-stall`` episode, windows where every GPU pauses, or
  where a minority writes (below 30 %) while the others spin at low power in a collective;
* ``idle``: windows where every GPU of the job is idle (busiest reading at most 5 %);
* ``partially-idle``: a GPU idle while another GPU of the job works;
* ``straggler-wait``: inside a ``straggler-gpu``/``straggler-node`` episode, ``1 - r`` of every
  busy window, where ``r`` is the straggler's metric (the failure's: SM clock, else power) over the
  median of the other GPUs in the same window: a synchronous job runs at its slowest GPU's pace;
* ``input-wait``: inside an ``input-starvation`` episode, the idle share (``1 - util/100``) of a
  busy window;
* ``busy``: the rest of the windows;
* ``no-telemetry``: allocated time no window covers (or a window without utilisation).

:class:`JobReporter` keeps what it needs per job (compact columns, not the messages) and builds
reports on demand, when a job ends or is requeued, and when one is due.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.shared.models import (
    Action,
    BreakdownItem,
    Category,
    Failure,
    FailureState,
    JobReport,
    JobState,
    JobWindow,
    ReportFinding,
    ReportGpu,
    Severity,
    WasteCategory,
    stable_id,
)
from gpuwarden.shared.slurm import TERMINAL_JOB_STATES

__all__ = [
    "IDLE_MAX_UTIL_PCT",
    "REQUEUE_STATES",
    "JobReporter",
    "build_job_report",
    "is_loss",
    "side_of",
]

#: A window whose busiest reading is at or below this is idle, % (the detector's idle rules).
IDLE_MAX_UTIL_PCT = 5.0
#: Checkpoint writers run below this while the other ranks wait, % (the detector's ``pauses``).
WRITER_MAX_UTIL_PCT = 30.0
#: States that end one run of a job that will run again.
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "REQUEUED_HOLD"})
_LOSS_ACTIONS = frozenset({Action.DRAIN, Action.RESET_GPU, Action.REBOOT, Action.RMA, Action.RESTART_JOB})
_BEHAVIOUR = frozenset(
    {
        "idle-allocation",
        "partial-idle-allocation",
        "straggler-gpu",
        "straggler-node",
        "checkpoint-stall",
        "collective-hang",
        "input-starvation",
        "low-tensor-activity",
        "gpu-memory-leak",
    }
)
_ORDER = list(WasteCategory)
_JOB_SIDE = {
    WasteCategory.IDLE,
    WasteCategory.PARTIALLY_IDLE,
    WasteCategory.CHECKPOINT_STALL,
    WasteCategory.INPUT_WAIT,
    WasteCategory.HUNG,
}
_NAN = math.nan
# compact window columns, in this order (NaN: absent)
_COLS = (
    "start",
    "end",
    "util_mean",
    "util_max",
    "util_min",
    "power",
    "power_limit",
    "clock",
    "tensor",
    "mem_max",
    "mem_total",
    "temp_max",
)


def side_of(category: Category) -> str:
    """``cluster`` for hardware, driver and infrastructure failures; ``job`` for the rest."""
    return "job" if category in (Category.APPLICATION, Category.EFFICIENCY) else "cluster"


def is_loss(f: Failure) -> bool:
    """Whether a failure costs the job its work from its onset on (see the module docs)."""
    if f.pattern in _BEHAVIOUR:
        return False
    return f.severity in (Severity.CRITICAL, Severity.FATAL) and f.recommended_action in _LOSS_ACTIONS


def _onset(f: Failure) -> float:
    return min([f.first_seen, *(e.ts for e in f.evidence)])


def _f(x: float | None) -> float:
    return _NAN if x is None else float(x)


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass
class _Series:
    """One GPU's windows as columns (sorted by start; a redelivered window replaces its twin)."""

    uuid: str | None = None
    cols: dict[str, array] = field(default_factory=lambda: {c: array("d") for c in _COLS})

    def __len__(self) -> int:
        return len(self.cols["start"])

    def add(self, w: JobWindow) -> None:
        row = (
            w.window_start,
            w.window_end,
            _f(w.utilization_gpu_pct_mean),
            _f(w.utilization_gpu_pct_max),
            _f(w.utilization_gpu_pct_min),
            _f(w.power_w_mean),
            _f(w.power_limit_w),
            _f(w.sm_clock_mhz_mean),
            _f(w.tensor_activity_pct_mean),
            _f(w.memory_used_mib_max),
            _f(w.memory_total_mib),
            _f(w.temperature_c_max),
        )
        self.uuid = w.gpu_uuid or self.uuid
        starts = self.cols["start"]
        n = len(starts)
        if n == 0 or w.window_start > starts[-1]:
            for c, v in zip(_COLS, row, strict=True):
                self.cols[c].append(v)
            return
        lo, hi = 0, n  # bisect on the start column
        while lo < hi:
            mid = (lo + hi) // 2
            if starts[mid] < w.window_start:
                lo = mid + 1
            else:
                hi = mid
        if lo < n and starts[lo] == w.window_start:
            for c, v in zip(_COLS, row, strict=True):
                self.cols[c][lo] = v
        else:
            for c, v in zip(_COLS, row, strict=True):
                self.cols[c].insert(lo, v)


@dataclass
class _Episode:
    failure: Failure
    start: float
    end: float

    def covers(self, a: float, b: float) -> bool:
        """The window [a, b) overlaps the episode (a window ending at the onset is its first)."""
        return b >= self.start and a < self.end


def _peak(s: _Series, i: int) -> float:
    m = s.cols["util_max"][i]
    return s.cols["util_mean"][i] if math.isnan(m) else m


def build_job_report(
    job: JobState,
    windows: Iterable[JobWindow],
    failures: Iterable[Failure],
    price_usd_per_gpu_hour: float,
    as_of: float | None = None,
) -> JobReport:
    """The verdict of one job.

    Args:
        job: the job's latest Slurm state (``gpus`` names its GPUs; a job that lists none is
            judged on the GPUs its windows name). A terminal state (COMPLETED, FAILED, ...) or a
            requeue makes the report ``final``, ending at ``end_ts`` (else the state's ``ts``).
        windows: the job's windows (other jobs' are ignored), any order.
        failures: failures of the job (``job_id``; others ignored); the latest version of each
            ``failure_id`` wins.
        price_usd_per_gpu_hour: USD per GPU-hour.
        as_of: end of the span for a running job, epoch s (default: the time most of its GPUs'
            windows reached, the median of their last window ends; else the state's ``ts``).

    Returns:
        The report; its breakdown adds up to ``gpu_hours`` (GPU-hours rounded to 1e-6, USD to
        cents, by largest remainder).

    Raises:
        ValueError: a negative price, or ``as_of`` before the job's start.
    """
    series: dict[tuple[str, int], _Series] = {}
    for w in windows:
        if w.job_id == job.job_id:
            series.setdefault((w.node, w.gpu_index), _Series()).add(w)
    latest: dict[str, Failure] = {}
    for f in failures:
        if f.job_id == job.job_id:
            old = latest.get(f.failure_id)
            if old is None or f.last_seen >= old.last_seen:
                latest[f.failure_id] = f
    return _build(job, series, list(latest.values()), price_usd_per_gpu_hour, as_of)


def _span(job: JobState, series: dict[tuple[str, int], _Series], as_of: float | None) -> tuple[float, float, bool]:
    starts = [s.cols["start"][0] for s in series.values() if len(s)]
    ends = [s.cols["end"][-1] for s in series.values() if len(s)]
    t0 = job.start_ts if job.start_ts is not None else min(starts, default=job.ts)
    final = job.state in TERMINAL_JOB_STATES or job.state in REQUEUE_STATES
    if final:
        t1 = job.end_ts if job.end_ts is not None and job.state not in REQUEUE_STATES else job.ts
    elif as_of is not None:
        t1 = as_of
    else:
        # the time most GPUs' windows reached: windows of one period arrive GPU by GPU, and a
        # GPU that stopped reporting must not hold the report back
        t1 = statistics.median_high(ends) if ends else job.ts
    if as_of is not None and as_of < t0:
        raise ValueError(f"as_of {as_of} is before the job's start {t0}")
    return t0, max(t0, t1), final


def _build(
    job: JobState,
    series: dict[tuple[str, int], _Series],
    failures: list[Failure],
    price: float,
    as_of: float | None,
) -> JobReport:
    if price < 0:
        raise ValueError(f"price must be >= 0 USD per GPU-hour, got {price}")
    t0, t1, final = _span(job, series, as_of)
    gpus = [(n, i) for n in job.nodes or sorted(job.gpus) for i in job.gpus.get(n, [])]
    if not gpus:
        gpus = sorted(series)
    gpu_set = set(gpus)
    failures = sorted(failures, key=lambda f: (_onset(f), f.failure_id))
    episodes: dict[str, list[_Episode]] = {}
    for f in failures:
        end = f.last_seen if f.state is FailureState.RESOLVED else t1
        episodes.setdefault(f.pattern, []).append(_Episode(f, _onset(f), max(end, _onset(f))))

    # losses: per GPU the earliest onset of a failure that costs it its work
    loss: dict[tuple[str, int], tuple[float, str]] = {}
    for f in failures:
        if not is_loss(f):
            continue
        start = min(max(_onset(f), t0), t1)
        if f.cost.affected_gpus >= len(gpus) or (f.gpu_index is None and f.cost.affected_gpus == 0):
            hit = gpus
        elif f.gpu_index is not None:
            hit = [(f.node, f.gpu_index)] if (f.node, f.gpu_index) in gpu_set else []
        else:
            hit = [g for g in gpus if g[0] == f.node]
        for g in hit:
            if g not in loss or start < loss[g][0]:
                loss[g] = (start, f.failure_id)

    # per window start: the GPUs' peaks and metrics, for idle/straggler/stall judgements
    groups: dict[float, dict[tuple[str, int], int]] = {}
    for g, s in series.items():
        if g not in gpu_set:
            continue
        for i, a in enumerate(s.cols["start"]):
            groups.setdefault(a, {})[g] = i
    working: dict[tuple[str, int], float] = {}
    for g, s in series.items():
        ps = [p for u, p in zip(s.cols["util_mean"], s.cols["power"], strict=True) if u >= 50 and not math.isnan(p)]
        if ps:
            working[g] = max(ps)

    def spinning(g: tuple[str, int], i: int) -> bool:
        s = series[g]
        u, p, lim = s.cols["util_mean"][i], s.cols["power"][i], s.cols["power_limit"][i]
        if math.isnan(u) or math.isnan(p) or u < 90:
            return False
        return (not math.isnan(lim) and p <= 0.35 * lim) or (g in working and p <= 0.5 * working[g])

    group_kind: dict[float, str] = {}
    for a, members in groups.items():
        peaks = [_peak(series[g], i) for g, i in members.items()]
        peaks = [p for p in peaks if not math.isnan(p)]
        if peaks and max(peaks) <= IDLE_MAX_UTIL_PCT:
            group_kind[a] = "idle"
            continue
        writers = [g for g, i in members.items() if series[g].cols["util_mean"][i] < WRITER_MAX_UTIL_PCT]
        waiters = [g for g, i in members.items() if spinning(g, i)]
        n = len(members)
        if writers and waiters and len(writers) < n / 2 and len(writers) + len(waiters) == n:
            group_kind[a] = "write"
        else:
            group_kind[a] = "busy"

    def straggler_ratio(ep: _Episode, a: float) -> float | None:
        f = ep.failure
        members = groups.get(a, {})
        metric = "clock"
        if f.evidence and str(f.evidence[-1].signal).startswith("power_w_mean"):
            metric = "power"
        if f.pattern == "straggler-gpu":
            mine = {(f.node, f.gpu_index)} if f.gpu_index is not None else set()
        else:
            mine = {g for g in members if g[0] == f.node}
        vals = {g: series[g].cols[metric][i] for g, i in members.items()}
        vals = {g: v for g, v in vals.items() if not math.isnan(v)}
        m = [v for g, v in vals.items() if g in mine]
        peers = [v for g, v in vals.items() if g not in mine]
        if m and peers and statistics.median(peers) > 0:
            return max(0.0, min(1.0, statistics.median(m) / statistics.median(peers)))
        last = f.evidence[-1].value if f.evidence else None
        return max(0.0, min(1.0, float(last))) if isinstance(last, int | float) else None

    secs: dict[WasteCategory, float] = dict.fromkeys(_ORDER, 0.0)
    attributed: dict[WasteCategory, dict[str, float]] = {c: {} for c in _ORDER}

    def add(cat: WasteCategory, dt: float, fid: str | None = None) -> None:
        if dt <= 0:
            return
        secs[cat] += dt
        if fid is not None:
            attributed[cat][fid] = attributed[cat].get(fid, 0.0) + dt

    def covering(pattern: str, a: float, b: float, g: tuple[str, int] | None = None) -> _Episode | None:
        for ep in episodes.get(pattern, []):
            f = ep.failure
            if g is not None and f.gpu_index is not None and (f.node, f.gpu_index) != g:
                continue
            if ep.covers(a, b):
                return ep
        return None

    per_gpu: list[ReportGpu] = []
    for g in gpus:
        s = series.get(g) or _Series()
        lost_from, lost_by = loss.get(g, (t1, ""))
        add(WasteCategory.LOST_TO_FAILURE, t1 - lost_from, lost_by or None)
        covered = busy_s = 0.0
        c = s.cols
        for i in range(len(s)):
            a, b = max(c["start"][i], t0), min(c["end"][i], lost_from)
            dt = b - a
            if dt <= 0:
                continue
            covered += dt
            u, peak = c["util_mean"][i], _peak(s, i)
            if math.isnan(peak):
                add(WasteCategory.NO_TELEMETRY, dt)
                continue
            ws, we = c["start"][i], c["end"][i]
            if ep := covering("collective-hang", ws, we):
                add(WasteCategory.HUNG, dt, ep.failure.failure_id)
                continue
            kind = group_kind.get(ws, "busy")
            ck = covering("checkpoint-stall", ws, we)
            if ck is not None and kind in ("idle", "write"):
                add(WasteCategory.CHECKPOINT_STALL, dt, ck.failure.failure_id)
                continue
            if peak <= IDLE_MAX_UTIL_PCT:
                if kind == "idle":
                    ep = covering("idle-allocation", ws, we)
                    add(WasteCategory.IDLE, dt, ep.failure.failure_id if ep else None)
                else:
                    ep = covering("partial-idle-allocation", ws, we, g)
                    add(WasteCategory.PARTIALLY_IDLE, dt, ep.failure.failure_id if ep else None)
                continue
            useful = dt
            ratios = [
                (r, ep)
                for p in ("straggler-gpu", "straggler-node")
                for ep in episodes.get(p, [])
                if ep.covers(ws, we) and (r := straggler_ratio(ep, ws)) is not None
            ]
            if ratios:
                r, ep = min(ratios, key=lambda x: x[0])
                add(WasteCategory.STRAGGLER_WAIT, useful * (1 - r), ep.failure.failure_id)
                useful *= r
            if (ep := covering("input-starvation", ws, we)) and not math.isnan(u):
                idle_share = max(0.0, min(1.0, 1 - u / 100.0))
                add(WasteCategory.INPUT_WAIT, useful * idle_share, ep.failure.failure_id)
                useful *= 1 - idle_share
            add(WasteCategory.BUSY, useful)
            busy_s += useful
        alloc = lost_from - t0
        add(WasteCategory.NO_TELEMETRY, alloc - covered)
        per_gpu.append(_gpu_row(g, s, covered, busy_s, t1 - t0))

    return _assemble(job, gpus, t0, t1, final, price, secs, attributed, per_gpu, failures)


def _mean(xs: Sequence[float]) -> float | None:
    v = [x for x in xs if not math.isnan(x)]
    return round(statistics.fmean(v), 2) if v else None


def _max(xs: Sequence[float]) -> float | None:
    v = [x for x in xs if not math.isnan(x)]
    return round(max(v), 2) if v else None


def _min(xs: Sequence[float]) -> float | None:
    v = [x for x in xs if not math.isnan(x)]
    return round(min(v), 2) if v else None


def _gpu_row(g: tuple[str, int], s: _Series, covered: float, busy: float, span: float) -> ReportGpu:
    c = s.cols
    lim = [x for x in c["power_limit"] if not math.isnan(x)]
    tot = [x for x in c["mem_total"] if not math.isnan(x)]
    return ReportGpu(
        node=g[0],
        gpu_index=g[1],
        gpu_uuid=s.uuid,
        windows=len(s),
        observed_s=round(covered, 3),
        busy_pct=round(min(100.0, 100.0 * busy / span), 2) if span > 0 else None,
        utilization_gpu_pct_mean=_mean(c["util_mean"]),
        utilization_gpu_pct_min=_min(c["util_mean"]),
        utilization_gpu_pct_max=_max(c["util_max"]),
        memory_used_mib_max=_max(c["mem_max"]),
        memory_total_mib=tot[-1] if tot else None,
        power_w_mean=_mean(c["power"]),
        power_limit_w=lim[-1] if lim else None,
        sm_clock_mhz_mean=_mean(c["clock"]),
        temperature_c_max=_max(c["temp_max"]),
        tensor_activity_pct_mean=_mean(c["tensor"]),
    )


def _apportion(values: list[float], total_units: int) -> list[int]:
    """Integers (largest remainder) proportional to ``values`` that add up to ``total_units``."""
    s = sum(values)
    if s <= 0:
        return [0] * len(values)
    raw = [v * total_units / s for v in values]
    ints = [math.floor(x) for x in raw]
    rest = total_units - sum(ints)
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - ints[i], reverse=True)[: max(0, rest)]:
        ints[i] += 1
    return ints


# -- words -----------------------------------------------------------------------------------
_WHAT = {
    "gpu-fallen-off-bus": "fell off the bus (XID 79)",
    "gpu-missing": "disappeared from the node",
    "uncorrectable-ecc": "had an uncorrectable ECC error",
    "uncontained-memory-error": "had an uncontained memory error",
    "contained-memory-error": "had a contained memory error",
    "gsp-firmware-error": "hung in its GSP firmware",
    "nvswitch-fatal": "lost its NVSwitch fabric",
    "nvlink-link-down": "lost an NVLink",
    "driver-fault": "hit a driver fault",
    "health-check-failed": "failed a health check",
    "xid-application-fault": "saw the job's code crash on it (application XID)",
}
_DO = {
    "idle-allocation": "Release GPUs the job does not use: request only what the code runs on, end interactive "
    "sessions when done.",
    "partial-idle-allocation": "Match --gres=gpu:N to the ranks the code starts (or check for a rank that died).",
    "input-starvation": "Feed the GPUs faster: more data-loader workers, pinned memory and prefetching, local or "
    "faster storage.",
    "checkpoint-stall": "Checkpoint less often, or asynchronously (write from a copy while training goes on).",
    "collective-hang": "Cancel and restart from the last checkpoint with NCCL_DEBUG=INFO and a shorter NCCL timeout.",
    "low-tensor-activity": "Use tensor cores: bf16/fp16 mixed precision or TF32 matmuls.",
    "gpu-memory-leak": "Find what keeps growing (tensors kept across steps, caches) before the job runs out of memory.",
    "straggler-gpu": "Have the slow GPU inspected (clocks, thermals, power) and resubmit excluding its node.",
    "straggler-node": "Have the slow node inspected (power, cooling, CPU, network) and resubmit excluding it.",
}


_UNEXPLAINED = {
    WasteCategory.IDLE: "every GPU sat idle while allocated",
    WasteCategory.PARTIALLY_IDLE: "some GPUs sat idle while the others worked",
    WasteCategory.LOST_TO_FAILURE: "work lost to a failure",
}


def _where_of(node: str, gpu: int | None) -> str:
    return f"GPU {gpu} on {node}" if gpu is not None else node


def _where(f: Failure) -> str:
    return _where_of(f.node, f.gpu_index)


def _phrase(f: Failure | ReportFinding) -> str:
    """A few words on what a finding saw, e.g. ``GPU 5 on gpu-node-003 fell off the bus (XID 79)``."""
    p, where = f.pattern, _where_of(f.node, f.gpu_index)
    ev = f.evidence[-1] if f.evidence else None
    fixed = {
        "idle-allocation": "every GPU sat idle while allocated",
        "partial-idle-allocation": f"{where} sat idle while the job's other GPUs worked",
        "input-starvation": "input-bound: the GPUs waited on the host for data",
        "checkpoint-stall": "checkpointing too often or too slowly: the GPUs stalled together",
        "collective-hang": "hung in a collective that never completes",
        "low-tensor-activity": "tensor cores mostly idle (slower precision?)",
        "gpu-memory-leak": f"GPU memory keeps growing on {where}",
    }
    if p in fixed:
        return fixed[p]
    if p in ("straggler-gpu", "straggler-node") and ev is not None:
        return f"{where} runs at {ev.value} x the job's median and the other GPUs wait for it"
    return f"{where} {_WHAT.get(p, p.replace('-', ' '))}"


def _assemble(
    job: JobState,
    gpus: list[tuple[str, int]],
    t0: float,
    t1: float,
    final: bool,
    price: float,
    secs: dict[WasteCategory, float],
    attributed: dict[WasteCategory, dict[str, float]],
    per_gpu: list[ReportGpu],
    failures: list[Failure],
) -> JobReport:
    total_s = len(gpus) * (t1 - t0)
    micro = round(total_s / 3600.0 * 1e6)
    units = _apportion([secs[c] for c in _ORDER], micro)
    hours = [u / 1e6 for u in units]
    cents_total = round(micro / 1e6 * price * 100)
    cents = _apportion(hours, cents_total)
    gpu_hours = micro / 1e6
    by_id = {f.failure_id: f for f in failures}
    breakdown = []
    for c, h, ct in zip(_ORDER, hours, cents, strict=True):
        fids = sorted(attributed[c], key=lambda k: -attributed[c][k])
        sides = {side_of(by_id[k].category) for k in fids}
        side: Any = None
        if c in _JOB_SIDE:
            side = "job"
        elif c is WasteCategory.STRAGGLER_WAIT or (c is WasteCategory.LOST_TO_FAILURE and sides):
            side = sides.pop() if len(sides) == 1 else None
            side = side or ("cluster" if c is WasteCategory.STRAGGLER_WAIT else None)
        breakdown.append(
            BreakdownItem(
                category=c,
                gpu_hours=h,
                usd=ct / 100,
                share_pct=round(100.0 * h / gpu_hours, 2) if gpu_hours > 0 else 0.0,
                side=side,
                failure_ids=fids,
            )
        )
    fid_secs: dict[str, float] = {}
    for c in _ORDER:
        for k, v in attributed[c].items():
            fid_secs[k] = fid_secs.get(k, 0.0) + v
    findings = [
        ReportFinding(
            failure_id=f.failure_id,
            pattern=f.pattern,
            rule_id=f.rule_id,
            category=f.category,
            severity=f.severity,
            side=side_of(f.category),  # type: ignore[arg-type]
            node=f.node,
            gpu_index=f.gpu_index,
            state=f.state,
            onset_ts=max(0.0, _onset(f)),
            first_seen=f.first_seen,
            last_seen=f.last_seen,
            verdict=f.verdict,
            evidence=list(f.evidence),
            cannot_determine=list(f.cannot_determine),
            recommended_action=f.recommended_action,
            gpu_hours=round(fid_secs.get(f.failure_id, 0.0) / 3600.0, 6),
            usd=round(fid_secs.get(f.failure_id, 0.0) / 3600.0 * price, 2),
        )
        for f in failures
    ]
    item = {b.category: b for b in breakdown}
    busy_h = item[WasteCategory.BUSY].gpu_hours
    unseen = item[WasteCategory.NO_TELEMETRY]
    waste_h = round(gpu_hours - busy_h - unseen.gpu_hours, 6)
    waste_usd = round(
        max(0.0, (cents_total - round(item[WasteCategory.BUSY].usd * 100) - round(unseen.usd * 100))) / 100, 2
    )
    sides = {side_of(f.category) for f in failures}
    side_all = "both" if len(sides) == 2 else (sides.pop() if sides else "none")
    utils = [g.utilization_gpu_pct_mean for g in per_gpu if g.utilization_gpu_pct_mean is not None]
    tensors = [g.tensor_activity_pct_mean for g in per_gpu if g.tensor_activity_pct_mean is not None]
    tensor = round(statistics.fmean(tensors), 2) if tensors else None
    busy_pct = round(100.0 * busy_h / gpu_hours, 2) if gpu_hours > 0 else 0.0
    verdict, summary = _verdict(job, len(gpus), gpu_hours, busy_pct, price, breakdown, findings, final)
    cannot = _cannot(failures, per_gpu, tensors, unseen, final, breakdown)
    recs: list[str] = []
    lost_nodes: set[str] = set()
    for f in sorted(findings, key=lambda x: -x.gpu_hours):
        r = _DO.get(f.pattern)
        if r is None and is_loss(by_id[f.failure_id]) and f.node not in lost_nodes:
            lost_nodes.add(f.node)
            r = (
                f"Resubmit from the last checkpoint excluding {f.node} (sbatch --exclude={f.node}): "
                f"{_where(by_id[f.failure_id])} needs a {f.recommended_action.value}."
            )
        if r and r not in recs:
            recs.append(r)
    for b in breakdown:
        if b.gpu_hours > 0 and not b.failure_ids and b.category in (WasteCategory.IDLE, WasteCategory.PARTIALLY_IDLE):
            r = _DO["idle-allocation" if b.category is WasteCategory.IDLE else "partial-idle-allocation"]
            if r not in recs:
                recs.append(r)
    if not recs and waste_h <= 0:
        recs.append("Nothing to do: the job kept its GPUs busy.")
    return JobReport(
        report_id=stable_id(job.job_id, t0, round(t1, 3), final),
        job_id=job.job_id,
        name=job.name,
        user=job.user,
        account=job.account,
        partition=job.partition,
        state=job.state,
        final=final,
        nodes=sorted({g[0] for g in gpus}),
        gpus={n: sorted(i for m, i in gpus if m == n) for n in sorted({g[0] for g in gpus})},
        gpu_count=len(gpus),
        start_ts=max(0.0, t0),
        end_ts=t1 if final else None,
        as_of=max(0.0, t1),
        duration_s=round(t1 - t0, 3),
        price_usd_per_gpu_hour=price,
        gpu_hours=gpu_hours,
        usd=cents_total / 100,
        busy_pct=busy_pct,
        waste_gpu_hours=max(0.0, waste_h),
        waste_usd=waste_usd,
        breakdown=breakdown,
        utilization_gpu_pct_mean=round(statistics.fmean(utils), 2) if utils else None,
        tensor_activity_pct_mean=tensor,
        tensor_activity_gpus=len(tensors),
        per_gpu=per_gpu,
        findings=findings,
        side=side_all,  # type: ignore[arg-type]
        verdict=verdict,
        cannot_determine=cannot,
        recommendations=recs,
        summary=summary,
    )


def _money(usd: float) -> str:
    return f"${usd:,.2f}"


def _verdict(
    job: JobState,
    n_gpus: int,
    gpu_hours: float,
    busy_pct: float,
    price: float,
    breakdown: list[BreakdownItem],
    findings: list[ReportFinding],
    final: bool,
) -> tuple[str, str]:
    who = f"Job {job.job_id}" + (f" ({job.user})" if job.user else "")
    tense = "used" if final else "has used"
    head = (
        f"{who} {tense} {gpu_hours:.3f} GPU-hours on {n_gpus} GPUs ({_money(gpu_hours * price)}); "
        f"{busy_pct:.1f} % did work."
    )
    waste = [
        b for b in breakdown if b.category not in (WasteCategory.BUSY, WasteCategory.NO_TELEMETRY) and b.gpu_hours > 0
    ]
    by_id = {f.failure_id: f for f in findings}
    parts: dict[str, list[str]] = {"cluster": [], "job": []}
    explained: set[str] = set()
    for b in sorted(waste, key=lambda b: -b.gpu_hours):
        fs = [by_id[k] for k in b.failure_ids if k in by_id]
        cost = f"{b.gpu_hours:.3f} GPU-h, {_money(b.usd)}"
        if fs:
            f = fs[0]
            explained.add(f.failure_id)
            text = _phrase(f)
            parts[f.side].append(f"{text} ({b.category.value}: {cost})")
        else:
            side = b.side or "job"
            parts[side].append(f"{_UNEXPLAINED.get(b.category, b.category.value)} ({b.category.value}: {cost})")
    for f in findings:  # findings without a cost share still say what they saw
        if f.failure_id not in explained and f.pattern not in ("gpu-missing",):
            parts[f.side].append(_phrase(f))
    words = [head]
    if parts["cluster"]:
        words.append("Cluster-side: " + "; ".join(parts["cluster"]) + ".")
    if parts["job"]:
        words.append("Job-side: " + "; ".join(parts["job"]) + ".")
    if not waste and not findings:
        words.append("No waste found.")
    top = max(waste, key=lambda b: b.gpu_hours, default=None)
    summary = f"gpuwarden: {busy_pct:.0f}% busy of {gpu_hours:.2f} GPU-h ({_money(gpu_hours * price)})"
    if top is not None:
        cause = next((by_id[k] for k in top.failure_ids if k in by_id), None)
        summary += f"; top waste {top.category.value} {top.gpu_hours:.2f} GPU-h ({_money(top.usd)})"
        if cause is not None:
            summary += f", {cause.side}-side: {cause.pattern} {cause.node}" + (
                f" GPU {cause.gpu_index}" if cause.gpu_index is not None else ""
            )
    return " ".join(words), summary[:250]


def _cannot(
    failures: list[Failure],
    per_gpu: list[ReportGpu],
    tensors: list[float],
    unseen: BreakdownItem,
    final: bool,
    breakdown: list[BreakdownItem],
) -> list[str]:
    out = ["what the job computed: GPU utilisation says a kernel ran, not how much useful work it did"]
    if not tensors:
        out.append(
            "tensor activity (the MFU proxy): no GPU of the job reported it (needs GPM on Hopper or later, "
            "or DCGM profiling fields)"
        )
    elif len(tensors) < len(per_gpu):
        out.append(f"tensor activity of {len(per_gpu) - len(tensors)} of {len(per_gpu)} GPUs: they did not report it")
    if unseen.gpu_hours > 0:
        out.append(f"what {unseen.gpu_hours:.3f} GPU-hours ({unseen.share_pct:.1f} %) without telemetry were used for")
    if any(b.category is WasteCategory.STRAGGLER_WAIT and b.gpu_hours > 0 for b in breakdown):
        out.append("the exact wait on the straggler: estimated from its SM clock (or power) against the job's median")
    if any(b.category is WasteCategory.LOST_TO_FAILURE and b.gpu_hours > 0 for b in breakdown):
        out.append("when the job last checkpointed, so how much work before the failure is lost too")
    if not final:
        out.append("how the job ends: it is still running; the figures cover its start to as_of")
    for f in failures:
        for line in f.cannot_determine:
            if line not in out:
                out.append(line)
    return out


# -- the accumulator ---------------------------------------------------------------------------
@dataclass
class _Job:
    state: JobState | None = None
    series: dict[tuple[str, int], _Series] = field(default_factory=dict)
    failures: dict[str, Failure] = field(default_factory=dict)
    last_window_end: float = 0.0
    last_published: float | None = None
    user: str | None = None
    partition: str | None = None

    def synth_state(self, job_id: str) -> JobState:
        """The job's state, or one made from its windows when slurm.jobs said nothing yet."""
        if self.state is not None:
            return self.state
        gpus: dict[str, list[int]] = {}
        for n, i in sorted(self.series):
            gpus.setdefault(n, []).append(i)
        starts = [s.cols["start"][0] for s in self.series.values() if len(s)]
        start = min(starts, default=0.0)
        return JobState(
            job_id=job_id,
            ts=max(0.0, self.last_window_end or start),
            state="UNKNOWN",
            user=self.user,
            partition=self.partition,
            nodes=sorted(gpus),
            gpus=gpus,
            start_ts=start,
        )


class JobReporter:
    """Per-job state for the verdicts: windows (compact columns), failures, the Slurm state.

    Feed it every ``slurm.jobs``, ``job.windows`` and ``failures`` message with :meth:`observe`;
    it returns the final report of a job that ends (or is requeued) and forgets the job. Memory
    is about 100 bytes per GPU window (a 64-GPU job over 6 h: about 14 MB) until the job ends.

    Args:
        price_usd_per_gpu_hour: USD per GPU-hour.
        max_jobs: jobs followed at once; beyond it the job with the oldest window is dropped.
        keep_final: final reports kept for :meth:`report` after their job ended.
    """

    def __init__(self, price_usd_per_gpu_hour: float, max_jobs: int = 5000, keep_final: int = 1000) -> None:
        if price_usd_per_gpu_hour < 0:
            raise ValueError("price must be >= 0")
        self.price = price_usd_per_gpu_hour
        self.max_jobs = max_jobs
        self.keep_final = keep_final
        self._jobs: dict[str, _Job] = {}
        self._final: OrderedDict[str, JobReport] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()

    def jobs(self) -> list[str]:
        """Job ids with a report available (followed now, or ended recently)."""
        return sorted(set(self._jobs) | set(self._final))

    def observe(self, value: Any) -> list[JobReport]:
        """Take one message (JobState, JobWindow or Failure; others are ignored).

        Returns:
            The final report of a job this state ends (empty otherwise).
        """
        if isinstance(value, JobWindow):
            if value.job_id in self._ended:
                return []
            j = self._job(value.job_id)
            j.series.setdefault((value.node, value.gpu_index), _Series()).add(value)
            j.last_window_end = max(j.last_window_end, value.window_end)
            j.user, j.partition = value.user or j.user, value.partition or j.partition
            return []
        if isinstance(value, Failure):
            if value.job_id and value.job_id not in self._ended:
                j = self._job(value.job_id)
                old = j.failures.get(value.failure_id)
                if old is None or value.last_seen >= old.last_seen:
                    j.failures[value.failure_id] = value
            return []
        if isinstance(value, JobState):
            return self._on_state(value)
        return []

    def _job(self, job_id: str) -> _Job:
        j = self._jobs.get(job_id)
        if j is None:
            if len(self._jobs) >= self.max_jobs:
                oldest = min(self._jobs, key=lambda k: self._jobs[k].last_window_end)
                del self._jobs[oldest]
            j = self._jobs[job_id] = _Job()
        return j

    def _on_state(self, st: JobState) -> list[JobReport]:
        ended = st.state in TERMINAL_JOB_STATES or st.state in REQUEUE_STATES
        if st.job_id in self._ended:
            return []
        j = self._jobs.get(st.job_id)
        if j is None and not ended and st.state not in ("RUNNING", "COMPLETING", "SUSPENDED"):
            return []  # pending: nothing allocated yet
        j = j or self._job(st.job_id)
        if j.state is not None and st.ts < j.state.ts:
            return []  # an older snapshot
        if not ended:
            if j.state is not None and j.state.start_ts != st.start_ts and st.start_ts is not None:
                j.series.clear()  # a new run of a requeued job
                j.failures.clear()
            j.state = st
            return []
        if j.state is None and not j.series:
            self._jobs.pop(st.job_id, None)
            return []
        if st.start_ts is None and j.state is not None:
            st = st.model_copy(update={"start_ts": j.state.start_ts})
        if not st.gpus and j.state is not None and j.state.gpus:
            st = st.model_copy(update={"gpus": j.state.gpus, "nodes": j.state.nodes})
        rep = _build(st, j.series, list(j.failures.values()), self.price, None)
        self._jobs.pop(st.job_id, None)
        self._final[st.job_id] = rep
        while len(self._final) > self.keep_final:
            self._final.popitem(last=False)
        if st.state not in REQUEUE_STATES:
            self._ended[st.job_id] = None
            while len(self._ended) > 10 * self.keep_final:
                self._ended.popitem(last=False)
        return [rep]

    def report(self, job_id: str, as_of: float | None = None) -> JobReport | None:
        """The job's report now (a running job: up to ``as_of``, default its last window); the
        final one for a job that ended; None for a job never seen."""
        j = self._jobs.get(job_id)
        if j is None:
            return self._final.get(job_id)
        if j.state is None and not j.series:
            return None
        return _build(j.synth_state(job_id), j.series, list(j.failures.values()), self.price, as_of)

    def reports(self) -> list[JobReport]:
        """Reports of every job followed now, and the final ones kept."""
        out = [r for k in sorted(self._jobs) if (r := self.report(k)) is not None]
        running = {r.job_id for r in out}
        return out + [r for k, r in self._final.items() if k not in running]

    def due(self, job_id: str, interval_s: float) -> JobReport | None:
        """The job's running report when its windows advanced ``interval_s`` (event time) since the
        last report returned here (the first one after ``interval_s`` of windows); else None."""
        j = self._jobs.get(job_id)
        if j is None or interval_s <= 0 or not j.series:
            return None
        starts = [s.cols["start"][0] for s in j.series.values() if len(s)]
        ref = j.last_published if j.last_published is not None else min(starts, default=j.last_window_end)
        if j.last_window_end - ref < interval_s:
            return None
        return self.mark(job_id)

    def mark(self, job_id: str) -> JobReport | None:
        """The job's running report now, noted as published (for :meth:`due`)."""
        rep = self.report(job_id)
        j = self._jobs.get(job_id)
        if rep is not None and j is not None:
            j.last_published = j.last_window_end
        return rep
