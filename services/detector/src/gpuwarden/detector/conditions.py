"""Condition rules: unhealthy states with a healthy default (STYLE item 6).

An XID is an *event*; "GPU 3 is thermally throttled" is a *condition*. A condition rule
names a signal (one of the types below, parameters from the catalog YAML), how long it
must hold before a failure opens (``for_s``) and how long it must be healthy again
before the failure resolves (``resolve_after_s``). Everything runs in event time.

Signal types, by scope:

* ``gpu`` (each GPU of each ``gpu.attributed`` sample; the previous sample of the same
  GPU is given for counters): ``throttle``, ``flag``, ``counter-rate``, ``clock-low``,
  ``pcie-degraded``, ``nvlink-rate``, ``nvlink-down``, ``memory-without-job``.
* ``node``: ``gpu-count-drop`` (a GPU vanished from the node's samples), ``silent`` (no
  sample from a node that reported before while other nodes keep reporting).
* ``job`` (the ``job.windows`` of one job and window start, all its GPUs together):
  ``idle``, ``partial-idle``, ``straggler-gpu``, ``straggler-node``, ``low-duty``,
  ``hang``, ``memory-growth``, ``low-tensor``, ``pauses``.
* ``health``: a failed prolog/epilog check on the ``health`` topic.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuwarden.shared.models import PATTERNS, Action, Category, Evidence, GpuSample, JobWindow, Severity

__all__ = [
    "ConditionRule",
    "CostModel",
    "JobContext",
    "Reading",
    "RuleBase",
    "Tracker",
    "evaluate_gpu",
    "evaluate_job",
]


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CostModel(_S):
    """``job``: all GPUs of the affected job stall; ``gpu``: only the GPU itself."""

    scope: Literal["job", "gpu"] = "job"


class Throttle(_S):
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


class Flag(_S):
    type: Literal["flag"]
    field: Literal["remapped_rows_pending", "remapped_rows_failure", "retired_pages_pending"]


class CounterRate(_S):
    type: Literal["counter-rate"]
    field: Literal["ecc_sbe_volatile", "ecc_dbe_volatile", "pcie_replay_count", "retired_pages"]
    min_per_min: float = Field(gt=0, description="Increase per minute that is unhealthy")


class ClockLow(_S):
    type: Literal["clock-low"]
    ratio_below: float = Field(gt=0, le=1, description="SM clock below this share of its maximum")
    min_utilization_pct: float = Field(50, ge=0, le=100)
    max_power_ratio: float = Field(
        0.95, gt=0, le=1, description="At or above this share of the power limit the GPU is power-capped, not slow"
    )


class PcieDegraded(_S):
    type: Literal["pcie-degraded"]
    min_utilization_pct: float = Field(50, ge=0, le=100, description="Gen below max only counts under load")


class NvlinkRate(_S):
    type: Literal["nvlink-rate"]
    min_per_min: float = Field(gt=0, description="CRC/replay/recovery errors per minute over all links")


class NvlinkDown(_S):
    type: Literal["nvlink-down"]


class MemoryWithoutJob(_S):
    type: Literal["memory-without-job"]
    min_mib: float = Field(1024, gt=0)


class GpuCountDrop(_S):
    type: Literal["gpu-count-drop"]


class Silent(_S):
    type: Literal["silent"]
    after_s: float = Field(30, gt=0, description="No sample this long while other nodes report, s")


class Idle(_S):
    """Every GPU of the job idle for a whole window (its busiest reading at most the threshold).
    An idle stretch from the job's start (model loading, data staging) counts from the start but
    opens no failure before ``startup_grace_s``: it is an idle allocation once it outlasts it."""

    type: Literal["idle"]
    max_utilization_pct: float = Field(5, ge=0, le=100)
    startup_grace_s: float = Field(300, ge=0, description="No idle allocation opens this soon after the job's start, s")


class PartialIdle(_S):
    """Some GPUs idle for whole windows while the others do real work (busy at working power,
    not spinning in a collective while one rank writes a checkpoint). No start-up grace: the
    working GPUs show the job is past its start-up."""

    type: Literal["partial-idle"]
    max_utilization_pct: float = Field(5, ge=0, le=100)
    busy_min_utilization_pct: float = Field(50, ge=0, le=100)


StragglerMetric = Literal["utilization_gpu_pct_mean", "sm_clock_mhz_mean", "power_w_mean"]


def _default_metrics() -> list[StragglerMetric]:
    return ["sm_clock_mhz_mean", "power_w_mean"]


class Straggler(_S):
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


class LowDuty(_S):
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


class Hang(_S):
    """Every GPU of the job pinned at full utilisation at idle power (spinning in a collective);
    the rule's ``for_s`` is how long (NCCL's own timeout is 10-30 min)."""

    type: Literal["hang"]
    min_utilization_pct: float = Field(95, ge=0, le=100)
    max_power_ratio: float = Field(0.35, gt=0, le=1, description="Power below this share of the limit")


class MemoryGrowth(_S):
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


class LowTensor(_S):
    """Busy GPUs of a job whose tensor pipes idle, reported once for the job (the share of its
    busy GPUs below the threshold); GPUs spinning at idle power (a hang) are not busy."""

    type: Literal["low-tensor"]
    max_tensor_pct: float = Field(10, ge=0, le=100)
    min_utilization_pct: float = Field(80, ge=0, le=100)
    min_share: float = Field(0.5, gt=0, le=1, description="Share of the busy GPUs that must be low")
    max_power_ratio: float = Field(0.35, gt=0, le=1, description="At or below this share of the limit: spinning")


class Pauses(_S):
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


class HealthFailed(_S):
    type: Literal["health-failed"]


Signal = Annotated[
    Throttle
    | Flag
    | CounterRate
    | ClockLow
    | PcieDegraded
    | NvlinkRate
    | NvlinkDown
    | MemoryWithoutJob
    | GpuCountDrop
    | Silent
    | Idle
    | PartialIdle
    | Straggler
    | LowDuty
    | Hang
    | MemoryGrowth
    | LowTensor
    | Pauses
    | HealthFailed,
    Field(discriminator="type"),
]
SCOPES = {
    "gpu": {
        "throttle",
        "flag",
        "counter-rate",
        "clock-low",
        "pcie-degraded",
        "nvlink-rate",
        "nvlink-down",
        "memory-without-job",
    },
    "node": {"gpu-count-drop", "silent", "health-failed"},
    "job": {
        "idle",
        "partial-idle",
        "straggler-gpu",
        "straggler-node",
        "low-duty",
        "hang",
        "memory-growth",
        "low-tensor",
        "pauses",
    },
}


TEMPLATE_FIELDS = {"node", "gpu", "job_text", "code", "message"}


def check_template(v: str) -> str:
    """Raise ValueError if a verdict template uses a field the renderer does not fill."""
    import string

    names = {f for _, f, _, _ in string.Formatter().parse(v) if f}
    unknown = names - TEMPLATE_FIELDS
    if unknown:
        raise ValueError(f"verdict uses unknown fields {sorted(unknown)}; allowed {sorted(TEMPLATE_FIELDS)}")
    return v


class RuleBase(_S):
    """What every catalog rule has: identity, the canonical pattern, severity, the
    recommended action, the cost scope, a verdict template and what the data cannot tell."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    pattern: str
    category: Category
    severity: Severity
    action: Action
    cost: CostModel = CostModel()
    verdict: str
    cannot_determine: list[str] = Field(default_factory=list)
    source: str | None = None
    fold_into: list[str] = Field(
        default_factory=list,
        description="Event rules (ids) whose open episode on the same GPU this finding belongs to: it is "
        "added there as evidence instead of opening a failure of its own (one root cause, one failure)",
    )

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        if v not in PATTERNS:
            raise ValueError(f"unknown pattern {v!r} (DESIGN section 5 lists the canonical ones)")
        return v

    @field_validator("action")
    @classmethod
    def _action(cls, v: Action) -> Action:
        if v is Action.RESUME:
            raise ValueError("resume is the remediator's own action, not a recommendation")
        return v

    @field_validator("verdict")
    @classmethod
    def _verdict(cls, v: str) -> str:
        return check_template(v)


class ConditionRule(RuleBase):
    """A condition: a signal that must hold ``for_s`` to open and clear ``resolve_after_s`` to resolve."""

    signal: Signal
    for_s: float = Field(30, ge=0, description="Unhealthy this long (event time) before the failure opens, s")
    resolve_after_s: float = Field(60, ge=0, description="Healthy this long before it resolves, s")
    explained_by: list[str] = Field(
        default_factory=list,
        description="Condition rules (ids) that explain this one on the same GPU (or node): while one of "
        "them is unhealthy there, this one stays quiet (a thermally throttled GPU is slow: one finding)",
    )

    @property
    def scope(self) -> str:
        return next(s for s, types in SCOPES.items() if self.signal.type in types)


@dataclass(frozen=True)
class Reading:
    """One evaluation of a signal: unhealthy or not, with the value and threshold shown as evidence."""

    unhealthy: bool
    signal: str
    value: float | str
    unit: str | None
    threshold: float | str | None
    hold: bool = False  # unhealthy, but may not open a failure yet (a job's start-up grace)

    def evidence(self, ts: float, source: str) -> Evidence:
        v = round(self.value, 3) if isinstance(self.value, float) else self.value
        t = round(self.threshold, 3) if isinstance(self.threshold, float) else self.threshold
        return Evidence(signal=self.signal, value=v, unit=self.unit, threshold=t, ts=ts, source=source)


# -- gpu scope -------------------------------------------------------------------------------
def _rate_per_min(cur: float | None, prev: float | None, dt: float) -> float | None:
    if cur is None or prev is None or dt <= 0:
        return None
    return max(0.0, cur - prev) * 60.0 / dt


def _nvlink_errors(g: GpuSample) -> float | None:
    if not g.nvlinks:
        return None
    keys = ("crc_flit_errors", "crc_data_errors", "replay_errors", "recovery_errors")
    return float(sum(int(link.get(k) or 0) for link in g.nvlinks for k in keys))


def evaluate_gpu(sig: Signal, g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool) -> Reading | None:
    """Evaluate a GPU-scope signal on one GPU reading; None when the GPU does not report it.

    Args:
        sig: the rule's signal.
        g: this sample of the GPU; ``prev``: the previous one (for counters), ``dt`` seconds earlier.
        has_job: whether a Slurm job held the GPU at the sample's time.
    """
    if isinstance(sig, Throttle):
        active = sorted(set(sig.reasons) & set(g.throttle_reasons))
        if (
            not active
            and sig.or_power_at_limit is not None
            and g.power_w is not None
            and g.power_limit_w
            and g.power_w >= sig.or_power_at_limit * g.power_limit_w
        ):
            active = ["power_at_limit"]
        bad = bool(active)
        if bad and sig.clock_ratio_below is not None:
            if g.sm_clock_mhz is None or not g.max_sm_clock_mhz:
                return None
            bad = g.sm_clock_mhz < sig.clock_ratio_below * g.max_sm_clock_mhz
        return Reading(bad, "throttle_reasons", ",".join(active) or "none", None, ",".join(sig.reasons))
    if isinstance(sig, Flag):
        flag = getattr(g, sig.field)
        return None if flag is None else Reading(bool(flag), sig.field, str(bool(flag)).lower(), None, "false")
    if isinstance(sig, CounterRate):
        cur = getattr(g, sig.field)
        rate = _rate_per_min(cur, getattr(prev, sig.field) if prev else None, dt)
        return None if rate is None else Reading(rate >= sig.min_per_min, sig.field, rate, "per min", sig.min_per_min)
    if isinstance(sig, ClockLow):
        if g.sm_clock_mhz is None or not g.max_sm_clock_mhz or g.utilization_gpu_pct is None:
            return None
        ratio = g.sm_clock_mhz / g.max_sm_clock_mhz
        throttled = [r for r in g.throttle_reasons if r != "gpu_idle"]
        capped = (
            g.power_w is not None
            and bool(g.power_limit_w)
            and g.power_w >= sig.max_power_ratio * (g.power_limit_w or 0)
        )
        bad = (
            ratio < sig.ratio_below
            and g.utilization_gpu_pct >= sig.min_utilization_pct
            and not throttled
            and not capped
        )
        return Reading(bad, "sm_clock_ratio", ratio, "ratio", sig.ratio_below)
    if isinstance(sig, PcieDegraded):
        if g.pcie_link_width is None or g.pcie_link_width_max is None:
            return None
        width_bad = g.pcie_link_width < g.pcie_link_width_max
        gen_bad = (
            g.pcie_link_gen is not None
            and g.pcie_link_gen_max is not None
            and g.pcie_link_gen < g.pcie_link_gen_max
            and (g.utilization_gpu_pct or 0) >= sig.min_utilization_pct
        )
        value = f"gen{g.pcie_link_gen} x{g.pcie_link_width}"
        return Reading(
            width_bad or gen_bad, "pcie_link", value, None, f"gen{g.pcie_link_gen_max} x{g.pcie_link_width_max}"
        )
    if isinstance(sig, NvlinkRate):
        rate = _rate_per_min(_nvlink_errors(g), _nvlink_errors(prev) if prev else None, dt)
        return (
            None
            if rate is None
            else Reading(rate >= sig.min_per_min, "nvlink_errors", rate, "per min", sig.min_per_min)
        )
    if isinstance(sig, NvlinkDown):
        if not g.nvlinks:
            return None
        down = [str(link.get("link")) for link in g.nvlinks if link.get("active") is False]
        return Reading(bool(down), "nvlink_inactive", ",".join(down) or "none", "links", "none")
    if isinstance(sig, MemoryWithoutJob):
        if g.memory_used_mib is None:
            return None
        procs = sum(1 for p in g.processes or [] if str(p.get("type") or "C").upper() != "G")  # not Xorg
        bad = not has_job and (g.memory_used_mib >= sig.min_mib or procs > 0)
        return Reading(bad, "memory_used_mib", g.memory_used_mib, "MiB", sig.min_mib)
    raise ValueError(f"{sig.type} is not a GPU-scope signal")


# -- job scope -------------------------------------------------------------------------------
def _v(w: JobWindow, metric: str) -> float | None:
    value = getattr(w, metric)
    return float(value) if value is not None else None


def _peak_util(w: JobWindow) -> float | None:
    """The busiest reading of the window (its maximum), else its mean."""
    return (
        _v(w, "utilization_gpu_pct_max") if w.utilization_gpu_pct_max is not None else _v(w, "utilization_gpu_pct_mean")
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
            u, p = _v(w, "utilization_gpu_pct_mean"), _v(w, "power_w_mean")
            if u is not None and p is not None and u >= busy_pct:
                k = (w.node, w.gpu_index)
                self.working_power_w[k] = max(self.working_power_w.get(k, 0.0), p)

    def spinning(self, w: JobWindow, min_util: float, max_ratio: float, limit_ratio: float = 0.35) -> bool:
        """Busy (``min_util`` % or more) at idle power: below ``limit_ratio`` x the power limit, or
        below ``max_ratio`` x the GPU's own working power."""
        u, p = _v(w, "utilization_gpu_pct_mean"), _v(w, "power_w_mean")
        if u is None or p is None or u < min_util:
            return False
        if w.power_limit_w and p <= limit_ratio * w.power_limit_w:
            return True
        ref = self.working_power_w.get((w.node, w.gpu_index))
        return ref is not None and p <= max_ratio * ref

    def in_grace(self, w: JobWindow, grace_s: float) -> bool:
        return self.start_ts is not None and w.window_end - self.start_ts < grace_s


def evaluate_job(
    sig: Signal, windows: list[JobWindow], history: list[list[JobWindow]], ctx: JobContext | None = None
) -> list[tuple[str, int | None, Reading]]:
    """Evaluate a job-scope signal on the windows of one job and window start.

    Args:
        windows: one JobWindow per GPU of the job for the same window.
        history: earlier window groups of the same job, oldest first (for trends).
        ctx: the job's start and its GPUs' working power (None: unknown).

    Returns:
        ``(node, gpu_index or None for the whole job/node, reading)`` per subject; the
        job as a whole is reported on its first node with ``gpu_index`` None.
    """
    if not windows:
        return []
    ctx = ctx or JobContext()
    first = min(windows, key=lambda w: (w.node, w.gpu_index))
    out: list[tuple[str, int | None, Reading]] = []
    utils = [u for w in windows if (u := _v(w, "utilization_gpu_pct_mean")) is not None]
    if isinstance(sig, Idle):
        peaks = [p for w in windows if (p := _peak_util(w)) is not None]
        if not peaks:
            return []
        peak = max(peaks)
        bad = peak <= sig.max_utilization_pct
        hold = ctx.in_grace(first, sig.startup_grace_s)
        return [(first.node, None, Reading(bad, "max_gpu_utilization_pct", peak, "%", sig.max_utilization_pct, hold))]
    if isinstance(sig, PartialIdle):
        if len(utils) < 2:
            return []
        idle = [w for w in windows if (_peak_util(w) or 0) <= sig.max_utilization_pct]
        working = [
            w
            for w in windows
            if (_v(w, "utilization_gpu_pct_mean") or 0) >= sig.busy_min_utilization_pct
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
                    Reading(bad, "gpu_utilization_pct_max", _peak_util(w) or 0.0, "%", sig.max_utilization_pct),
                )
            )
        return out
    if isinstance(sig, Straggler):
        return _stragglers(sig, windows)
    if isinstance(sig, LowDuty):
        if not utils:
            return []
        mean = statistics.fmean(utils)
        turns = len(utils) >= sig.turn_taking_gpus and 70.0 <= sum(utils) <= 130.0
        bad = sig.min_utilization_pct < mean <= sig.max_utilization_pct and not turns
        return [(first.node, None, Reading(bad, "mean_gpu_utilization_pct", mean, "%", sig.max_utilization_pct))]
    if isinstance(sig, Hang):
        pairs = [
            (u, p / lim)
            for w in windows
            if (u := _v(w, "utilization_gpu_pct_mean")) is not None
            and (p := _v(w, "power_w_mean")) is not None
            and (lim := _v(w, "power_limit_w"))
        ]
        if not pairs or len(pairs) < len(windows):
            return []  # a GPU without power or limit: the whole job cannot be judged
        bad = all(u >= sig.min_utilization_pct and r <= sig.max_power_ratio for u, r in pairs)
        worst = max(r for _, r in pairs)
        return [
            (first.node, None, Reading(bad, "power_ratio_at_full_utilization", worst, "ratio", sig.max_power_ratio))
        ]
    if isinstance(sig, MemoryGrowth):
        for w in windows:
            series = [
                (x.window_end / 60.0, x.memory_used_mib_max)
                for group in [*history, [w]]
                for x in group
                if (x.node, x.gpu_index) == (w.node, w.gpu_index)
                and x.memory_used_mib_max is not None
                and not ctx.in_grace(x, sig.startup_grace_s)
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
    if isinstance(sig, LowTensor):
        busy = [
            (w, t)
            for w in windows
            if (t := _v(w, "tensor_activity_pct_mean")) is not None
            and (_v(w, "utilization_gpu_pct_mean") or 0) >= sig.min_utilization_pct
            and not ctx.spinning(w, sig.min_utilization_pct, 0.5, sig.max_power_ratio)
        ]
        if not busy:
            return []
        low = [t for _, t in busy if t <= sig.max_tensor_pct]
        share = len(low) / len(busy)
        value = statistics.median(t for _, t in busy)
        return [
            (first.node, None, Reading(share >= sig.min_share, "tensor_activity_pct", value, "%", sig.max_tensor_pct))
        ]
    if isinstance(sig, Pauses):
        return [(first.node, None, _pauses(sig, [*history, windows], ctx))]
    raise ValueError(f"{sig.type} is not a job-scope signal")


def _window_kind(sig: Pauses, group: list[JobWindow], ctx: JobContext) -> str:
    """``busy``; ``idle`` (every GPU idle); ``write`` (a minority of GPUs, rank 0 writing a
    checkpoint, below the writer threshold while all the others spin in a collective); ``other``."""
    peaks = [_peak_util(w) or 0.0 for w in group]
    if peaks and max(peaks) <= sig.max_utilization_pct:
        return "idle"
    if len(group) >= 2:
        writers = [w for w in group if (_v(w, "utilization_gpu_pct_mean") or 0) < sig.writer_max_utilization_pct]
        waiters = [w for w in group if ctx.spinning(w, sig.wait_min_utilization_pct, sig.wait_max_power_ratio)]
        if writers and waiters and len(writers) < len(group) / 2 and len(writers) + len(waiters) == len(group):
            return "write"
    busy = [w for w in group if (_v(w, "utilization_gpu_pct_mean") or 0) >= 50 and not ctx.spinning(w, 50, 0.5)]
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


def _stragglers(sig: Straggler, windows: list[JobWindow]) -> list[tuple[str, int | None, Reading]]:
    """Subjects (GPUs, or nodes by their GPUs' median) slower than their peers by a robust margin
    on the first metric every busy GPU of the job reports (see :class:`Straggler`).

    Leave-one-out: each subject is compared with the median and the robust spread (1.4826 x MAD)
    of the *other* subjects' GPUs, so one slow node of two, or one slow GPU of four, stands out.
    """
    windows = [w for w in windows if (_v(w, "utilization_gpu_pct_mean") or 0) >= sig.min_utilization_pct]
    if len(windows) < sig.min_gpus:
        return []
    subjects: dict[tuple[str, int | None], list[JobWindow]] = {}
    for w in windows:
        subjects.setdefault((w.node, w.gpu_index if sig.type == "straggler-gpu" else None), []).append(w)
    if len(subjects) < 2:
        return []
    for metric in sig.metrics:
        per_gpu = {(w.node, w.gpu_index): x for w in windows if (x := _v(w, metric)) is not None}
        if len(per_gpu) < len(windows):
            continue  # not every GPU reports it: try the next metric
        ratio_limit = sig.power_only_ratio if metric == "power_w_mean" else sig.below_median_ratio
        out: list[tuple[str, int | None, Reading]] = []
        for (node, gpu), ws in sorted(subjects.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
            mine = {(w.node, w.gpu_index) for w in ws}
            val = statistics.median(per_gpu[k] for k in mine)
            peers = [v for k, v in per_gpu.items() if k not in mine]
            med = statistics.median(peers)
            if med <= 0:
                continue
            spread = max(1.4826 * statistics.median(abs(v - med) for v in peers), sig.min_spread * med)
            bad = val / med < ratio_limit and (med - val) > sig.mad_k * spread
            out.append((node, gpu, Reading(bad, f"{metric}_vs_job_median", round(val / med, 4), "ratio", ratio_limit)))
        return out
    return []


# -- the state machine -----------------------------------------------------------------------
@dataclass
class Tracker:
    """Healthy -> pending -> open -> resolving -> resolved, in event time."""

    bad_since: float | None = None
    good_since: float | None = None
    opened: bool = False
    first_seen: float = 0.0
    last_seen: float = 0.0
    occurrences: int = 0
    evidence: list[Evidence] = field(default_factory=list)
    last_emitted: float = 0.0
    folded: bool = False  # joined an event's failure (``fold_into``)
    emitted: bool = False  # an open failure was published for the current episode

    def step(self, rule: ConditionRule, ts: float, reading: Reading, source: str) -> str | None:
        """Feed one reading; returns ``"open"``, ``"update"``, ``"resolved"`` or None."""
        if reading.unhealthy:
            self.good_since = None
            if self.bad_since is None:
                self.bad_since = ts
                self.evidence = []
            # evidence: the onset reading and the four latest
            self.evidence = [*self.evidence[:1], *self.evidence[1:][-3:], reading.evidence(ts, source)]
            self.occurrences += 1
            self.last_seen = ts
            if not self.opened and ts - self.bad_since >= rule.for_s and not reading.hold:
                # first_seen is when the condition is confirmed (held for_s): the detection time;
                # the evidence keeps the readings from its onset on
                self.opened, self.first_seen = True, ts
                return "open"
            return "update" if self.opened else None
        if not self.opened:
            self.bad_since, self.occurrences = None, 0
            return None
        if self.good_since is None:
            self.good_since = ts
        if ts - self.good_since >= rule.resolve_after_s:
            self.opened, self.bad_since, self.good_since, self.occurrences = False, None, None, 0
            self.last_seen = ts
            return "resolved"
        return None
