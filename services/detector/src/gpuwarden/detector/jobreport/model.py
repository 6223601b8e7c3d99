"""What the job verdict reads: the failure classes and thresholds, a GPU's windows as columns.

:func:`is_loss` and :func:`side_of` classify failures (see :mod:`gpuwarden.detector.jobreport`
for the breakdown they feed); :class:`Series` holds one GPU's ``job.windows`` as ``array("d")``
columns (about 100 bytes per window; NaN for a metric the window lacks: %, W, MHz, MiB, C);
:class:`Episode` is a failure's span in event time (epoch s); :class:`Stretch` one GPU's run of
time in one waste category; :func:`failure_cut` the earliest report end that is after every
failure a report counts.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from gpuwarden.shared.models import Action, Category, Failure, JobWindow, Severity, WasteCategory

__all__ = [
    "COLS",
    "IDLE_MAX_UTIL_PCT",
    "ORDER",
    "REQUEUE_STATES",
    "WINDOW_S",
    "WRITER_MAX_UTIL_PCT",
    "Episode",
    "Series",
    "Stretch",
    "failure_cut",
    "is_loss",
    "onset",
    "side_of",
    "to_nan",
    "window_len",
    "window_peak",
]

#: A window whose busiest reading is at or below this is idle, % (the detector's idle rules).
IDLE_MAX_UTIL_PCT = 5.0
#: Checkpoint writers run below this while the other ranks wait, % (the detector's ``pauses``).
WRITER_MAX_UTIL_PCT = 30.0
#: The length of a job window when the windows do not tell, s (the correlator's default).
WINDOW_S = 10.0
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
#: The breakdown's categories, in report order.
ORDER = list(WasteCategory)
# compact window columns, in this order (NaN: absent)
COLS = (
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
    """Whether a failure costs the job its work from its onset on (see :mod:`gpuwarden.detector.jobreport`)."""
    if f.pattern in _BEHAVIOUR:
        return False
    return f.severity in (Severity.CRITICAL, Severity.FATAL) and f.recommended_action in _LOSS_ACTIONS


def onset(f: Failure) -> float:
    """When a failure began: its first evidence, or ``first_seen`` if earlier, epoch s."""
    return min([f.first_seen, *(e.ts for e in f.evidence)])


def to_nan(x: float | None) -> float:
    """A column value: ``None`` (not reported) -> NaN."""
    return math.nan if x is None else float(x)


@dataclass
class Series:
    """One GPU's windows as columns (sorted by start; a redelivered window replaces its twin)."""

    uuid: str | None = None
    cols: dict[str, array[float]] = field(default_factory=lambda: {c: array("d") for c in COLS})

    def __len__(self) -> int:
        return len(self.cols["start"])

    def add(self, w: JobWindow) -> None:
        """Insert ``w`` in start order, or replace the window with the same start (a redelivery)."""
        row = (
            w.window_start,
            w.window_end,
            to_nan(w.utilization_gpu_pct_mean),
            to_nan(w.utilization_gpu_pct_max),
            to_nan(w.utilization_gpu_pct_min),
            to_nan(w.power_w_mean),
            to_nan(w.power_limit_w),
            to_nan(w.sm_clock_mhz_mean),
            to_nan(w.tensor_activity_pct_mean),
            to_nan(w.memory_used_mib_max),
            to_nan(w.memory_total_mib),
            to_nan(w.temperature_c_max),
        )
        self.uuid = w.gpu_uuid or self.uuid
        starts = self.cols["start"]
        n = len(starts)
        if n == 0 or w.window_start > starts[-1]:
            for c, v in zip(COLS, row, strict=True):
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
            for c, v in zip(COLS, row, strict=True):
                self.cols[c][lo] = v
        else:
            for c, v in zip(COLS, row, strict=True):
                self.cols[c].insert(lo, v)

    def between(self, a: float, b: float) -> Series:
        """The windows overlapping ``[a, b)`` (epoch s): this series itself when all do."""
        starts, ends = self.cols["start"], self.cols["end"]
        n = len(starts)
        lo = 0
        while lo < n and ends[lo] <= a:
            lo += 1
        hi = n
        while hi > lo and starts[hi - 1] >= b:
            hi -= 1
        if lo == 0 and hi == n:
            return self
        return Series(self.uuid, {c: v[lo:hi] for c, v in self.cols.items()})


@dataclass
class Episode:
    """A failure's span, epoch s: from its onset to its resolution (else the report's end)."""

    failure: Failure
    start: float
    end: float

    def covers(self, a: float, b: float) -> bool:
        """The window [a, b) overlaps the episode (a window ending at the onset is its first)."""
        return b >= self.start and a < self.end


def window_peak(s: Series, i: int) -> float:
    """Window ``i``'s busiest reading (its maximum utilisation, else its mean), %."""
    m: float = s.cols["util_max"][i]
    mean: float = s.cols["util_mean"][i]
    return mean if math.isnan(m) else m


def window_len(series: dict[tuple[str, int], Series] | list[Series]) -> float:
    """The job's window length, s: the median length of each GPU's last window (windows are
    tumbling and epoch-aligned); :data:`WINDOW_S` without windows."""
    vals = series.values() if isinstance(series, dict) else series
    lens = sorted(s.cols["end"][-1] - s.cols["start"][-1] for s in vals if len(s))
    lens = [x for x in lens if x > 0]
    return lens[len(lens) // 2] if lens else WINDOW_S


def failure_cut(failures: list[Failure], window_s: float) -> float | None:
    """The end of the window holding the latest ``first_seen`` of ``failures``, epoch s
    (``floor(ts / window_s) * window_s + window_s``: strictly after it); None without failures.

    A report that ends here is after every failure it counts, and is the same whenever it is
    built once the windows up to here are in: it depends on event times only (``first_seen``,
    unlike ``last_seen``, does not move when a failure is updated)."""
    if not failures:
        return None
    ts = max(f.first_seen for f in failures)
    w = window_s if window_s > 0 else WINDOW_S
    return math.floor(ts / w) * w + w


@dataclass
class Stretch:
    """One GPU's contiguous time in one waste category, epoch s ``[start, end)``.

    ``seconds`` is the GPU-time the category got in it (less than ``end - start`` for the
    shares of a window: straggler and input waits); ``failure_id`` the finding it is
    attributed to (None: none); ``worked_before`` whether the GPU did work (a busy window)
    in the job before ``start``; ``worked_after`` after ``end``."""

    category: WasteCategory
    node: str
    gpu_index: int
    start: float
    end: float
    seconds: float
    failure_id: str | None = None
    worked_before: bool = False
    worked_after: bool = False
