"""Detector event lane: its own consumer group, raw events attributed by the engine, each event
turned into one failure whichever of its two copies (raw, attributed) comes first."""

from __future__ import annotations

import asyncio

import pytest

from gpuwarden.detector.lanes import EVENT_LANE, SAMPLE_LANE, as_attributed, event_lane_group
from gpuwarden.detector.service import DetectorService, DetectorSettings
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import AttributedEvent, EventKind, GpuAttribution, GpuEvent, JobState, stable_id

RAW = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"


def _event(ts: float = 1000.0) -> GpuEvent:
    return GpuEvent(
        event_id=stable_id("gpu-node-002", ts, 79, RAW),
        node="gpu-node-002",
        ts=ts,
        kind=EventKind.XID,
        code=79,
        gpu_index=3,
        pci_bus_id="0000:44:00.0",
        message="GPU has fallen off the bus",
        raw=RAW,
        source="test",
    )


def _job() -> JobState:
    return JobState(
        job_id="1001",
        ts=990.0,
        state="RUNNING",
        user="user1",
        partition="gpu",
        nodes=["gpu-node-002"],
        gpus={"gpu-node-002": [0, 1, 2, 3]},
        start_ts=900.0,
    )


def _service(group: str | None = None) -> tuple[DetectorService, MemoryPublisher]:
    out = MemoryPublisher()
    return DetectorService(DetectorSettings(consumer_group=group), producer=out), out  # type: ignore[arg-type]


def test_lanes_split_the_topics_and_the_event_lane_has_its_own_group() -> None:
    svc, _ = _service("det-a")
    asyncio.run(svc.on_start())
    by_group = {c._group_id: c.topics for c in svc._consumers}
    assert by_group == {"det-a": list(SAMPLE_LANE), "det-a-events": list(EVENT_LANE)}
    assert not set(SAMPLE_LANE) & set(EVENT_LANE)
    assert {"gpu.events", "gpu.events.attributed", "slurm.jobs"} <= set(EVENT_LANE)
    assert "gpu.attributed" not in EVENT_LANE  # the sample backlog is never in front of an XID
    assert event_lane_group(DetectorSettings()) == "gpuwarden-detector-events"


def test_raw_event_is_attributed_by_the_engine_from_slurm_jobs() -> None:
    a = as_attributed(_event())
    assert a.job is None and a.node_jobs == [] and a.event.code == 79
    svc, out = _service()
    asyncio.run(svc.handle("slurm.jobs", _job()))
    asyncio.run(svc.handle("gpu.events", _event()))
    [f] = out.of("failures")
    assert (f.pattern, f.node, f.gpu_index, f.job_id, f.user) == (
        "gpu-fallen-off-bus",
        "gpu-node-002",
        3,
        "1001",
        "user1",
    )


@pytest.mark.parametrize("raw_first", [True, False])
def test_the_two_copies_of_an_event_give_one_failure(raw_first: bool) -> None:
    svc, out = _service()
    job = GpuAttribution(gpu_index=3, job_id="1001", user="user1", partition="gpu", job_gpus=4)
    asyncio.run(svc.handle("slurm.jobs", _job()))
    copies: list[tuple[str, GpuEvent | AttributedEvent]] = [
        ("gpu.events", _event()),
        ("gpu.events.attributed", AttributedEvent(event=_event(), job=job)),
    ]
    for topic, value in copies if raw_first else reversed(copies):
        asyncio.run(svc.handle(topic, value))
    fails = out.of("failures")
    assert len(fails) == 1
    assert fails[0].failure_id == stable_id("xid-79-fallen-off-bus", "gpu-node-002", 3, 1000.0)
    assert fails[0].occurrences == 1  # the second copy is not counted as a repeat


@pytest.mark.parametrize("own_view", ["none", "other job"])
def test_the_correlators_copy_names_the_job_when_the_raw_copy_had_none_or_another(own_view: str) -> None:
    """One place attributes: with several detector workers a worker reads only its share of
    ``slurm.jobs``, so its own view may know no job, or a stale one, for the raw copy. The
    correlator's attributed copy then re-emits the same failure (same id) with its job; a
    redelivery of it, or a raw copy after it, changes nothing."""
    svc, out = _service()
    if own_view == "other job":
        asyncio.run(svc.handle("slurm.jobs", _job().model_copy(update={"job_id": "999", "user": "old"})))
    job = GpuAttribution(gpu_index=3, job_id="1001", user="user1", partition="gpu", job_gpus=4)
    asyncio.run(svc.handle("gpu.events", _event()))
    first = out.of("failures")
    assert [f.job_id for f in first] == ([None] if own_view == "none" else ["999"])
    for topic, value in [
        ("gpu.events.attributed", AttributedEvent(event=_event(), job=job)),
        ("gpu.events.attributed", AttributedEvent(event=_event(), job=job)),  # redelivery
        ("gpu.events", _event()),
    ]:
        asyncio.run(svc.handle(topic, value))
    fails = out.of("failures")
    assert len(fails) == 2
    assert {f.failure_id for f in fails} == {first[0].failure_id}
    assert (fails[-1].job_id, fails[-1].user, fails[-1].occurrences) == ("1001", "user1", 1)


def test_a_gpu_failing_under_two_jobs_is_a_repeat_offender_when_only_the_correlator_names_them() -> None:
    """With several workers the raw copy of an XID may have no job (the job's ``slurm.jobs``
    share is on another worker): the correlator's copy, which names it, still counts the event
    under that job for ``repeat-offender-gpu`` (helper review: the attributed copy once fed
    the repeat history, then stopped)."""
    from gpuwarden.detector import Detector, load_catalog

    d = Detector(load_catalog())
    out = []
    for i, (ts, job) in enumerate([(1000.0, "A"), (9000.0, "B")]):
        raw = f"NVRM: Xid (PCI:0000:44:00): 13, Graphics Exception {i}"
        ev = GpuEvent(event_id=stable_id("n1", ts, 13, raw), node="n1", ts=ts, kind=EventKind.XID, code=13,
                      gpu_index=0, raw=raw, source="t", message="Graphics Exception")  # fmt: skip
        out += d.on_event(as_attributed(ev))
        out += d.on_event(AttributedEvent(event=ev, job=GpuAttribution(gpu_index=0, job_id=job, user="u")))
    out += d.flush()
    assert ("repeat-offender-gpu", "B") in {(f.rule_id, f.job_id) for f in out}
    assert {f.job_id for f in out if f.rule_id != "repeat-offender-gpu" and f.first_seen == 1000.0} >= {"A"}
