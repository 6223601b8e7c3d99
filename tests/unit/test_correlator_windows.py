"""Per (job, node, GPU) tumbling windows: the pure functions and the correlator's handling."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from gpuwarden.correlator.core import Correlator
from gpuwarden.correlator.windows import add_sample, window_start
from gpuwarden.shared.bus import decode
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.models import AttributedSample, GpuAttribution, GpuSample, JobState, JobWindow, NodeSample

T0 = 1_700_000_000.0  # a multiple of 10


def att(node: str, ts: float, gpus: list[GpuSample], jobs: dict[int, str]) -> AttributedSample:
    return AttributedSample(
        sample=NodeSample(node=node, ts=ts, collector_id="c", source="simulated", gpus=gpus),
        jobs=[
            GpuAttribution(gpu_index=i, job_id=j, user="alice", partition="gpu", job_gpus=2) for i, j in jobs.items()
        ],
    )


def run(samples: list[AttributedSample], size: float = 10.0, grace: float = 5.0) -> tuple[list[JobWindow], list[Any]]:
    states: dict[str, Any] = {}
    out: list[JobWindow] = []
    late: list[Any] = []
    for s in samples:
        step = add_sample(states.get(s.sample.node), s, size, grace)
        states[s.sample.node] = step.state
        out += step.closed
        late += step.late
    return out, late


def test_window_start() -> None:
    assert window_start(T0 + 9.999, 10) == T0
    assert window_start(T0 + 10, 10) == T0 + 10
    assert window_start(T0 + 7, 5) == T0 + 5


def test_summary_fields() -> None:
    def g0(i: int) -> GpuSample:
        return GpuSample(
            index=0,
            uuid="GPU-0",
            utilization_gpu_pct=[10.0, 50.0, 90.0, 30.0][i],
            power_w=[100.0, 200.0, 300.0, 400.0][i],
            power_limit_w=[700.0, 700.0, 700.0, 650.0][i],
            sm_clock_mhz=1980.0,
            max_sm_clock_mhz=1980.0,
            memory_used_mib=[1000.0, 5000.0, 3000.0, 2000.0][i],
            memory_total_mib=81559.0,
            temperature_c=[60.0, 71.0, 65.0, 62.0][i],
            throttle_reasons=[["gpu_idle"], ["sw_power_cap"], ["gpu_idle", "sw_thermal_slowdown"], []][i],
            tensor_activity_pct=[20.0, 40.0, None, None][i],
            processes=[[{"pid": 1}], [{"pid": 1}, {"pid": 2}], [], [{"pid": 1}]][i],
        )

    # GPU 1 is unheld, GPU 2 is held but missing from the sample: neither is windowed.
    samples = [
        att("n1", T0 + 2 * i, [g0(i), GpuSample(index=1, utilization_gpu_pct=5.0)], {0: "j1", 2: "j1"})
        for i in range(4)
    ]
    samples.append(att("n1", T0 + 15, [GpuSample(index=0)], {0: "j1"}))  # watermark = end + grace
    [w], late = run(samples)
    assert late == []
    assert (w.job_id, w.node, w.gpu_index, w.gpu_uuid) == ("j1", "n1", 0, "GPU-0")
    assert (w.user, w.partition, w.job_gpus) == ("alice", "gpu", 2)
    assert (w.window_start, w.window_end, w.samples) == (T0, T0 + 10, 4)
    assert (w.utilization_gpu_pct_mean, w.utilization_gpu_pct_min, w.utilization_gpu_pct_max) == (45.0, 10.0, 90.0)
    assert (w.power_w_mean, w.power_limit_w) == (250.0, 650.0)
    assert (w.sm_clock_mhz_mean, w.max_sm_clock_mhz) == (1980.0, 1980.0)
    assert (w.memory_used_mib_first, w.memory_used_mib_last, w.memory_used_mib_max) == (1000.0, 2000.0, 5000.0)
    assert (w.memory_total_mib, w.temperature_c_max) == (81559.0, 71.0)
    # Two of four samples have a non-idle reason; the period is (6 - 0) / 3 = 2 s.
    assert w.throttle_s == 4.0
    assert w.throttle_reasons == ["gpu_idle", "sw_power_cap", "sw_thermal_slowdown"]
    assert w.tensor_activity_pct_mean == 30.0
    assert w.sm_occupancy_pct_mean is None
    assert w.processes_max == 2


def test_window_closes_only_when_watermark_passes_end_plus_grace() -> None:
    g = [GpuSample(index=0, utilization_gpu_pct=50.0)]
    closed, _ = run([att("n1", T0 + 1, g, {0: "j"}), att("n1", T0 + 14.9, g, {0: "j"})])
    assert closed == []
    closed, _ = run([att("n1", T0 + 1, g, {0: "j"}), att("n1", T0 + 15, g, {0: "j"})])
    assert [(w.window_start, w.samples) for w in closed] == [(T0, 1)]
    # grace 0: the next window's first sample closes it
    closed, _ = run([att("n1", T0 + 1, g, {0: "j"}), att("n1", T0 + 10, g, {0: "j"})], grace=0)
    assert [(w.window_start, w.samples) for w in closed] == [(T0, 1)]


def test_out_of_order_within_grace_is_folded_late_after_is_reported() -> None:
    g = [GpuSample(index=0, utilization_gpu_pct=50.0)]
    closed, late = run(
        [
            att("n1", T0 + 1, g, {0: "j"}),
            att("n1", T0 + 13, g, {0: "j"}),
            att("n1", T0 + 9, g, {0: "j"}),  # out of order, within grace: folded in
            att("n1", T0 + 16, g, {0: "j"}),  # closes [T0, T0+10)
            att("n1", T0 + 5, g, {0: "j"}),  # late: its window is closed
        ]
    )
    assert [(w.window_start, w.samples) for w in closed] == [(T0, 2)]
    assert late == [("j", "n1", 0, T0)]


def test_redelivered_sample_is_not_counted_twice() -> None:
    g = [GpuSample(index=0, utilization_gpu_pct=50.0)]
    s = att("n1", T0 + 1, g, {0: "j"})
    closed, _ = run([s, s, att("n1", T0 + 2, g, {0: "j"}), s, att("n1", T0 + 20, g, {0: "j"})])
    assert [(w.window_start, w.samples) for w in closed] == [(T0, 2)]


def test_add_sample_does_not_mutate_its_input() -> None:
    g = [GpuSample(index=0, utilization_gpu_pct=50.0)]
    first = add_sample(None, att("n1", T0 + 1, g, {0: "j"}))
    before = orjson.dumps(first.state)
    add_sample(first.state, att("n1", T0 + 2, g, {0: "j"}))
    add_sample(first.state, att("n1", T0 + 30, g, {0: "j"}))
    assert orjson.dumps(first.state) == before


def _fleet(seed: int) -> list[AttributedSample]:
    """3 nodes x 4 GPUs x 60 s at 1 Hz with varied readings; a job change on n2 at 30 s."""
    rnd = random.Random(seed)
    out = []
    for node in ("n1", "n2", "n3"):
        for t in range(60):
            gpus = [
                GpuSample(
                    index=i,
                    utilization_gpu_pct=round(rnd.uniform(0, 100), 3),
                    power_w=rnd.uniform(50, 700),
                    sm_clock_mhz=rnd.choice([1410.0, 1755.0, 1980.0]),
                    memory_used_mib=rnd.uniform(0, 80000),
                    temperature_c=rnd.uniform(30, 90),
                    throttle_reasons=rnd.choice([[], ["gpu_idle"], ["sw_power_cap"]]),
                    sm_occupancy_pct=rnd.uniform(0, 100),
                    processes=[{"pid": p} for p in range(rnd.randint(0, 3))],
                )
                for i in range(4)
            ]
            job = "a" if node != "n2" or t < 30 else "b"
            out.append(att(node, T0 + t + 0.25, gpus, {0: job, 1: job, 3: "c"}))
    return out


def _shuffle_within(samples: list[AttributedSample], rnd: random.Random, span: int) -> list[AttributedSample]:
    """Per node, shuffle consecutive chunks of ``span`` samples (1 Hz: disorder < span s),
    then interleave the nodes at random."""
    per_node: dict[str, list[AttributedSample]] = {}
    for s in samples:
        per_node.setdefault(s.sample.node, []).append(s)
    queues = []
    for seq in per_node.values():
        chunks = [seq[i : i + span] for i in range(0, len(seq), span)]
        for c in chunks:
            rnd.shuffle(c)
        queues.append([s for c in chunks for s in c])
    out = []
    while any(queues):
        q = rnd.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_in_another_order_gives_identical_windows(seed: int) -> None:
    samples = _fleet(seed)
    # A final sample per node pushes every watermark past the last window's end + grace.
    tail = [att(n, T0 + 200, [GpuSample(index=0)], {}) for n in ("n1", "n2", "n3")]
    in_order, late1 = run(samples + tail)
    shuffled, late2 = run(_shuffle_within(samples, random.Random(seed), 5) + tail)
    assert late1 == late2 == []
    key = lambda w: (w.job_id, w.node, w.gpu_index, w.window_start)
    assert len(in_order) == 3 * 6 * 3  # 3 nodes x 6 windows x 3 held GPUs
    assert len({key(w) for w in in_order}) == len(in_order)
    assert sorted(in_order, key=key) == sorted(shuffled, key=key)  # exact equality, every field
    assert {w.job_id for w in in_order if w.node == "n2" and w.gpu_index == 0} == {"a", "b"}


def test_correlator_windows_the_samples_it_attributes_late_and_bad() -> None:
    metrics = ServiceMetrics("correlator")
    c = Correlator(topic_name=lambda s: f"x.{s}", metrics=metrics, window_s=10, window_grace_s=2)
    job = JobState(
        job_id="j", ts=T0 - 10, state="RUNNING", user="alice", partition="gpu", nodes=["n1"], gpus={"n1": [0, 1]}
    )
    assert c.handle("slurm.jobs", job.to_json()) == []  # applied to the (ungated) view
    assert set(c.view.allocations("n1")) == {"j"}

    def sample(ts: float) -> bytes:
        return NodeSample(
            node="n1", ts=ts, collector_id="c", source="simulated", gpus=[GpuSample(index=0, utilization_gpu_pct=50.0)]
        ).to_json()

    [a] = c.handle("gpu.samples", sample(T0 + 1))
    assert a.topic == "gpu.attributed"
    [out, a] = c.handle("gpu.samples", sample(T0 + 12))
    assert a.topic == "gpu.attributed"
    assert (out.topic, out.key) == ("job.windows", "j")
    w = decode("job.windows", out.value)
    assert isinstance(w, JobWindow) and (w.window_start, w.samples, w.job_gpus) == (T0, 1, 2)
    [a] = c.handle("gpu.samples", sample(T0 + 3))
    assert c.late_samples == 1
    assert metrics.registry.get_sample_value("gpuwarden_late_samples_total") == 1.0
    [dl] = c.handle("gpu.samples", b'{"node": {}}', b"n1", 1, 42)
    assert dl.topic == "deadletter" and b"x.gpu.samples" in dl.value
    # Its own output looped back (the in-process runner routes every output) is ignored.
    assert c.handle("gpu.attributed", a.value) == []
    # The state is plain JSON (it goes through the table's changelog).
    assert orjson.loads(orjson.dumps(c.windows.get("n1"))) == c.windows.get("n1")


def test_correlator_windows_equal_the_pure_fold_of_what_it_publishes() -> None:
    """Windowing in the sample handler (in place) gives exactly the windows of folding its
    ``gpu.attributed`` output with the pure :func:`add_sample`, as the separate agent did."""
    c = Correlator(topic_name=lambda s: f"x.{s}", window_s=10, window_grace_s=5)
    job = JobState(job_id="a", ts=T0 - 10, state="RUNNING", nodes=["n1", "n2"], gpus={"n1": [0, 1], "n2": [0, 1, 3]})
    assert c.handle("slurm.jobs", job.to_json()) == []
    samples = [s.sample for s in _shuffle_within(_fleet(7), random.Random(7), 5) if s.sample.node in ("n1", "n2")]
    samples += [NodeSample(node=n, ts=T0 + 200, collector_id="c", source="simulated", gpus=[]) for n in ("n1", "n2")]
    published: list[AttributedSample] = []
    windows: list[JobWindow] = []
    for s in samples:
        for o in c.handle("gpu.samples", s.to_json()):
            if o.topic == "gpu.attributed":
                published.append(decode("gpu.attributed", o.value))  # type: ignore[arg-type]
            else:
                windows.append(decode("job.windows", o.value))  # type: ignore[arg-type]
    expected, late = run(published)
    key = lambda w: (w.job_id, w.node, w.gpu_index, w.window_start)
    assert late == [] and len(windows) == len(expected) > 0
    # each window names its input partition and how far that partition was when it closed
    # (at least the window's end plus its grace: the sample that closed it)
    assert all(w.stream_partition == 0 and w.stream_ts is not None and w.stream_ts >= w.window_end + 5
               for w in windows)  # fmt: skip
    windows = [w.model_copy(update={"stream_partition": None, "stream_ts": None}) for w in windows]
    assert sorted(windows, key=key) == sorted(expected, key=key)
    assert [key(w) for w in windows] == [key(w) for w in expected]  # same order too


@pytest.mark.parametrize("seed", [1, 2])
def test_in_place_fold_equals_the_pure_one(seed: int) -> None:
    samples = _shuffle_within(_fleet(seed), random.Random(seed), 5)
    samples += [att(n, T0 + 200, [GpuSample(index=0)], {}) for n in ("n1", "n2", "n3")]
    samples.insert(len(samples) // 2, samples[3])  # a redelivery
    pure, _late = run(samples)
    states: dict[str, Any] = {}
    in_place: list[JobWindow] = []
    for s in samples:
        step = add_sample(states.get(s.sample.node), s, 10.0, 5.0, in_place=True)
        assert states.setdefault(s.sample.node, step.state) is step.state
        in_place += step.closed
    assert in_place == pure and len(pure) == 3 * 6 * 3


def test_a_node_clock_ahead_does_not_carry_its_partitions_progress() -> None:
    """n3's clock runs 400 s ahead on the partition n1 and n2 share: the windows of n1 and n2
    still carry their partition's progress as their peers have it (within the progress's 5 s
    lead), not n3's time (the detector would judge n1 and n2 silent on their partition)."""
    c = Correlator(topic_name=lambda s: f"x.{s}", window_s=10, window_grace_s=5)
    job = JobState(job_id="a", ts=T0 - 10, state="RUNNING", nodes=["n1", "n2"], gpus={"n1": [0], "n2": [0]})
    assert c.handle("slurm.jobs", job.to_json()) == []
    windows: list[JobWindow] = []
    for s in range(60):
        for node, ahead in (("n1", 0.0), ("n2", 0.0), ("n3", 400.0)):
            sample = NodeSample(
                node=node, ts=T0 + s + ahead, collector_id="c", source="simulated",
                gpus=[GpuSample(index=0, utilization_gpu_pct=50.0)],
            )  # fmt: skip
            for o in c.handle("gpu.samples", sample.to_json(), node.encode(), 0, 3 * s):
                if o.topic == "job.windows":
                    windows.append(decode("job.windows", o.value))  # type: ignore[arg-type]
    assert {w.node for w in windows} == {"n1", "n2"} and len(windows) >= 8
    assert all(w.stream_ts is not None and w.window_end + 5 <= w.stream_ts <= w.window_end + 5 + 1 + 5 for w in windows)
