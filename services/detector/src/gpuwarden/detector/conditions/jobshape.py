"""Job-shape condition signals: how a job's GPUs use their allocation, all GPUs of one window together.

``idle`` (the whole allocation idle), ``partial-idle`` (some GPUs idle while the others work),
``low-duty`` (busy only a small share of every window), ``hang`` (full utilisation at idle
power: spinning in a collective), ``low-tensor`` (busy GPUs whose tensor pipes idle) and
``pauses`` (repeated stalls: checkpoints, evaluation). Utilisation in %, power in W. Each
``evaluate_*`` takes the non-empty windows of one job and window start (one per GPU) and returns
``(node, gpu_index or None for the whole job, reading)`` per subject.
"""

from __future__ import annotations

import statistics
from typing import Literal, NamedTuple

from pydantic import Field

from gpuwarden.shared.models import JobWindow

from .base import FrozenModel, JobContext, Reading, peak_util, window_value

__all__ = [
    "Hang",
    "Idle",
    "LowDuty",
    "LowTensor",
    "PartialIdle",
    "Pauses",
    "evaluate_hang",
    "evaluate_idle",
    "evaluate_low_duty",
    "evaluate_low_tensor",
    "evaluate_partial_idle",
    "evaluate_pauses",
]


class Idle(FrozenModel):
    """Every GPU of the job idle for a whole window (its busiest reading at most the threshold).
    An idle stretch from the job's start (model loading, data staging) counts from the start; the
    rule's ``explain: {startup_s: ...}`` holds what is found in the start-up until it is over and
    drops it if it ended by then (the pending stage, :mod:`gpuwarden.detector.pending`)."""

    type: Literal["idle"]
    max_utilization_pct: float = Field(5, ge=0, le=100)


class PartialIdle(FrozenModel):
    """Some GPUs idle for whole windows while the others do real work (busy at working power,
    not spinning in a collective while one rank writes a checkpoint). No start-up grace: the
    working GPUs show the job is past its start-up."""

    type: Literal["partial-idle"]
    max_utilization_pct: float = Field(5, ge=0, le=100)
    busy_min_utilization_pct: float = Field(50, ge=0, le=100)


class LowDuty(FrozenModel):
    """The job's GPUs busy only a small share of every window (mean in the band), steadily: the
    rule's ``for_s`` is the persistence (a bursty inference load leaves the band often)."""

    type: Literal["low-duty"]
    min_utilization_pct: float = Field(5, ge=0, le=100)
    max_utilization_pct: float = Field(40, ge=0, le=100)
    turn_taking_gpus: int = Field(
        3,
        ge=2,
        description="With this many GPUs or more, utilisations that add up to about one busy GPU "
        "(70-130 %) are GPUs taking turns (sequential model parallelism), not GPUs waiting on the host",
    )


class Hang(FrozenModel):
    """Every GPU of the job pinned at full utilisation at idle power: spinning in a collective that
    never completes (NCCL's own timeout is 10-30 min).

    A GPU spins when it is at least ``min_utilization_pct`` busy at no more than ``max_power_ratio``
    of its power limit or ``max_working_power_ratio`` of its own working power (its busiest power
    earlier in the job). A checkpoint is no hang: rank 0 (or some rank) works alone, below full
    utilisation, while the others spin, and the stall ends; a hang has *every* GPU spinning.

    The evidence is strong when every GPU of the job (all ``job_gpus`` reported) fell from its
    own working power to at most ``max_working_power_ratio`` of it and, where the SM clock is
    reported, holds at least ``min_clock_ratio`` of its own busy clock (from earlier windows, else
    its maximum clock): SMs at full clock drawing idle power do no work (a throttled or
    clock-locked GPU draws less with its clock down). With strong evidence the failure opens after
    the rule's ``for_s``; with the limit alone to go on (no baseline from earlier in the job, a
    clock that fell, a GPU unreported) the spin must last ``weak_for_s``, counted over the job's
    recent windows.
    """

    type: Literal["hang"]
    min_utilization_pct: float = Field(95, ge=0, le=100)
    max_power_ratio: float = Field(0.35, gt=0, le=1, description="Power below this share of the limit")
    max_working_power_ratio: float = Field(
        0.35, gt=0, le=1, description="Power below this share of the GPU's own working power earlier in the job"
    )
    min_clock_ratio: float = Field(
        0.85, ge=0, le=1, description="Strong evidence: SM clock at least this share of the GPU's own busy clock"
    )
    weak_for_s: float = Field(
        300, ge=0, description="Without strong evidence the spin must last this long (event time), s"
    )


class LowTensor(FrozenModel):
    """Busy GPUs of a job whose tensor pipes idle, reported once for the job (the share of its
    busy GPUs below the threshold); GPUs spinning at idle power (a hang) are not busy."""

    type: Literal["low-tensor"]
    max_tensor_pct: float = Field(10, ge=0, le=100)
    min_utilization_pct: float = Field(80, ge=0, le=100)
    min_share: float = Field(0.5, gt=0, le=1, description="Share of the busy GPUs that must be low")
    max_power_ratio: float = Field(0.35, gt=0, le=1, description="At or below this share of the limit: spinning")


class Pauses(FrozenModel):
    """Repeated stalls of a busy job, the signature of checkpoints (or evaluation): a stalled
    window is one where every GPU idles (busiest reading at most ``max_utilization_pct``), or
    where a minority of GPUs (rank 0 writing the checkpoint) drops below
    ``writer_max_utilization_pct`` while the others spin in a collective (at least
    ``wait_min_utilization_pct`` busy at no more than ``wait_max_power_ratio`` of their working
    power). Only stalls between busy windows count (not the start-up or the end), and the share
    of recent windows and the number of separate stalls must both reach their minimum."""

    type: Literal["pauses"]
    max_utilization_pct: float = Field(5, ge=0, le=100, description="A window where every GPU is below this")
    writer_max_utilization_pct: float = Field(30, ge=0, le=100)
    wait_min_utilization_pct: float = Field(90, ge=0, le=100)
    wait_max_power_ratio: float = Field(0.5, gt=0, le=1, description="Share of the GPU's working power")
    min_share: float = Field(0.15, gt=0, le=1, description="Share of windows with a pause that is unhealthy")
    min_windows: int = Field(12, ge=3, description="Windows of history needed")
    min_pauses: int = Field(2, ge=1, description="Separate pauses needed (periodicity)")
    max_pause_windows: int = Field(
        12, ge=1, description="An all-idle stretch longer than this many windows is idle time, not a pause"
    )


def _first(windows: list[JobWindow]) -> JobWindow:
    """The window a whole-job reading is reported on: the job's first node and GPU."""
    return min(windows, key=lambda w: (w.node, w.gpu_index))


def _utils(windows: list[JobWindow]) -> list[float]:
    return [u for w in windows if (u := window_value(w, "utilization_gpu_pct_mean")) is not None]


def evaluate_idle(sig: Idle, windows: list[JobWindow], ctx: JobContext) -> list[tuple[str, int | None, Reading]]:
    """The whole job idle (its busiest GPU at most the threshold)."""
    first = _first(windows)
    peaks = [p for w in windows if (p := peak_util(w)) is not None]
    if not peaks:
        return []
    peak = max(peaks)
    bad = peak <= sig.max_utilization_pct
    return [(first.node, None, Reading(bad, "max_gpu_utilization_pct", peak, "%", sig.max_utilization_pct))]


def evaluate_partial_idle(
    sig: PartialIdle, windows: list[JobWindow], ctx: JobContext
) -> list[tuple[str, int | None, Reading]]:
    """Per GPU: idle while others of the same window do real work."""
    out: list[tuple[str, int | None, Reading]] = []
    if len(_utils(windows)) < 2:
        return []
    idle = [w for w in windows if (peak_util(w) or 0) <= sig.max_utilization_pct]
    working = [
        w
        for w in windows
        if (window_value(w, "utilization_gpu_pct_mean") or 0) >= sig.busy_min_utilization_pct
        and not ctx.spinning(w, sig.busy_min_utilization_pct, 0.5)
    ]
    if not working and idle:
        return []  # the others stall too (a checkpoint, an eval pause): this window tells nothing
    for w in windows:
        bad = bool(working) and w in idle
        out.append(
            (
                w.node,
                w.gpu_index,
                Reading(bad, "gpu_utilization_pct_max", peak_util(w) or 0.0, "%", sig.max_utilization_pct),
            )
        )
    return out


def evaluate_low_duty(sig: LowDuty, windows: list[JobWindow]) -> list[tuple[str, int | None, Reading]]:
    """The job's mean utilisation in the low-duty band (GPUs taking turns excepted)."""
    first = _first(windows)
    utils = _utils(windows)
    if not utils:
        return []
    mean = statistics.fmean(utils)
    turns = len(utils) >= sig.turn_taking_gpus and 70.0 <= sum(utils) <= 130.0
    bad = sig.min_utilization_pct < mean <= sig.max_utilization_pct and not turns
    return [(first.node, None, Reading(bad, "mean_gpu_utilization_pct", mean, "%", sig.max_utilization_pct))]


_HANG_SIGNAL = "power_ratio_at_full_utilization"


class _Spin(NamedTuple):
    """One GPU's window as the hang signal sees it."""

    spinning: bool  # busy at idle power (against its limit or its own working power)
    dropped: bool  # busy at no more than ``max_working_power_ratio`` of its own working power
    limit_ratio: float | None  # power / limit
    working_ratio: float | None  # power / its working power


def _hang_spin(sig: Hang, w: JobWindow, ctx: JobContext) -> _Spin | None:
    """None when the GPU cannot be judged (no utilisation or power, or neither limit nor working power)."""
    u, p = window_value(w, "utilization_gpu_pct_mean"), window_value(w, "power_w_mean")
    lim = window_value(w, "power_limit_w")
    ref = ctx.working_power_w.get((w.node, w.gpu_index))
    if u is None or p is None or not (lim or ref):
        return None
    busy = u >= sig.min_utilization_pct
    limit_ratio = p / lim if lim else None
    working_ratio = p / ref if ref else None
    dropped = busy and working_ratio is not None and working_ratio <= sig.max_working_power_ratio
    low = limit_ratio is not None and limit_ratio <= sig.max_power_ratio
    return _Spin(busy and (low or dropped), dropped, limit_ratio, working_ratio)


def _hang_group(sig: Hang, group: list[JobWindow], ctx: JobContext) -> bool:
    """Every GPU of a window group spinning."""
    spins = [_hang_spin(sig, w, ctx) for w in group]
    return bool(spins) and all(s is not None and s.spinning for s in spins)


def _busy_clocks(sig: Hang, history: list[list[JobWindow]], ctx: JobContext) -> dict[tuple[str, int], float]:
    """Per GPU its own busy SM clock: the highest mean clock of an earlier window in which it
    worked (busy, not spinning against its working power), MHz."""
    out: dict[tuple[str, int], float] = {}
    for group in history:
        for h in group:
            c, u, p = h.sm_clock_mhz_mean, h.utilization_gpu_pct_mean, h.power_w_mean
            if c is None or u is None or p is None or u < 50:
                continue
            key = (h.node, h.gpu_index)
            ref = ctx.working_power_w.get(key)
            if ref and p <= sig.max_working_power_ratio * ref:
                continue  # it was spinning then
            out[key] = max(out.get(key, 0.0), c)
    return out


def _hang_streak_s(sig: Hang, windows: list[JobWindow], history: list[list[JobWindow]], ctx: JobContext) -> float:
    """How long every GPU has been spinning, as the tracker counts it: from the end of the first
    window of the run that reaches ``windows`` to the end of ``windows``, within the job's recent
    windows the detector keeps (30: 300 s at the correlator's default 10 s windows)."""
    end = max(w.window_end for w in windows)
    first_end = end
    for group in reversed(history):
        if not group or not _hang_group(sig, group, ctx):
            break
        first_end = max(w.window_end for w in group)
    return end - first_end


def evaluate_hang(
    sig: Hang, windows: list[JobWindow], history: list[list[JobWindow]], ctx: JobContext
) -> list[tuple[str, int | None, Reading]]:
    """Every GPU at full utilisation at idle power; with strong evidence (each fell from its own
    working power, its SM clock held, every GPU of the job reported) unhealthy at once, else held
    until every GPU has spun ``weak_for_s``. Nothing when a GPU lacks utilisation or power, or
    both a limit and a working power."""
    first = _first(windows)
    spins = [_hang_spin(sig, w, ctx) for w in windows]
    judged = [s for s in spins if s is not None]
    if len(judged) < len(spins):
        return []  # a GPU that cannot be judged: neither can the job
    limit_ratio = max((s.limit_ratio for s in judged if s.limit_ratio is not None), default=None)
    value = limit_ratio if limit_ratio is not None else max(s.working_ratio or 0.0 for s in judged)
    if not all(s.spinning for s in judged):
        return [(first.node, None, Reading(False, _HANG_SIGNAL, value, "ratio", sig.max_power_ratio))]
    complete = first.job_gpus is None or len(windows) >= first.job_gpus
    if complete and all(s.dropped for s in judged) and _clocks_held(sig, windows, history, ctx):
        worst = max(s.working_ratio or 0.0 for s in judged)
        signal = "power_share_of_own_working_power"
        return [(first.node, None, Reading(True, signal, worst, "ratio", sig.max_working_power_ratio))]
    unconfirmed = _hang_streak_s(sig, windows, history, ctx) < sig.weak_for_s - 1e-3
    return [(first.node, None, Reading(True, _HANG_SIGNAL, value, "ratio", sig.max_power_ratio, unconfirmed))]


def _clocks_held(sig: Hang, windows: list[JobWindow], history: list[list[JobWindow]], ctx: JobContext) -> bool:
    """Every GPU that reports its SM clock at ``min_clock_ratio`` of its own busy clock or more
    (from the job's earlier windows, else its maximum clock)."""
    busy: dict[tuple[str, int], float] | None = None
    for w in windows:
        c = window_value(w, "sm_clock_mhz_mean")
        if c is None:
            continue
        if busy is None:
            busy = _busy_clocks(sig, history, ctx)
        ref = busy.get((w.node, w.gpu_index)) or window_value(w, "max_sm_clock_mhz")
        if ref and c < sig.min_clock_ratio * ref:
            return False
    return True


def evaluate_low_tensor(
    sig: LowTensor, windows: list[JobWindow], ctx: JobContext
) -> list[tuple[str, int | None, Reading]]:
    """The share of the job's busy (not spinning) GPUs whose tensor activity is low."""
    first = _first(windows)
    busy = [
        (w, t)
        for w in windows
        if (t := window_value(w, "tensor_activity_pct_mean")) is not None
        and (window_value(w, "utilization_gpu_pct_mean") or 0) >= sig.min_utilization_pct
        and not ctx.spinning(w, sig.min_utilization_pct, 0.5, sig.max_power_ratio)
    ]
    if not busy:
        return []
    low = [t for _, t in busy if t <= sig.max_tensor_pct]
    share = len(low) / len(busy)
    value = statistics.median(t for _, t in busy)
    return [(first.node, None, Reading(share >= sig.min_share, "tensor_activity_pct", value, "%", sig.max_tensor_pct))]


def evaluate_pauses(
    sig: Pauses, windows: list[JobWindow], history: list[list[JobWindow]], ctx: JobContext
) -> list[tuple[str, int | None, Reading]]:
    """Stalled share of the job's recent windows (``history`` then ``windows``)."""
    first = _first(windows)
    return [(first.node, None, _pauses(sig, [*history, windows], ctx))]


def _window_kind(sig: Pauses, group: list[JobWindow], ctx: JobContext) -> str:
    """``busy``; ``idle`` (every GPU idle); ``write`` (a minority of GPUs, rank 0 writing a
    checkpoint, below the writer threshold while all the others spin in a collective); ``other``."""
    peaks = [peak_util(w) or 0.0 for w in group]
    if peaks and max(peaks) <= sig.max_utilization_pct:
        return "idle"
    if len(group) >= 2:
        writers = [
            w for w in group if (window_value(w, "utilization_gpu_pct_mean") or 0) < sig.writer_max_utilization_pct
        ]
        waiters = [w for w in group if ctx.spinning(w, sig.wait_min_utilization_pct, sig.wait_max_power_ratio)]
        if writers and waiters and len(writers) < len(group) / 2 and len(writers) + len(waiters) == len(group):
            return "write"
    busy = [
        w for w in group if (window_value(w, "utilization_gpu_pct_mean") or 0) >= 50 and not ctx.spinning(w, 50, 0.5)
    ]
    return "busy" if len(busy) * 2 >= len(group) else "other"


def _pauses(sig: Pauses, groups: list[list[JobWindow]], ctx: JobContext) -> Reading:
    """Stalled share of ``groups``: checkpoint writes always count; all-idle windows only between
    busy windows (not the start-up, not a tail that never resumes)."""
    kinds = [_window_kind(sig, g, ctx) for g in groups]
    stalled = [k == "write" for k in kinds]
    last_busy: int | None = None
    for i, k in enumerate(kinds):
        if k != "busy":
            continue
        if last_busy is not None and i - last_busy - 1 <= sig.max_pause_windows:
            for j in range(last_busy + 1, i):
                stalled[j] = stalled[j] or kinds[j] == "idle"
        last_busy = i
    episodes = sum(1 for i, s in enumerate(stalled) if s and (i == 0 or not stalled[i - 1]))
    writes = sum(1 for k in kinds if k == "write")
    share = sum(stalled) / len(groups)
    periodic = episodes >= sig.min_pauses or writes >= sig.min_windows
    bad = len(groups) >= sig.min_windows and share >= sig.min_share and periodic
    return Reading(bad, "stalled_window_share", share, "ratio", sig.min_share)
