"""Condition rules of the shipped catalog: each must fire on its signal and stay quiet on a
healthy fleet and on near misses (shorter than ``for_s``), in event time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from factories import healthy_gpu as healthy
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    EventKind,
    Failure,
    FailureState,
    GpuAttribution,
    GpuEvent,
    GpuSample,
    HealthCheckResult,
    JobState,
    JobWindow,
    NodeSample,
)

T0 = 1_700_000_000.0
JOB = GpuAttribution(gpu_index=0, job_id="77", user="alice", partition="gpu", job_start_ts=T0 - 600, job_gpus=16)


def run(
    mutate: Callable[[int, float], dict[str, Any]] | None,
    seconds: int,
    *,
    gpus: int = 8,
    jobbed: bool = True,
    node: str = "gpu-node-001",
) -> list[Failure]:
    """Feed ``seconds`` 1-Hz samples of one node; ``mutate(gpu, t)`` changes GPU 0..n fields."""
    d = Detector(load_catalog())
    out: list[Failure] = []
    for s in range(seconds):
        ts = T0 + s
        gs = [healthy(i, **(mutate(i, s) if mutate else {})) for i in range(gpus)]
        gs = [g for g in gs if g.index >= 0]
        jobs = [JOB.model_copy(update={"gpu_index": i}) for i in range(gpus)] if jobbed else []
        sample = NodeSample(node=node, ts=ts, collector_id="t", source="test", gpus=gs)
        out += d.on_sample(AttributedSample(sample=sample, jobs=jobs))
    return out + d.flush()  # the end of a finite stream: the pending stage decides what it holds


def patterns(fs: list[Failure]) -> set[str]:
    return {f.pattern for f in fs if f.state is FailureState.OPEN}


def on_gpu3(fields: dict[str, Any], start: int = 10) -> Callable[[int, float], dict[str, Any]]:
    return lambda i, t: fields if i == 3 and t >= start else {}


GPU_CASES = {
    "thermal-throttle": (
        on_gpu3({"throttle_reasons": ["sw_thermal_slowdown"], "temperature_c": 88.0, "sm_clock_mhz": 1500.0}),
        30,
    ),
    "power-brake": (on_gpu3({"throttle_reasons": ["hw_power_brake_slowdown"], "sm_clock_mhz": 600.0}), 20),
    "power-cap-throttle": (on_gpu3({"throttle_reasons": ["sw_power_cap"], "sm_clock_mhz": 1100.0}), 120),
    "clocks-low": (on_gpu3({"sm_clock_mhz": 900.0}), 60),
    "row-remap-pending": (on_gpu3({"remapped_rows_pending": True}), 0),
    "row-remap-failure": (on_gpu3({"remapped_rows_failure": True}), 0),
    "retired-pages": (on_gpu3({"retired_pages_pending": True}), 0),
    "pcie-link-degraded": (on_gpu3({"pcie_link_width": 8}), 60),
    "nvlink-link-down": (on_gpu3({"nvlinks": [{"link": i, "active": i != 4} for i in range(18)]}), 10),
}


@pytest.mark.parametrize("pattern", sorted(GPU_CASES))
def test_gpu_condition_fires_after_for_s_and_not_before(pattern: str) -> None:
    mutate, for_s = GPU_CASES[pattern]
    fired = run(mutate, 10 + for_s + 1)
    assert pattern in patterns(fired), patterns(fired)
    f = next(f for f in fired if f.pattern == pattern)
    assert (f.node, f.gpu_index, f.job_id) == ("gpu-node-001", 3, "77")
    # first_seen is the detection time: the onset (10 s) plus the rule's for_s; the evidence
    # starts at the onset
    assert f.first_seen == T0 + 10 + for_s and f.evidence[0].ts == T0 + 10 and f.verdict
    if for_s:
        assert pattern not in patterns(run(mutate, 10 + for_s - 2))  # a near miss stays quiet


COUNTER_CASES = {
    "uncorrectable-ecc": lambda i, t: {"ecc_dbe_volatile": 1} if i == 3 and t >= 10 else {},
    "correctable-ecc-storm": lambda i, t: {"ecc_sbe_volatile": max(0, t - 10)} if i == 3 else {},  # 60/min
    "pcie-replay-storm": lambda i, t: {"pcie_replay_count": max(0, (t - 10) * 5)} if i == 3 else {},  # 300/min
    "nvlink-error": lambda i, t: (
        {"nvlinks": [{"link": 0, "active": True, "crc_flit_errors": max(0, t - 10)}]} if i == 3 else {}
    ),
}


@pytest.mark.parametrize("pattern", sorted(COUNTER_CASES))
def test_counter_rate_conditions(pattern: str) -> None:
    fired = run(COUNTER_CASES[pattern], 90)
    assert pattern in patterns(fired) and all(f.gpu_index == 3 for f in fired if f.pattern == pattern)


def test_a_slowly_rising_counter_is_not_a_storm() -> None:
    slow = lambda i, t: {"ecc_sbe_volatile": t // 20, "pcie_replay_count": t // 10} if i == 3 else {}
    assert not patterns(run(slow, 200))


def test_healthy_fleet_for_ten_minutes_raises_nothing() -> None:
    """The negative case for every GPU and node condition at once, with realistic jitter."""
    jitter = lambda i, t: {
        "utilization_gpu_pct": 90.0 + (t * 7 + i) % 10,
        "power_w": 600.0 + (t + i) % 80,
        "throttle_reasons": ["sw_power_cap"] if t % 50 < 5 else [],
        "pcie_link_gen": 5 if t % 60 else 4,
    }  # gen dips briefly
    assert run(jitter, 600) == []


def test_idle_gpus_at_low_pcie_gen_without_job_are_not_degraded() -> None:
    idle = lambda i, t: {
        "utilization_gpu_pct": 0.0,
        "power_w": 70.0,
        "sm_clock_mhz": 345.0,
        "pcie_link_gen": 1,
        "memory_used_mib": 0.0,
        "processes": [],
    }
    assert run(idle, 300, jobbed=False) == []


def test_zombie_process_on_a_gpu_without_job() -> None:
    zombie = lambda i, t: (
        {"utilization_gpu_pct": 0.0, "memory_used_mib": 0.0, "processes": []}
        if i != 3
        else {
            "utilization_gpu_pct": 0.0,
            "memory_used_mib": 9000.0,
        }
    )
    fired = run(zombie, 90, jobbed=False)
    assert patterns(fired) == {"zombie-process"} and fired[0].gpu_index == 3 and fired[0].job_id is None


def test_gpu_missing_when_a_gpu_drops_out_and_resolves_when_it_returns() -> None:
    d = Detector(load_catalog())
    out: list[Failure] = []
    for s in range(150):
        n = 7 if 20 <= s < 60 else 8
        sample = NodeSample(node="n1", ts=T0 + s, collector_id="t", source="test", gpus=[healthy(i) for i in range(n)])
        jobs = [JOB.model_copy(update={"gpu_index": i}) for i in range(n)]
        out += d.on_sample(AttributedSample(sample=sample, jobs=jobs))
    states = [(f.pattern, f.state) for f in out]
    assert states == [("gpu-missing", FailureState.OPEN), ("gpu-missing", FailureState.RESOLVED)]
    opened = next(f for f in out if f.state is FailureState.OPEN)
    resolved = next(f for f in out if f.state is FailureState.RESOLVED)
    assert opened.failure_id == resolved.failure_id and opened.first_seen == T0 + 20 + 10  # onset + for_s


def test_telemetry_silent_node_while_others_report() -> None:
    d = Detector(load_catalog())
    out: list[Failure] = []
    for s in range(100):
        for node in ("a", "b", "c"):
            if node == "b" and 20 <= s < 80:
                continue
            sample = NodeSample(node=node, ts=T0 + s, collector_id="t", source="test", gpus=[healthy(0)])
            out += d.on_sample(AttributedSample(sample=sample, jobs=[JOB]))
    silent = [f for f in out if f.pattern == "telemetry-silent"]
    assert {f.node for f in silent} == {"b"}
    assert silent[0].state is FailureState.OPEN and silent[-1].state is FailureState.RESOLVED


def test_health_check_failure_and_pass() -> None:
    d = Detector(load_catalog())
    ok = HealthCheckResult(node="n1", ts=T0, phase="prolog", check="ecc", passed=True, job_id="5")
    assert d.on_health(ok) == []
    [f] = d.on_health(
        ok.model_copy(update={"passed": False, "detail": "CRITICAL: GPU 2 uncorrectable ECC", "gpu_index": 2})
    )
    assert (f.pattern, f.node, f.gpu_index, f.job_id) == ("health-check-failed", "n1", 2, "5")


# -- job scope ---------------------------------------------------------------------------------
def windows(
    job_gpus: dict[str, int],
    start: float,
    per_gpu: Callable[[str, int, int], dict[str, Any]],
    k: int,
    job_id: str = "88",
) -> list[JobWindow]:
    out = []
    total = sum(job_gpus.values())
    for node, n in job_gpus.items():
        for g in range(n):
            base: dict[str, Any] = dict(
                job_id=job_id,
                node=node,
                gpu_index=g,
                user="bob",
                partition="gpu",
                job_gpus=total,
                window_start=start,
                window_end=start + 10,
                samples=10,
                utilization_gpu_pct_mean=95.0,
                utilization_gpu_pct_min=90.0,
                utilization_gpu_pct_max=99.0,
                power_w_mean=650.0,
                power_limit_w=700.0,
                sm_clock_mhz_mean=1980.0,
                max_sm_clock_mhz=1980.0,
                memory_used_mib_first=60_000.0,
                memory_used_mib_last=60_000.0,
                memory_used_mib_max=60_000.0,
                memory_total_mib=81_559.0,
                temperature_c_max=70.0,
                tensor_activity_pct_mean=45.0,
            )
            base.update(per_gpu(node, g, k))
            out.append(JobWindow(**base))
    return out


def run_windows(
    per_gpu: Callable[[str, int, int], dict[str, Any]], count: int, job_gpus: dict[str, int] | None = None
) -> list[Failure]:
    d = Detector(load_catalog())
    out: list[Failure] = []
    for k in range(count):
        for w in windows(job_gpus or {"n1": 4, "n2": 4}, T0 + 10 * k, per_gpu, k):
            out += d.on_window(w)
    return out + d.flush()


JOB_CASES: dict[str, Callable[[str, int, int], dict[str, Any]]] = {
    "idle-allocation": lambda n, g, k: {
        "utilization_gpu_pct_mean": 0.0,
        "utilization_gpu_pct_min": 0.0,
        "utilization_gpu_pct_max": 1.0,
        "power_w_mean": 70.0,
    },
    "partial-idle-allocation": lambda n, g, k: (
        {
            "utilization_gpu_pct_mean": 0.0,
            "utilization_gpu_pct_min": 0.0,
            "utilization_gpu_pct_max": 2.0,
            "power_w_mean": 70.0,
        }
        if (n, g) == ("n2", 1)
        else {}
    ),
    "straggler-gpu": lambda n, g, k: (
        {"sm_clock_mhz_mean": 1400.0, "power_w_mean": 480.0} if (n, g) == ("n1", 2) else {}
    ),
    "straggler-node": lambda n, g, k: {"sm_clock_mhz_mean": 1450.0, "power_w_mean": 470.0} if n == "n2" else {},
    "input-starvation": lambda n, g, k: {"utilization_gpu_pct_mean": 22.0, "utilization_gpu_pct_min": 0.0},
    "collective-hang": lambda n, g, k: {
        "utilization_gpu_pct_mean": 100.0,
        "utilization_gpu_pct_min": 100.0,
        "power_w_mean": 110.0,
    },
    "gpu-memory-leak": lambda n, g, k: (
        {"memory_used_mib_max": 40_000.0 + 300 * (k + 1) + (k % 3) * 50}  # +1800 MiB/min, steady
        if (n, g) == ("n1", 0)
        else {"memory_used_mib_max": 60_000.0 + ((k * 7 + g) % 5) * 400}  # noisy but flat: no leak
    ),
    "low-tensor-activity": lambda n, g, k: {"tensor_activity_pct_mean": 2.0},
    # every 6th and 7th window of 10: rank 0 writes the checkpoint while the other GPUs spin in a collective
    "checkpoint-stall": lambda n, g, k: (
        (
            {"utilization_gpu_pct_mean": 12.0, "power_w_mean": 160.0}
            if (n, g) == ("n1", 0)
            else {"utilization_gpu_pct_mean": 100.0, "utilization_gpu_pct_max": 100.0, "power_w_mean": 150.0}
        )
        if k % 10 in (6, 7)
        else {}
    ),
}


@pytest.mark.parametrize("pattern", sorted(JOB_CASES))
def test_job_condition_fires(pattern: str) -> None:
    fired = run_windows(JOB_CASES[pattern], 100)  # 1000 s: past the start-up grace and the longest for_s
    assert pattern in patterns(fired), patterns(fired)
    f = next(f for f in fired if f.pattern == pattern)
    assert f.job_id == "88" and f.user == "bob" and f.verdict and f.evidence


@pytest.mark.parametrize("pattern", sorted(JOB_CASES))
def test_job_condition_quiet_before_for_s(pattern: str) -> None:
    # checkpoint-stall needs 3 windows to see a period; the others a for_s above 30 s
    fired = run_windows(JOB_CASES[pattern], 2 if pattern == "checkpoint-stall" else 3)
    assert pattern not in patterns(fired)


def test_healthy_job_raises_nothing_over_an_hour_of_windows() -> None:
    wobble = lambda n, g, k: {
        "utilization_gpu_pct_mean": 90.0 + (k + g) % 8,
        "power_w_mean": 620.0 + (k * 3 + g) % 60,
        "sm_clock_mhz_mean": 1900.0 + (k + g) % 80,
    }
    assert run_windows(wobble, 360) == []


def test_job_conditions_resolve_when_the_job_ends() -> None:
    d = Detector(load_catalog())
    out: list[Failure] = []
    for k in range(70):  # past the 300 s start-up grace and the 300 s for_s
        for w in windows({"n1": 4, "n2": 4}, T0 + 10 * k, JOB_CASES["idle-allocation"], k):
            out += d.on_window(w)
    opened = [f for f in out if f.pattern == "idle-allocation"]
    assert opened and opened[0].state is FailureState.OPEN
    ended = d.on_job(JobState(job_id="88", ts=T0 + 700, state="COMPLETED", nodes=["n1", "n2"], end_ts=T0 + 700))
    [res] = [f for f in ended if f.pattern == "idle-allocation"]
    assert res.state is FailureState.RESOLVED and res.failure_id == opened[0].failure_id


def test_every_condition_pattern_is_exercised_here() -> None:
    tested = (
        set(GPU_CASES)
        | set(COUNTER_CASES)
        | set(JOB_CASES)
        | {"zombie-process", "gpu-missing", "telemetry-silent", "health-check-failed"}
    )
    assert {c.pattern for c in load_catalog().conditions} == tested


def test_a_lagging_partition_does_not_make_its_nodes_look_silent() -> None:
    """Node b's partition is read 60 s behind node a's: b is late, not silent."""
    d = Detector(load_catalog())
    out: list[Failure] = []
    for s in range(100):
        a = NodeSample(node="a", ts=T0 + s + 60, collector_id="t", source="test", gpus=[healthy(0)])
        b = NodeSample(node="b", ts=T0 + s, collector_id="t", source="test", gpus=[healthy(0)])
        out += d.on_sample(AttributedSample(sample=a, jobs=[JOB]), partition=0)
        out += d.on_sample(AttributedSample(sample=b, jobs=[JOB]), partition=1)
    assert out == []


def test_nodes_of_an_idle_partition_still_become_silent() -> None:
    d = Detector(load_catalog())
    out: list[Failure] = []
    for s in range(400):
        a = NodeSample(node="a", ts=T0 + s, collector_id="t", source="test", gpus=[healthy(0)])
        out += d.on_sample(AttributedSample(sample=a, jobs=[JOB]), partition=0)
        if s < 20:  # b's partition carries nothing after 20 s
            b = NodeSample(node="b", ts=T0 + s, collector_id="t", source="test", gpus=[healthy(0)])
            out += d.on_sample(AttributedSample(sample=b, jobs=[JOB]), partition=1)
    assert {(f.pattern, f.node) for f in out} == {("telemetry-silent", "b")}


# -- real-GPU behaviour: near misses that look alarming ------------------------------------------
def test_a_gpu_at_its_power_limit_is_power_capped_not_slow() -> None:
    """A recording without throttle reasons: 348 W of a 350 W cap at 825 of 1755 MHz (H100 PCIe GEMM)."""
    capped = lambda i, t: {
        "power_w": 348.0,
        "power_limit_w": 350.0,
        "sm_clock_mhz": 825.0,
        "max_sm_clock_mhz": 1755.0,
        "throttle_reasons": [],
    }
    fired = patterns(run(capped, 200))
    assert "power-cap-throttle" in fired and not fired & {"clocks-low", "thermal-throttle", "power-brake"}


def test_busy_gpus_below_their_power_limit_at_low_clocks_are_still_clocks_low() -> None:
    slow = lambda i, t: {"sm_clock_mhz": 900.0, "power_w": 420.0} if i == 3 and t >= 10 else {}
    assert "clocks-low" in patterns(run(slow, 90))


def test_per_gpu_power_spread_of_real_gpus_is_no_straggler() -> None:
    """Real GPUs of one job differ 10-20 % in power; without clocks that alone is no straggler."""
    spread = lambda n, g, k: {"sm_clock_mhz_mean": None, "power_w_mean": 520.0 + 25 * g + (k * 7 + g) % 20}
    assert not patterns(run_windows(spread, 120))


def test_a_gpu_slower_by_clock_is_a_straggler_even_among_noisy_peers() -> None:
    slow = lambda n, g, k: {
        "sm_clock_mhz_mean": 1350.0 if (n, g) == ("n1", 2) else 1850.0 + (k * 13 + g * 7) % 90,
        "power_w_mean": 560.0 + 20 * g,
    }
    fired = [f for f in run_windows(slow, 60) if f.pattern == "straggler-gpu"]
    assert {(f.node, f.gpu_index) for f in fired} == {("n1", 2)}


def _hang(n: str, g: int, k: int, start: int, end: int) -> dict[str, Any]:
    if start <= k < end:
        return {
            "utilization_gpu_pct_mean": 100.0,
            "utilization_gpu_pct_max": 100.0,
            "power_w_mean": 110.0,
            "tensor_activity_pct_mean": 0.0,
        }
    return {}


def test_a_short_all_gpu_pin_that_recovers_is_no_hang() -> None:
    # 120 s: under the 150 s a hang on strong evidence needs (a 200 s pin, the old rule's near miss,
    # is a hang now: nothing in the telemetry tells it apart before it ends)
    fired = patterns(run_windows(lambda n, g, k: _hang(n, g, k, 40, 52), 100))
    assert "collective-hang" not in fired and "low-tensor-activity" not in fired


def test_a_hang_is_one_failure_for_the_job_not_one_per_gpu() -> None:
    out = run_windows(lambda n, g, k: _hang(n, g, k, 40, 100), 100)  # 600 s pinned
    opened = {f.failure_id: f for f in out if f.state is FailureState.OPEN}
    assert [f.pattern for f in opened.values()] == ["collective-hang"]
    assert next(iter(opened.values())).gpu_index is None


def test_checkpoint_writes_are_checkpoint_stalls_not_hangs_or_partial_idle() -> None:
    """Rank 0 writes (< 30 %) while ranks 1-7 spin at 100 % and ~150 W, most of the time."""

    def ckpt(n: str, g: int, k: int) -> dict[str, Any]:
        if k < 20 or k % 8 == 0:
            return {}  # working windows
        if (n, g) == ("n1", 0):
            return {"utilization_gpu_pct_mean": 3.0, "utilization_gpu_pct_max": 4.0, "power_w_mean": 145.0}
        return {"utilization_gpu_pct_mean": 100.0, "utilization_gpu_pct_max": 100.0, "power_w_mean": 150.0}

    fired = patterns(run_windows(ckpt, 120))
    assert "checkpoint-stall" in fired
    assert not fired & {"collective-hang", "partial-idle-allocation", "straggler-gpu", "straggler-node"}


def test_a_start_up_phase_is_not_an_idle_allocation() -> None:
    loading = lambda n, g, k: JOB_CASES["idle-allocation"](n, g, k) if k < 25 else {}  # 250 s loading
    assert "idle-allocation" not in patterns(run_windows(loading, 60))


def test_a_contained_memory_error_and_its_row_remap_are_one_failure() -> None:
    d = Detector(load_catalog())
    out: list[Failure] = []
    for s in range(60):  # past the 30 s the pending stage holds XID 94 and the row remap
        g = [
            healthy(i, **({"remapped_rows_pending": True, "ecc_dbe_volatile": 1} if i == 3 and s >= 10 else {}))
            for i in range(8)
        ]
        sample = NodeSample(node="n1", ts=T0 + s, collector_id="t", source="test", gpus=g)
        out += d.on_sample(
            AttributedSample(sample=sample, jobs=[JOB.model_copy(update={"gpu_index": i}) for i in range(8)])
        )
        if s == 10:
            ev = GpuEvent(
                event_id="x94",
                node="n1",
                ts=T0 + 10.2,
                kind=EventKind.XID,
                code=94,
                gpu_index=3,
                message="Contained: SM (0x1)",
                raw="NVRM: Xid (PCI:0000:1b:00): 94, ...",
                source="test",
            )
            out += d.on_event(AttributedEvent(event=ev, job=JOB.model_copy(update={"gpu_index": 3})))
    ids = {f.failure_id for f in out}
    assert len(ids) == 1 and {f.pattern for f in out} == {"contained-memory-error"}
    signals = {e.signal for e in out[-1].evidence}
    assert {"xid", "remapped_rows_pending"} <= signals


def test_gpus_taking_turns_are_not_input_starved() -> None:
    """Sequential model parallelism (a 70B model split over 4 GPUs, one busy at a time): each GPU
    ~25 %, together one busy GPU; an 8-GPU data-parallel job at the same duty is input-bound."""
    turns = lambda n, g, k: {"utilization_gpu_pct_mean": 22.0 + g % 3, "utilization_gpu_pct_min": 0.0}
    assert "input-starvation" not in patterns(run_windows(turns, 100, {"n1": 4}))
    assert "input-starvation" in patterns(run_windows(turns, 100, {"n1": 8}))


def test_an_idle_start_is_an_idle_allocation_once_it_outlasts_the_grace() -> None:
    fired = [f for f in run_windows(JOB_CASES["idle-allocation"], 40) if f.pattern == "idle-allocation"]
    assert fired and fired[0].first_seen == T0 + 310  # the first window ends at 10 s, + 300 s: not grace + for_s
    assert not [f for f in run_windows(JOB_CASES["idle-allocation"], 28) if f.pattern == "idle-allocation"]


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(
    values=st.lists(st.sampled_from([0.0, 1.0, 2.5, 2.5, 1980.0]) | st.floats(0, 2000), min_size=2, max_size=40),
    data=st.data(),
)
def test_median_without_is_the_median_of_what_is_left(values: list[float], data: st.DataObject) -> None:
    """The stragglers' leave-one-out median and MAD (no sort of the peers per subject) equal
    statistics.median of the peers, duplicates included."""
    import statistics

    from gpuwarden.detector.conditions.fleet import median_without

    out = data.draw(st.sets(st.integers(0, len(values) - 1), min_size=1, max_size=len(values) - 1))
    rest = [v for i, v in enumerate(values) if i not in out]
    assert median_without(sorted(values), [values[i] for i in out]) == statistics.median(rest)


def _catalog_with_short_idle_for() -> Any:
    """The shipped catalog with idle-allocation's for_s at 60 s, shorter than its 300 s start-up:
    the only setting where the start-up decides anything (the shipped for_s equals it)."""
    from importlib import resources

    text = resources.files("gpuwarden.detector").joinpath("catalog.yaml").read_text()
    old = "    explain: {startup_s: 300}\n    for_s: 300\n"
    assert text.count(old) == 1
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text.replace(old, "    explain: {startup_s: 300}\n    for_s: 60\n"))
    return load_catalog(f.name)


def _idle_until(k_end: int) -> Callable[[str, int, int], dict[str, Any]]:
    return lambda n, g, k: JOB_CASES["idle-allocation"](n, g, k) if k < k_end else {}


def _run_with(
    catalog: Any, per_gpu: Callable[[str, int, int], dict[str, Any]], count: int
) -> list[tuple[int, Failure]]:
    d = Detector(catalog)
    out: list[tuple[int, Failure]] = []
    for k in range(count):
        for w in windows({"n1": 4, "n2": 4}, T0 + 10 * k, per_gpu, k):
            out += [(k, f) for f in d.on_window(w)]
    return out + [(count, f) for f in d.flush()]


def test_the_start_up_is_the_pending_stages_explanation_of_an_idle_start() -> None:
    """Issue 24: the start-up grace is an ``explain:`` block (``startup_s``) of the one pending
    stage, not a gate in the condition. With for_s shorter than the start-up: an idle start that
    ends within the start-up is dropped, nothing published; one that outlasts it is published once
    the watermark passes the start-up, first seen when it was confirmed (onset + for_s)."""
    cat = _catalog_with_short_idle_for()
    assert cat.explanations()["idle-allocation"].startup_s == 300
    loading = [f for _, f in _run_with(cat, _idle_until(20), 60) if f.pattern == "idle-allocation"]
    assert loading == []  # confirmed at 60 s, resolved at ~230 s: the start-up explains it
    stuck = [(k, f) for k, f in _run_with(cat, _idle_until(40), 80) if f.pattern == "idle-allocation"]
    assert stuck, "an idle start past the start-up is an idle allocation"
    k0, first = stuck[0]
    assert first.state is FailureState.OPEN and first.first_seen < T0 + 300 and k0 == 29  # out at 300 s
    assert len({f.failure_id for _, f in stuck}) == 1 and stuck[-1][1].state is FailureState.RESOLVED


def test_the_shipped_start_up_changes_no_idle_allocation() -> None:
    """With the shipped for_s (300 s, the start-up's length) nothing is first seen inside the
    start-up, so the stage holds nothing of it: the first idle allocation is where it was."""
    fired = [f for _, f in _run_with(load_catalog(), _idle_until(60), 60) if f.pattern == "idle-allocation"]
    assert fired[0].first_seen == T0 + 310


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``strategy`` three times in four, else None (a field the GPU does not report)."""
    return st.one_of(strategy, strategy, strategy, st.none())


_OPT_FLOAT = _maybe(st.floats(0, 2000, allow_nan=False))
_OPT_COUNT = _maybe(st.integers(0, 3))  # small: a rise from the previous reading is common
_LINKS = _maybe(
    st.lists(
        st.fixed_dictionaries(
            {
                "link": st.integers(0, 17),
                "active": st.booleans(),
                "crc_flit_errors": st.integers(0, 3),
                "replay_errors": st.integers(0, 3),
            }
        ),
        max_size=4,
    )
)
_REASONS = [
    "gpu_idle",
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
]


@st.composite
def _gpu_reading(draw: st.DrawFn) -> GpuSample:
    return GpuSample(
        index=0,
        utilization_gpu_pct=draw(_maybe(st.floats(0, 100))),
        power_w=draw(_OPT_FLOAT),
        power_limit_w=draw(_OPT_FLOAT),
        sm_clock_mhz=draw(_OPT_FLOAT),
        max_sm_clock_mhz=draw(_OPT_FLOAT),
        memory_used_mib=draw(_maybe(st.floats(0, 90000))),
        processes=draw(
            _maybe(st.lists(st.fixed_dictionaries({"type": st.sampled_from(["C", "G", "C+G"])}), max_size=2))
        ),
        throttle_reasons=draw(st.lists(st.sampled_from(_REASONS), max_size=3)),
        ecc_sbe_volatile=draw(_OPT_COUNT),
        ecc_dbe_volatile=draw(_OPT_COUNT),
        pcie_replay_count=draw(_OPT_COUNT),
        retired_pages=draw(_OPT_COUNT),
        remapped_rows_pending=draw(_maybe(st.booleans())),
        remapped_rows_failure=draw(_maybe(st.booleans())),
        retired_pages_pending=draw(_maybe(st.booleans())),
        pcie_link_gen=draw(_maybe(st.integers(1, 5))),
        pcie_link_gen_max=draw(_maybe(st.integers(1, 5))),
        pcie_link_width=draw(_maybe(st.sampled_from([1, 4, 8, 16]))),
        pcie_link_width_max=draw(_maybe(st.sampled_from([8, 16]))),
        nvlinks=draw(_LINKS),
    )


@functools.cache
def _gpu_rules() -> list[tuple[Any, Any]]:
    from gpuwarden.detector.conditions import gpu_evaluator

    return [(c, gpu_evaluator(c.signal)) for c in load_catalog().conditions if c.scope == "gpu"]


def _nv(errors: int) -> list[dict[str, Any]]:
    return [{"link": 0, "active": True, "crc_flit_errors": errors, "replay_errors": 0}]


#: unhealthy just past each threshold, where a random draw rarely lands
_EDGES = [
    (
        GpuSample(
            index=0,
            pcie_link_gen=3,
            pcie_link_gen_max=5,
            pcie_link_width=16,
            pcie_link_width_max=16,
            utilization_gpu_pct=90.0,
        ),
        None,
    ),
    (
        GpuSample(
            index=0,
            sm_clock_mhz=1100.0,
            max_sm_clock_mhz=1980.0,
            utilization_gpu_pct=90.0,
            power_w=300.0,
            power_limit_w=700.0,
        ),
        None,
    ),
    (GpuSample(index=0, nvlinks=_nv(4)), GpuSample(index=0, nvlinks=_nv(3))),
    (
        GpuSample(index=0, ecc_sbe_volatile=5, ecc_dbe_volatile=1),
        GpuSample(index=0, ecc_sbe_volatile=4, ecc_dbe_volatile=0),
    ),
    (
        GpuSample(index=0, nvlinks=[{"link": 2, "active": False}], memory_used_mib=2048.0, remapped_rows_pending=True),
        None,
    ),
]


@hypothesis.settings(max_examples=1000, deadline=None)
@hypothesis.example(g=_EDGES[0][0], prev=_EDGES[0][1], dt=5.0, has_job=True)
@hypothesis.example(g=_EDGES[1][0], prev=_EDGES[1][1], dt=5.0, has_job=True)
@hypothesis.example(g=_EDGES[2][0], prev=_EDGES[2][1], dt=5.0, has_job=True)
@hypothesis.example(g=_EDGES[3][0], prev=_EDGES[3][1], dt=5.0, has_job=True)
@hypothesis.example(g=_EDGES[4][0], prev=_EDGES[4][1], dt=1.0, has_job=False)
@hypothesis.given(
    g=_gpu_reading(),
    prev=st.one_of(st.none(), _gpu_reading()),
    dt=st.sampled_from([0.0, 1.0, 5.0]),
    has_job=st.booleans(),
)
def test_a_gpu_evaluator_asked_for_unhealthy_readings_only_drops_only_healthy_ones(
    g: GpuSample, prev: GpuSample | None, dt: float, has_job: bool
) -> None:
    """``full=False`` (the engine, for a GPU with no open tracker) may turn a healthy reading
    into None and changes nothing else: every GPU rule of the shipped catalog, random readings."""
    for rule, fn in _gpu_rules():
        whole = fn(rule.signal, g, prev, dt, has_job, True)
        short = fn(rule.signal, g, prev, dt, has_job, False)
        if whole is not None and whole.unhealthy:
            assert short == whole, rule.id
        else:
            assert short is None or short == whole, rule.id
