"""The simulator's raw signals: one test per job profile and per fault kind (docs/architecture.md#scenarios).

Each test reads the fake NVML through the real NvmlSource (or the kernel-log generator) and
asserts the raw telemetry / log line a real GPU would show - never a verdict.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pynvml
import pytest

from gpuwarden.collector.sources import NvmlSource
from gpuwarden.shared.fields import FIELDS
from gpuwarden.shared.models import EventKind, GpuSample, NodeSample
from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line
from gpuwarden.shared.scenario import FAULT_KINDS, PROFILES, Scenario, ScenarioClock
from gpuwarden.sim.collector import SimulatedSource, logger_gaps
from gpuwarden.sim.gpu_model import JobTiming, gpu_offsets, job_timing, pci_of
from gpuwarden.sim.health_check import simulated_health_check
from gpuwarden.sim.kernel_log import KernelLogGenerator
from gpuwarden.sim.nvml import REGISTRY_CALLS, FakeNvml

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


def timing(sc: Scenario, job_id: str = "1001") -> JobTiming:
    j = next(j for j in sc.jobs if str(j.id) == job_id)
    return job_timing(sc.seed, job_id, j.profile, j.start_s)


def _in(steady: float, phase: float, every: float, length: float) -> bool:
    return steady >= phase and (steady - phase) % every < length


def quiet(tm: JobTiming, steady: float) -> bool:
    """True when a training job is in a compute second (no checkpoint, eval pause or step edge)."""
    k = int(steady) % tm.step_s
    return (
        k != 0
        and k < tm.step_s - 2
        and not _in(steady, tm.ckpt_phase_s, tm.ckpt_every_s, tm.ckpt_len_s)
        and not _in(steady, tm.eval_phase_s, tm.eval_every_s, tm.eval_len_s)
    )


def compute_t(sc: Scenario, after: float = 0.0, job_id: str = "1001") -> float:
    """The first scenario second after ``after`` in the job's compute phase (past start-up)."""
    j = next(j for j in sc.jobs if str(j.id) == job_id)
    tm = timing(sc, job_id)
    t = int(max(after, j.start_s + tm.startup_s)) + 1
    while not quiet(tm, t - j.start_s - tm.startup_s):
        t += 1
    return float(t)


def quiet_seed(profile: str = "training", span: float = 60.0) -> int:
    """A seed whose job 1001 (start 0) has no checkpoint or eval pause in its first ``span`` s."""
    for seed in range(1, 500):
        tm = job_timing(seed, "1001", profile, 0)
        if min(tm.ckpt_phase_s, tm.eval_phase_s) > span:
            return seed
    raise AssertionError("no quiet seed")


# -- profiles ------------------------------------------------------------------------------


def test_every_profile_and_fault_kind_has_a_test() -> None:
    names = set(globals())
    for p in PROFILES:
        assert f"test_profile_{p.replace('-', '_')}" in names, p
    for k in FAULT_KINDS:
        assert f"test_fault_{k.replace('-', '_')}" in names, k


def test_profile_training() -> None:
    sc = scen([job("training")], seed=quiet_seed())
    ss = series(sc, [float(t) for t in range(0, 40)])
    util = [g(s, 0).utilization_gpu_pct for s in ss]
    power = [g(s, 0).power_w or 0 for s in ss]
    assert statistics.mean(u or 0 for u in util) >= 85 and statistics.mean(power) >= 500
    # step-periodic dips: util well below the compute plateau at regular intervals
    dips = [t for t, u in enumerate(util) if u < 80]  # type: ignore[operator]
    assert len(dips) >= 3 and len({b - a for a, b in itertools.pairwise(dips)}) == 1
    # NCCL phases: util stays high, power and tensor activity fall
    nccl = [s for s in ss[1:] if g(s, 0).utilization_gpu_pct >= 97 and g(s, 0).power_w < 500]  # type: ignore[operator]
    assert nccl and all(g(s, 0).tensor_activity_pct < 6 for s in nccl)  # type: ignore[operator]
    compute = [s for s in ss[1:] if g(s, 0).power_w >= 500]  # type: ignore[operator]
    assert compute and all(g(s, 0).tensor_activity_pct >= 55 for s in compute)  # type: ignore[operator]
    # all GPUs of the job are in the same phase (synchronous steps)
    assert all(len({(g(s, i).tensor_activity_pct or 0) >= 50 for i in range(8)}) == 1 for s in ss[1:])
    assert all(g(s, 0).processes and g(s, 0).processes[0]["used_memory_mib"] > 60_000 for s in ss)  # type: ignore[index]


def test_profile_inference() -> None:
    """Really bursty serving (a100-swing recordings): busy 3-15 % of the time, idle at 60-80 W."""
    ss = series(scen([job("inference")], duration_s=1800), [float(t) for t in range(0, 1800)])
    util = [g(s, 2).utilization_gpu_pct or 0.0 for s in ss]
    busy = [u > 50 for u in util]
    assert 0.03 <= sum(busy) / len(busy) <= 0.15
    bursts = [len(list(run)) for on, run in itertools.groupby(busy) if on]
    assert len(bursts) >= 5 and min(bursts) <= 8 and max(bursts) >= 10  # a few s to tens of s
    idle_power = [g(s, 2).power_w or 0 for s, b in zip(ss, busy, strict=True) if not b]
    assert 55 <= statistics.median(idle_power) <= 85
    assert max(g(s, 2).power_w or 0 for s in ss) > 300
    # the GPUs of the job serve together; the model stays loaded and its process stays
    assert all(len({(x.utilization_gpu_pct or 0) > 50 for x in s.gpus}) == 1 for s in ss)
    assert all(40 * 1024 - 600 <= (g(s, 2).memory_used_mib or 0) <= 40 * 1024 + 600 for s in ss)
    assert all(g(s, 2).processes for s in ss)


def test_profile_comm_bound() -> None:
    """gloo-like data parallel (titanx2 gloo recording): ~25-30 % util, periodic, low power."""
    sc = scen([job("comm-bound")])
    ss = series(sc, [float(t) for t in range(0, 120)])
    util = [g(s, 1).utilization_gpu_pct or 0.0 for s in ss]
    assert 18 <= statistics.mean(util) <= 35
    period = timing(sc).comm_period_s
    peaks = [t for t, u in enumerate(util) if u >= 80]
    assert peaks and {b - a for a, b in itertools.pairwise(peaks)} == {period}
    assert statistics.mean(g(s, 1).power_w or 0 for s in ss) < 260


def test_profile_input_bound() -> None:
    ss = series(scen([job("input-bound")]), [float(t) for t in range(0, 20)])
    util = [g(s, 1).utilization_gpu_pct or 0.0 for s in ss]
    assert all(15 <= u <= 40 for u in util)  # low duty cycle: the GPU waits for data
    assert all((g(s, 1).power_w or 0) < 350 for s in ss)
    assert statistics.mean(g(s, 1).pcie_rx_kbps or 0 for s in ss) > 30_000  # busy input pipeline


def checkpoint_seconds(ss: list[NodeSample], writer: int) -> list[bool]:
    """Per sample: the real checkpoint signature (h100x8-llama3-8b-ckpt): the writer below 30 %
    util while every other GPU sits >= 90 % util at < 250 W (spinning in a collective)."""
    out = []
    for s in ss:
        others = [x for x in s.gpus if x.index != writer]
        out.append(
            (g(s, writer).utilization_gpu_pct or 0) < 30
            and all((x.utilization_gpu_pct or 0) >= 90 and (x.power_w or 0) < 250 for x in others)
        )
    return out


def test_profile_checkpoint_heavy() -> None:
    sc = scen([job("checkpoint-heavy")])
    ss = series(sc, [float(t) for t in range(0, 600)])
    ck = checkpoint_seconds(ss, 0)
    episodes = [len(list(run)) for on, run in itertools.groupby(ck) if on]
    assert len(episodes) >= 4 and 0.15 <= sum(ck) / len(ck) <= 0.5
    assert all(10 <= e <= 46 for e in episodes)
    during = [s for s, c in zip(ss, ck, strict=True) if c]
    assert all((x.memory_used_mib or 0) > 60_000 and x.processes for s in during for x in s.gpus)  # memory kept
    assert all((g(s, 0).power_w or 0) < 200 for s in during)


def test_training_checkpoints_are_rare_and_eval_pauses_hit_every_gpu() -> None:
    sc = scen([job("training")], duration_s=3000, seed=5)
    tm = timing(sc)
    ss = series(sc, [float(t) for t in range(0, 1500)])
    ck = checkpoint_seconds(ss, 0)
    episodes = [len(list(run)) for on, run in itertools.groupby(ck) if on]
    assert 1 <= len(episodes) <= 4 and sum(ck) / len(ck) < 0.1  # 10-30 s every 7-12 min
    assert tm.ckpt_per_node or not any(
        checkpoint_seconds(series(sc, [float(t) for t in range(0, 1500)], "gpu-node-002"), 0)
    )
    low = [all((x.utilization_gpu_pct or 0) < 20 for x in s.gpus) for s in ss]
    pauses = [len(list(run)) for on, run in itertools.groupby(low) if on]
    assert pauses and all(p <= 31 for p in pauses) and max(pauses) >= 10


def test_startup_phase() -> None:
    """A job starting after second 0 loads its model first (h100x8-llama3-8b-ckpt: ~115 s)."""
    sc = scen([job("training", start_s=50)])
    tm = timing(sc)
    assert 60 <= tm.startup_s <= 240
    end = 50 + tm.startup_s
    ss = series(sc, [float(t) for t in range(50, int(end))])
    for s in ss:
        assert all((x.utilization_gpu_pct or 0) <= 5 and 55 <= (x.power_w or 0) <= 140 for x in s.gpus)
    mem = [g(s, 0).memory_used_mib or 0 for s in ss]
    assert mem[0] < 1024 and mem == sorted(mem) and mem[-1] > 60_000  # ramps to the working set
    after = at(sc, compute_t(sc, end))
    assert all((x.utilization_gpu_pct or 0) >= 90 for x in after.gpus)
    assert timing(scen([job("training")])).startup_s == 0  # already running when the scenario began


def test_healthy_gpus_differ_stably() -> None:
    """Per-GPU offsets: power within +/-12 % of the profile's, a 5-22 % spread, busy SM
    clocks 1700-1980 MHz and not constant, temperatures apart, counters non-zero but constant."""
    sc = scen([job("training")], seed=quiet_seed(span=200))
    ts = [float(t) for t in range(0, 200)]
    ss = series(sc, ts)
    tm = timing(sc)
    compute = [s for s, t in zip(ss, ts, strict=True) if quiet(tm, t)]
    power = [statistics.mean(g(s, i).power_w or 0 for s in compute) for i in range(8)]
    med = statistics.median(power)
    assert all(0.88 <= p / 595 <= 1.12 for p in power) and 0.05 <= (max(power) - min(power)) / med <= 0.22
    assert max(g(s, i).power_w or 0 for s in ss for i in range(8)) < 700  # never at the limit
    clocks = [g(s, 2).sm_clock_mhz or 0 for s in compute]
    assert len(set(clocks)) > 5 and all(1700 <= c <= 1980 for c in clocks) and statistics.mean(clocks) < 1980
    assert statistics.pstdev(statistics.mean(g(s, i).temperature_c or 0 for s in compute) for i in range(8)) >= 1
    off = gpu_offsets(sc.seed, NODE, 8)
    for i in range(8):  # counters a GPU already carries: constant, so healthy
        assert {g(s, i).ecc_sbe_volatile for s in ss} == {off.sbe[i]}
        assert {g(s, i).pcie_replay_count for s in ss} == {off.pcie_replays[i]}
    seeds = range(1, 40)
    assert any(any(gpu_offsets(x, NODE, 8).sbe) for x in seeds) and any(gpu_offsets(x, NODE, 8).hot for x in seeds)


def test_hot_gpu() -> None:
    seed = next(x for x in range(1, 100) if gpu_offsets(x, NODE, 8).hot is not None)
    hot = gpu_offsets(seed, NODE, 8).hot
    sc = scen([job("training")], seed=seed)
    s = at(sc, compute_t(sc, 5))
    temps = sorted((x.temperature_c or 0, x.index) for x in s.gpus)
    assert temps[-1][1] == hot and temps[-1][0] - statistics.median(t for t, _ in temps) >= 8
    assert g(s, hot or 0).throttle_reasons == []  # hot but healthy


def test_staggered_job_end() -> None:
    jid = next(j for j in range(1001, 2000) if job_timing(3, str(j), "training", 0).stagger_s >= 40)
    tm = job_timing(3, str(jid), "training", 0)
    sc = scen([job("training", id=jid, end_s=400)])
    s = at(sc, 400 - tm.stagger_s + 2)
    assert all(x.utilization_gpu_pct == 0 and not x.processes for x in s.gpus if x.index >= 4)
    assert any((x.utilization_gpu_pct or 0) > 0 for x in s.gpus if x.index < 4)


def test_profile_idle() -> None:
    s = at(scen([job("idle")]), 30)
    for x in s.gpus:
        assert x.utilization_gpu_pct == 0 and 55 <= (x.power_w or 0) <= 90 and x.sm_clock_mhz == 345
        assert x.throttle_reasons == ["gpu_idle"] and x.processes == [] and (x.memory_used_mib or 0) < 1024


def test_profile_partial_idle() -> None:
    sc = scen([job("partial-idle")])
    s = at(sc, compute_t(sc, 4))
    busy = [x.index for x in s.gpus if (x.utilization_gpu_pct or 0) > 50]
    idle = [x.index for x in s.gpus if x.utilization_gpu_pct == 0 and (x.power_w or 0) < 90]
    assert busy == [0, 1, 2, 3] and idle == [4, 5, 6, 7]


def test_profile_memory_leak() -> None:
    ss = series(scen([job("memory-leak")]), [0.0, 60.0, 120.0, 240.0, 3600.0])
    mem = [g(s, 0).memory_used_mib or 0 for s in ss]
    assert mem == sorted(mem) and mem[1] - mem[0] == pytest.approx(900, rel=0.01)  # 15 MiB/s, 900 MiB/min
    total = g(ss[-1], 0).memory_total_mib or 0
    assert total - 300 < mem[-1] < total  # grew up to the limit within the hour


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
    base = gpu_offsets(sc.seed, NODE, 8).sbe
    sbe = [(g(s, 6).ecc_sbe_volatile or 0) - base[6] for s in ss]
    assert sbe == [0, 100, 500] and g(ss[-1], 5).ecc_sbe_volatile == base[5]
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
    base = gpu_offsets(sc.seed, NODE, 8).pcie_replays[6]
    assert [(g(s, 6).pcie_replay_count or 0) - base for s in series(sc, [5.0, 15.0, 25.0])] == [0, 100, 300]


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
    sc = scen([job()], [{"at_s": 0, "kind": "power-cap", "node": NODE, "gpu": 5, "factor": 0.8}])
    s = at(sc, compute_t(sc, 4))
    assert (g(s, 5).sm_clock_mhz or 0) <= 0.8 * 1980 + 1 and (g(s, 5).sm_clock_mhz or 0) >= 0.8 * 1700


def test_fault_clocks_low() -> None:
    sc = scen([job()], [{"at_s": 0, "kind": "clocks-low", "node": NODE, "gpu": 2, "factor": 0.5}])
    s = at(sc, compute_t(sc, 4))
    x = g(s, 2)
    assert 850 <= (x.sm_clock_mhz or 0) <= 990 and x.throttle_reasons == [] and (x.utilization_gpu_pct or 0) >= 90
    assert all((x.sm_clock_mhz or 0) >= 1700 for x in s.gpus if x.index != 2)


def test_fault_straggler_gpu() -> None:
    sc = scen([job()], [{"at_s": 0, "kind": "straggler-gpu", "node": NODE, "gpu": 2, "factor": 2}])
    s = at(sc, compute_t(sc, 4))
    slow = g(s, 2)
    peers = statistics.median(x.sm_clock_mhz or 0 for x in s.gpus)
    assert (slow.sm_clock_mhz or 0) <= 0.55 * peers  # well under the rule's 0.85 x the job median
    assert (slow.utilization_gpu_pct or 0) < 0.6 * statistics.median(x.utilization_gpu_pct or 0 for x in s.gpus)


def test_fault_straggler_node() -> None:
    sc = scen([job(nodes="gpu-node-[001-002]")], [{"at_s": 0, "kind": "straggler-node", "node": NODE, "factor": 0.7}])
    t = compute_t(sc, 4)
    slow, peer = at(sc, t), at(sc, t, "gpu-node-002")
    assert max(x.sm_clock_mhz or 0 for x in slow.gpus) <= 0.7 * 1980 + 1
    assert min(x.sm_clock_mhz or 0 for x in peer.gpus) >= 1700
    mean = lambda s: statistics.mean(x.power_w or 0 for x in s.gpus)
    assert mean(slow) < 0.8 * mean(peer)


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


async def test_fault_health_check_fail() -> None:
    """Nothing in NVML telemetry or the kernel log: the node's fake dcgmi diag fails, and the
    real health checks (run on the node's simulated inputs) report it."""
    healthy = scen([job()])
    sc = scen([job()], [{"at_s": 10, "kind": "health-check-fail", "node": NODE, "gpu": 3}])
    assert at(sc, 15).model_dump() == at(healthy, 15).model_dump()
    assert lines(sc) == []
    clock = ScenarioClock(START)
    res = await simulated_health_check(sc, clock, NODE, 10.0)
    failed = [r for r in res if not r.passed]
    assert [(r.check, r.gpu_index, r.phase) for r in failed] == [("dcgm", 3, "periodic")]
    assert failed[0].detail.startswith("CRITICAL: dcgmi diag fail: GPU Memory") and failed[0].ts == START + 10
    assert {r.check for r in res} >= {"gpu-count", "nvml", "ecc", "xid", "dcgm"}
    assert all(r.passed for r in await simulated_health_check(sc, clock, "gpu-node-002", 10.0))
    assert all(r.passed for r in await simulated_health_check(sc, clock, NODE, 5.0))  # before the fault
    with pytest.raises(ValueError, match="not in scenario"):
        await simulated_health_check(sc, clock, "gpu-node-009", 10.0)


def test_deterministic_by_seed() -> None:
    a, b = at(scen([job("inference")]), 7), at(scen([job("inference")]), 7)
    c = at(scen([job("inference")], seed=4), 7)
    assert a.model_dump() == b.model_dump() and a.model_dump() != c.model_dump()
    ts = [float(t) for t in range(0, 300, 7)]
    run = lambda seed: [s.model_dump() for s in series(scen([job("training", start_s=20)], seed=seed), ts)]
    assert run(8) == run(8) and run(8) != run(9)
    assert logger_gaps(8, NODE, 600) == logger_gaps(8, NODE, 600)


async def test_logger_gaps() -> None:
    """Some nodes' collectors skip ticks (rtx4090 recording: gaps up to 7 s every ~35 s): 1-7 s
    every 30-60 s, never near telemetry-silent's 30 s."""
    seed = next(x for x in range(1, 50) if logger_gaps(x, NODE, 600) and not logger_gaps(x, "gpu-node-002", 600))
    sc = scen([job()], seed=seed)
    src = SimulatedSource(sc, ScenarioClock(START), collector_id="t")
    seen: dict[str, list[float]] = {NODE: [], "gpu-node-002": []}
    for _ in range(601):
        for s in await src.collect():
            seen[s.node].append(s.ts - START)
    assert len(seen["gpu-node-002"]) == 601
    gaps = [b - a - 1 for a, b in itertools.pairwise(seen[NODE]) if b - a > 1]
    assert 8 <= len(gaps) <= 20 and min(gaps) >= 1 and max(gaps) <= 7
    assert all(b - a >= 30 for a, b in itertools.pairwise(x for x, _ in logger_gaps(seed, NODE, 600)))


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


def test_the_fake_nvml_answers_every_call_of_the_field_registry() -> None:
    """Each NVML function of fields.csv is modelled or answers NOT_SUPPORTED (a new row's call does
    until the fake models it), so the simulated collector reads every row as a real node would."""
    fake = FakeNvml(scen(jobs=[job()]), ScenarioClock(START), NODE)
    fake.t = 10.0
    h = fake.nvmlDeviceGetHandleByIndex(0)
    unmodelled = {c for c in REGISTRY_CALLS if (vars(FakeNvml)[c].__doc__ or "").startswith("A registry call")}
    assert "nvmlDeviceGetMigDeviceHandleByIndex" in unmodelled  # MIG is off on every simulated GPU
    for c in REGISTRY_CALLS:
        assert callable(getattr(fake, c)), c
    for c in unmodelled:
        with pytest.raises(pynvml.NVMLError) as exc:
            getattr(fake, c)(h, 0)
        assert exc.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert not hasattr(fake, "nvmlDeviceGetNoSuchCall")  # only the registry's calls
    # every scalar row the fake models reaches the simulated sample; a row whose call it does not
    # model (a field just added to fields.csv) or without an NVML call is absent, as on a real GPU
    # without the feature
    gpu = at(scen(jobs=[job()]), 10.0).gpus[0]
    absent = {f for f, v in gpu.model_dump().items() if v is None}
    not_read = {f.field for f in FIELDS if f.nvml_read is None or f.nvml_read.call in unmodelled}
    expected = {
        "fan_speed_pct",  # SXM: no fan of its own (NOT_SUPPORTED)
        "memory_reserved_mib",  # nvmlMemory_t (v1) has no reserved
        "retired_pages", "retired_pages_dbe", "retired_pages_pending", "retired_pages_sbe",  # HBM: rows remap
        "vbios_version",  # sent on a GPU's first sample only
    }  # fmt: skip
    assert absent - not_read == expected
