"""Detector: catalog loading and the XID rules of the thin path, on real kernel-log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.detector import CatalogError, Detector, load_catalog
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
    assert cat.for_event("xid", 13) is None


@pytest.mark.parametrize("path", sorted((FIX / "catalog").glob("bad_*.yaml")), ids=lambda p: p.stem)
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
    [new] = d.on_event(AttributedEvent(event=event(79, 1040.0 + 181), job=JOB))  # past the 180 s burst window
    assert new.failure_id != first.failure_id


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
    [f] = Detector(load_catalog()).on_event(AttributedEvent(event=event(code, 5.0), job=JOB))
    assert f.pattern == pattern and f.recommended_action is action


def test_unmatched_xid_yields_nothing() -> None:
    assert Detector(load_catalog()).on_event(AttributedEvent(event=event(13, 5.0), job=JOB)) == []
