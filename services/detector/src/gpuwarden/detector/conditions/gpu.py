"""GPU-scope condition signals: per-GPU thresholds and health flags of one ``gpu.attributed`` sample.

``throttle``, ``flag`` (row remap / page retirement pending or failed), ``counter-rate`` (ECC,
PCIe replay, retired pages per minute), ``clock-low``, ``pcie-degraded``, ``nvlink-rate``,
``nvlink-down``, ``memory-without-job``. Counters are judged against the previous sample of the
same GPU (``dt`` s earlier).

Only ``memory-without-job`` depends on whether a job holds the GPU (:data:`JOB_DEPENDENT`): the
engine gives it no reading for a sample whose attribution is ``unknown``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from gpuwarden.shared.models import GpuSample

from .base import FrozenModel, Reading

if TYPE_CHECKING:
    from . import Signal

__all__ = [
    "JOB_DEPENDENT",
    "ClockLow",
    "CounterRate",
    "Flag",
    "MemoryWithoutJob",
    "NvlinkDown",
    "NvlinkRate",
    "PcieDegraded",
    "Throttle",
    "evaluate_gpu",
    "gpu_evaluator",
]


class Throttle(FrozenModel):
    type: Literal["throttle"]
    reasons: list[str] = Field(min_length=1)
    clock_ratio_below: float | None = Field(None, gt=0, le=1, description="Also require SM clock < ratio x max")
    or_power_at_limit: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Also count power >= this share of the enforced limit as the reason (a recording or an "
        "older driver without throttle reasons: a GPU at its power limit is power-capped)",
    )

    @cached_property
    def reason_set(self) -> frozenset[str]:
        """``reasons`` as a set (computed once: read per GPU per sample)."""
        return frozenset(self.reasons)

    @cached_property
    def reasons_text(self) -> str:
        """``reasons`` as the evidence's threshold text (computed once)."""
        return ",".join(self.reasons)


class Flag(FrozenModel):
    type: Literal["flag"]
    field: Literal["remapped_rows_pending", "remapped_rows_failure", "retired_pages_pending"]


class CounterRate(FrozenModel):
    type: Literal["counter-rate"]
    field: Literal["ecc_sbe_volatile", "ecc_dbe_volatile", "pcie_replay_count", "retired_pages"]
    min_per_min: float = Field(gt=0, description="Increase per minute that is unhealthy")


class ClockLow(FrozenModel):
    type: Literal["clock-low"]
    ratio_below: float = Field(gt=0, le=1, description="SM clock below this share of its maximum")
    min_utilization_pct: float = Field(50, ge=0, le=100)
    max_power_ratio: float = Field(
        0.95, gt=0, le=1, description="At or above this share of the power limit the GPU is power-capped, not slow"
    )


class PcieDegraded(FrozenModel):
    type: Literal["pcie-degraded"]
    min_utilization_pct: float = Field(50, ge=0, le=100, description="Gen below max only counts under load")


class NvlinkRate(FrozenModel):
    type: Literal["nvlink-rate"]
    min_per_min: float = Field(gt=0, description="CRC/replay/recovery errors per minute over all links")


class NvlinkDown(FrozenModel):
    type: Literal["nvlink-down"]


class MemoryWithoutJob(FrozenModel):
    type: Literal["memory-without-job"]
    min_mib: float = Field(1024, gt=0)


def _rate_per_min(cur: float | None, prev: float | None, dt: float) -> float | None:
    if cur is None or prev is None or dt <= 0:
        return None
    return max(0.0, cur - prev) * 60.0 / dt


#: ``(signal, reading, previous reading, dt s, has_job, full)`` -> a reading or None. With
#: ``full`` False a healthy reading may come back as None, before its evidence text is built:
#: the engine asks so for a GPU with no open tracker, which only an unhealthy reading changes
#: (most GPUs, most of the time).
GpuEvaluator = Callable[[Any, GpuSample, "GpuSample | None", float, bool, bool], "Reading | None"]


def _throttle(
    sig: Throttle, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    reasons = g.throttle_reasons
    active = sorted(sig.reason_set.intersection(reasons)) if reasons else []
    if (
        not active
        and sig.or_power_at_limit is not None
        and g.power_w is not None
        and g.power_limit_w
        and g.power_w >= sig.or_power_at_limit * g.power_limit_w
    ):
        active = ["power_at_limit"]
    bad = bool(active)
    if not bad and not full:
        return None
    if bad and sig.clock_ratio_below is not None:
        if g.sm_clock_mhz is None or not g.max_sm_clock_mhz:
            return None
        bad = g.sm_clock_mhz < sig.clock_ratio_below * g.max_sm_clock_mhz
    return Reading(bad, "throttle_reasons", ",".join(active) if active else "none", None, sig.reasons_text)


def _flag(
    sig: Flag, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    flag = getattr(g, sig.field)
    if flag is None or (not flag and not full):
        return None
    return Reading(bool(flag), sig.field, str(bool(flag)).lower(), None, "false")


def _counter_rate(
    sig: CounterRate, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    cur = getattr(g, sig.field)
    if cur is None:
        return None
    before = getattr(prev, sig.field) if prev is not None else None
    if not full and (before is None or cur <= before):  # healthy unless the counter rose (min_per_min > 0)
        return None
    rate = _rate_per_min(cur, before, dt)
    if rate is None or (not full and rate < sig.min_per_min):
        return None
    return Reading(rate >= sig.min_per_min, sig.field, rate, "per min", sig.min_per_min)


def _clock_low(
    sig: ClockLow, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    if g.sm_clock_mhz is None or not g.max_sm_clock_mhz or g.utilization_gpu_pct is None:
        return None
    ratio = g.sm_clock_mhz / g.max_sm_clock_mhz
    bad = ratio < sig.ratio_below and g.utilization_gpu_pct >= sig.min_utilization_pct
    if bad:  # slow under load: unless a throttle reason or the power cap says why
        throttled = any(r != "gpu_idle" for r in g.throttle_reasons)
        capped = (
            g.power_w is not None
            and bool(g.power_limit_w)
            and g.power_w >= sig.max_power_ratio * (g.power_limit_w or 0)
        )
        bad = not throttled and not capped
    if not bad and not full:
        return None
    return Reading(bad, "sm_clock_ratio", ratio, "ratio", sig.ratio_below)


def _pcie_degraded(
    sig: PcieDegraded, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    if g.pcie_link_width is None or g.pcie_link_width_max is None:
        return None
    width_bad = g.pcie_link_width < g.pcie_link_width_max
    gen_bad = (
        g.pcie_link_gen is not None
        and g.pcie_link_gen_max is not None
        and g.pcie_link_gen < g.pcie_link_gen_max
        and (g.utilization_gpu_pct or 0) >= sig.min_utilization_pct
    )
    if not full and not (width_bad or gen_bad):
        return None
    value = f"gen{g.pcie_link_gen} x{g.pcie_link_width}"
    return Reading(width_bad or gen_bad, "pcie_link", value, None, f"gen{g.pcie_link_gen_max} x{g.pcie_link_width_max}")


def _nvlink_rate(
    sig: NvlinkRate, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    if not g.nvlinks:
        return None
    rate = _rate_per_min(g.nvlink_errors, prev.nvlink_errors if prev else None, dt)
    if rate is None or (not full and rate < sig.min_per_min):
        return None
    return Reading(rate >= sig.min_per_min, "nvlink_errors", rate, "per min", sig.min_per_min)


def _nvlink_down(
    sig: NvlinkDown, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    if not g.nvlinks:
        return None
    down = [str(link.get("link")) for link in g.nvlinks if link.get("active") is False]
    if not down and not full:
        return None
    return Reading(bool(down), "nvlink_inactive", ",".join(down) or "none", "links", "none")


def _memory_without_job(
    sig: MemoryWithoutJob, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool, full: bool = True
) -> Reading | None:
    if g.memory_used_mib is None:
        return None
    bad = not has_job and (
        g.memory_used_mib >= sig.min_mib
        or any(str(p.get("type") or "C").upper() != "G" for p in g.processes or [])  # a compute process, not Xorg
    )
    if not bad and not full:
        return None
    return Reading(bad, "memory_used_mib", g.memory_used_mib, "MiB", sig.min_mib)


#: signal type -> its evaluator (one dict lookup per rule instead of a chain of isinstance).
_EVALUATORS: dict[type, GpuEvaluator] = {
    Throttle: _throttle,
    Flag: _flag,
    CounterRate: _counter_rate,
    ClockLow: _clock_low,
    PcieDegraded: _pcie_degraded,
    NvlinkRate: _nvlink_rate,
    NvlinkDown: _nvlink_down,
    MemoryWithoutJob: _memory_without_job,
}


#: GPU-scope signal types whose reading depends on whether (or which) job holds the GPU: not
#: evaluated on a sample whose attribution is ``unknown`` (the correlator could not tell).
JOB_DEPENDENT: frozenset[type] = frozenset({MemoryWithoutJob})


def gpu_evaluator(sig: Signal) -> GpuEvaluator:
    """The function :func:`evaluate_gpu` calls for ``sig`` (resolved once per rule by the engine).

    Raises:
        ValueError: ``sig`` is not a GPU-scope signal.
    """
    fn = _EVALUATORS.get(type(sig))
    if fn is None:
        raise ValueError(f"{sig.type} is not a GPU-scope signal")
    return fn


def evaluate_gpu(sig: Signal, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool) -> Reading | None:
    """Evaluate a GPU-scope signal on one GPU reading; None when the GPU does not report it.

    Args:
        sig: the rule's signal.
        g: this sample of the GPU; ``prev``: the previous one (for counters), ``dt`` seconds earlier.
        has_job: whether a Slurm job held the GPU at the sample's time.

    Raises:
        ValueError: ``sig`` is not a GPU-scope signal.
    """
    return gpu_evaluator(sig)(sig, g, prev, dt, has_job, True)
