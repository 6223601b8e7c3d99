"""FakeNvml + NvmlSource + SimulatedSource, and ReplaySource following kern.log."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuwarden.collector.sources import FileFollower, NvmlSource, ReplaySource
from gpuwarden.shared.models import EventKind
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.sim.collector import SimulatedSource
from gpuwarden.sim.gpu_model import HGX_H100_PCI
from gpuwarden.sim.nvml import FakeNvml

FIX = Path(__file__).resolve().parents[1] / "fixtures"
START = 1_750_000_000.0


def scenario(**over: object) -> Scenario:
    data: dict[str, object] = {
        "name": "two-nodes-xid79",
        "seed": 7,
        "duration_s": 20,
        "tick_s": 1,
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "jobs": [
            {
                "id": 1001,
                "nodes": "gpu-node-[001-002]",
                "gpus_per_node": 4,
                "start_s": 0,
                "end_s": 20,
                "profile": "training",
            }
        ],
        "faults": [
            {"at_s": 5, "kind": "xid", "node": "gpu-node-002", "gpu": 3, "xid": 79},
            {"at_s": 2, "kind": "thermal-throttle", "node": "gpu-node-001", "gpu": 1, "duration_s": 4},
        ],
    }
    data.update(over)
    return Scenario.model_validate(data)


async def run_ticks(src: SimulatedSource, n: int) -> tuple[list, list]:
    samples, events = [], []
    for _ in range(n):
        samples.extend(await src.collect())
        events.extend(await src.events())
    return samples, events


async def test_simulated_xid79_at_right_time_and_gpu() -> None:
    clock = ScenarioClock(START, speed=10)
    src = SimulatedSource(scenario(), clock)
    samples, events = await run_ticks(src, 8)
    xids = [e for e in events if e.kind is EventKind.XID]
    assert len(xids) == 1
    x = xids[0]
    assert (x.node, x.code, x.gpu_index, x.pci_bus_id) == ("gpu-node-002", 79, 3, HGX_H100_PCI[3])
    assert x.ts == pytest.approx(clock.event_ts(5))
    assert x.message == "GPU has fallen off the bus." and x.source == "simulated"
    assert x.gpu_uuid is not None and x.gpu_uuid.startswith("GPU-")
    lost = [e for e in events if e.kind is EventKind.GPU_LOST]
    assert [(e.node, e.gpu_index, e.ts) for e in lost] == [("gpu-node-002", 3, clock.event_ts(5))]
    # after the fault the GPU is gone from NVML samples of that node, the other node keeps 8
    after = [s for s in samples if s.ts >= clock.event_ts(5)]
    assert {len(s.gpus) for s in after if s.node == "gpu-node-002"} == {7}
    assert {len(s.gpus) for s in after if s.node == "gpu-node-001"} == {8}
    assert [s.ts for s in samples if s.node == "gpu-node-001"] == [clock.event_ts(t) for t in range(8)]


async def test_simulated_profiles_and_thermal_throttle() -> None:
    src = SimulatedSource(scenario(), ScenarioClock(START), nodes=["gpu-node-001"])
    samples, _ = await run_ticks(src, 4)
    s3 = samples[3]  # t=3: thermal fault on GPU 1 active (2..6)
    busy = s3.gpus[0]
    assert 90 <= busy.utilization_gpu_pct <= 100 and 500 <= busy.power_w <= 700
    assert 1700 <= busy.sm_clock_mhz <= 1980 and 50 <= busy.temperature_c <= 75  # per-GPU spread (sim realism)
    assert 68 * 1024 <= busy.memory_used_mib <= 72 * 1024
    hot = s3.gpus[1]
    assert hot.throttle_reasons == ["sw_thermal_slowdown"] and hot.sm_clock_mhz < 1500 and hot.temperature_c >= 87
    idle = s3.gpus[6]  # job holds GPUs 0-3 only
    assert idle.utilization_gpu_pct == 0 and idle.sm_clock_mhz == 345 and idle.throttle_reasons == ["gpu_idle"]
    assert 55 <= idle.power_w <= 85
    assert samples[0].gpus[1].throttle_reasons == []  # before the fault


async def test_simulation_is_deterministic() -> None:
    a, _ = await run_ticks(SimulatedSource(scenario(), ScenarioClock(START)), 3)
    b, _ = await run_ticks(SimulatedSource(scenario(), ScenarioClock(START)), 3)
    assert [s.model_dump() for s in a] == [s.model_dump() for s in b]


async def test_simulated_source_paces_and_finishes() -> None:
    clock = ScenarioClock(START, speed=4)
    src = SimulatedSource(scenario(duration_s=2), clock)
    assert src.next_due() == clock.wall_of(0)
    await run_ticks(src, 3)
    assert src.next_due() is None


def test_unknown_node_is_an_error() -> None:
    with pytest.raises(ValueError, match="not in scenario"):
        SimulatedSource(scenario(), ScenarioClock(START), nodes=["nope"])


class BrokenNvml(FakeNvml):
    """Temperature unsupported on every GPU (NVMLError NOT_SUPPORTED)."""

    def nvmlDeviceGetTemperature(self, handle, sensor):  # type: ignore[no-untyped-def]
        raise self.NVMLError(3)


async def test_nvml_source_field_error_is_none() -> None:
    sc = scenario()
    fake = BrokenNvml(sc, ScenarioClock(START), "gpu-node-001")
    fake.t = 1.0
    src = NvmlSource(fake, "gpu-node-001", lambda: START + 1)
    [sample] = await src.collect()
    assert len(sample.gpus) == 8
    assert all(g.temperature_c is None and g.power_w is not None for g in sample.gpus)
    assert sample.gpus[2].pci_bus_id == HGX_H100_PCI[2]
    await src.close()


def test_file_follower(tmp_path: Path) -> None:
    p = tmp_path / "kern.log"
    f = FileFollower(p)
    assert f.read_new_lines() == []
    p.write_text("a\nb\npart")
    assert f.read_new_lines() == ["a", "b"]
    with p.open("a") as fh:
        fh.write("ial\nc\n")
    assert f.read_new_lines() == ["partial", "c"]
    p.write_text("x\n")  # truncated / rotated
    assert f.read_new_lines() == ["x"]


async def test_replay_source_follows_kern_log_and_maps_pci(tmp_path: Path) -> None:
    node = tmp_path / "gpu-node-007"
    node.mkdir()
    shutil.copy(FIX / "nvidia-smi" / "rtx3080-xml-v13-595.xml", node / "000.xml")
    shutil.copy(FIX / "nvidia-smi" / "tesla-t4-xml-v11-processes.xml", node / "001.xml")
    now = [START]
    src = ReplaySource(tmp_path, None, lambda: now[0])
    [s0] = await src.collect()
    now[0] += 1
    [s1] = await src.collect()
    [s2] = await src.collect()
    assert (s0.node, s0.ts, s0.source, s0.driver_version) == ("gpu-node-007", START, "nvidia-smi-xml", "595.58.03")
    assert [s.gpus[0].name for s in (s0, s1, s2)] == ["NVIDIA GeForce RTX 3080", "Tesla T4", "NVIDIA GeForce RTX 3080"]
    assert await src.events() == []
    # XID 79 for the RTX 3080's bus appended while running; a noise line too
    with (node / "kern.log").open("a") as fh:
        fh.write("[  12.000001] NVRM: loading NVIDIA UNIX Open Kernel Module\n")
        fh.write("2025-03-01T10:00:00,000000+00:00 NVRM: Xid (PCI:0000:0c:00): 79, GPU has fallen off the bus.\n")
    [ev] = await src.events()
    assert (ev.node, ev.code, ev.gpu_index, ev.pci_bus_id) == ("gpu-node-007", 79, 0, "0000:0c:00.0")
    assert ev.gpu_uuid == "GPU-00000000-0000-0000-0000-000000000001"
    assert ev.source == "replay"
    assert await src.events() == []  # offset remembered


async def test_replay_source_node_filter_and_missing_root(tmp_path: Path) -> None:
    for n in ("a", "b"):
        (tmp_path / n).mkdir()
        shutil.copy(FIX / "nvidia-smi" / "tesla-t4-xml-v11-processes.xml", tmp_path / n / "x.xml")
    assert [s.node for s in await ReplaySource(tmp_path, ["b"], lambda: START).collect()] == ["b"]
    with pytest.raises(FileNotFoundError):
        await ReplaySource(tmp_path / "missing", None, lambda: START).collect()


async def test_a_resumed_simulated_collector_samples_from_now_not_from_second_0() -> None:
    """Issue 25: a restarted collector resumes where the scenario is, as a real one samples
    "now"; a replay from second 0 would refill the hole its death made and hide the loss."""
    import time

    clock = ScenarioClock(START, speed=1.0, wall_start=time.time() - 7.4)  # 7.4 s into the run
    src = SimulatedSource(scenario(), clock, resume=True)
    assert src.next_due() == pytest.approx(clock.wall_of(8))
    samples, events = await run_ticks(src, 2)
    assert sorted({s.ts for s in samples}) == [clock.event_ts(8), clock.event_ts(9)]
    # the kernel log is read from its start (no saved /dev/kmsg position): the XID at 5 s is there
    assert [e.code for e in events if e.kind is EventKind.XID] == [79]
    # the GPU that fell off the bus at 5 s is gone from its node's samples
    assert {len(s.gpus) for s in samples if s.node == "gpu-node-002"} == {7}
    # not resuming, or before the scenario starts: second 0
    assert SimulatedSource(scenario(), clock).t == 0.0
    assert SimulatedSource(scenario(), ScenarioClock(START, 1.0, time.time() + 5), resume=True).t == 0.0
