"""Pure helpers of ``gpuwarden bench pipeline`` (no broker, no timing)."""

from __future__ import annotations

import pytest

from gpuwarden.sim.bench.figures import (
    CPU_MULTIPLE_TARGETS,
    BenchResult,
    LagSeries,
    cpu_budget,
    cpu_ms_per_1000,
    cpu_multiples,
    machine_cores,
    percentile,
    rate,
    ratio,
    raw_cpu_line,
    raw_floor_line,
    report,
    stage_cpu_ms,
    summarise_latencies,
)


def test_percentile_interpolates_and_handles_edges() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    xs = [float(i) for i in range(1, 101)]  # 1..100
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 100.0
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0  # unsorted input
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_ratio() -> None:
    assert ratio(10.0, 40.0) == 0.25
    assert ratio(None, 1.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


def test_rate_uses_last_points_at_or_before_bounds() -> None:
    pts = [(0.0, 0.0), (1.0, 100.0), (2.0, 300.0), (3.0, 600.0)]
    assert rate(pts, 1.0, 3.0) == pytest.approx(250.0)
    assert rate(pts, 1.5, 2.9) == pytest.approx(200.0)  # (2, 300) - (1, 100) over 1 s
    assert rate(pts, -1.0, 3.0) is None  # nothing before t0
    assert rate(pts, 3.0, 3.0) is None  # one point only


def test_summarise_latencies_counts_missing() -> None:
    sent = {"a": 10.0, "b": 20.0, "c": 30.0}
    seen = {"a": 10.1, "b": 20.3}
    s = summarise_latencies(sent, seen)
    assert s["n"] == 2 and s["missing"] == 1
    assert s["p50_s"] == pytest.approx(0.2)
    assert s["max_s"] == pytest.approx(0.3)
    assert summarise_latencies({}, {})["p99_s"] is None


def test_lag_series() -> None:
    ls = LagSeries()
    ls.add(1.0, end=100, committed=40)
    ls.add(2.0, end=200, committed=190)
    ls.add(3.0, end=200, committed=250)  # committed past a stale end offset: lag 0, not negative
    assert ls.max_lag() == 60.0
    assert ls.max_lag(1.5, 3.0) == 10.0
    assert ls.lag_at(2.5) == 10.0
    assert ls.lag_at(0.5) is None
    assert ls.committed[-1] == (3.0, 250.0)


def _result_with_cpu() -> BenchResult:
    """A 100-node x 8-GPU run at 1 Hz (800 GPU samples/s offered), measured from t=10 to t=20."""
    res = BenchResult(nodes=100, gpus=8, hz=1.0, services=["correlator", "detector", "remediator"], cores=2)
    res.t_measure = (10.0, 20.0)
    # committed node samples: the correlator 50/s (400 GPU samples/s), the detector 25/s
    for svc, per_s in (("correlator", 50), ("detector", 25)):
        for t in (10.0, 20.0):
            res.series.setdefault(svc, LagSeries()).add(t, end=10_000, committed=int(per_s * t))
    # CPU s used so far: two correlator workers 0.2 + 0.2 cores, detector 0.5, remediator 0.1,
    # broker 0.3; the load generator sampled once only (no rate)
    for proc, cores in (("correlator", 0.2), ("correlator-2", 0.2), ("detector", 0.5), ("remediator", 0.1)):
        res.cpu[proc] = [(10.0, 100.0), (20.0, 100.0 + 10 * cores)]
    res.cpu["broker"] = [(10.0, 5.0), (20.0, 8.0)]
    res.cpu["load"] = [(20.0, 1.0)]
    res.kinds = {"correlator": "correlator", "correlator-2": "correlator", "detector": "detector"}
    return res


def test_cpu_budget_scales_sample_stages_to_the_offered_rate() -> None:
    lines = cpu_budget(_result_with_cpu())
    assert len(lines) == 2
    # correlator: 0.4 cores / 400 GPU samples/s = 1 ms per GPU sample = 1,000 ms per 1,000
    assert "correlator 1000.0 ms (2 workers)" in lines[0]
    # detector: 0.5 / 200 = 2.5 ms per GPU sample
    assert "detector 2500.0 ms (1 worker)" in lines[0]
    assert "remediator" not in lines[0] and "broker" not in lines[0]
    # at 800 GPU samples/s: correlator 0.8 cores, detector 2.0, remediator 0.1 and broker 0.3 as measured
    assert "offered 800 GPU samples/s" in lines[1]
    assert "correlator 0.80" in lines[1] and "detector 2.00" in lines[1]
    assert "remediator 0.10" in lines[1] and "broker 0.30" in lines[1]
    assert "load" not in lines[1]  # one sample: no rate, left out rather than guessed
    assert "total >= 3.20" in lines[1] and "this machine has 2" in lines[1]


def test_cpu_budget_is_empty_without_committed_samples() -> None:
    res = _result_with_cpu()
    res.series = {}
    assert cpu_budget(res) == []
    res = _result_with_cpu()
    res.cpu = {}
    assert cpu_budget(res) == []


def test_report_keeps_its_summary_lines_and_adds_the_budget() -> None:
    lines = report(_result_with_cpu())
    assert any(line.startswith("pipeline (min of correlator, detector): ") for line in lines)
    assert any(line.startswith("cpu (cores used during the measured window, of ") for line in lines)
    assert any(line.startswith("cores needed at the offered ") for line in lines)


def test_machine_cores_is_positive() -> None:
    n = machine_cores()
    assert n is None or n >= 1


def test_cpu_budget_says_when_a_sample_stage_committed_nothing() -> None:
    res = _result_with_cpu()
    res.series["detector"] = LagSeries()
    for t in (10.0, 20.0):
        res.series["detector"].add(t, end=10_000, committed=0)  # stalled: no rate to scale by
    lines = cpu_budget(res)
    assert "detector" not in lines[0]
    assert "detector 0.50 (committed nothing: as measured)" in lines[1]


def test_cpu_ms_per_1000() -> None:
    # 0.27 CPU-s for 100,000 GPU samples = 2.7 us each = 2.7 ms per 1,000
    assert cpu_ms_per_1000(0.27, 100_000) == pytest.approx(2.7)
    assert cpu_ms_per_1000(None, 100_000) is None
    assert cpu_ms_per_1000(0.27, 0) is None  # nothing consumed: no cost, not a division by zero


def test_stage_cpu_ms_is_the_budget_cost_of_each_sample_stage() -> None:
    res = _result_with_cpu()
    costs = stage_cpu_ms(res)
    # the same figures cpu_budget prints: correlator 0.4 cores / 400 GPU samples/s, detector 0.5 / 200
    assert costs == {"correlator": pytest.approx(1000.0), "detector": pytest.approx(2500.0)}
    assert "remediator" not in costs and "broker" not in costs  # not sample stages
    res.series["detector"] = LagSeries()
    for t in (10.0, 20.0):
        res.series["detector"].add(t, end=10_000, committed=0)
    assert "detector" not in stage_cpu_ms(res)  # committed nothing: no cost


def test_cpu_multiples_divide_by_the_raw_consume() -> None:
    m = cpu_multiples(2.5, {"correlator": 20.0, "detector": 10.0})
    assert m == {"correlator": pytest.approx(8.0), "detector": pytest.approx(4.0)}
    assert cpu_multiples(None, {"correlator": 20.0}) == {"correlator": None}
    assert cpu_multiples(0.0, {"correlator": 20.0}) == {"correlator": None}


def test_raw_cpu_line_gives_each_stage_its_multiple_and_target() -> None:
    assert CPU_MULTIPLE_TARGETS == {"correlator": 8.0, "detector": 6.0, "otlp-bridge": 4.0}
    line = raw_cpu_line(
        2.5, {"correlator": 55.25, "detector": 10.0, "otlp-bridge": 12.5}, ["correlator", "detector", "otlp-bridge"]
    )
    assert line == (
        "raw consume CPU per 1,000 GPU samples: 2.50 ms (aiokafka + orjson); stages as a multiple of it: "
        "correlator 22.1x (target <= 8x), detector 4.0x (<= 6x), otlp-bridge 5.0x (<= 4x)"
    )
    # a stage without a cost, and no raw figure: n/a rather than a guess
    assert raw_cpu_line(2.5, {"correlator": 20.0}, ["correlator", "detector"]).endswith(
        "correlator 8.0x (target <= 8x), detector n/a (<= 6x)"
    )
    assert raw_cpu_line(None, {"correlator": 20.0}, ["correlator"]) == (
        "raw consume CPU per 1,000 GPU samples: n/a (aiokafka + orjson); stages as a multiple of it: "
        "correlator n/a (target <= 8x)"
    )


def test_report_adds_the_raw_consume_cpu_line_and_keeps_the_raw_lines() -> None:
    res = _result_with_cpu()
    res.raw_rate, res.raw_json_rate, res.raw_messages = 50_000.0, 30_000.0, 1_000
    before = report(res)
    assert not any(line.startswith("raw consume CPU per 1,000 GPU samples") for line in before)
    res.raw_cpu_ms = 125.0
    lines = report(res)
    assert lines[: len(before)] == before  # every existing line as it was, the new one after them
    assert lines[len(before) :] == [
        "raw consume CPU per 1,000 GPU samples: 125.00 ms (aiokafka + orjson); stages as a multiple of it: "
        "correlator 8.0x (target <= 8x), detector 20.0x (<= 6x)",  # no otlp-bridge in this run's services
        # 125 us per GPU sample at 800/s: 0.1 cores each for the two sample stages of this run
        "floor at the offered 800 GPU samples/s: 2 sample stages that each read every sample need >= 0.20 cores "
        "for the raw consume alone (0.10 each), before any work of their own, the broker and the load; "
        "this machine has 2",
    ]
    assert any(
        line.startswith("raw aiokafka consume of gpu.samples (1,000 msgs): 400,000 GPU samples/s bytes only")
        for line in lines
    )
    assert any(line.startswith("ratio pipeline/raw: ") for line in lines)


def test_the_load_is_what_the_nvml_collector_sends() -> None:
    """The bench's samples are the NVML collector's (its NvmlSource over the fake NVML), every
    health field the rules and the bridge read, NVLinks in the full variant only; each node has
    its own GPU UUIDs; and they pass the topic's schema."""
    import orjson

    from gpuwarden.shared.models import NodeSample
    from gpuwarden.sim.bench.pipeline import collector_gpus, node_template

    gpus = collector_gpus(8)
    a, _full, lean = node_template("gpu-node-0001", gpus)
    b, _, _ = node_template("gpu-node-0002", gpus)
    s = NodeSample.model_validate_json(orjson.dumps(a))
    assert len(s.gpus) == 8 and all(g.nvlinks and len(g.nvlinks) == 18 for g in s.gpus)
    g = s.gpus[0]
    health = ("ecc_sbe_volatile", "ecc_dbe_volatile", "remapped_rows_pending", "pcie_link_gen", "pcie_link_width")
    for name in (*health, "pcie_replay_count", "sm_clock_mhz", "max_sm_clock_mhz", "power_w", "processes"):
        assert getattr(g, name) is not None, name
    lean_sample = NodeSample.model_validate_json(orjson.dumps({**a, "gpus": lean}))
    assert all(x.nvlinks is None for x in lean_sample.gpus)
    assert {x["uuid"] for x in a["gpus"]}.isdisjoint({x["uuid"] for x in b["gpus"]})
    assert len(orjson.dumps(a)) > 2 * len(orjson.dumps({**a, "gpus": lean}))


@pytest.mark.parametrize("bench", ["pipeline", "correlator"])
def test_a_bench_pointed_at_a_dead_broker_says_so_in_one_line(bench: str) -> None:
    """``--bootstrap`` naming an address where no broker answers ends with one error line that
    names the address and what to check, exit status 1, not aiokafka's traceback."""
    from typer.testing import CliRunner

    from gpuwarden.shared.cli import app, load_plugins
    from gpuwarden.sim.brokers import free_port

    load_plugins()
    where = f"127.0.0.1:{free_port()}"
    res = CliRunner().invoke(app, ["bench", bench, "--bootstrap", where, "--seconds", "1", "--warmup", "1"]
                             if bench == "pipeline" else ["bench", bench, "--bootstrap", where])  # fmt: skip
    assert res.exit_code == 1, res.output
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert f"no Kafka broker answers at {where}" in line and "--bootstrap" in line
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    "args",
    [
        ["pipeline", "--bootstrap", "notahost:xx"],
        ["pipeline", "--bootstrap", "127.0.0.1:99999"],
        ["pipeline", "--nodes", "0"],
        ["pipeline", "--seconds", "inf"],
        ["pipeline", "--broker", "tansu", "--bootstrap", "127.0.0.1:1"],
        ["correlator", "--bootstrap", "127.0.0.1:"],
        ["correlator", "--nodes", "0"],
        ["correlator", "--workers", "0"],
        ["correlator", "--timeout", "inf"],
    ],
)
def test_a_benchs_bad_options_are_usage_errors(args: list[str]) -> None:
    """Malformed addresses and counts are refused before anything starts (exit 2, one error),
    not a traceback from aiokafka or pydantic half-way in; --broker tansu refuses --bootstrap."""
    from typer.testing import CliRunner

    from gpuwarden.shared.cli import app, load_plugins

    load_plugins()
    res = CliRunner().invoke(app, ["bench", *args])
    assert res.exit_code == 2, res.output
    assert "Invalid value" in res.output and "Traceback" not in res.output


def test_the_simulated_pci_bus_ids_are_valid_and_distinct_for_every_gpu_count() -> None:
    from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id
    from gpuwarden.sim.gpu_model import pci_of

    ids = [pci_of(i) for i in range(256)]
    assert len(set(ids)) == 256
    assert all(normalize_pci_bus_id(i) for i in ids)


def test_the_training_scenario_names_every_node_of_a_large_fleet() -> None:
    """``bench collector --nodes 1000`` and the like: the job names the scenario's own node names
    (4 digits past 999), not 3-digit ones it does not have."""
    from gpuwarden.sim.collector import training_scenario

    sc = training_scenario("x", 1000, 2, 10)
    assert sc.cluster.node_names()[-1] == "gpu-node-1000"
    assert sc.jobs[0].node_list() == sc.cluster.node_names()


def test_raw_floor_line_is_one_raw_consume_per_sample_stage_at_the_offered_rate() -> None:
    # 20 ms per 1,000 GPU samples = 20 us each; at 25,000/s that is 0.5 cores per stage, 1.5 for three
    line = raw_floor_line(20.0, ["correlator", "detector", "otlp-bridge"], 25_000, 2)
    assert line == (
        "floor at the offered 25,000 GPU samples/s: 3 sample stages that each read every sample need >= 1.50 "
        "cores for the raw consume alone (0.50 each), before any work of their own, the broker and the load; "
        "this machine has 2"
    )
    assert "1 sample stage that" in (raw_floor_line(20.0, ["correlator"], 25_000, None) or "")
    assert "this machine has n/a" in (raw_floor_line(20.0, ["correlator"], 25_000, None) or "")
    # no raw figure, no stage, nothing offered: no line rather than a guess
    assert raw_floor_line(None, ["correlator"], 25_000, 2) is None
    assert raw_floor_line(0.0, ["correlator"], 25_000, 2) is None
    assert raw_floor_line(20.0, [], 25_000, 2) is None
    assert raw_floor_line(20.0, ["correlator"], 0, 2) is None
