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


def test_event_without_job_is_attributed_from_last_sample_and_says_what_it_cannot_tell() -> None:
    d = Detector(load_catalog())
    sample = NodeSample(
        node="gpu-node-002",
        ts=990.0,
        collector_id="c",
        source="test",
        gpus=[GpuSample(index=3, uuid="GPU-abc", pci_bus_id="0000:44:00.0")],
    )
    d.on_sample(AttributedSample(sample=sample, jobs=[JOB]))
    [f] = d.on_event(AttributedEvent(event=event(79, 1000.0)))
    assert f.job_id == "1001" and f.gpu_uuid == "GPU-abc"
    [g] = Detector(load_catalog()).on_event(AttributedEvent(event=event(79, 1000.0, node="gpu-node-009")))
    assert g.job_id is None and g.cost.affected_gpus == 1
    assert any("which job" in c for c in g.cannot_determine)


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
