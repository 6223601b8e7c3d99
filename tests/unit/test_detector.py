"""Detector: catalog loading and the XID rules of the thin path, on real kernel-log lines."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuwarden.detector import CatalogError, Detector, load_catalog
from gpuwarden.detector.catalog import load_xid_table
from gpuwarden.shared.models import (
    Action,
    AttributedEvent,
    AttributedSample,
    EventKind,
    GpuAttribution,
    GpuEvent,
    GpuSample,
    JobState,
    NodeSample,
    Severity,
    stable_id,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
XID79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"  # fixtures/xid-logs/xid79-fallen-off-bus-short


def event(code: int, ts: float, gpu: int | None = 3, node: str = "gpu-node-002", raw: str = XID79) -> GpuEvent:
    return GpuEvent(
        event_id=stable_id(node, ts, code, raw),
        node=node,
        ts=ts,
        kind=EventKind.XID,
        code=code,
        gpu_index=gpu,
        pci_bus_id="0000:44:00.0",
        message="GPU has fallen off the bus",
        raw=raw,
        source="test",
    )


JOB = GpuAttribution(gpu_index=3, job_id="1001", user="user1", partition="gpu", job_start_ts=0.0, job_gpus=32)


def test_shipped_catalog_loads_and_covers_thin_path_xids() -> None:
    cat = load_catalog()
    assert {c for r in cat.rules for c in r.match.codes} >= {79, 48, 94, 95, 119}
    assert cat.for_event("xid", 79).pattern == "gpu-fallen-off-bus"
    assert cat.for_event("xid", 13).pattern == "xid-application-fault"
    assert cat.for_event("xid", 99999).pattern == "xid-other"  # unknown codes are never ignored


BAD_CATALOGS = sorted((FIX / "catalog").glob("bad_*.yaml"))


def test_bad_catalog_examples_exist() -> None:
    assert len(BAD_CATALOGS) >= 3, f"bad_*.yaml examples missing in {FIX / 'catalog'}"


@pytest.mark.parametrize("path", BAD_CATALOGS, ids=lambda p: p.stem)
def test_bad_catalogs_fail_at_load(path: Path) -> None:
    with pytest.raises(CatalogError):
        load_catalog(path)


def test_xid79_with_job_gives_fatal_drain_failure_with_job_cost() -> None:
    d = Detector(load_catalog(), price_usd_per_gpu_hour=3.26)
    [f] = d.on_event(AttributedEvent(event=event(79, 1000.0), job=JOB))
    assert (f.pattern, f.node, f.gpu_index, f.job_id, f.user) == (
        "gpu-fallen-off-bus",
        "gpu-node-002",
        3,
        "1001",
        "user1",
    )
    assert f.severity is Severity.FATAL and f.recommended_action is Action.DRAIN
    assert f.cost.affected_gpus == 32 and f.cost.usd_per_hour == pytest.approx(32 * 3.26)
    assert f.evidence[0].value == 79 and f.evidence[0].source == XID79
    assert "job 1001" in f.verdict and f.first_seen == 1000.0
    assert f.failure_id == stable_id("xid-79-fallen-off-bus", "gpu-node-002", 3, 1000.0)


def test_repeats_within_burst_window_fold_into_one_episode() -> None:
    d = Detector(load_catalog(), update_interval_s=30)
    [first] = d.on_event(AttributedEvent(event=event(79, 1000.0), job=JOB))
    assert d.on_event(AttributedEvent(event=event(79, 1010.0), job=JOB)) == []  # quiet: within update interval
    [upd] = d.on_event(AttributedEvent(event=event(79, 1040.0), job=JOB))
    assert upd.failure_id == first.failure_id and upd.occurrences == 3 and upd.last_seen == 1040.0
    assert upd.cost.gpu_hours_lost == pytest.approx(32 * 40 / 3600, rel=1e-4)
    [new] = d.on_event(AttributedEvent(event=event(79, 1040.0 + 3601), job=JOB))  # past XID 79's sticky hour
    assert new.failure_id != first.failure_id
    d48 = Detector(load_catalog())
    [a] = d48.on_event(AttributedEvent(event=event(48, 1000.0), job=JOB))
    [b] = d48.on_event(AttributedEvent(event=event(48, 1181.0), job=JOB))  # past the 180 s burst window
    assert a.failure_id != b.failure_id


def test_redelivered_event_does_not_open_a_new_failure() -> None:
    d = Detector(load_catalog())
    e = AttributedEvent(event=event(79, 1000.0), job=JOB)
    assert len(d.on_event(e)) == 1
    assert d.on_event(e) == []


def running_job(ts: float = 990.0) -> JobState:
    return JobState(
        job_id="1001",
        ts=ts,
        state="RUNNING",
        user="user1",
        partition="gpu",
        nodes=["gpu-node-002", "gpu-node-003"],
        gpus={"gpu-node-002": [0, 1, 2, 3], "gpu-node-003": [0]},
        start_ts=900.0,
    )


def test_event_without_job_is_attributed_from_slurm_jobs_and_sample_identity() -> None:
    d = Detector(load_catalog())
    sample = NodeSample(
        node="gpu-node-002",
        ts=990.0,
        collector_id="c",
        source="test",
        gpus=[GpuSample(index=3, uuid="GPU-abc", pci_bus_id="0000:44:00.0")],
    )
    d.on_sample(AttributedSample(sample=sample, jobs=[]))
    assert d.on_job(running_job()) == []  # nothing open to explain yet
    [f] = d.on_event(AttributedEvent(event=event(79, 1000.0)))
    assert (f.job_id, f.user, f.gpu_uuid, f.cost.affected_gpus) == ("1001", "user1", "GPU-abc", 5)
    [g] = Detector(load_catalog()).on_event(AttributedEvent(event=event(79, 1000.0, node="gpu-node-009")))
    assert g.job_id is None and g.cost.affected_gpus == 1
    assert any("which job" in c for c in g.cannot_determine)


def test_job_arriving_after_the_event_enriches_the_same_failure() -> None:
    """Arrival order must not change the outcome (a replay at any speed gives the same failures)."""
    d = Detector(load_catalog())
    [early] = d.on_event(AttributedEvent(event=event(79, 1000.0)))
    assert early.job_id is None
    [late] = d.on_job(running_job(ts=1005.0))
    assert late.failure_id == early.failure_id and late.job_id == "1001" and late.cost.affected_gpus == 5
    assert not any("which job" in c for c in late.cannot_determine)
    in_order = Detector(load_catalog())
    in_order.on_job(running_job(ts=1005.0))
    [f] = in_order.on_event(AttributedEvent(event=event(79, 1000.0)))
    assert f == late
    assert d.on_job(running_job(ts=1006.0)) == []  # already explained: nothing re-emitted


def test_job_that_started_after_the_event_does_not_claim_it() -> None:
    d = Detector(load_catalog())
    d.on_event(AttributedEvent(event=event(79, 800.0)))
    assert d.on_job(running_job()) == []  # started at 900 s, the XID was at 800 s


@pytest.mark.parametrize(
    ("code", "pattern", "action"),
    [
        (48, "uncorrectable-ecc", Action.RESET_GPU),
        (94, "contained-memory-error", Action.RESTART_JOB),
        (95, "uncontained-memory-error", Action.DRAIN),
        (119, "gsp-firmware-error", Action.DRAIN),
    ],
)
def test_other_thin_path_xids(code: int, pattern: str, action: Action) -> None:
    d = Detector(load_catalog())
    # XID 94 waits in the pending stage for an XID 48 it may be part of: the stream's end decides
    [f] = d.on_event(AttributedEvent(event=event(code, 5.0), job=JOB)) + d.flush()
    assert f.pattern == pattern and f.recommended_action is action


def test_unknown_xid_is_reported_as_xid_other() -> None:
    [f] = Detector(load_catalog()).on_event(AttributedEvent(event=event(4242, 5.0), job=JOB))
    assert f.pattern == "xid-other" and f.recommended_action is Action.ALERT


REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "xid_catalog.csv"


def test_every_documented_xid_maps_to_a_pattern_and_action() -> None:
    table = load_xid_table()
    assert len(table) == 172
    if REFERENCE.exists():  # ../shared beside the checkout (developers and CI have it)
        with REFERENCE.open() as fh:
            assert {int(r["xid"]) for r in csv.DictReader(fh)} == set(table)
    cat = load_catalog()
    for code, entry in table.items():
        rule = cat.for_event("xid", code)
        assert rule.pattern == entry.pattern, code  # explicit YAML rules agree with the table
        assert code in rule.match.codes


def lines_to_events(name: str) -> list[AttributedEvent]:
    from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line

    text = (FIX / "xid-logs" / f"{name}.txt").read_text()
    events = [parse_kernel_log_line(line, "gpu-node-001", 0.0) for line in text.splitlines()]
    return [AttributedEvent(event=e) for e in events if e is not None]


def test_real_sm_warp_exception_burst_is_two_application_incidents_and_no_drain() -> None:
    """fixtures/xid-logs/xid13-43-sm-warp-exception-burst: XID 13 flood + XID 43 = at most 2 incidents."""
    d = Detector(load_catalog())
    out = [f for e in lines_to_events("xid13-43-sm-warp-exception-burst") for f in d.on_event(e)]
    ids = {f.failure_id for f in out}
    assert len(ids) <= 2 * 3  # three bursts in the capture, at most 13-flood + 43 each
    first_burst = {f.rule_id for f in out if f.first_seen == out[0].first_seen}
    assert first_burst <= {"xid-13", "xid-43"}
    assert all(f.pattern == "xid-application-fault" for f in out)
    assert all(f.recommended_action in (Action.RESTART_JOB, Action.NONE) for f in out)


def test_real_dbe_row_remap_contained_sequence() -> None:
    """fixtures/xid-logs/xid48-63-94-dbe-row-remap-sequence: the DBE (48), its row remap (63) and its
    containment (94) are one root cause: one critical failure with all three as evidence."""
    d = Detector(load_catalog())
    out = [f for e in lines_to_events("xid48-63-94-dbe-row-remap-sequence") for f in d.on_event(e)] + d.flush()
    assert {f.pattern for f in out} == {"uncorrectable-ecc"} and len({f.failure_id for f in out}) == 1
    assert out[0].severity is Severity.CRITICAL
    # the row remap (63) and the containment (94) are the DBE's evidence, named as what it explains
    assert {e.value for e in out[-1].evidence} >= {48, 63, 94}
    explains = {str(e.value) for e in out[-1].evidence if e.signal == "explains"}
    assert any("xid-63" in x for x in explains) and any("xid-94" in x for x in explains)


def test_sticky_xid_repeats_within_an_hour_are_one_episode() -> None:
    d = Detector(load_catalog())
    [a] = d.on_event(AttributedEvent(event=event(79, 1000.0), job=JOB))
    later = d.on_event(AttributedEvent(event=event(79, 1000.0 + 1800, raw=XID79 + " "), job=JOB))
    assert all(f.failure_id == a.failure_id for f in later)


def test_secondary_xid_naming_its_cause_is_folded_into_the_cause() -> None:
    d = Detector(load_catalog())
    [cause] = d.on_event(AttributedEvent(event=event(79, 1000.0), job=JOB))
    sec = event(45, 1001.0, raw="NVRM: Xid (PCI:0000:44:00): 45, preemptive cleanup, due to previous Xid 79")
    sec = sec.model_copy(update={"caused_by_xid": 79})
    assert d.on_event(AttributedEvent(event=sec, job=JOB)) == []  # folded, within the update interval
    assert d.episodes[(cause.rule_id, "gpu-node-002", 3)].occurrences == 2


def test_application_xids_on_one_gpu_under_two_jobs_make_a_repeat_offender() -> None:
    d = Detector(load_catalog())
    other = JOB.model_copy(update={"job_id": "2002"})
    first = d.on_event(AttributedEvent(event=event(13, 1000.0), job=JOB))
    assert [f.pattern for f in first] == ["xid-application-fault"]  # the job's fault so far
    second = d.on_event(AttributedEvent(event=event(31, 5000.0, raw="x"), job=other))
    patterns = sorted(f.pattern for f in second)
    assert patterns == ["repeat-offender-gpu", "xid-application-fault"]
    rep = next(f for f in second if f.pattern == "repeat-offender-gpu")
    assert rep.recommended_action is Action.DRAIN and "1001" in rep.verdict and "2002" in rep.verdict
    later = d.on_event(AttributedEvent(event=event(13, 5000.0 + 90000, raw="y"), job=other))
    assert "repeat-offender-gpu" not in {f.pattern for f in later}  # the first job is out of the 24 h window
