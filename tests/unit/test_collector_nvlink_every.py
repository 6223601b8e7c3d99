"""NvmlSource reads NVLink every Nth tick (``nvlink_every``), and the detector's NVLink rules
still work on such samples (rates between the readings that carry NVLink counters)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.collector.sources import NvmlSource
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.shared.models import AttributedSample, FailureState, GpuAttribution, GpuSample, NodeSample
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.sim.collector import SIM_NVLINK_EVERY, SimulatedSource
from gpuwarden.sim.nvml import FakeNvml

START = 1_750_000_000.0
NODE = "gpu-node-001"


def scen(faults: list[dict[str, Any]] | None = None) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "seed": 3,
            "duration_s": 600,
            "cluster": {"nodes": 1, "gpus_per_node": 8},
            "jobs": [{"id": 1001, "nodes": NODE, "gpus_per_node": 8, "start_s": 0, "profile": "training"}],
            "faults": faults or [],
        }
    )


def test_nvlink_is_read_every_nth_tick_only() -> None:
    fake = FakeNvml(scen(), ScenarioClock(START), NODE)
    src = NvmlSource(fake, NODE, lambda: START + (fake.t or 0.0), collector_id="t", nvlink_every=3)
    carried, calls = [], []
    for t in range(7):
        fake.t = float(t)
        before = fake.calls
        s = src.collect_sync()
        calls.append(fake.calls - before)
        carried.append(all(g.nvlinks is not None for g in s.gpus))
        assert all((g.nvlinks is None) == (not carried[-1]) for g in s.gpus)
        assert all(g.utilization_gpu_pct is not None for g in s.gpus)  # the rest is read every tick
    assert carried == [True, False, False, True, False, False, True]
    # 18 links x (1 state + 4 counters) = 90 fake NVML calls per GPU saved on the other ticks
    assert calls[1] == calls[2] and calls[3] - calls[4] == 8 * 90


def test_nvlink_every_must_be_positive() -> None:
    fake = FakeNvml(scen(), ScenarioClock(START), NODE)
    with pytest.raises(ValueError, match="nvlink_every"):
        NvmlSource(fake, NODE, lambda: START, nvlink_every=0)


def test_simulated_source_reads_nvlink_every_fifth_tick_by_default() -> None:
    src = SimulatedSource(scen(), ScenarioClock(START))
    got = [all(g.nvlinks is not None for g in s.gpus) for _ in range(6) for s in src.collect_sync()]
    assert SIM_NVLINK_EVERY == 5 and got == [True, False, False, False, False, True]


def _run(errors_per_s: float, every: int, seconds: int = 200) -> list[Any]:
    """One node's samples to the detector, NVLink counters only on every ``every``-th; GPU 3's
    CRC counter rises by ``errors_per_s`` from t=10."""
    d = Detector(load_catalog())
    out = []
    for t in range(seconds):
        gpus = []
        for i in range(8):
            links = None
            if t % every == 0:
                crc = int(max(0, t - 10) * errors_per_s) if i == 3 else 0
                links = [{"link": k, "active": True, "crc_flit_errors": crc if k == 0 else 0} for k in range(18)]
            gpus.append(GpuSample(index=i, uuid=f"GPU-{i}", utilization_gpu_pct=95.0, nvlinks=links))
        jobs = [GpuAttribution(gpu_index=i, job_id="77", job_gpus=8) for i in range(8)]
        s = NodeSample(node=NODE, ts=START + t, collector_id="t", source="test", gpus=gpus)
        out += d.on_sample(AttributedSample(sample=s, jobs=jobs))
    return [(f.pattern, f.gpu_index) for f in out if f.state is FailureState.OPEN]


@pytest.mark.parametrize("every", [1, 5])
def test_nvlink_error_rate_is_detected_from_every_nth_reading(every: int) -> None:
    # 1 error/s = 60/min, over the rule's 10/min; the rate is the same whatever the read interval
    assert ("nvlink-error", 3) in _run(1.0, every)


@pytest.mark.parametrize("every", [1, 5])
def test_a_slow_nvlink_counter_is_not_an_error_rate(every: int) -> None:
    # 0.1 error/s = 6/min: under 10/min at every read interval (5 s readings do not add up to a spike)
    assert _run(0.1, every) == []
