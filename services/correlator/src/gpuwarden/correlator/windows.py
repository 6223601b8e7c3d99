"""Per (job, node, GPU) tumbling windows over attributed samples, as functions over plain data.

The state of one node is a JSON-able dict (it lives in a faust table whose changelog
restores it after a restart)::

    {"v": 2,                                  # layout version (see below)
     "wm": 1700000012.0,                      # event-time watermark: newest sample ts seen, epoch s
     "w": {"<job>|<gpu>|<start>": acc, ...}}  # open windows, one accumulator each

An accumulator is a positional JSON list (layout 2, :data:`ACC_FIELDS`), not a dict: the whole
state goes to the table's changelog once per node per commit, so its size is what the
changelog costs (about 2.5x smaller than layout 1's dicts with named keys and absolute
timestamps). Timestamps inside an accumulator are integer microseconds from the window start.
A layout-1 state (no ``"v"``; dict accumulators, as written before layout 2) is upgraded when
it is first read (:func:`upgrade_state`), so a changelog written by an older worker restores.

:func:`add_sample` folds one :class:`~gpuwarden.shared.models.AttributedSample` into that
state and returns the new state, the windows it closed (as
:class:`~gpuwarden.shared.models.JobWindow`) and the windows it came too late for. It does
not mutate its input, unless asked to (``in_place=True``: the correlator's hot path, which
owns the state and gets identical results without copying it).

Rules (event time only, no wall clock anywhere):

* A sample at ``ts`` belongs to the window ``[floor(ts / size) * size, + size)``; only GPUs
  attributed to a job are windowed (an unheld GPU has no job to summarise).
* The node's watermark is the newest sample ``ts`` seen. A window closes when
  ``watermark >= window_end + grace``; a sample whose window is already that old is *late*:
  it is reported (the caller counts and logs it) and not folded in.
* A sample with a ``ts`` already folded into the window (a redelivery after a restart, at
  least once) is ignored, so redelivery does not double count.
* Every accumulator is order-independent (sums are exact fixed-point integers, first/last
  are chosen by ``ts``), so any arrival order within the grace period, at any replay speed,
  gives identical windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from gpuwarden.shared.models import AttributedSample, GpuAttribution, GpuSample, JobWindow, NodeSample

__all__ = [
    "ACC_FIELDS",
    "IDLE_REASON",
    "STATE_VERSION",
    "WindowKey",
    "WindowStep",
    "add_sample",
    "close_due",
    "fold_sample",
    "summarise",
    "upgrade_state",
    "window_start",
]

#: The throttle reason NVML reports for an idle GPU; it does not count as throttling.
IDLE_REASON = "gpu_idle"
#: Fixed-point scale of the exact sums (values are kept to 1e-6 of their unit).
_SCALE = 1_000_000
#: Mean fields: JobWindow field -> GpuSample field.
_MEANS = {
    "utilization_gpu_pct_mean": "utilization_gpu_pct",
    "power_w_mean": "power_w",
    "sm_clock_mhz_mean": "sm_clock_mhz",
    "tensor_activity_pct_mean": "tensor_activity_pct",
    "sm_occupancy_pct_mean": "sm_occupancy_pct",
}
#: "Last reported" fields: JobWindow field -> GpuSample field (the value at the newest ts).
_LAST = {
    "power_limit_w": "power_limit_w",
    "max_sm_clock_mhz": "max_sm_clock_mhz",
    "memory_total_mib": "memory_total_mib",
    "gpu_uuid": "uuid",
}
_IDLE_ONLY = frozenset({IDLE_REASON})

WindowKey = tuple[str, str, int, float]
"""Dedupe key of a window: (job id, node, GPU index, window start epoch s)."""


@dataclass
class WindowStep:
    """Result of :func:`add_sample`.

    Attributes:
        state: the node's new state dict (see the module docstring).
        closed: windows closed by this sample's watermark, sorted by (start, job, GPU).
        late: ``(job id, node, gpu index, window start)`` of the GPUs of this sample whose
            window had already closed (sample older than watermark - grace, roughly).
    """

    state: dict[str, Any]
    closed: list[JobWindow] = field(default_factory=list)
    late: list[WindowKey] = field(default_factory=list)


def window_start(ts: float, size_s: float) -> float:
    """Start (epoch s, inclusive) of the ``size_s``-second tumbling window holding ``ts``."""
    return math.floor(ts / size_s) * size_s


#: Layout version of the state dicts written now (``state["v"]``); layout 1 had no ``"v"``.
STATE_VERSION = 2
#: Positions of an accumulator list (layout 2). ``ts``: the readings' timestamps as integer
#: microseconds from ``start`` (dedupe and sample period); ``sum``: one ``[fixed-point sum,
#: count]`` or null per :data:`_MEANS` field, in that order; ``last``: one ``[ts us, value]`` or
#: null per :data:`_LAST` field; ``mem_first``/``mem_last``: ``[ts us, MiB]``; ``throttled``:
#: readings with a non-idle throttle reason.
ACC_FIELDS = (
    "job",
    "node",
    "gpu",
    "start",
    "end",
    "user",
    "partition",
    "job_gpus",
    "ts",
    "sum",
    "last",
    "util_min",
    "util_max",
    "mem_first",
    "mem_last",
    "mem_max",
    "temp_max",
    "throttled",
    "reasons",
    "procs_max",
)
(
    _JOB,
    _NODE,
    _GPU,
    _START,
    _END,
    _USER,
    _PART,
    _JOB_GPUS,
    _TS,
    _SUM,
    _LASTS,
    _UMIN,
    _UMAX,
    _MFIRST,
    _MLAST,
    _MMAX,
    _TMAX,
    _THR,
    _REASONS,
    _PROCS,
) = range(len(ACC_FIELDS))
#: Resolution of the timestamps kept in an accumulator: 1 us.
_US = 1_000_000
_MEAN_SRC = tuple(_MEANS.values())
_LAST_SRC = tuple(_LAST.values())
#: one C call for the fields a fold reads (the hot path: once per GPU reading)
_GET_MEANS = attrgetter(*_MEAN_SRC)
_GET_LASTS = attrgetter(*_LAST_SRC)
_GET_REST = attrgetter("utilization_gpu_pct", "memory_used_mib", "temperature_c", "throttle_reasons", "processes")


def _rel_us(ts: float, start: float) -> int:
    """``ts`` as integer microseconds from ``start`` (the window start)."""
    return round((ts - start) * _US)


def _new_acc(job: str, node: str, gpu: int, start: float, size_s: float, att: Any) -> list[Any]:
    acc: list[Any] = [None] * len(ACC_FIELDS)
    acc[_JOB], acc[_NODE], acc[_GPU], acc[_START], acc[_END] = job, node, gpu, start, start + size_s
    acc[_USER], acc[_PART], acc[_JOB_GPUS] = att.user, att.partition, att.job_gpus
    acc[_TS] = []
    acc[_SUM] = [None] * len(_MEAN_SRC)
    acc[_LASTS] = [None] * len(_LAST_SRC)
    acc[_THR] = 0
    acc[_REASONS] = []
    return acc


def _max(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None or b > a else a


def _min(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None or b < a else a


def _fold(acc: list[Any], tus: int, g: GpuSample) -> list[Any]:
    """A new accumulator with one GPU reading (at ``tus`` us from the start) folded in (``acc``
    is not changed)."""
    new = list(acc)
    new[_TS] = list(acc[_TS])
    new[_SUM] = [None if v is None else list(v) for v in acc[_SUM]]
    new[_LASTS] = list(acc[_LASTS])
    _fold_into(new, tus, g)
    return new


def _fold_into(acc: list[Any], tus: int, g: GpuSample) -> None:
    """Fold one GPU reading at ``tus`` (us from the window start) into ``acc`` in place.

    Only the ``ts`` list, the ``[sum, count]`` lists of ``sum`` and the ``sum`` and ``last``
    lists are mutated; every other nested value is replaced, not changed (:func:`_fold` copies
    exactly those before calling this).
    """
    acc[_TS].append(tus)
    sums = acc[_SUM]
    for i, v in enumerate(_GET_MEANS(g)):
        if v is not None:
            s = sums[i]
            if s is None:
                sums[i] = [round(v * _SCALE), 1]
            else:
                s[0] += round(v * _SCALE)
                s[1] += 1
    last = acc[_LASTS]
    for i, v in enumerate(_GET_LASTS(g)):
        if v is not None:
            cur = last[i]
            if cur is None or tus >= cur[0]:
                last[i] = [tus, v]
    u, m, t, tr, procs = _GET_REST(g)
    if u is not None:
        lo, hi = acc[_UMIN], acc[_UMAX]
        if lo is None or u < lo:
            acc[_UMIN] = u
        if hi is None or u > hi:
            acc[_UMAX] = u
    if m is not None:
        first, mlast, mmax = acc[_MFIRST], acc[_MLAST], acc[_MMAX]
        if first is None or tus < first[0]:
            acc[_MFIRST] = [tus, m]
        if mlast is None or tus > mlast[0]:
            acc[_MLAST] = [tus, m]
        if mmax is None or m > mmax:
            acc[_MMAX] = m
    if t is not None:
        tmax = acc[_TMAX]
        if tmax is None or t > tmax:
            acc[_TMAX] = t
    if tr:
        reasons = set(tr)
        if reasons - _IDLE_ONLY:
            acc[_THR] += 1
        if not reasons.issubset(acc[_REASONS]):
            acc[_REASONS] = sorted(reasons.union(acc[_REASONS]))
    if procs is not None:
        compute = sum(1 for p in procs if str(p.get("type") or "C").upper() != "G")  # graphics-only: not work
        acc[_PROCS] = int(_max(acc[_PROCS], compute) or 0)


def summarise(acc: list[Any]) -> JobWindow:
    """The :class:`JobWindow` of one accumulator (layout 2, :data:`ACC_FIELDS`).

    ``throttle_s`` = samples with a non-idle throttle reason x the sample period, where the
    period is ``(last ts - first ts) / (samples - 1)`` (``window_end - ts`` for a single
    sample), capped at the window length: each sample stands for one period. Timestamps are
    kept to 1 us, so the period is exact to 1 us.
    """
    ts = acc[_TS]
    n = len(ts)
    start, end = acc[_START], acc[_END]
    size = end - start
    if n >= 2:
        period = (max(ts) - min(ts)) / _US / (n - 1)
    elif n == 1:
        period = size - ts[0] / _US
    else:
        period = 0.0
    throttle_s = min(size, acc[_THR] * period)
    means = {out: (s[0] / _SCALE) / s[1] for out, s in zip(_MEANS, acc[_SUM], strict=True) if s is not None and s[1]}
    last = {out: v[1] for out, v in zip(_LAST, acc[_LASTS], strict=True) if v is not None}
    mem_first, mem_last = acc[_MFIRST], acc[_MLAST]
    return JobWindow(
        job_id=acc[_JOB],
        node=acc[_NODE],
        gpu_index=acc[_GPU],
        gpu_uuid=last.get("gpu_uuid"),
        user=acc[_USER],
        partition=acc[_PART],
        job_gpus=acc[_JOB_GPUS],
        window_start=start,
        window_end=end,
        samples=n,
        utilization_gpu_pct_mean=means.get("utilization_gpu_pct_mean"),
        utilization_gpu_pct_min=acc[_UMIN],
        utilization_gpu_pct_max=acc[_UMAX],
        power_w_mean=means.get("power_w_mean"),
        power_limit_w=last.get("power_limit_w"),
        sm_clock_mhz_mean=means.get("sm_clock_mhz_mean"),
        max_sm_clock_mhz=last.get("max_sm_clock_mhz"),
        memory_used_mib_first=mem_first[1] if mem_first else None,
        memory_used_mib_last=mem_last[1] if mem_last else None,
        memory_used_mib_max=acc[_MMAX],
        memory_total_mib=last.get("memory_total_mib"),
        temperature_c_max=acc[_TMAX],
        throttle_s=throttle_s,
        throttle_reasons=list(acc[_REASONS]),
        tensor_activity_pct_mean=means.get("tensor_activity_pct_mean"),
        sm_occupancy_pct_mean=means.get("sm_occupancy_pct_mean"),
        processes_max=acc[_PROCS],
    )


def _upgrade_acc(old: dict[str, Any]) -> list[Any]:
    """A layout-1 accumulator (dict, absolute timestamps) as a layout-2 list.

    Raises:
        ValueError: ``old`` lacks a field layout 1 always had.
    """
    try:
        start = float(old["start"])
        acc: list[Any] = [None] * len(ACC_FIELDS)
        for i, name in enumerate(ACC_FIELDS[:_TS]):
            acc[i] = old[name]
        acc[_TS] = [_rel_us(t, start) for t in old["ts"]]
        acc[_SUM] = [list(old["sum"][k]) if k in old["sum"] else None for k in _MEANS]
        acc[_LASTS] = [
            [_rel_us(old["last"][k][0], start), old["last"][k][1]] if k in old["last"] else None for k in _LAST
        ]
        for i in (_UMIN, _UMAX, _MMAX, _TMAX, _THR, _REASONS, _PROCS):
            acc[i] = old[ACC_FIELDS[i]]
        for i in (_MFIRST, _MLAST):
            v = old[ACC_FIELDS[i]]
            acc[i] = None if v is None else [_rel_us(v[0], start), v[1]]
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not a window accumulator of layout 1: {exc!r}") from exc
    return acc


def upgrade_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` in layout 2: returned as is when it already is, else upgraded in place from
    layout 1 (a changelog written before layout 2) and returned.

    Raises:
        ValueError: ``state`` is neither layout (an unknown ``"v"``, or a malformed accumulator).
    """
    v = state.get("v")
    if v == STATE_VERSION:
        return state
    if v is not None:
        raise ValueError(f"window state layout {v!r} is not known (this worker reads 1 and {STATE_VERSION})")
    windows = state.get("w") or {}
    state["w"] = {k: _upgrade_acc(a) if isinstance(a, dict) else a for k, a in windows.items()}
    state["v"] = STATE_VERSION
    return state


def _key(job: str, gpu: int, start: float) -> str:
    return f"{job}|{gpu}|{start!r}"


def _current(state: dict[str, Any], in_place: bool) -> dict[str, Any]:
    """``state`` in the current layout: itself when it is, else upgraded (in place only if asked)."""
    if state.get("v") == STATE_VERSION:
        return state
    if not in_place:
        state = {**state, "w": dict(state.get("w") or {})}
    return upgrade_state(state)


def close_due(state: dict[str, Any], grace_s: float, *, in_place: bool = False) -> WindowStep:
    """Close every open window with ``window_end + grace_s <= state["wm"]``.

    Pure by default; with ``in_place`` the closed windows are removed from ``state["w"]``
    itself and the returned step's state is ``state``. A layout-1 state is upgraded first
    (:func:`upgrade_state`; in place only with ``in_place``).

    Raises:
        ValueError: ``state`` is of an unknown layout.
    """
    state = _current(state, in_place)
    wm = state.get("wm")
    windows: dict[str, Any] = state.get("w", {})
    if wm is None:
        return WindowStep(state)
    due = [k for k, acc in windows.items() if acc[_END] + grace_s <= wm]
    if not due:
        return WindowStep(state)
    accs = sorted((windows[k] for k in due), key=lambda a: (a[_START], a[_JOB], a[_GPU]))
    if in_place:
        for k in due:
            del windows[k]
        new_state = state
    else:
        gone = set(due)
        new_state = {"v": STATE_VERSION, "wm": wm, "w": {k: acc for k, acc in windows.items() if k not in gone}}
    return WindowStep(new_state, [summarise(a) for a in accs])


def add_sample(
    state: dict[str, Any] | None,
    sample: AttributedSample,
    size_s: float = 10.0,
    grace_s: float = 5.0,
    *,
    in_place: bool = False,
) -> WindowStep:
    """Fold one attributed sample (one node, one tick) into the node's window state.

    Args:
        state: the node's state (``None`` for a node never seen); not mutated unless
            ``in_place``.
        sample: the sample and its per-GPU job attribution.
        size_s: window length, s (event time).
        grace_s: how long after a window's end (in the node's event time) it stays open
            for late and out-of-order samples, s.
        in_place: update ``state`` itself (and return it as the step's state) instead of
            copying what changes: same result, no copies (the correlator's hot path, which
            owns its state). The caller must not keep references into the old state.

    Returns:
        The new state, the windows this sample's watermark closed and the late windows.

    Raises:
        ValueError: ``state`` is of an unknown layout (a layout-1 state is upgraded,
            :func:`upgrade_state`).
    """
    return fold_sample(state, sample.sample, sample.jobs, size_s, grace_s, in_place=in_place)


def fold_sample(
    state: dict[str, Any] | None,
    sample: NodeSample,
    jobs: list[GpuAttribution],
    size_s: float = 10.0,
    grace_s: float = 5.0,
    *,
    in_place: bool = False,
) -> WindowStep:
    """:func:`add_sample` of a sample and its per-GPU attributions given apart (no
    ``AttributedSample`` built: the correlator's hot path). Same arguments, result and errors."""
    if state is None:
        state = {"v": STATE_VERSION, "wm": None, "w": {}}
    else:
        state = _current(state, in_place)
        if in_place and "w" not in state:
            state["w"] = {}
    wm_old: float | None = state.get("wm")
    ts = sample.ts
    node = sample.node
    start = window_start(ts, size_s)
    tus = _rel_us(ts, start)
    late: list[WindowKey] = []
    windows: dict[str, Any] = state.get("w", {})
    by_index = {g.index: g for g in sample.gpus}
    new_windows = windows
    too_late = wm_old is not None and start + size_s + grace_s <= wm_old
    for att in jobs:
        g = by_index.get(att.gpu_index)
        if g is None:
            continue
        if too_late:
            late.append((att.job_id, node, att.gpu_index, start))
            continue
        k = _key(att.job_id, att.gpu_index, start)
        acc = windows.get(k)
        if acc is None:
            acc = _new_acc(att.job_id, node, att.gpu_index, start, size_s, att)
            if in_place:
                windows[k] = acc
                _fold_into(acc, tus, g)
                continue
        elif tus in acc[_TS]:
            continue  # redelivered
        if in_place:
            _fold_into(acc, tus, g)
            continue
        if new_windows is windows:
            new_windows = dict(windows)
        new_windows[k] = _fold(acc, tus, g)
    wm = ts if wm_old is None else max(wm_old, ts)
    if in_place:
        state["wm"] = wm
        if wm_old is not None and math.floor((wm - grace_s) / size_s) == math.floor((wm_old - grace_s) / size_s):
            # Window ends are multiples of size_s and none open is due at wm_old (a window this
            # sample opened is not: it was not too late): nothing can close before the watermark
            # crosses the next end + grace.
            step = WindowStep(state)
            step.late = late
            return step
        step = close_due(state, grace_s, in_place=True)
    else:
        step = close_due({"v": STATE_VERSION, "wm": wm, "w": new_windows}, grace_s)
    step.late = late
    return step
