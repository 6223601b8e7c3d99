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
from typing import Literal

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
    An idle stretch from the job's start (model loading, data staging) counts from the start but
    opens no failure before ``startup_grace_s``: it is an idle allocation once it outlasts it."""

    type: Literal["idle"]
    max_utilization_pct: float = Field(5, ge=0, le=100)
    startup_grace_s: float = Field(300, ge=0, description="No idle allocation opens this soon after the job's start, s")


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
    """Every GPU of the job pinned at full utilisation at idle power (spinning in a collective);
    the rule's ``for_s`` is how long (NCCL's own timeout is 10-30 min)."""

    type: Literal["hang"]
    min_utilization_pct: float = Field(95, ge=0, le=100)
    max_power_ratio: float = Field(0.35, gt=0, le=1, description="Power below this share of the limit")


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
    """The whole job idle (its busiest GPU at most the threshold); held in the start-up grace."""
    first = _first(windows)
    peaks = [p for w in windows if (p := peak_util(w)) is not None]
    if not peaks:
        return []
    peak = max(peaks)
    bad = peak <= sig.max_utilization_pct
    hold = ctx.in_grace(first, sig.startup_grace_s)
    return [(first.node, None, Reading(bad, "max_gpu_utilization_pct", peak, "%", sig.max_utilization_pct, hold))]


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


def evaluate_hang(sig: Hang, windows: list[JobWindow]) -> list[tuple[str, int | None, Reading]]:
    """Every GPU at full utilisation at idle power; nothing when a GPU lacks power or limit."""
    first = _first(windows)
    pairs = [
        (u, p / lim)
        for w in windows
        if (u := window_value(w, "utilization_gpu_pct_mean")) is not None
        and (p := window_value(w, "power_w_mean")) is not None
        and (lim := window_value(w, "power_limit_w"))
    ]
    if not pairs or len(pairs) < len(windows):
        return []  # a GPU without power or limit: the whole job cannot be judged
    bad = all(u >= sig.min_utilization_pct and r <= sig.max_power_ratio for u, r in pairs)
    worst = max(r for _, r in pairs)
    return [(first.node, None, Reading(bad, "power_ratio_at_full_utilization", worst, "ratio", sig.max_power_ratio))]


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
