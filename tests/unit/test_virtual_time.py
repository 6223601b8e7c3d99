"""Virtual time of simulated runs: the drain criterion, the fixed event origin, the
``gpu.attributed`` value built around the input's bytes, and the benchmark's RSS reading."""

from __future__ import annotations

import os

import orjson
from aiokafka import TopicPartition

from gpuwarden.correlator.core import Correlator, attributed_json
from gpuwarden.demo.virtual import PIPELINE_GROUPS, lag_of, source_finished
from gpuwarden.detector.lanes import EVENT_LANE, SAMPLE_LANE
from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import AttributedSample, GpuSample, JobState, NodeSample, dumps
from gpuwarden.shared.scenario import ScenarioClock
from gpuwarden.sim.bench.figures import rss_mib

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def test_lag_counts_uncommitted_and_never_committed_partitions() -> None:
    assert lag_of({A: 10, B: 0}, {A: 10, B: None}) == 0  # an empty partition needs no commit
    assert lag_of({A: 10, B: 5}, {A: 7, B: None}) == 3 + 5
    assert lag_of({A: 10}, {}) == 10
    assert lag_of({A: 10}, {A: 12}) == 0  # never negative


def test_pipeline_groups_cover_the_detector_lanes() -> None:
    assert PIPELINE_GROUPS["gpuwarden-detector"] == SAMPLE_LANE
    assert PIPELINE_GROUPS["gpuwarden-detector-events"] == EVENT_LANE
    assert "failures" in PIPELINE_GROUPS["gpuwarden-remediator"]


def test_source_finished_is_false_without_an_answer() -> None:
    assert source_finished(1, timeout_s=0.2) is False


def test_clock_with_a_fixed_event_origin_and_the_runs_wall_start() -> None:
    c = ScenarioClock(1_700_000_000.0, speed=50, wall_start=2_000_000_000.0)
    assert c.event_ts(30) == 1_700_000_030.0
    assert c.wall_of(50) == 2_000_000_001.0
    assert c.scenario_s(2_000_000_002.0) == 100.0
    same = ScenarioClock(1000.0, speed=2)  # default: wall start = event start
    assert same.wall_of(10) == 1005.0 and same.scenario_s(1005.0) == 10.0


def test_clock_from_env_reads_the_wall_start(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPUWARDEN_SIM_START", "1700000000")
    monkeypatch.setenv("GPUWARDEN_SIM_WALL_START", "1800000000.5")
    monkeypatch.setenv("GPUWARDEN_SIM_SPEED", "10")
    c = ScenarioClock.from_env()
    assert (c.start, c.wall_start, c.speed) == (1_700_000_000.0, 1_800_000_000.5, 10.0)
    monkeypatch.delenv("GPUWARDEN_SIM_WALL_START")
    assert ScenarioClock.from_env().wall_start == 1_700_000_000.0


def _sample(ts: float) -> NodeSample:
    return NodeSample(
        node="n1",
        ts=ts,
        collector_id="c",
        source="simulated",
        gpus=[GpuSample(index=i, uuid=f"GPU-{i}", power_w=600.5 + i, utilization_gpu_pct=90.0) for i in range(2)],
    )


def test_attributed_output_embeds_the_input_and_decodes_to_the_same_model() -> None:
    c = Correlator()
    job = JobState(job_id="7", ts=900.0, state="RUNNING", nodes=["n1"], gpus={"n1": [1]}, start_ts=900.0)
    assert c.handle("slurm.jobs", job.to_json()) == []
    raw = dumps(_sample(1000.0)) + b"\n"
    [att] = [o for o in c.handle("gpu.samples", raw) if o.topic == "gpu.attributed"]
    assert att.value.startswith(b'{"schema_version":1,"sample":' + raw.strip() + b',"jobs":')
    got = decode("gpu.attributed", att.value)
    assert isinstance(got, AttributedSample)
    assert got.sample == _sample(1000.0)
    assert [(j.gpu_index, j.job_id) for j in got.jobs] == [(1, "7")]
    assert orjson.loads(attributed_json(b' {"a":1} ', b"[]")) == {"schema_version": 1, "sample": {"a": 1}, "jobs": []}
    unknown = orjson.loads(attributed_json(b' {"a":1} ', b"[]", known=False))
    assert unknown == {"schema_version": 1, "sample": {"a": 1}, "jobs": [], "attribution": "unknown"}


def test_rss_of_this_process_and_of_none() -> None:
    mib = rss_mib(os.getpid())
    assert mib is not None and 5 < mib < 100_000
    assert rss_mib(2**22 + 12345) is None
