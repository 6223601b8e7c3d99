"""Pure join logic of the correlator: fan-out, allocation table updates, event-time attribution."""

from __future__ import annotations

import random

import pytest

from gpuwarden.shared.allocations import (
    Allocation,
    apply_allocation,
    attribute_event,
    attribute_sample,
    attributions_at,
    base_state,
    dump_allocations,
    expire,
    fan_out,
    load_allocations,
)
from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, JobState, NodeSample


def job(state: str = "RUNNING", ts: float = 100.0, **kw: object) -> JobState:
    base: dict[str, object] = dict(
        job_id="1001",
        ts=ts,
        state=state,
        user="alice",
        account="ml",
        partition="gpu",
        nodes=["n1", "n2"],
        gpus={"n1": [0, 1], "n2": [2, 3, 3]},
        start_ts=50.0,
        end_ts=3650.0,
    )
    base.update(kw)
    return JobState.model_validate(base)


def sample(ts: float, node: str = "n1", n: int = 4) -> NodeSample:
    return NodeSample(
        node=node, ts=ts, collector_id="c", source="simulated", gpus=[GpuSample(index=i) for i in range(n)]
    )


def event(ts: float, gpu: int | None, node: str = "n1") -> GpuEvent:
    return GpuEvent(
        event_id="e", node=node, ts=ts, kind=EventKind.XID, code=79, gpu_index=gpu, raw="x", source="simulated"
    )


def table(*jobs: JobState, node: str = "n1") -> dict[str, Allocation]:
    allocs: dict[str, Allocation] = {}
    for j in jobs:
        for a in fan_out(j):
            if a.node == node:
                allocs = apply_allocation(allocs, a)
    return allocs


def test_fan_out_running_job_one_open_allocation_per_node() -> None:
    allocs = fan_out(job())
    assert [(a.node, a.gpus, a.end_ts, a.job_gpus) for a in allocs] == [
        ("n1", [0, 1], None, 4),
        ("n2", [2, 3], None, 4),
    ]
    assert allocs[0].user == "alice" and allocs[0].start_ts == 50.0 and allocs[0].ts == 100.0


@pytest.mark.parametrize(
    ("state", "end_ts", "expected_end"),
    [
        ("COMPLETED", 500.0, 500.0),
        ("FAILED", None, 100.0),  # no end from Slurm: closed at the observation ts
        ("CANCELLED by 1000", 400.0, 400.0),
        ("NODE_FAIL", 300.0, 300.0),
    ],
)
def test_fan_out_terminal_states_close_the_allocation(state: str, end_ts: float | None, expected_end: float) -> None:
    allocs = fan_out(job(state, end_ts=end_ts))
    assert {a.end_ts for a in allocs} == {expected_end}
    assert allocs[0].state == base_state(state)


def test_fan_out_pending_job_has_no_allocation() -> None:
    assert fan_out(job("PENDING", nodes=[], gpus={})) == []


def test_fan_out_node_only_in_gpus_map() -> None:
    assert [a.node for a in fan_out(job(nodes=[], gpus={"n3": [1]}))] == ["n3"]


def test_apply_ignores_stale_updates_and_is_idempotent() -> None:
    running = fan_out(job(ts=100))[0]
    done = fan_out(job("COMPLETED", ts=200, end_ts=190.0))[0]
    allocs = apply_allocation(apply_allocation({}, running), done)
    assert allocs["1001"].end_ts == 190.0
    assert apply_allocation(allocs, running) == allocs  # an old snapshot redelivered
    assert apply_allocation(allocs, done) == allocs


def test_apply_closing_record_without_gpus_keeps_known_gpus() -> None:
    allocs = apply_allocation({}, fan_out(job())[0])
    closing = fan_out(job("COMPLETED", ts=200, end_ts=190.0, gpus={}, nodes=["n1"]))[0]
    assert closing.gpus == []
    out = apply_allocation(allocs, closing)
    assert out["1001"].gpus == [0, 1] and out["1001"].end_ts == 190.0
    assert apply_allocation({}, closing) == {}  # nothing known, nothing to attribute


def test_apply_does_not_mutate_input() -> None:
    allocs: dict[str, Allocation] = {}
    apply_allocation(allocs, fan_out(job())[0])
    assert allocs == {}


def test_attribution_is_by_event_time_with_half_open_interval() -> None:
    allocs = table(job(), job("COMPLETED", ts=200.0, end_ts=190.0))
    assert attributions_at(allocs, 49.9) == []
    assert [a.gpu_index for a in attributions_at(allocs, 50.0)] == [0, 1]
    assert [a.gpu_index for a in attributions_at(allocs, 189.99)] == [0, 1]
    assert attributions_at(allocs, 190.0) == []


def test_unknown_start_covers_earlier_samples() -> None:
    allocs = table(job(start_ts=None))
    assert [a.job_id for a in attributions_at(allocs, 1.0)] == ["1001", "1001"]


def test_overlapping_allocations_resolve_to_latest_start_deterministically() -> None:
    a = table(job(), job(job_id="2002", start_ts=80.0, gpus={"n1": [1, 2]}, nodes=["n1"]))
    got = {x.gpu_index: x.job_id for x in attributions_at(a, 90.0)}
    assert got == {0: "1001", 1: "2002", 2: "2002"}


def test_attribute_sample_only_gpus_of_the_sample_and_held_by_a_job() -> None:
    allocs = table(job())
    out = attribute_sample(sample(60.0), allocs)
    assert [(j.gpu_index, j.job_id, j.job_gpus, j.job_start_ts) for j in out.jobs] == [
        (0, "1001", 4, 50.0),
        (1, "1001", 4, 50.0),
    ]
    assert attribute_sample(sample(60.0, n=1), allocs).jobs[0].gpu_index == 0
    assert attribute_sample(sample(60.0, node="n9"), {}).jobs == []


def test_attribute_event_job_of_its_gpu_and_all_node_jobs() -> None:
    allocs = table(job())
    ev = attribute_event(event(60.0, 1), allocs)
    assert ev.job is not None and ev.job.job_id == "1001" and ev.job.gpu_index == 1
    assert [a.gpu_index for a in ev.node_jobs] == [0, 1]
    assert attribute_event(event(60.0, 3), allocs).job is None  # idle GPU
    node_wide = attribute_event(event(60.0, None), allocs)
    assert node_wide.job is None and len(node_wide.node_jobs) == 2
    assert attribute_event(event(10.0, 1), allocs).job is None  # before the job started


def test_late_sample_attributes_after_the_job_ended_until_expiry() -> None:
    allocs = table(job(), job("COMPLETED", ts=200.0, end_ts=190.0))
    assert attribute_sample(sample(150.0), expire(allocs, 1000.0, 3600)).jobs  # late, within retention
    assert expire(allocs, 190.0 + 3600, 3600) == {}
    assert expire(table(job()), 1e9, 1) == table(job())  # running jobs never expire


def test_replay_order_of_job_updates_does_not_change_the_result() -> None:
    updates = [a for j in (job(ts=t) for t in (100.0, 130.0, 160.0)) for a in fan_out(j) if a.node == "n1"]
    updates += [a for a in fan_out(job("COMPLETED", ts=200.0, end_ts=190.0)) if a.node == "n1"]
    expected = None
    rng = random.Random(7)
    for _ in range(20):
        rng.shuffle(updates)
        allocs: dict[str, Allocation] = {}
        for u in updates:
            allocs = apply_allocation(allocs, u)
        result = [attribute_sample(sample(t), allocs).jobs for t in (40.0, 60.0, 189.0, 195.0)]
        expected = expected or result
        assert result == expected
    assert expected is not None and [len(r) for r in expected] == [0, 2, 2, 0]


def test_table_value_round_trips_through_json() -> None:
    allocs = table(job())
    assert load_allocations(dump_allocations(allocs)) == allocs
    assert load_allocations(None) == {}
