"""The simulator's raw signals: one test per job profile and per fault kind (DESIGN section 6).

Each test reads the fake NVML through the real NvmlSource (or the kernel-log generator) and
asserts the raw telemetry / log line a real GPU would show - never a verdict.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pytest

from gpuwarden.collector.parsers import parse_kernel_log_line
from gpuwarden.collector.sim import FakeNvml, KernelLogGenerator, SimulatedSource, pci_of
from gpuwarden.collector.sources import NvmlSource
from gpuwarden.shared.models import EventKind, GpuSample, NodeSample
from gpuwarden.shared.scenario import FAULT_KINDS, PROFILES, Scenario, ScenarioClock

START = 1_750_000_000.0
NODE = "gpu-node-001"


def scen(jobs: list[dict[str, Any]] | None = None, faults: list[dict[str, Any]] | None = None, **kw: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "t",
        "seed": 3,
        "duration_s": 600,
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "jobs": jobs or [],
        "faults": faults or [],
    }
    data["cluster"].update(kw.pop("cluster", {}))
    data.update(kw)
    return Scenario.model_validate(data)


def job(profile: str = "training", nodes: str = NODE, **kw: Any) -> dict[str, Any]:
    return {"id": kw.pop("id", 1001), "nodes": nodes, "gpus_per_node": 8, "start_s": 0, "profile": profile, **kw}


def series(sc: Scenario, ts: list[float], node: str = NODE) -> list[NodeSample]:
    """Samples of ``node`` at scenario seconds ``ts`` (ascending), read through NvmlSource."""
    fake = FakeNvml(sc, ScenarioClock(START), node)
    src = NvmlSource(fake, node, lambda: START + (fake.t or 0.0), collector_id="t")
    out = []
    for t in ts:
        fake.t = t
        out.append(src.collect_sync())
    return out


def at(sc: Scenario, t: float, node: str = NODE) -> NodeSample:
    return series(sc, [t - 1, t], node)[-1]


def g(sample: NodeSample, index: int) -> GpuSample:
    return next(x for x in sample.gpus if x.index == index)


# -- profiles ------------------------------------------------------------------------------


def test_every_profile_and_fault_kind_has_a_test() -> None:
    names = set(globals())
    for p in PROFILES:
        assert f"test_profile_{p.replace('-', '_')}" in names, p
    for k in FAULT_KINDS:
        assert f"test_fault_{k.replace('-', '_')}" in names, k


def test_profile_training() -> None:
    sc = scen([job("training")])
    ss = series(sc, [float(t) for t in range(0, 40)])
    util = [g(s, 0).utilization_gpu_pct for s in ss]
    power = [g(s, 0).power_w for s in ss]
    assert statistics.mean(util) >= 85 and statistics.mean(power) >= 500  # type: ignore[type-var]
    # step-periodic dips: util well below the compute plateau at regular intervals
    dips = [t for t, u in enumerate(util) if u < 80]  # type: ignore[operator]
    assert len(dips) >= 3 and len({b - a for a, b in itertools.pairwise(dips)}) == 1
    # NCCL phases: util stays high, power and tensor activity fall
    nccl = [s for s in ss[1:] if g(s, 0).utilization_gpu_pct >= 97 and g(s, 0).power_w < 470]  # type: ignore[operator]
    assert nccl and all(g(s, 0).tensor_activity_pct < 6 for s in nccl)  # type: ignore[operator]
    compute = [s for s in ss[1:] if g(s, 0).power_w >= 600]  # type: ignore[operator]
    assert compute and all(g(s, 0).tensor_activity_pct >= 55 for s in compute)  # type: ignore[operator]
    # all GPUs of the job are in the same phase (synchronous steps)
    assert all(len({g(s, i).power_w >= 590 for i in range(8)}) == 1 for s in ss)  # type: ignore[operator]
    assert all(g(s, 0).processes and g(s, 0).processes[0]["used_memory_mib"] > 60_000 for s in ss)  # type: ignore[index]


def test_profile_inference() -> None:
    ss = series(scen([job("inference")]), [float(t) for t in range(0, 60)])
    util = [g(s, 2).utilization_gpu_pct or 0.0 for s in ss]
    assert 20 <= statistics.mean(util) <= 70  # moderate on average
    assert min(util) < 30 and max(util) > 55  # bursty
    assert all(40 * 1024 - 600 <= (g(s, 2).memory_used_mib or 0) <= 40 * 1024 + 600 for s in ss)


def test_profile_input_bound() -> None:
    ss = series(scen([job("input-bound")]), [float(t) for t in range(0, 20)])
    util = [g(s, 1).utilization_gpu_pct or 0.0 for s in ss]
    assert all(15 <= u <= 40 for u in util)  # low duty cycle: the GPU waits for data
    assert all((g(s, 1).power_w or 0) < 350 for s in ss)
    assert statistics.mean(g(s, 1).pcie_rx_kbps or 0 for s in ss) > 30_000  # busy input pipeline


def test_profile_checkpoint_heavy() -> None:
    ss = series(scen([job("checkpoint-heavy")]), [float(t) for t in range(95, 125)])
    paused = [s for s in ss if s.ts - START >= 105 and s.ts - START < 120]
    assert len(paused) == 15
    for s in paused:  # every GPU pauses at once: no kernels, memory kept, idle clocks
        assert all(x.utilization_gpu_pct == 0 and (x.power_w or 0) < 140 for x in s.gpus)
        assert all((x.memory_used_mib or 0) > 60_000 for x in s.gpus)
        assert all(x.throttle_reasons == ["gpu_idle"] for x in s.gpus)
    running = [s for s in ss if s not in paused]
    assert all(statistics.mean(x.utilization_gpu_pct or 0 for x in s.gpus) > 50 for s in running)


def test_profile_idle() -> None:
    s = at(scen([job("idle")]), 30)
    for x in s.gpus:
        assert x.utilization_gpu_pct == 0 and 60 <= (x.power_w or 0) <= 80 and x.sm_clock_mhz == 345
        assert x.throttle_reasons == ["gpu_idle"] and x.processes == [] and (x.memory_used_mib or 0) < 1024


def test_profile_partial_idle() -> None:
    s = at(scen([job("partial-idle")]), 4)
    busy = [x.index for x in s.gpus if (x.utilization_gpu_pct or 0) > 50]
    idle = [x.index for x in s.gpus if x.utilization_gpu_pct == 0 and (x.power_w or 0) < 80]
    assert busy == [0, 1, 2, 3] and idle == [4, 5, 6, 7]


def test_profile_memory_leak() -> None:
    ss = series(scen([job("memory-leak")]), [0.0, 60.0, 120.0, 240.0, 500.0])
    mem = [g(s, 0).memory_used_mib or 0 for s in ss]
    assert mem == sorted(mem) and mem[1] - mem[0] == pytest.approx(12_000, rel=0.01)  # 200 MiB/s
    total = g(ss[-1], 0).memory_total_mib or 0
    assert total - 300 < mem[-1] < total  # grew up to the limit


def test_profile_low_tensor() -> None:
    s = at(scen([job("low-tensor")]), 5)
    for x in s.gpus:
        assert (x.utilization_gpu_pct or 0) >= 95 and (x.sm_occupancy_pct or 0) >= 35
        assert x.tensor_activity_pct is not None and x.tensor_activity_pct <= 5


def test_gpm_absent_before_hopper() -> None:
    s = at(scen([job("low-tensor")], cluster={"gpu_model": "A100-SXM4-80GB"}), 5)
    assert all(x.sm_occupancy_pct is None and x.tensor_activity_pct is None for x in s.gpus)
    first = series(scen([job("training")]), [3.0])[0]
    assert all(x.tensor_activity_pct is None for x in first.gpus)  # GPM needs two samples


# -- faults --------------------------------------------------------------------------------


def lines(sc: Scenario, t1: float = 100, node: str = NODE) -> list[str]:
    return KernelLogGenerator(sc, ScenarioClock(START), node).lines(-1, t1)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (13, "Graphics SM Warp Exception"),
        (31, "MMU Fault"),
        (48, "uncorrectable double bit error (DBE)"),
        (74, "NVLink: fatal error detected on link 7"),
        (79, "GPU has fallen off the bus."),
        (94, "Contained: SM"),
        (119, "Timeout after 6s of waiting for RPC response"),
        (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 7"),
        (154, "GPU recovery action changed"),
        (999, "Ch 00000008"),
    ],
)
def test_fault_xid(code: int, text: str) -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "xid", "node": NODE, "gpu": 2, "xid": code, "link": 7}])
    [line] = lines(sc)
    assert text in line and f"NVRM: Xid (PCI:{pci_of(2).rsplit('.', 1)[0]}): {code}, " in line
    ev = parse_kernel_log_line(line, NODE, START)
    assert ev is not None and ev.code == code and ev.ts == pytest.approx(START + 10)
    assert lines(sc, t1=9.5) == []


def test_fault_xid_without_gpu_hits_every_gpu() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "xid", "node": NODE, "xid": 13}])
    assert len(lines(sc)) == 8


def test_healthy_training_prints_no_kernel_line() -> None:
    assert lines(scen([job()])) == []


def test_fault_sxid() -> None:
    sc = scen([job()], [{"at_s": 5, "kind": "sxid", "node": NODE, "sxid": 20034, "link": 30}])
    [line] = lines(sc)
    assert "nvidia-nvswitch" in line and ": SXid (PCI:0000:0" in line and "20034, Fatal, Link 30" in line
    ev = parse_kernel_log_line(line, NODE, START)
    assert ev is not None and ev.kind is EventKind.SXID and ev.code == 20034


def test_fault_gpu_lost() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "gpu-lost", "node": NODE, "gpu": 4, "duration_s": 20}])
    fake = FakeNvml(sc, ScenarioClock(START), NODE)
    src = NvmlSource(fake, NODE, lambda: START + (fake.t or 0.0), collector_id="t")
    counts = []
    for t in (5.0, 10.0, 20.0, 30.0):
        fake.t = t
        counts.append([x.index for x in src.collect_sync().gpus])
    assert counts == [list(range(8)), [0, 1, 2, 3, 5, 6, 7], [0, 1, 2, 3, 5, 6, 7], list(range(8))]
    assert lines(sc) == []  # NVML only: no XID line


def test_fault_gpu_missing() -> None:
    sc = scen([job()], [{"at_s": 0, "kind": "gpu-missing", "node": NODE, "gpu": 3}])
    s = at(sc, 5)
    assert len(s.gpus) == 7  # count drops; NVML renumbers, the PCI bus ids show which is gone
    assert pci_of(3) not in {x.pci_bus_id for x in s.gpus} and g(s, 3).pci_bus_id == pci_of(4)


def test_fault_ecc_dbe() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "ecc-dbe", "node": NODE, "gpu": 1}])
    before, after = at(sc, 9), at(sc, 11)
    assert (
        g(before, 1).ecc_dbe_volatile == 0 and g(after, 1).ecc_dbe_volatile == 1 and g(after, 1).ecc_dbe_aggregate == 1
    )
    assert g(after, 1).remapped_rows_pending is True and g(after, 0).ecc_dbe_volatile == 0
    [line] = lines(sc)
    assert ": 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error" in line


def test_fault_ecc_sbe_storm() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "ecc-sbe-storm", "node": NODE, "gpu": 6}])
    ss = series(sc, [9.0, 12.0, 20.0])
    sbe = [g(s, 6).ecc_sbe_volatile for s in ss]
    assert sbe == [0, 100, 500] and g(ss[-1], 5).ecc_sbe_volatile == 0
    assert lines(sc) == []


def test_fault_row_remap_pending() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "row-remap-pending", "node": NODE, "gpu": 2}])
    x = g(at(sc, 12), 2)
    assert x.remapped_rows_pending is True and x.remapped_rows_failure is False and x.remapped_rows_uncorrectable == 1
    assert ": 63, " in lines(sc)[0] and "marked for remapping" in lines(sc)[0]


def test_fault_row_remap_failed() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "row-remap-failed", "node": NODE, "gpu": 2}])
    x = g(at(sc, 12), 2)
    assert x.remapped_rows_failure is True
    assert ": 64, " in lines(sc)[0] and "Failed to remap row" in lines(sc)[0]


def test_fault_retired_pages() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "retired-pages", "node": NODE, "gpu": 3}])
    s = at(sc, 12)
    x = g(s, 3)
    assert (x.retired_pages_sbe, x.retired_pages_dbe, x.retired_pages, x.retired_pages_pending) == (2, 1, 3, True)
    assert g(s, 2).retired_pages is None  # H100: page retirement not supported (row remapping)
    v100 = g(at(scen([job()], cluster={"gpu_model": "V100-SXM2-32GB"}), 12), 0)
    assert (v100.retired_pages, v100.retired_pages_pending) == (0, False)


def test_fault_nvlink_errors() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "nvlink-errors", "node": NODE, "gpu": 5, "link": 3}])
    a, b = series(sc, [10.0, 20.0])
    links = {d["link"]: d for d in g(b, 5).nvlinks or []}
    assert len(links) == 18 and links[3]["crc_flit_errors"] == 400 and links[3]["replay_errors"] == 120
    assert links[3]["crc_data_errors"] == 30 and links[3]["active"] is True
    assert all(d["crc_flit_errors"] == 0 for k, d in links.items() if k != 3)
    assert {d["link"]: d for d in g(a, 5).nvlinks or []}[3]["crc_flit_errors"] == 0  # climbing from 0


def test_fault_nvlink_down() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "nvlink-down", "node": NODE, "gpu": 5, "link": 2}])
    links = {d["link"]: d for d in g(at(sc, 12), 5).nvlinks or []}
    assert links[2]["active"] is False and all(d["active"] for k, d in links.items() if k != 2)
    whole = scen([job()], [{"at_s": 10, "kind": "nvlink-down", "node": NODE, "gpu": 5}])
    assert not any(d["active"] for d in g(at(whole, 12), 5).nvlinks or [])


def test_fault_pcie_degraded() -> None:
    x = g(at(scen([job()], [{"at_s": 0, "kind": "pcie-degraded", "node": NODE, "gpu": 6}]), 5), 6)
    assert (x.pcie_link_gen, x.pcie_link_gen_max, x.pcie_link_width, x.pcie_link_width_max) == (3, 5, 8, 16)


def test_fault_pcie_replays() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "pcie-replays", "node": NODE, "gpu": 6}])
    assert [g(s, 6).pcie_replay_count for s in series(sc, [5.0, 15.0, 25.0])] == [0, 100, 300]


def test_fault_thermal_throttle() -> None:
    sc = scen([job()], [{"at_s": 10, "kind": "thermal-throttle", "node": NODE, "gpu": 1, "duration_s": 60}])
    ss = series(sc, [9.0, 11.0, 20.0, 40.0, 80.0])
    hot = [g(s, 1) for s in ss[1:4]]
    assert all(x.throttle_reasons == ["sw_thermal_slowdown"] for x in hot)
    assert all(87 <= (x.temperature_c or 0) <= (x.temperature_slowdown_c or 0) for x in hot)
    clocks = [x.sm_clock_mhz or 0 for x in hot]
    assert clocks == sorted(clocks, reverse=True) and clocks[-1] < clocks[0] < 1500  # falling
    assert g(ss[0], 1).throttle_reasons == [] and g(ss[-1], 1).throttle_reasons == []


def test_fault_power_brake() -> None:
    x = g(at(scen([job()], [{"at_s": 0, "kind": "power-brake", "node": NODE, "gpu": 5}]), 4), 5)
    assert x.throttle_reasons == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert (x.sm_clock_mhz or 0) <= 810 and (x.power_w or 0) <= 320


def test_fault_power_cap() -> None:
    x = g(at(scen([job()], [{"at_s": 0, "kind": "power-cap", "node": NODE, "gpu": 5}]), 4), 5)
    assert x.throttle_reasons == ["sw_power_cap"] and (x.sm_clock_mhz or 0) <= 1410
    assert 690 <= (x.power_w or 0) <= (x.power_limit_w or 0) == 700


def test_fault_clocks_low() -> None:
    x = g(at(scen([job()], [{"at_s": 0, "kind": "clocks-low", "node": NODE, "gpu": 2, "factor": 0.5}]), 4), 2)
    assert x.sm_clock_mhz == 990 and x.throttle_reasons == [] and (x.utilization_gpu_pct or 0) >= 90


def test_fault_straggler_gpu() -> None:
    s = at(scen([job()], [{"at_s": 0, "kind": "straggler-gpu", "node": NODE, "gpu": 2, "factor": 2}]), 4)
    slow, peer = g(s, 2), g(s, 3)
    assert slow.sm_clock_mhz == 990 and (slow.utilization_gpu_pct or 0) < 0.6 * (peer.utilization_gpu_pct or 0)
    assert (slow.power_w or 0) < 0.6 * (peer.power_w or 0)


def test_fault_straggler_node() -> None:
    sc = scen([job(nodes="gpu-node-[001-002]")], [{"at_s": 0, "kind": "straggler-node", "node": NODE, "factor": 0.7}])
    slow, peer = at(sc, 4), at(sc, 4, "gpu-node-002")
    assert all(x.sm_clock_mhz == 1386 for x in slow.gpus) and all(x.sm_clock_mhz == 1980 for x in peer.gpus)
    mean = lambda s: statistics.mean(x.power_w or 0 for x in s.gpus)
    assert mean(slow) < 0.75 * mean(peer)


def test_fault_collective_hang() -> None:
    sc = scen(
        [job(nodes="gpu-node-[001-002]")],
        [{"at_s": 10, "kind": "collective-hang", "node": "gpu-node-002", "gpu": 0, "duration_s": 100}],
    )
    for node in ("gpu-node-001", "gpu-node-002"):  # every GPU of the job, on all its nodes
        s = at(sc, 20, node)
        assert all(x.utilization_gpu_pct == 100 and (x.power_w or 0) <= 125 for x in s.gpus)
        assert all(x.tensor_activity_pct == 0 and x.utilization_memory_pct == 0 for x in s.gpus)
    assert all((x.power_w or 0) > 250 for x in at(sc, 5).gpus)  # before: normal training


def test_fault_zombie_process() -> None:
    sc = scen([job(gpus=[0, 1], gpus_per_node=2)], [{"at_s": 10, "kind": "zombie-process", "node": NODE, "gpu": 6}])
    s = at(sc, 12)
    z = g(s, 6)
    assert z.utilization_gpu_pct == 0 and (z.memory_used_mib or 0) > 60_000
    assert z.processes and len(z.processes) == 1 and z.processes[0]["used_memory_mib"] > 59_000
    assert g(s, 7).processes == [] and g(at(sc, 9), 6).processes == []


async def test_fault_telemetry_silent() -> None:
    sc = scen([job()], [{"at_s": 2, "kind": "telemetry-silent", "node": NODE, "duration_s": 2}])
    src = SimulatedSource(sc, ScenarioClock(START), collector_id="t")
    per_tick = [[s.node for s in await src.collect()] for _ in range(6)]
    assert per_tick[1] == [NODE, "gpu-node-002"] and per_tick[2] == per_tick[3] == ["gpu-node-002"]
    assert per_tick[4] == [NODE, "gpu-node-002"]


def test_fault_health_check_fail() -> None:
    """Nothing in NVML telemetry or the kernel log: a failing health check is the health
    checker's own result (the health-check service reads the scenario for that)."""
    healthy = scen([job()])
    sc = scen([job()], [{"at_s": 0, "kind": "health-check-fail", "node": NODE}])
    assert at(sc, 5).model_dump() == at(healthy, 5).model_dump()
    assert lines(sc) == []


def test_deterministic_by_seed() -> None:
    a, b = at(scen([job("inference")]), 7), at(scen([job("inference")]), 7)
    c = at(scen([job("inference")], seed=4), 7)
    assert a.model_dump() == b.model_dump() and a.model_dump() != c.model_dump()


# -- static fields on change, GPM through NvmlSource ----------------------------------------


def test_driver_and_vbios_only_on_first_sample_refresh_and_reinit() -> None:
    fake = FakeNvml(scen([job()]), ScenarioClock(START), NODE)
    src = NvmlSource(fake, NODE, lambda: START + (fake.t or 0.0), collector_id="t", static_every_s=300)
    out = []
    for t in (0.0, 1.0, 2.0, 300.0, 301.0):
        fake.t = t
        out.append(src.collect_sync())
    assert [s.driver_version for s in out] == ["550.90.07", None, None, "550.90.07", None]
    assert [s.gpus[0].vbios_version for s in out] == ["96.00.74.00.01", None, None, "96.00.74.00.01", None]
    src._inited = False  # as after an NVML outage: the next tick re-initialises and re-sends
    fake.t = 302.0
    again = src.collect_sync()
    assert again.driver_version == "550.90.07" and all(x.vbios_version for x in again.gpus)


class NoGpmBinding(FakeNvml):
    """An nvidia-ml-py without the GPM calls (older than 12.535)."""

    nvmlGpmMetricsGet = None  # type: ignore[assignment]
    c_nvmlGpmMetricsGet_t = None  # type: ignore[assignment]


def test_gpm_absent_without_binding_support() -> None:
    sc = scen([job("training")])
    fake = NoGpmBinding(sc, ScenarioClock(START), NODE)
    src = NvmlSource(fake, NODE, lambda: START + (fake.t or 0.0), collector_id="t")
    for t in (1.0, 2.0, 3.0):
        fake.t = t
        s = src.collect_sync()
    assert all(x.tensor_activity_pct is None and x.sm_occupancy_pct is None for x in s.gpus)


def test_gpm_values_follow_the_interval() -> None:
    s = at(scen([job("training")]), 3)  # compute phase
    assert all(55 <= (x.tensor_activity_pct or 0) <= 75 and 45 <= (x.sm_occupancy_pct or 0) <= 65 for x in s.gpus)
