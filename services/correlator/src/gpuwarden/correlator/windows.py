"""Per (job, node, GPU) tumbling windows over attributed samples, as functions over plain data.

The state of one node is a JSON-able dict (it lives in a faust table whose changelog
restores it after a restart)::

    {"wm": 1700000012.0,                      # event-time watermark: newest sample ts seen, epoch s
     "w": {"<job>|<gpu>|<start>": acc, ...}}  # open windows, one accumulator each

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
from typing import Any

from gpuwarden.shared.models import AttributedSample, GpuSample, JobWindow

__all__ = ["IDLE_REASON", "WindowKey", "WindowStep", "add_sample", "close_due", "summarise", "window_start"]

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
_MEANS_ITEMS = tuple(_MEANS.items())
_LAST_ITEMS = tuple(_LAST.items())
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


def _new_acc(job: str, node: str, gpu: int, start: float, size_s: float, att: Any) -> dict[str, Any]:
    return {
        "job": job,
        "node": node,
        "gpu": gpu,
        "start": start,
        "end": start + size_s,
        "user": att.user,
        "partition": att.partition,
        "job_gpus": att.job_gpus,
        "ts": [],
        "sum": {},  # JobWindow mean field -> [fixed-point sum, count]
        "last": {},  # JobWindow field -> [ts, value]
        "util_min": None,
        "util_max": None,
        "mem_first": None,  # [ts, MiB]
        "mem_last": None,
        "mem_max": None,
        "temp_max": None,
        "throttled": 0,  # samples with a non-idle throttle reason
        "reasons": [],
        "procs_max": None,
    }


def _max(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None or b > a else a


def _min(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None or b < a else a


def _fold(acc: dict[str, Any], ts: float, g: GpuSample) -> dict[str, Any]:
    """A new accumulator with one GPU reading at ``ts`` folded in (``acc`` is not changed)."""
    new = dict(acc)
    new["ts"] = list(acc["ts"])
    new["sum"] = {k: list(v) for k, v in acc["sum"].items()}
    new["last"] = dict(acc["last"])
    _fold_into(new, ts, g)
    return new


def _fold_into(acc: dict[str, Any], ts: float, g: GpuSample) -> None:
    """Fold one GPU reading at ``ts`` into ``acc`` in place.

    Only ``acc["ts"]``, the ``[sum, count]`` lists of ``acc["sum"]`` and the ``acc["sum"]`` and
    ``acc["last"]`` dicts are mutated; every other nested value is replaced, not changed
    (:func:`_fold` copies exactly those before calling this).
    """
    acc["ts"].append(ts)
    sums = acc["sum"]
    for out, src in _MEANS_ITEMS:
        v = getattr(g, src)
        if v is not None:
            s = sums.get(out)
            if s is None:
                sums[out] = [round(v * _SCALE), 1]
            else:
                s[0] += round(v * _SCALE)
                s[1] += 1
    last = acc["last"]
    for out, src in _LAST_ITEMS:
        v = getattr(g, src)
        if v is not None:
            cur = last.get(out)
            if cur is None or ts >= cur[0]:
                last[out] = [ts, v]
    u = g.utilization_gpu_pct
    if u is not None:
        acc["util_min"] = _min(acc["util_min"], u)
        acc["util_max"] = _max(acc["util_max"], u)
    m = g.memory_used_mib
    if m is not None:
        if acc["mem_first"] is None or ts < acc["mem_first"][0]:
            acc["mem_first"] = [ts, m]
        if acc["mem_last"] is None or ts > acc["mem_last"][0]:
            acc["mem_last"] = [ts, m]
        acc["mem_max"] = _max(acc["mem_max"], m)
    acc["temp_max"] = _max(acc["temp_max"], g.temperature_c)
    tr = g.throttle_reasons
    if tr:
        reasons = set(tr)
        if reasons - _IDLE_ONLY:
            acc["throttled"] += 1
        if not reasons.issubset(acc["reasons"]):
            acc["reasons"] = sorted(reasons.union(acc["reasons"]))
    if g.processes is not None:
        acc["procs_max"] = int(_max(acc["procs_max"], len(g.processes)) or 0)


def summarise(acc: dict[str, Any]) -> JobWindow:
    """The :class:`JobWindow` of one accumulator.

    ``throttle_s`` = samples with a non-idle throttle reason x the sample period, where the
    period is ``(last ts - first ts) / (samples - 1)`` (``window_end - ts`` for a single
    sample), capped at the window length: each sample stands for one period.
    """
    ts = acc["ts"]
    n = len(ts)
    size = acc["end"] - acc["start"]
    if n >= 2:
        period = (max(ts) - min(ts)) / (n - 1)
    elif n == 1:
        period = acc["end"] - ts[0]
    else:
        period = 0.0
    throttle_s = min(size, acc["throttled"] * period)
    means = {out: (s / _SCALE) / c for out, (s, c) in acc["sum"].items() if c}
    last = {out: v for out, (_t, v) in acc["last"].items()}
    return JobWindow(
        job_id=acc["job"],
        node=acc["node"],
        gpu_index=acc["gpu"],
        gpu_uuid=last.get("gpu_uuid"),
        user=acc["user"],
        partition=acc["partition"],
        job_gpus=acc["job_gpus"],
        window_start=acc["start"],
        window_end=acc["end"],
        samples=n,
        utilization_gpu_pct_mean=means.get("utilization_gpu_pct_mean"),
        utilization_gpu_pct_min=acc["util_min"],
        utilization_gpu_pct_max=acc["util_max"],
        power_w_mean=means.get("power_w_mean"),
        power_limit_w=last.get("power_limit_w"),
        sm_clock_mhz_mean=means.get("sm_clock_mhz_mean"),
        max_sm_clock_mhz=last.get("max_sm_clock_mhz"),
        memory_used_mib_first=acc["mem_first"][1] if acc["mem_first"] else None,
        memory_used_mib_last=acc["mem_last"][1] if acc["mem_last"] else None,
        memory_used_mib_max=acc["mem_max"],
        memory_total_mib=last.get("memory_total_mib"),
        temperature_c_max=acc["temp_max"],
        throttle_s=throttle_s,
        throttle_reasons=list(acc["reasons"]),
        tensor_activity_pct_mean=means.get("tensor_activity_pct_mean"),
        sm_occupancy_pct_mean=means.get("sm_occupancy_pct_mean"),
        processes_max=acc["procs_max"],
    )


def _key(job: str, gpu: int, start: float) -> str:
    return f"{job}|{gpu}|{start!r}"


def close_due(state: dict[str, Any], grace_s: float, *, in_place: bool = False) -> WindowStep:
    """Close every open window with ``window_end + grace_s <= state["wm"]``.

    Pure by default; with ``in_place`` the closed windows are removed from ``state["w"]``
    itself and the returned step's state is ``state``.
    """
    wm = state.get("wm")
    windows: dict[str, Any] = state.get("w", {})
    if wm is None:
        return WindowStep(state)
    due = [k for k, acc in windows.items() if acc["end"] + grace_s <= wm]
    if not due:
        return WindowStep(state)
    accs = sorted((windows[k] for k in due), key=lambda a: (a["start"], a["job"], a["gpu"]))
    if in_place:
        for k in due:
            del windows[k]
        new_state = state
    else:
        gone = set(due)
        new_state = {"wm": wm, "w": {k: acc for k, acc in windows.items() if k not in gone}}
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
    """
    if state is None:
        state = {"wm": None, "w": {}}
    elif in_place and "w" not in state:
        state["w"] = {}
    wm_old: float | None = state.get("wm")
    ts = sample.sample.ts
    node = sample.sample.node
    start = window_start(ts, size_s)
    late: list[WindowKey] = []
    windows: dict[str, Any] = state.get("w", {})
    by_index = {g.index: g for g in sample.sample.gpus}
    new_windows = windows
    too_late = wm_old is not None and start + size_s + grace_s <= wm_old
    for att in sample.jobs:
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
                _fold_into(acc, ts, g)
                continue
        elif ts in acc["ts"]:
            continue  # redelivered
        if in_place:
            _fold_into(acc, ts, g)
            continue
        if new_windows is windows:
            new_windows = dict(windows)
        new_windows[k] = _fold(acc, ts, g)
    wm = ts if wm_old is None else max(wm_old, ts)
    if in_place:
        state["wm"] = wm
        step = close_due(state, grace_s, in_place=True)
    else:
        step = close_due({"wm": wm, "w": new_windows}, grace_s)
    step.late = late
    return step
