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

__all__ = ["ConditionRule", "CostModel", "Reading", "RuleBase", "Tracker", "evaluate_gpu", "evaluate_job"]


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CostModel(_S):
    """``job``: all GPUs of the affected job stall; ``gpu``: only the GPU itself."""

    scope: Literal["job", "gpu"] = "job"


class Throttle(_S):
    type: Literal["throttle"]
    reasons: list[str] = Field(min_length=1)
    clock_ratio_below: float | None = Field(None, gt=0, le=1, description="Also require SM clock < ratio x max")


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
    type: Literal["idle"]
    max_utilization_pct: float = Field(5, ge=0, le=100)


class PartialIdle(_S):
    type: Literal["partial-idle"]
    max_utilization_pct: float = Field(5, ge=0, le=100)
    busy_min_utilization_pct: float = Field(50, ge=0, le=100)


StragglerMetric = Literal["utilization_gpu_pct_mean", "sm_clock_mhz_mean", "power_w_mean"]


def _default_metrics() -> list[StragglerMetric]:
    return ["sm_clock_mhz_mean", "power_w_mean"]


class Straggler(_S):
    type: Literal["straggler-gpu", "straggler-node"]
    metrics: list[StragglerMetric] = Field(default_factory=_default_metrics, min_length=1)
    below_median_ratio: float = Field(0.85, gt=0, lt=1, description="Slower than this share of the job's median")
    min_gpus: int = Field(4, ge=2, description="Peers needed for a robust median")
    min_utilization_pct: float = Field(
        20, ge=0, le=100, description="Only busy GPUs are compared (an idle GPU is not slow: see partial-idle)"
    )


class LowDuty(_S):
    type: Literal["low-duty"]
    min_utilization_pct: float = Field(5, ge=0, le=100)
    max_utilization_pct: float = Field(40, ge=0, le=100)


class Hang(_S):
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


class LowTensor(_S):
    type: Literal["low-tensor"]
    max_tensor_pct: float = Field(10, ge=0, le=100)
    min_utilization_pct: float = Field(80, ge=0, le=100)


class Pauses(_S):
    """Periodic all-GPU pauses: the share of recent windows in which every GPU of the job
    dropped to idle while the job is otherwise busy."""

    type: Literal["pauses"]
    max_utilization_pct: float = Field(5, ge=0, le=100, description="A window where every GPU is below this")
    min_share: float = Field(0.15, gt=0, le=1, description="Share of windows with a pause that is unhealthy")
    min_windows: int = Field(12, ge=3, description="Windows of history needed")
    min_pauses: int = Field(2, ge=1, description="Separate pauses needed (periodicity)")


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
        bad = ratio < sig.ratio_below and g.utilization_gpu_pct >= sig.min_utilization_pct and not throttled
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
        procs = len(g.processes or [])
        bad = not has_job and (g.memory_used_mib >= sig.min_mib or procs > 0)
        return Reading(bad, "memory_used_mib", g.memory_used_mib, "MiB", sig.min_mib)
    raise ValueError(f"{sig.type} is not a GPU-scope signal")


# -- job scope -------------------------------------------------------------------------------
def _v(w: JobWindow, metric: str) -> float | None:
    value = getattr(w, metric)
    return float(value) if value is not None else None


def evaluate_job(
    sig: Signal, windows: list[JobWindow], history: list[list[JobWindow]]
) -> list[tuple[str, int | None, Reading]]:
    """Evaluate a job-scope signal on the windows of one job and window start.

    Args:
        windows: one JobWindow per GPU of the job for the same window.
        history: earlier window groups of the same job, oldest first (for trends).

    Returns:
        ``(node, gpu_index or None for the whole job/node, reading)`` per subject; the
        job as a whole is reported on its first node with ``gpu_index`` None.
    """
    if not windows:
        return []
    first = min(windows, key=lambda w: (w.node, w.gpu_index))
    out: list[tuple[str, int | None, Reading]] = []
    utils = [u for w in windows if (u := _v(w, "utilization_gpu_pct_mean")) is not None]
    if isinstance(sig, Idle):
        if not utils:
            return []
        peak = max(utils)
        return [
            (
                first.node,
                None,
                Reading(peak <= sig.max_utilization_pct, "max_gpu_utilization_pct", peak, "%", sig.max_utilization_pct),
            )
        ]
    if isinstance(sig, PartialIdle):
        if len(utils) < 2:
            return []
        idle = [w for w in windows if (_v(w, "utilization_gpu_pct_mean") or 0) <= sig.max_utilization_pct]
        busy = max(utils) >= sig.busy_min_utilization_pct
        for w in windows:
            bad = busy and w in idle
            out.append(
                (
                    w.node,
                    w.gpu_index,
                    Reading(
                        bad,
                        "gpu_utilization_pct",
                        _v(w, "utilization_gpu_pct_mean") or 0.0,
                        "%",
                        sig.max_utilization_pct,
                    ),
                )
            )
        return out
    if isinstance(sig, Straggler):
        return _stragglers(sig, windows)
    if isinstance(sig, LowDuty):
        if not utils:
            return []
        mean = statistics.fmean(utils)
        bad = sig.min_utilization_pct < mean <= sig.max_utilization_pct
        return [(first.node, None, Reading(bad, "mean_gpu_utilization_pct", mean, "%", sig.max_utilization_pct))]
    if isinstance(sig, Hang):
        pairs = [
            (u, p / lim)
            for w in windows
            if (u := _v(w, "utilization_gpu_pct_mean")) is not None
            and (p := _v(w, "power_w_mean")) is not None
            and (lim := _v(w, "power_limit_w"))
        ]
        if not pairs:
            return []
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
                if (x.node, x.gpu_index) == (w.node, w.gpu_index) and x.memory_used_mib_max is not None
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
        out = []
        for w in windows:
            t, u = _v(w, "tensor_activity_pct_mean"), _v(w, "utilization_gpu_pct_mean")
            if t is None or u is None:
                continue
            bad = u >= sig.min_utilization_pct and t <= sig.max_tensor_pct
            out.append((w.node, w.gpu_index, Reading(bad, "tensor_activity_pct", t, "%", sig.max_tensor_pct)))
        return out
    if isinstance(sig, Pauses):
        groups = [*history, windows]
        paused = [all((_v(w, "utilization_gpu_pct_min") or 0) <= sig.max_utilization_pct for w in g) for g in groups]
        busy = any((_v(w, "utilization_gpu_pct_mean") or 0) >= 50 for g in groups for w in g)  # else: idle job
        episodes = sum(1 for i, p in enumerate(paused) if p and (i == 0 or not paused[i - 1]))
        share = sum(paused) / len(groups)
        bad = busy and len(groups) >= sig.min_windows and share >= sig.min_share and episodes >= sig.min_pauses
        return [(first.node, None, Reading(bad, "paused_window_share", share, "ratio", sig.min_share))]
    raise ValueError(f"{sig.type} is not a job-scope signal")


def _stragglers(sig: Straggler, windows: list[JobWindow]) -> list[tuple[str, int | None, Reading]]:
    """Subjects (GPUs, or nodes by their GPUs' median) below ``ratio`` x the job median on any metric."""
    subjects: dict[tuple[str, int | None], list[JobWindow]] = {}
    windows = [w for w in windows if (_v(w, "utilization_gpu_pct_mean") or 0) >= sig.min_utilization_pct]
    for w in windows:
        key = (w.node, w.gpu_index if sig.type == "straggler-gpu" else None)
        subjects.setdefault(key, []).append(w)
    if len(windows) < sig.min_gpus or len(subjects) < 2:
        return []
    worst: dict[tuple[str, int | None], tuple[float, str, float, float]] = {}
    for metric in sig.metrics:
        vals: dict[tuple[str, int | None], float] = {}
        for k, ws in subjects.items():
            xs = [x for w in ws if (x := _v(w, metric)) is not None]
            if xs:
                vals[k] = statistics.median(xs)
        if len(vals) < 2:
            continue
        med = statistics.median(vals.values())
        if med <= 0:
            continue
        for k, val in vals.items():
            ratio = val / med
            if k not in worst or ratio < worst[k][0]:
                worst[k] = (ratio, metric, val, med)
    return [
        (
            node,
            gpu,
            Reading(
                ratio < sig.below_median_ratio,
                f"{metric}_vs_job_median",
                round(ratio, 4),
                "ratio",
                sig.below_median_ratio,
            ),
        )
        for (node, gpu), (ratio, metric, _, _) in sorted(worst.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1))
    ]


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
            if not self.opened and ts - self.bad_since >= rule.for_s:
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
