"""Layout 2 of the correlator's window state (what goes to the windows table's changelog):
compact, JSON, and layout-1 states written by an older worker still restore."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from gpuwarden.correlator.windows import STATE_VERSION, add_sample, close_due, upgrade_state
from gpuwarden.shared.models import AttributedSample, GpuAttribution, GpuSample, NodeSample

T0 = 1_700_000_030.0
UUID = "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"


def sample(ts: float, gpus: int = 8, mem: float = 40030.0) -> AttributedSample:
    return AttributedSample(
        sample=NodeSample(
            node="n1",
            ts=ts,
            collector_id="c",
            source="simulated",
            gpus=[
                GpuSample(
                    index=i,
                    uuid=UUID,
                    utilization_gpu_pct=90.0,
                    power_w=600.0,
                    power_limit_w=700.0,
                    sm_clock_mhz=1980.0,
                    max_sm_clock_mhz=1980.0,
                    memory_used_mib=mem,
                    memory_total_mib=81559.0,
                    temperature_c=65.0,
                    throttle_reasons=["sw_power_cap"] if ts == T0 + 0.5 else [],
                )
                for i in range(gpus)
            ],
        ),
        jobs=[
            GpuAttribution(gpu_index=i, job_id="9001", user="alice", partition="gpu", job_gpus=gpus)
            for i in range(gpus)
        ],
    )


#: One accumulator as layout 1 wrote it (dict with named keys, absolute timestamps): GPU 0 of
#: job 9001 after readings at T0 + 0.5 (throttled) and T0 + 1.5.
V1_ACC: dict[str, Any] = {
    "job": "9001",
    "node": "n1",
    "gpu": 0,
    "start": T0,
    "end": T0 + 10,
    "user": "alice",
    "partition": "gpu",
    "job_gpus": 1,
    "ts": [T0 + 0.5, T0 + 1.5],
    "sum": {
        "utilization_gpu_pct_mean": [180000000, 2],
        "power_w_mean": [1200000000, 2],
        "sm_clock_mhz_mean": [3960000000, 2],
    },
    "last": {
        "power_limit_w": [T0 + 1.5, 700.0],
        "max_sm_clock_mhz": [T0 + 1.5, 1980.0],
        "memory_total_mib": [T0 + 1.5, 81559.0],
        "gpu_uuid": [T0 + 1.5, UUID],
    },
    "util_min": 90.0,
    "util_max": 90.0,
    "mem_first": [T0 + 0.5, 40030.0],
    "mem_last": [T0 + 1.5, 40031.0],
    "mem_max": 40031.0,
    "temp_max": 65.0,
    "throttled": 1,
    "reasons": ["sw_power_cap"],
    "procs_max": None,
}


def v1_state() -> dict[str, Any]:
    return {"wm": T0 + 1.5, "w": {f"9001|0|{T0!r}": copy.deepcopy(V1_ACC)}}


def test_state_is_versioned_json_and_compact() -> None:
    state = None
    for t in range(10):
        state = add_sample(state, sample(T0 + t + 0.123456, mem=40030.0 + t), in_place=True).state
    assert state is not None and state["v"] == STATE_VERSION
    raw = orjson.dumps(state)
    assert orjson.loads(raw) == state
    # One full 10 s window of 8 GPUs: layout 1 took 6,870 bytes for this (named keys, absolute
    # timestamps in every accumulator); layout 2 is positional with microsecond offsets.
    assert len(raw) <= 3200, len(raw)
    acc = state["w"][f"9001|0|{T0!r}"]
    assert acc[8] == [t * 1_000_000 + 123456 for t in range(10)]  # ts: us from the window start


def test_layout_1_state_restores_to_the_same_window() -> None:
    """A state from an older worker's changelog folds on and closes to the window a fresh
    state gives for the same readings."""
    g1 = sample(T0 + 0.5, gpus=1, mem=40030.0)
    g2 = sample(T0 + 1.5, gpus=1, mem=40031.0)
    later = sample(T0 + 20, gpus=1)
    fresh = add_sample(add_sample(None, g1).state, g2).state
    old = v1_state()
    # a redelivered reading is still recognised in the upgraded state
    step = add_sample(old, g2)
    assert orjson.dumps(step.state) == orjson.dumps(fresh)
    assert old == v1_state()  # pure: the layout-1 input is not changed
    [w_old] = add_sample(old, later).closed
    [w_new] = add_sample(fresh, later).closed
    assert w_old == w_new
    assert (w_old.samples, w_old.memory_used_mib_first, w_old.memory_used_mib_last) == (2, 40030.0, 40031.0)
    assert w_old.throttle_s == pytest.approx(1.0) and w_old.gpu_uuid == UUID
    # in place (the correlator's hot path) upgrades the state itself
    inplace = v1_state()
    assert upgrade_state(inplace) is inplace and inplace["v"] == STATE_VERSION
    assert inplace == fresh


def test_close_due_reads_layout_1() -> None:
    state = v1_state()
    state["wm"] = T0 + 15
    [w] = close_due(state, 5.0).closed
    assert (w.job_id, w.gpu_index, w.window_start, w.samples) == ("9001", 0, T0, 2)


def test_unknown_or_malformed_state_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="layout 3"):
        add_sample({"v": 3, "wm": T0, "w": {}}, sample(T0 + 1))
    bad = v1_state()
    del bad["w"][f"9001|0|{T0!r}"]["ts"]
    with pytest.raises(ValueError, match="layout 1"):
        upgrade_state(bad)
