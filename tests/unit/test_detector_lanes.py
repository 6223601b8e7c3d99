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
        out += d.on_event(as_attributed(ev), raw=True)
        out += d.on_event(AttributedEvent(event=ev, job=GpuAttribution(gpu_index=0, job_id=job, user="u")))
    out += d.flush()
    assert ("repeat-offender-gpu", "B") in {(f.rule_id, f.job_id) for f in out}
    assert {f.job_id for f in out if f.rule_id != "repeat-offender-gpu" and f.first_seen == 1000.0} >= {"A"}


def _app_xid(ts: float, code: int) -> GpuEvent:
    raw = f"NVRM: Xid (PCI:0000:1b:00): {code}, pid=4242, Graphics Exception at {ts}"
    return GpuEvent(event_id=stable_id("gpu-node-001", ts, code, raw), node="gpu-node-001", ts=ts,
                    kind=EventKind.XID, code=code, gpu_index=1, raw=raw, source="t",
                    message="Graphics Exception")  # fmt: skip


def _hand_over_job(job_id: str, ts: float, state: str, start: float, end: float | None = None) -> JobState:
    return JobState(job_id=job_id, ts=ts, state=state, user="user1", partition="gpu", nodes=["gpu-node-001"],
                    gpus={"gpu-node-001": list(range(8))}, start_ts=start, end_ts=end)  # fmt: skip


# The inputs of repeat-offender-gpu-s37 as the detector's topics carry them: job 3001 on the
# node's 8 GPUs from t=0 to 150, job 3002 from 160; XID 13 on GPU 1 at 60 (under 3001) and XID 31
# at 220 (under 3002). Each order is one the services produced or can produce: at --speed 5 the
# jobs arrive first; at --speed 50 under a CPU hog (2026-12-07) the raw XID came before the job,
# slurm.jobs re-attributed its failure, and the correlator's copy then changed nothing, so the
# first XID never entered the repeat history and the finding was missed.
_E1, _E2 = _app_xid(60.0, 13), _app_xid(220.0, 31)
_A = GpuAttribution(gpu_index=1, job_id="3001", user="user1", partition="gpu", job_gpus=8)
_B = GpuAttribution(gpu_index=1, job_id="3002", user="user1", partition="gpu", job_gpus=8)
_START_A = ("slurm.jobs", _hand_over_job("3001", 1.0, "RUNNING", 0.0))
_END_A = ("slurm.jobs", _hand_over_job("3001", 151.0, "COMPLETED", 0.0, 150.0))
_START_B = ("slurm.jobs", _hand_over_job("3002", 161.0, "RUNNING", 160.0))
_RAW1, _RAW2 = ("gpu.events", _E1), ("gpu.events", _E2)
_COPY1 = ("gpu.events.attributed", AttributedEvent(event=_E1, job=_A))
_COPY2 = ("gpu.events.attributed", AttributedEvent(event=_E2, job=_B))
_ORDERS = {
    "jobs first (speed 5)": [_START_A, _RAW1, _COPY1, _END_A, _START_B, _RAW2, _COPY2],
    "raw XID before its job (speed 50)": [_RAW1, _START_A, _COPY1, _RAW2, _END_A, _START_B, _COPY2],
    "own view stale at the hand-over": [_START_A, _RAW1, _COPY1, _RAW2, _COPY2, _END_A, _START_B],
    "correlator copies only (in-process)": [_START_A, _COPY1, _END_A, _START_B, _COPY2],
    "second copy before the first": [_START_A, _END_A, _START_B, _RAW1, _RAW2, _COPY2, _COPY1],
}


@pytest.mark.parametrize("order", list(_ORDERS))
def test_repeat_offender_does_not_depend_on_which_copy_or_job_came_first(order: str) -> None:
    svc, out = _service()
    for topic, value in _ORDERS[order]:
        asyncio.run(svc.handle(topic, value))
    fails = out.of("failures") + svc.detector.flush()
    rep = {(f.failure_id, f.first_seen, f.job_id) for f in fails if f.pattern == "repeat-offender-gpu"}
    assert rep == {(stable_id("repeat-offender-gpu", "gpu-node-001", 1, 220.0), 220.0, "3002")}, order


def test_the_detector_s_own_stale_job_never_makes_a_repeat_offender() -> None:
    """Two application XIDs under one job (3002) right after a hand-over: the raw copy of the
    first is attributed by this detector's own view, which still holds the job that ended (3001).
    Only the correlator's jobs are counted, so there is one job and no repeat offender."""
    first = _app_xid(165.0, 13)
    copy_first = AttributedEvent(event=first, job=_B)
    svc, out = _service()
    for topic, value in [_START_A, ("gpu.events", first), _RAW2, ("gpu.events.attributed", copy_first), _COPY2,
                         _END_A, _START_B]:  # fmt: skip
        asyncio.run(svc.handle(topic, value))
    fails = out.of("failures") + svc.detector.flush()
    assert [f for f in fails if f.pattern == "xid-application-fault" and f.first_seen == 165.0]
    assert not [f for f in fails if f.pattern == "repeat-offender-gpu"]


def test_an_xid_storm_under_one_job_keeps_the_other_job_in_the_bounded_repeat_history() -> None:
    """One application XID under job A, then a storm of 600 under job B on the same GPU: one
    repeat offender opened at B's first XID that every later XID folds into, and a history
    bounded at MAX_APP_XIDS that still holds A (the oldest of the job with the most go first)."""
    from gpuwarden.detector import Detector, load_catalog
    from gpuwarden.detector.episodes import MAX_APP_XIDS

    d = Detector(load_catalog())
    out = d.on_event(AttributedEvent(event=_app_xid(100.0, 13), job=_A))
    for i in range(600):
        out += d.on_event(AttributedEvent(event=_app_xid(200.0 + i, 31), job=_B))
    out += d.flush()
    rep = [f for f in out if f.pattern == "repeat-offender-gpu"]
    assert {(f.first_seen, f.job_id) for f in rep} == {(200.0, "3002")}
    assert rep[-1].occurrences == 600
    hist = d._app_xids[("gpu-node-001", 1)]
    assert len(hist) == MAX_APP_XIDS and "3001" in {e.job_id for e in hist.values()}
