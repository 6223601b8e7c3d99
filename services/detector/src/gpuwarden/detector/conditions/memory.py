"""Memory-trend condition signals: a job's GPU memory growing steadily towards its limit.

``memory-growth``: a least-squares slope (MiB/min) over the windows' peak memory, a good linear
fit and the limit (MiB) within the horizon (min). Memory held without a job is a GPU-scope
threshold (:mod:`.gpu`).
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import Field

from gpuwarden.shared.models import JobWindow

from .base import FrozenModel, JobContext, Reading

__all__ = ["MemoryGrowth", "evaluate_memory_growth"]


class MemoryGrowth(FrozenModel):
    """Steady growth: a least-squares slope over the windows' peak memory, a good linear fit
    (noise around a flat level fits badly), and the limit within the horizon."""

    type: Literal["memory-growth"]
    min_mib_per_min: float = Field(gt=0)
    horizon_min: float = Field(60, gt=0, description="Unhealthy if the limit is reached within this many minutes")
    min_windows: int = Field(6, ge=3, description="Windows of history needed for a trend")
    min_r2: float = Field(0.8, gt=0, le=1, description="Fit quality (r squared) that counts as steady growth")
    startup_grace_s: float = Field(
        300, ge=0, description="Windows this soon after the job's start (the model loading) are left out, s"
    )


def evaluate_memory_growth(
    sig: MemoryGrowth, windows: list[JobWindow], history: list[list[JobWindow]], ctx: JobContext
) -> list[tuple[str, int | None, Reading]]:
    """Per GPU: the growth slope of its peak memory, unhealthy when the limit is near."""
    out: list[tuple[str, int | None, Reading]] = []
    # each GPU's history in one pass over it (not a pass per GPU: O(GPUs x history), not GPUs^2)
    past: dict[tuple[str, int], list[JobWindow]] = {}
    for group in history:
        for x in group:
            past.setdefault((x.node, x.gpu_index), []).append(x)
    for w in windows:
        series = [
            (x.window_end / 60.0, x.memory_used_mib_max)
            for x in [*past.get((w.node, w.gpu_index), ()), w]
            if x.memory_used_mib_max is not None and not ctx.in_grace(x, sig.startup_grace_s)
        ]
        if len(series) < sig.min_windows or not w.memory_total_mib or w.memory_used_mib_max is None:
            continue
        xs, ys = zip(*series, strict=True)
        if len(set(ys)) == 1:
            slope, r2 = 0.0, 0.0
        else:
            slope = statistics.linear_regression(xs, ys).slope
            r2 = statistics.correlation(xs, ys) ** 2
        minutes_left = (w.memory_total_mib - w.memory_used_mib_max) / slope if slope > 0 else float("inf")
        bad = slope >= sig.min_mib_per_min and r2 >= sig.min_r2 and minutes_left <= sig.horizon_min
        out.append(
            (w.node, w.gpu_index, Reading(bad, "memory_growth_mib_per_min", slope, "MiB/min", sig.min_mib_per_min))
        )
    return out
