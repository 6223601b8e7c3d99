"""The detector's pending-finding stage (issue 24): one way out of the engine, where a candidate
finding is held until its explanation window has closed in event time, then emitted, folded into
the failure that explains it, or merged into a node-level finding."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.catalog import Catalog
from gpuwarden.detector.conditions import Explain
from gpuwarden.detector.pending import PendingStage
from gpuwarden.shared.models import (
    Action,
    AttributedEvent,
    AttributedSample,
    Category,
    CostEstimate,
    EventKind,
    Failure,
    FailureState,
    GpuAttribution,
    GpuEvent,
    GpuSample,
    NodeSample,
    Severity,
)

T0 = 1_700_000_000.0
JOB = GpuAttribution(gpu_index=0, job_id="77", user="alice", partition="gpu", job_gpus=8)


def gpu(i: int, **kw: Any) -> GpuSample:
    from test_detector_conditions import healthy

    return healthy(i, **kw)


def sample(node: str, ts: float, gpus: list[GpuSample]) -> AttributedSample:
    ns = NodeSample(node=node, ts=ts, collector_id="t", source="test", gpus=gpus)
    return AttributedSample(sample=ns, jobs=[JOB.model_copy(update={"gpu_index": g.index}) for g in gpus])


def xid(code: int, ts: float, node: str = "n1", gpu_index: int = 3, eid: str | None = None) -> AttributedEvent:
    ev = GpuEvent(
        event_id=eid or f"x{code}-{ts}",
        node=node,
        ts=ts,
        kind=EventKind.XID,
        code=code,
        gpu_index=gpu_index,
        message=f"test XID {code}",
        raw=f"NVRM: Xid (PCI:0000:{0x18 + gpu_index:02x}:00): {code}, test",
        source="test",
    )
    return AttributedEvent(event=ev, job=JOB.model_copy(update={"gpu_index": gpu_index}))


def published(out: list[Failure]) -> dict[str, list[Failure]]:
    ids: dict[str, list[Failure]] = {}
    for f in out:
        ids.setdefault(f.failure_id, []).append(f)
    return ids


# -- XID 79 and the gpu-missing it causes: one failure, in either order ------------------------
def _xid79_then_missing(xid_at: float, drop_at: int, seconds: int = 200) -> list[Failure]:
    d = Detector(load_catalog())
    out: list[Failure] = []
    for s in range(seconds):
        if s == int(xid_at):
            out += d.on_event(xid(79, T0 + xid_at))
        n = 7 if s >= drop_at else 8
        out += d.on_sample(sample("n1", T0 + s, [gpu(i) for i in range(n)]))
    return out + d.flush()


def test_xid79_and_its_gpu_missing_are_one_failure_whichever_comes_first() -> None:
    for xid_at, drop_at in ((50.0, 50), (50.0, 45), (58.0, 40), (30.0, 60)):
        out = _xid79_then_missing(xid_at, drop_at)
        ids = published(out)
        assert {f.pattern for f in out} == {"gpu-fallen-off-bus"}, (xid_at, drop_at, {f.pattern for f in out})
        assert len(ids) == 1
        last = out[-1]
        assert any(e.signal == "explains" and "gpu-missing" in str(e.value) for e in last.evidence)
        assert last.severity is Severity.FATAL and last.recommended_action is Action.DRAIN


def test_a_gpu_missing_with_no_xid_is_published_once_its_window_has_passed() -> None:
    out = _xid79_then_missing(10_000.0, 40, seconds=200)  # the XID never comes
    opened = [f for f in out if f.pattern == "gpu-missing" and f.state is FailureState.OPEN]
    assert opened and len({f.failure_id for f in opened}) == 1
    # detected at 40 + 10 s (for_s), held 60 s for an XID 79 in event time: out by the sample at 110
    assert opened[0].first_seen == T0 + 50


# -- memory errors ---------------------------------------------------------------------------
def test_xid94_before_or_after_xid48_folds_into_the_dbe() -> None:
    for order in ((48, 94), (94, 48)):
        d = Detector(load_catalog())
        out: list[Failure] = []
        for k, code in enumerate(order):
            out += d.on_event(xid(code, T0 + 10 + 0.1 * k))
        out += d.flush()
        assert {f.pattern for f in out} == {"uncorrectable-ecc"}, order
        assert len(published(out)) == 1
        # the XID 94 it carries tells that the error was contained: the failure no longer says it cannot
        last = out[-1]
        assert any(e.signal == "explains" and "contained-memory-error" in str(e.value) for e in last.evidence)
        assert not any(c.startswith("whether the error was contained") for c in last.cannot_determine), order
        assert any(c.startswith("whether the memory repair took effect") for c in last.cannot_determine)


def test_an_xid48_alone_still_cannot_tell_whether_it_was_contained() -> None:
    d = Detector(load_catalog())
    out = d.on_event(xid(48, T0 + 10)) + d.flush()
    assert any(c.startswith("whether the error was contained") for c in out[-1].cannot_determine)


def test_pre_a100_page_retirement_is_its_own_finding_with_nvidia_advice() -> None:
    """XID 48 + XID 63 in the 2018 driver's words: the DBE, and a page retirement pending until
    the driver reloads (a reboot): two findings, the second says so."""
    d = Detector(load_catalog())
    e48 = xid(48, T0 + 10)
    e63 = xid(63, T0 + 10.1)
    e63 = e63.model_copy(
        update={
            "event": e63.event.model_copy(
                update={
                    "message": "Dynamic Page Retirement: New page retired, reboot to activate, Page 0x1b2c",
                    "raw": "NVRM: Xid (PCI:0000:1b:00): 63, Dynamic Page Retirement: New page retired, reboot to "
                    "activate, Page 0x1b2c",
                }
            )
        }
    )
    out = d.on_event(e48) + d.on_event(e63) + d.flush()
    by = {f.pattern: f for f in out}
    assert set(by) == {"uncorrectable-ecc", "retired-pages"}
    assert by["retired-pages"].recommended_action is Action.REBOOT
    assert "reboot" in by["retired-pages"].verdict
    assert not any("A100 row" in c for c in by["uncorrectable-ecc"].cannot_determine)


def test_an_a100_row_remap_xid63_stays_with_its_error() -> None:
    d = Detector(load_catalog())
    out = d.on_event(xid(94, T0 + 10)) + d.on_event(xid(63, T0 + 10.2)) + d.flush()
    assert {f.pattern for f in out} == {"contained-memory-error"} and len(published(out)) == 1


# -- straggler and partial idle: scope -------------------------------------------------------
def test_a_throttled_gpu_is_not_also_a_straggler() -> None:
    from gpuwarden.detector.pending import _same_gpu

    a = _failure("straggler-gpu", gpu_index=3)
    b = _failure("thermal-throttle", gpu_index=3)
    c = _failure("thermal-throttle", gpu_index=4)
    assert _same_gpu(a, b) and not _same_gpu(a, c)
    stage = PendingStage()
    explain = load_catalog().explanations()
    ctx = _Ctx()
    out = stage.release([b], T0, explain, ctx) + stage.release([a], T0 + 5, explain, ctx)
    out += stage.release([], T0 + 200, explain, ctx)
    assert [f.rule_id for f in out if f.state is FailureState.OPEN] == ["thermal-throttle", "thermal-throttle"]
    assert any(e.signal == "explains" and "straggler-gpu" in str(e.value) for e in out[-1].evidence)


def test_most_gpus_of_a_node_idle_are_one_node_level_finding() -> None:
    stage = PendingStage()
    explain = load_catalog().explanations()
    ctx = _Ctx(gpus=8)
    idle = [_failure("partial-idle-allocation", gpu_index=i) for i in (4, 5, 6, 7)]
    out = stage.release(idle, T0 + 100, explain, ctx)
    [node] = out
    assert node.gpu_index is None and node.pattern == "partial-idle-allocation"
    assert any(e.signal == "gpus" and e.value == "4,5,6,7" for e in node.evidence)
    # the members resolve: the node-level finding resolves once, when the last does
    res = [m.model_copy(update={"state": FailureState.RESOLVED, "last_seen": T0 + 400}) for m in idle]
    out = stage.release(res, T0 + 400, explain, ctx)
    assert [f.state for f in out][-1] is FailureState.RESOLVED
    assert {f.failure_id for f in out} == {node.failure_id}


def test_one_idle_gpu_of_eight_stays_a_gpu_finding() -> None:
    stage = PendingStage()
    explain = load_catalog().explanations()
    out = stage.release([_failure("partial-idle-allocation", gpu_index=6)], T0 + 100, explain, _Ctx(gpus=8))
    [f] = out
    assert f.gpu_index == 6


def _idle(nodes: list[str], gpus: tuple[int, ...] = (4, 5, 6, 7), first: float = T0) -> list[Failure]:
    return [_failure("partial-idle-allocation", gpu_index=i, node=n, first=first) for n in nodes for i in gpus]


def test_most_nodes_of_a_job_idle_alike_are_one_job_level_finding() -> None:
    """Issue 24, scope aggregation: half the GPUs idle on 3 of the 4 nodes of job 77 is one
    job-level finding naming the nodes (hostlist) and their GPUs, costed over the 12 GPUs; it
    resolves once, when the last member does."""
    from gpuwarden.shared.models import stable_id

    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=4)
    idle = _idle(["gpu-node-003", "gpu-node-001", "gpu-node-002"])
    [job] = stage.release(idle, T0 + 100, explain, ctx)
    assert (job.node, job.gpu_index, job.job_id) == ("gpu-node-001", None, "77")
    assert job.failure_id == stable_id("partial-idle-allocation", "job", "77", T0)
    assert job.cost.affected_gpus == 12
    assert "gpu-node-[001-003]" in job.verdict and "4,5,6,7" in job.verdict
    ev = {(e.signal, e.source): e.value for e in job.evidence}
    assert ev[("nodes", "3 nodes, 12 GPUs of job 77")] == "gpu-node-[001-003]"
    assert ev[("gpus", "gpu-node-002")] == "4,5,6,7"
    res = [m.model_copy(update={"state": FailureState.RESOLVED, "last_seen": T0 + 400}) for m in idle]
    out = stage.release(res[:-1], T0 + 400, explain, ctx)
    assert all(f.state is FailureState.OPEN for f in out)
    out = stage.release(res[-1:], T0 + 401, explain, ctx)
    assert [(f.failure_id, f.state) for f in out] == [(job.failure_id, FailureState.RESOLVED)]


def test_a_node_that_idles_later_joins_the_open_job_level_finding() -> None:
    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=4)
    [job] = stage.release(_idle(["gpu-node-001", "gpu-node-002"]), T0 + 100, explain, ctx)
    out = stage.release(_idle(["gpu-node-004"], first=T0 + 30), T0 + 200, explain, ctx)
    assert [f.failure_id for f in out] == [job.failure_id]
    assert "gpu-node-[001-002,004]" in out[-1].verdict and out[-1].cost.affected_gpus == 12


@pytest.mark.parametrize("nodes_in_job", [4, 0])
def test_one_node_of_a_job_idle_stays_a_node_level_finding(nodes_in_job: int) -> None:
    """Below the job share (1 of 4 nodes; or the job's size unknown, one node with the finding
    is not two) the node-level group of ``aggregate: node`` applies."""
    stage, explain = PendingStage(), load_catalog().explanations()
    [node] = stage.release(_idle(["gpu-node-002"]), T0 + 100, explain, _Ctx(gpus=8, nodes=nodes_in_job))
    assert (node.node, node.gpu_index) == ("gpu-node-002", None)
    assert not any(e.signal == "nodes" for e in node.evidence)


def test_a_jobs_end_resolves_its_job_level_finding_once() -> None:
    """Every member of a 200-node job-level failure resolves in one release (the job ended): the
    resolved publication (and at most one throttled update), not one per member (helper review:
    2,000 publications and 20 s of a blocked loop for a 500-node job)."""
    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=200)
    idle = _idle([f"gpu-node-{i:03d}" for i in range(200)])
    [job] = stage.release(idle, T0 + 100, explain, ctx)
    res = [m.model_copy(update={"state": FailureState.RESOLVED, "last_seen": T0 + 400}) for m in idle]
    out = stage.release(res, T0 + 400, explain, ctx)
    # at most the throttled update the first member's newer last_seen allows, then the end
    assert len(out) <= 2 and {f.failure_id for f in out} == {job.failure_id}
    assert out[-1].state is FailureState.RESOLVED


def test_a_group_that_ended_while_held_publishes_its_open_first() -> None:
    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=2)
    idle = _idle(["gpu-node-001", "gpu-node-002"])
    res = [m.model_copy(update={"state": FailureState.RESOLVED, "last_seen": T0 + 20}) for m in idle]
    out = stage.release(idle + res, T0 + 100, explain, ctx)
    assert [f.state for f in out] == [FailureState.OPEN, FailureState.RESOLVED]
    assert len({f.failure_id for f in out}) == 1


def test_a_job_level_finding_keeps_its_node_and_a_node_below_the_share_stands_apart() -> None:
    """``failures`` is keyed by node: a node that sorts first joining later does not move the
    failure to another key; a node with one idle GPU of eight gets a finding of its own."""
    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=4)
    [job] = stage.release(_idle(["gpu-node-002", "gpu-node-003"]), T0 + 100, explain, ctx)
    assert job.node == "gpu-node-002"
    lone = _idle(["gpu-node-004"], gpus=(7,), first=T0 + 10)
    out = stage.release(_idle(["gpu-node-001"], first=T0 + 10) + lone, T0 + 200, explain, ctx)
    grouped = [f for f in out if f.failure_id == job.failure_id]
    assert grouped and all(f.node == "gpu-node-002" for f in grouped)
    assert "gpu-node-[001-003]" in grouped[-1].verdict
    assert [(f.node, f.gpu_index) for f in out if f.failure_id != job.failure_id] == [("gpu-node-004", 7)]


def test_a_job_level_aggregate_is_refused_on_a_rule_that_acts_on_a_node() -> None:
    from pydantic import ValidationError

    from gpuwarden.detector.conditions import ConditionRule

    rule = next(r for r in load_catalog().conditions if r.id == "partial-idle-allocation")
    with pytest.raises(ValidationError, match="aggregate job needs action alert or none"):
        ConditionRule.model_validate({**rule.model_dump(), "action": "drain"})


# -- the property: no "resolved" without its "open", nothing out for what was folded ------------
class _Ctx:
    def __init__(self, gpus: int = 8, nodes: int = 1) -> None:
        self.gpus = gpus
        self.nodes = nodes
        self.d = Detector(load_catalog())

    def gpus_in_job(self, node: str, job_id: str | None) -> int:
        return self.gpus

    def nodes_in_job(self, job_id: str) -> int:
        return self.nodes

    def job_start(self, job_id: str | None) -> float | None:
        return T0  # candidates of a rule with startup_s near T0 are held for the start-up

    def aggregate(self, members: list[Failure], state: FailureState, scope: str = "node") -> Failure:
        return self.d.aggregate(members, state, scope)


def _failure(
    rule_id: str,
    gpu_index: int | None = 3,
    first: float = T0,
    last: float | None = None,
    state: FailureState = FailureState.OPEN,
    node: str = "n1",
) -> Failure:
    from gpuwarden.shared.models import stable_id

    return Failure(
        failure_id=stable_id(rule_id, node, gpu_index, first),
        pattern=_PATTERNS.get(rule_id, "xid-other"),
        rule_id=rule_id,
        category=Category.HARDWARE,
        severity=Severity.WARNING,
        node=node,
        gpu_index=gpu_index,
        job_id="77",
        first_seen=first,
        last_seen=last if last is not None else first,
        state=state,
        occurrences=1,
        evidence=[],
        verdict=f"{rule_id} on GPU {gpu_index} (x=1)",
        cannot_determine=[],
        recommended_action=Action.ALERT,
        cost=CostEstimate(affected_gpus=1, usd_per_hour=1.0, gpu_hours_lost=0.0),
    )


_CATALOG: Catalog = load_catalog()
_PATTERNS = {r.id: r.pattern for r in [*_CATALOG.conditions, *_CATALOG.rules]}
_RULES = [
    "xid-48-double-bit-ecc",
    "xid-94-contained-memory-error",
    "row-remap-pending",
    "ecc-dbe-counter",
    "xid-79-fallen-off-bus",
    "gpu-missing",
    "straggler-gpu",
    "straggler-node",
    "thermal-throttle",
    "partial-idle-allocation",
    "zombie-process",
]

_step = st.tuples(
    st.sampled_from(_RULES),
    st.sampled_from([None, 0, 3, 4, 5]),
    st.integers(0, 400),  # first_seen offset, s
    st.integers(0, 200),  # duration, s
    st.booleans(),  # resolved
    st.integers(0, 60),  # clock advance before it, s
    st.sampled_from(["n1", "n2", "n3"]),  # node: job-level groups need two nodes or more
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, min_size=1, max_size=30))
def test_no_resolved_without_its_open_and_nothing_for_a_folded_candidate(steps: list[tuple]) -> None:
    stage = PendingStage()
    explain: dict[str, Explain] = _CATALOG.explanations()
    ctx = _Ctx(gpus=2, nodes=3)
    clock = T0
    out: list[Failure] = []
    for rule_id, g, off, dur, resolved, adv, node in steps:
        clock += adv
        first = T0 + off
        opened = _failure(rule_id, g, first, first + dur, node=node)
        batch = [opened]
        if resolved:
            batch.append(opened.model_copy(update={"state": FailureState.RESOLVED}))
        out += stage.release(batch, clock, explain, ctx)
    out += stage.release([], clock, explain, ctx, final=True)
    seen_open: set[str] = set()
    for f in out:
        if f.state is FailureState.OPEN:
            seen_open.add(f.failure_id)
        else:
            assert f.failure_id in seen_open, f"resolved {f.rule_id} {f.failure_id} never published open"
    assert not (set(stage.folded) & {f.failure_id for f in out}), "a folded candidate was published"
    assert not stage.held  # the end of the stream decides everything


def test_every_explain_block_names_known_rules_and_no_cycle() -> None:
    import pytest

    from gpuwarden.detector.catalog import CatalogError

    ex = _CATALOG.explanations()
    assert ex["gpu-missing"].by == ["xid-79-fallen-off-bus"] and ex["gpu-missing"].scope == "node"
    assert ex["partial-idle-allocation"].aggregate == "job"
    text = (
        "version: 1\nrules:\n"
        "  - {id: a, pattern: xid-other, category: driver, severity: warning, action: alert, verdict: x,\n"
        "     match: {event: xid, codes: [1]}, explain: {by: [b]}}\n"
        "  - {id: b, pattern: xid-other, category: driver, severity: warning, action: alert, verdict: x,\n"
        "     match: {event: xid, codes: [2]}, explain: {by: [a]}}\n"
    )
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write(text)
    with pytest.raises(CatalogError, match="cycle"):
        load_catalog(fh.name)


def test_with_an_event_lane_a_candidate_waits_until_that_lane_has_read_its_window() -> None:
    """The services read events on a lane of their own: one fetch of samples may span more event
    time than a window (at 50x), so the sample watermark alone would decide gpu-missing before the
    event lane has handed over the XID 79 that explains it."""
    d = Detector(load_catalog())
    d.track_event_lane()
    out: list[Failure] = []
    for s in range(200):  # the sample lane runs far ahead: GPU 7 gone from s=40
        out += d.on_sample(sample("n1", T0 + s, [gpu(i) for i in range(7 if s >= 40 else 8)]))
    assert out == []  # gpu-missing is held: the event lane has not been read past its window
    out += d.on_event(xid(79, T0 + 40.5, gpu_index=7))  # the event lane's XID, late in wall time
    out += d.event_lane_caught_up()
    assert {f.pattern for f in out} == {"gpu-fallen-off-bus"} and len(published(out)) == 1
    assert any(e.signal == "explains" and "gpu-missing" in str(e.value) for e in out[-1].evidence)


def _idle_jobs(jobs: int, nodes: int = 4) -> list[Failure]:
    """One idle GPU on each of ``nodes`` nodes of each of ``jobs`` jobs (none reaches a share: every
    one stands apart), first seen one after the other."""
    out = []
    for j in range(jobs):
        for n in range(nodes):
            f = _failure("partial-idle-allocation", gpu_index=n, node=f"gpu-node-{j * nodes + n:04d}",
                         first=T0 + 0.01 * (j * nodes + n))  # fmt: skip
            out.append(f.model_copy(update={"job_id": str(1000 + j)}))
    return out


def test_held_candidates_of_many_jobs_are_decided_once_each_in_deadline_order() -> None:
    """The stage keeps what it holds by deadline and by (rule, job): a large fault holds thousands
    (it scanned every held candidate per input record and per decision: quadratic)."""
    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=4)
    held = _idle_jobs(200)
    assert stage.release(held, T0, explain, ctx) == []
    window = explain["partial-idle-allocation"].window_s
    first = stage.release([], T0 + window + 0.005, explain, ctx)  # the first job's first candidate only
    assert [f.failure_id for f in first] == [held[0].failure_id]
    rest = stage.release([], T0 + window + 100, explain, ctx)
    assert [f.failure_id for f in rest] == [f.failure_id for f in held[1:]]
    assert not stage.held and stage.release([], T0 + window + 200, explain, ctx) == []


def test_a_stage_from_a_snapshot_without_its_indexes_decides_the_same() -> None:
    """A state file written before the deadline heap and the (rule, job) index: both are built from
    what is held, and a held candidate whose job became known moves in the index."""
    explain, ctx = load_catalog().explanations(), _Ctx(gpus=8, nodes=4)
    results = []
    for old in (False, True):
        stage = PendingStage()
        stage.release(_idle(["gpu-node-001", "gpu-node-002"]) + _idle_jobs(3), T0, explain, ctx)
        if old:
            del stage.__dict__["deadlines"], stage.__dict__["held_index"]
        results.append([(f.failure_id, f.node, f.gpu_index) for f in stage.release([], T0 + 500, explain, ctx)])
    assert results[0] == results[1] and len(results[0]) == 13  # the job-77 group and 12 GPU findings
    stage = PendingStage()
    nojob = _failure("partial-idle-allocation", gpu_index=1, node="gpu-node-009").model_copy(update={"job_id": None})
    stage.release([nojob], T0, explain, ctx)
    stage.release([nojob.model_copy(update={"job_id": "77", "last_seen": T0 + 1})], T0 + 1, explain, ctx)
    assert list(stage._index()) == [("partial-idle-allocation", "77")]


def test_a_node_level_finding_is_handed_over_when_the_job_level_one_forms() -> None:
    """Issue 24: one node of job 77 idles first (a node-level finding: 1 of 4 nodes); two more
    follow within the window. They make a job-level finding that takes the first node over: the
    node-level finding ends with a ``handed over`` evidence naming it, its GPUs are the job-level
    finding's (costed, named), and its members' later versions go there."""
    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=4)
    first = _idle(["gpu-node-001"])
    [node] = stage.release(first, T0 + 100, explain, ctx)
    assert (node.node, node.gpu_index, node.state) == ("gpu-node-001", None, FailureState.OPEN)
    out = stage.release(_idle(["gpu-node-002", "gpu-node-003"], first=T0 + 30), T0 + 200, explain, ctx)
    assert [(f.failure_id == node.failure_id, f.state) for f in out] == [
        (False, FailureState.OPEN), (True, FailureState.RESOLVED)]  # fmt: skip
    job, ended = out
    assert job.gpu_index is None and "gpu-node-[001-003]" in job.verdict and job.cost.affected_gpus == 12
    assert [(e.signal, e.source) for e in ended.evidence if e.signal == "handed over"] == [
        ("handed over", job.failure_id)]  # fmt: skip
    assert stage.open_ids() == {job.failure_id}
    # node 001's GPUs end: the job-level failure carries it; the node-level one stays ended
    res = [m.model_copy(update={"state": FailureState.RESOLVED, "last_seen": T0 + 400}) for m in first]
    out = stage.release(res, T0 + 400, explain, ctx)
    assert {f.failure_id for f in out} <= {job.failure_id}
    rest = [m.model_copy(update={"state": FailureState.RESOLVED, "last_seen": T0 + 500})
            for m in _idle(["gpu-node-002", "gpu-node-003"], first=T0 + 30)]  # fmt: skip
    out = stage.release(rest, T0 + 500, explain, ctx)
    assert [(f.failure_id, f.state) for f in out][-1] == (job.failure_id, FailureState.RESOLVED)
    assert stage.open_ids() == set()


def test_a_node_level_finding_outside_the_window_is_not_handed_over() -> None:
    stage, explain, ctx = PendingStage(), load_catalog().explanations(), _Ctx(gpus=8, nodes=4)
    [node] = stage.release(_idle(["gpu-node-001"]), T0 + 100, explain, ctx)
    # node 001's finding's span ends at T0 (its members' last_seen); T0 + 600 is past the 60 s window
    out = stage.release(_idle(["gpu-node-002", "gpu-node-003"], first=T0 + 600), T0 + 800, explain, ctx)
    assert [f.state for f in out] == [FailureState.OPEN] and out[0].failure_id != node.failure_id
    assert stage.open_ids() == {node.failure_id, out[0].failure_id}
