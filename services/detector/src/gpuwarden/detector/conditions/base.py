"""What every condition family shares: the frozen model base, a signal's reading, the job context.

A :class:`Reading` is one evaluation of a signal (unhealthy or not, value and threshold for the
evidence); a :class:`JobContext` is what the engine knows of a job beyond its windows (its start,
its GPUs' working power in W). No I/O, no Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from gpuwarden.shared.models import Evidence, JobWindow

__all__ = ["CostModel", "FrozenModel", "JobContext", "Reading", "peak_util", "window_value"]


class FrozenModel(BaseModel):
    """Base of the catalog's rule and signal models: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CostModel(FrozenModel):
    """``job``: all GPUs of the affected job stall; ``gpu``: only the GPU itself."""

    scope: Literal["job", "gpu"] = "job"


class Reading(NamedTuple):
    """One evaluation of a signal: unhealthy or not, with the value and threshold shown as evidence.

    A named tuple (immutable), not a frozen dataclass: the detector builds several per GPU per
    sample, and a frozen dataclass's ``__init__`` cost 3x as much (~0.7 against ~0.25 us).
    """

    unhealthy: bool
    signal: str
    value: float | str
    unit: str | None
    threshold: float | str | None
    #: unhealthy on weak evidence that must last longer before it may open a failure (a collective
    #: hang's ``weak_for_s``): part of what the signal means, not a deferral (those are the pending
    #: stage's, :mod:`gpuwarden.detector.pending`)
    unconfirmed: bool = False

    def evidence(self, ts: float, source: str) -> Evidence:
        v = round(self.value, 3) if isinstance(self.value, float) else self.value
        t = round(self.threshold, 3) if isinstance(self.threshold, float) else self.threshold
        return Evidence(signal=self.signal, value=v, unit=self.unit, threshold=t, ts=ts, source=source)


def window_value(w: JobWindow, metric: str) -> float | None:
    """``w.<metric>`` as a float (units those of :class:`JobWindow`), None when not reported."""
    value = getattr(w, metric)
    return float(value) if value is not None else None


def peak_util(w: JobWindow) -> float | None:
    """The busiest reading of the window (its maximum), else its mean, %."""
    return (
        window_value(w, "utilization_gpu_pct_max")
        if w.utilization_gpu_pct_max is not None
        else window_value(w, "utilization_gpu_pct_mean")
    )


@dataclass
class JobContext:
    """What the engine knows about a job beyond its windows.

    Attributes:
        start_ts: the job's start (Slurm's, else its first window), epoch s.
        working_power_w: per (node, GPU index) the highest mean power of a busy window seen
            in this job, W: the GPU's working power, against which a spinning GPU is judged.
    """

    start_ts: float | None = None
    working_power_w: dict[tuple[str, int], float] = field(default_factory=dict)

    def observe(self, windows: list[JobWindow], busy_pct: float = 50.0) -> None:
        """Update the working-power reference from one window group."""
        for w in windows:
            u, p = window_value(w, "utilization_gpu_pct_mean"), window_value(w, "power_w_mean")
            if u is not None and p is not None and u >= busy_pct:
                k = (w.node, w.gpu_index)
                self.working_power_w[k] = max(self.working_power_w.get(k, 0.0), p)

    def spinning(self, w: JobWindow, min_util: float, max_ratio: float, limit_ratio: float = 0.35) -> bool:
        """Busy (``min_util`` % or more) at idle power: below ``limit_ratio`` x the power limit, or
        below ``max_ratio`` x the GPU's own working power."""
        u, p = window_value(w, "utilization_gpu_pct_mean"), window_value(w, "power_w_mean")
        if u is None or p is None or u < min_util:
            return False
        if w.power_limit_w and p <= limit_ratio * w.power_limit_w:
            return True
        ref = self.working_power_w.get((w.node, w.gpu_index))
        return ref is not None and p <= max_ratio * ref

    def in_grace(self, w: JobWindow, grace_s: float) -> bool:
        return self.start_ts is not None and w.window_end - self.start_ts < grace_s
