"""The breakdown of a job's GPU-hours: its span and, window by window, where each GPU's time went.

:func:`build_job_report` is the pure entry point (Slurm state, ``job.windows``, failures in; a
:class:`~gpuwarden.shared.models.JobReport` out); :func:`build` attributes every second of every
GPU to one :class:`~gpuwarden.shared.models.WasteCategory` (the rules are listed in
:mod:`gpuwarden.detector.jobreport`) and hands the seconds to :func:`.verdict.assemble`.
Times in epoch s, utilisation in %, power in W, SM clock in MHz.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from gpuwarden.shared.models import Failure, FailureState, JobReport, JobState, JobWindow, ReportGpu, WasteCategory
from gpuwarden.shared.slurm import TERMINAL_JOB_STATES

from .model import (
    IDLE_MAX_UTIL_PCT,
    ORDER,
    REQUEUE_STATES,
    WRITER_MAX_UTIL_PCT,
    Episode,
    Series,
    Stretch,
    failure_cut,
    is_loss,
    onset,
    window_len,
    window_peak,
)
from .verdict import assemble

__all__ = ["build", "build_job_report", "gpu_row", "loss_gpus", "span"]


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
        as_of: end of the span for a running job, epoch s (default: the later of the time most
            of its GPUs' windows reached, the median of their last window ends, else the
            state's ``ts``; and :func:`~.model.failure_cut`, the end of the window holding the
            latest failure's ``first_seen``: a report is never taken before a failure it counts).

    Returns:
        The report; its breakdown adds up to ``gpu_hours`` (GPU-hours rounded to 1e-6, USD to
        cents, by largest remainder). A failure whose onset is after the span's end (an
        explicit ``as_of``, the job's end) is not counted.

    Raises:
        ValueError: a negative price, or ``as_of`` before the job's start.
    """
    series: dict[tuple[str, int], Series] = {}
    for w in windows:
        if w.job_id == job.job_id:
            series.setdefault((w.node, w.gpu_index), Series()).add(w)
    latest: dict[str, Failure] = {}
    for f in failures:
        if f.job_id == job.job_id:
            old = latest.get(f.failure_id)
            if old is None or f.last_seen >= old.last_seen:
                latest[f.failure_id] = f
    return build(job, series, list(latest.values()), price_usd_per_gpu_hour, as_of)


def span(
    job: JobState,
    series: dict[tuple[str, int], Series],
    as_of: float | None,
    failures: Sequence[Failure] = (),
) -> tuple[float, float, bool]:
    """The report's ``(start, end, final)``, epoch s (see :func:`build_job_report` for ``as_of``).

    Raises:
        ValueError: ``as_of`` before the job's start.
    """
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
        # never before a failure it counts (an XID arrives ahead of the windows of its second)
        cut = failure_cut(list(failures), window_len(series))
        if cut is not None:
            t1 = max(t1, cut)
    if as_of is not None and as_of < t0:
        raise ValueError(f"as_of {as_of} is before the job's start {t0}")
    return t0, max(t0, t1), final


def build(
    job: JobState,
    series: dict[tuple[str, int], Series],
    failures: list[Failure],
    price: float,
    as_of: float | None,
) -> JobReport:
    """The report of ``job`` from its windows as columns and its failures (latest versions).

    Args:
        job: the job's Slurm state (see :func:`build_job_report`).
        series: (node, GPU index) -> that GPU's windows.
        failures: the job's failures; those whose onset is after the span's end are left out.
        price: USD per GPU-hour.
        as_of: the span's end for a running job, epoch s (None: see :func:`span`).

    Raises:
        ValueError: a negative price, or ``as_of`` before the job's start.
    """
    if price < 0:
        raise ValueError(f"price must be >= 0 USD per GPU-hour, got {price}")
    t0, t1, final = span(job, series, as_of, failures)
    # only the span's windows: a report up to t1 is the same whatever arrived after it
    series = {g: s.between(t0, t1) for g, s in series.items()}
    gpus = job_gpus(job, series)
    gpu_set = set(gpus)
    failures = sorted((f for f in failures if onset(f) <= t1), key=lambda f: (onset(f), f.failure_id))
    episodes: dict[str, list[Episode]] = {}
    for f in failures:
        end = f.last_seen if f.state is FailureState.RESOLVED else t1
        episodes.setdefault(f.pattern, []).append(Episode(f, onset(f), max(end, onset(f))))

    # losses: per GPU the earliest onset of a failure that costs it its work
    loss: dict[tuple[str, int], tuple[float, str]] = {}
    for f in failures:
        if not is_loss(f):
            continue
        start = min(max(onset(f), t0), t1)
        for g in loss_gpus(f, gpus):
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
        peaks = [window_peak(series[g], i) for g, i in members.items()]
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

    def straggler_ratio(ep: Episode, a: float) -> float | None:
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
            return float(max(0.0, min(1.0, statistics.median(m) / statistics.median(peers))))
        last = f.evidence[-1].value if f.evidence else None
        return max(0.0, min(1.0, float(last))) if isinstance(last, int | float) else None

    secs: dict[WasteCategory, float] = dict.fromkeys(ORDER, 0.0)
    attributed: dict[WasteCategory, dict[str, float]] = {c: {} for c in ORDER}

    def add(cat: WasteCategory, dt: float, fid: str | None = None) -> None:
        if dt <= 0:
            return
        secs[cat] += dt
        if fid is not None:
            attributed[cat][fid] = attributed[cat].get(fid, 0.0) + dt

    def covering(pattern: str, a: float, b: float, g: tuple[str, int] | None = None) -> Episode | None:
        """The episode of ``pattern`` over the window; for a GPU ``g``: its own GPU's first,
        then one of its node, then a node- or job-level one of another node."""
        best: tuple[int, Episode] | None = None
        for ep in episodes.get(pattern, []):
            f = ep.failure
            if g is not None and f.gpu_index is not None and (f.node, f.gpu_index) != g:
                continue
            if not ep.covers(a, b):
                continue
            if g is None:
                return ep
            rank = 0 if f.gpu_index is not None else (1 if f.node == g[0] else 2)
            if best is None or rank < best[0]:
                best = (rank, ep)
        return best[1] if best is not None else None

    per_gpu: list[ReportGpu] = []
    stretches: list[Stretch] = []
    for g in gpus:
        s = series.get(g) or Series()
        lost_from, lost_by = loss.get(g, (t1, ""))
        add(WasteCategory.LOST_TO_FAILURE, t1 - lost_from, lost_by or None)
        covered = busy_s = 0.0
        c = s.cols
        # this GPU's time by category, window by window: (category, start, end, seconds, failure)
        marks: list[tuple[WasteCategory, float, float, float, str | None]] = []
        if t1 > lost_from:
            marks.append((WasteCategory.LOST_TO_FAILURE, lost_from, t1, t1 - lost_from, lost_by or None))
        seen: list[tuple[float, float]] = []  # the windows' clipped spans
        worked: list[tuple[float, float]] = []  # windows where the GPU did something (peak above idle)

        def mark(
            cat: WasteCategory,
            a: float,
            b: float,
            dt: float,
            fid: str | None = None,
            marks: list[tuple[WasteCategory, float, float, float, str | None]] = marks,
        ) -> None:
            add(cat, dt, fid)
            if dt > 0 and cat is not WasteCategory.BUSY:
                marks.append((cat, a, b, dt, fid))

        for i in range(len(s)):
            a, b = max(c["start"][i], t0), min(c["end"][i], lost_from)
            dt = b - a
            if dt <= 0:
                continue
            covered += dt
            seen.append((a, b))
            u, peak = c["util_mean"][i], window_peak(s, i)
            if math.isnan(peak):
                mark(WasteCategory.NO_TELEMETRY, a, b, dt)
                continue
            if peak > IDLE_MAX_UTIL_PCT:
                worked.append((a, b))
            ws, we = c["start"][i], c["end"][i]
            if ep := covering("collective-hang", ws, we):
                mark(WasteCategory.HUNG, a, b, dt, ep.failure.failure_id)
                continue
            kind = group_kind.get(ws, "busy")
            ck = covering("checkpoint-stall", ws, we)
            if ck is not None and kind in ("idle", "write"):
                mark(WasteCategory.CHECKPOINT_STALL, a, b, dt, ck.failure.failure_id)
                continue
            if peak <= IDLE_MAX_UTIL_PCT:
                if kind == "idle":
                    ep = covering("idle-allocation", ws, we)
                    mark(WasteCategory.IDLE, a, b, dt, ep.failure.failure_id if ep else None)
                else:
                    ep = covering("partial-idle-allocation", ws, we, g)
                    mark(WasteCategory.PARTIALLY_IDLE, a, b, dt, ep.failure.failure_id if ep else None)
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
                mark(WasteCategory.STRAGGLER_WAIT, a, b, useful * (1 - r), ep.failure.failure_id)
                useful *= r
            if (ep := covering("input-starvation", ws, we)) and not math.isnan(u):
                idle_share = max(0.0, min(1.0, 1 - u / 100.0))
                mark(WasteCategory.INPUT_WAIT, a, b, useful * idle_share, ep.failure.failure_id)
                useful *= 1 - idle_share
            add(WasteCategory.BUSY, useful)
            busy_s += useful
        alloc = lost_from - t0
        add(WasteCategory.NO_TELEMETRY, alloc - covered)
        for a, b in _gaps(seen, t0, lost_from):
            marks.append((WasteCategory.NO_TELEMETRY, a, b, b - a, None))
        stretches += _stretches(g, marks, worked)
        per_gpu.append(gpu_row(g, s, covered, busy_s, t1 - t0))

    return assemble(job, gpus, t0, t1, final, price, secs, attributed, per_gpu, failures, stretches)


def job_gpus(job: JobState, series: dict[tuple[str, int], Series]) -> list[tuple[str, int]]:
    """The job's GPUs as (node, index): those its Slurm state names, else those its windows name."""
    gpus = [(n, i) for n in job.nodes or sorted(job.gpus) for i in job.gpus.get(n, [])]
    return gpus or sorted(series)


def loss_gpus(f: Failure, gpus: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """The GPUs of ``gpus`` (node, index) a loss failure costs their work: every GPU of the job
    for a job-scope cost (``affected_gpus`` at least the job's GPUs, or a node-level failure
    without a cost scope); else the failure's GPU; else the GPUs on its node."""
    if f.cost.affected_gpus >= len(gpus) or (f.gpu_index is None and f.cost.affected_gpus == 0):
        return list(gpus)
    if f.gpu_index is not None:
        return [(f.node, f.gpu_index)] if (f.node, f.gpu_index) in set(gpus) else []
    return [g for g in gpus if g[0] == f.node]


def _gaps(seen: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """The parts of ``[t0, t1)`` no span of ``seen`` (ascending starts) covers."""
    out, at = [], t0
    for a, b in sorted(seen):
        if a > at:
            out.append((at, min(a, t1)))
        at = max(at, b)
    if at < t1:
        out.append((at, t1))
    return [(a, b) for a, b in out if b > a]


def _stretches(
    g: tuple[str, int],
    marks: list[tuple[WasteCategory, float, float, float, str | None]],
    worked: list[tuple[float, float]],
) -> list[Stretch]:
    """One GPU's marks merged into stretches: adjacent marks of one category and failure join."""
    out: list[Stretch] = []
    last: dict[tuple[WasteCategory, str | None], Stretch] = {}
    for cat, a, b, dt, fid in sorted(marks, key=lambda m: (m[1], m[2])):
        prev = last.get((cat, fid))
        if prev is not None and a <= prev.end + 1e-6:
            prev.end = max(prev.end, b)
            prev.seconds += dt
            continue
        st = Stretch(cat, g[0], g[1], a, b, dt, fid)
        last[(cat, fid)] = st
        out.append(st)
    first_work = min((a for a, _ in worked), default=math.inf)
    last_work = max((b for _, b in worked), default=-math.inf)
    for st in out:
        st.worked_before = first_work < st.start
        st.worked_after = last_work > st.end
    return out


def _mean(xs: Sequence[float]) -> float | None:
    v = [x for x in xs if not math.isnan(x)]
    return round(statistics.fmean(v), 2) if v else None


def _max(xs: Sequence[float]) -> float | None:
    v = [x for x in xs if not math.isnan(x)]
    return round(max(v), 2) if v else None


def _min(xs: Sequence[float]) -> float | None:
    v = [x for x in xs if not math.isnan(x)]
    return round(min(v), 2) if v else None


def gpu_row(g: tuple[str, int], s: Series, covered: float, busy: float, span: float) -> ReportGpu:
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
