"""Fleet-comparison condition signals: a GPU or node slower than its job's peers.

``straggler-gpu`` / ``straggler-node``: leave-one-out comparison with the job's median and robust
spread (1.4826 x MAD) on SM clock (MHz), power (W) or utilisation (%).
"""

from __future__ import annotations

import bisect
import statistics
from typing import Literal

from pydantic import Field

from gpuwarden.shared.models import JobWindow

from .base import FrozenModel, Reading, window_value

__all__ = ["Straggler", "StragglerMetric", "evaluate_stragglers", "median_without"]

StragglerMetric = Literal["utilization_gpu_pct_mean", "sm_clock_mhz_mean", "power_w_mean"]


def _default_metrics() -> list[StragglerMetric]:
    return ["sm_clock_mhz_mean", "power_w_mean"]


class Straggler(FrozenModel):
    """A GPU (or node) slower than its job's peers by a robust margin: below ``below_median_ratio``
    x the job median AND more than ``mad_k`` robust deviations (1.4826 x MAD, at least
    ``min_spread`` x median) below it. The first metric of ``metrics`` the GPUs report is used
    (SM clock before power: real GPUs of one job differ 10-20 % in power); power alone must fall
    below ``power_only_ratio``."""

    type: Literal["straggler-gpu", "straggler-node"]
    metrics: list[StragglerMetric] = Field(default_factory=_default_metrics, min_length=1)
    below_median_ratio: float = Field(0.85, gt=0, lt=1, description="Slower than this share of the job's median")
    power_only_ratio: float = Field(0.7, gt=0, lt=1, description="The ratio when power is the only metric")
    mad_k: float = Field(3.0, gt=0, description="Robust deviations below the median that count")
    min_spread: float = Field(0.03, ge=0, lt=1, description="Floor of the robust deviation, share of the median")
    min_gpus: int = Field(4, ge=2, description="Peers needed for a robust median")
    min_utilization_pct: float = Field(
        20, ge=0, le=100, description="Only busy GPUs are compared (an idle GPU is not slow: see partial-idle)"
    )


def evaluate_stragglers(sig: Straggler, windows: list[JobWindow]) -> list[tuple[str, int | None, Reading]]:
    """Subjects (GPUs, or nodes by their GPUs' median) slower than their peers by a robust margin
    on the first metric every busy GPU of the job reports (see :class:`Straggler`).

    Leave-one-out: each subject is compared with the median and the robust spread (1.4826 x MAD)
    of the *other* subjects' GPUs, so one slow node of two, or one slow GPU of four, stands out.
    """
    windows = [w for w in windows if (window_value(w, "utilization_gpu_pct_mean") or 0) >= sig.min_utilization_pct]
    if len(windows) < sig.min_gpus:
        return []
    subjects: dict[tuple[str, int | None], list[JobWindow]] = {}
    for w in windows:
        subjects.setdefault((w.node, w.gpu_index if sig.type == "straggler-gpu" else None), []).append(w)
    if len(subjects) < 2:
        return []
    for metric in sig.metrics:
        per_gpu = {(w.node, w.gpu_index): x for w in windows if (x := window_value(w, metric)) is not None}
        if len(per_gpu) < len(windows):
            continue  # not every GPU reports it: try the next metric
        ratio_limit = sig.power_only_ratio if metric == "power_w_mean" else sig.below_median_ratio
        out: list[tuple[str, int | None, Reading]] = []
        values = sorted(per_gpu.values())
        deviations: dict[float, list[float]] = {}  # the peers' median -> every GPU's |value - it|, sorted
        for (node, gpu), ws in sorted(subjects.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
            mine = [per_gpu[k] for k in {(w.node, w.gpu_index) for w in ws}]
            val = statistics.median(mine)
            med = median_without(values, mine)  # the peers' median: the subject left out
            if med <= 0:
                continue
            devs = deviations.get(med)
            if devs is None:
                devs = deviations[med] = sorted(abs(v - med) for v in values)
            mad = median_without(devs, [abs(v - med) for v in mine])
            spread = max(1.4826 * mad, sig.min_spread * med)
            bad = val / med < ratio_limit and (med - val) > sig.mad_k * spread
            out.append((node, gpu, Reading(bad, f"{metric}_vs_job_median", round(val / med, 4), "ratio", ratio_limit)))
        return out
    return []


def median_without(ordered: list[float], removed: list[float]) -> float:
    """``statistics.median`` of the multiset ``ordered`` (sorted ascending) less ``removed`` (each
    of its values occurs in ``ordered``): O(k log n) for k removed of n, not a sort of the rest.

    Raises:
        statistics.StatisticsError: nothing is left.
    """
    taken: list[int] = []  # the indexes of ordered the removed values take, ascending
    for v in sorted(removed):
        lo = taken[-1] + 1 if taken and ordered[taken[-1]] == v else 0
        taken.append(bisect.bisect_left(ordered, v, lo))
    n = len(ordered) - len(taken)
    if n <= 0:
        raise statistics.StatisticsError("no median for empty data")

    def at(rank: int) -> float:  # the rank-th value left (0-based)
        i = rank
        for p in taken:
            if p <= i:
                i += 1
            else:
                break
        return ordered[i]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2
