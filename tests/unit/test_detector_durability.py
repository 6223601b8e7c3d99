"""Detector under faults (issue 13, points 6 and 7): bounded event time, state across restarts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuwarden.detector.service import DetectorService, DetectorSettings
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.eventtime import EventTimeGuard
from gpuwarden.shared.models import (
    AttributedSample,
    Failure,
    FailureState,
    GpuAttribution,
    GpuSample,
    NodeSample,
)

T0 = 1_700_000_000.0
JOB = GpuAttribution(gpu_index=0, job_id="77", user="alice", partition="gpu", job_start_ts=T0 - 600, job_gpus=16)


def gpu(i: int) -> GpuSample:
    return GpuSample(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", utilization_gpu_pct=96.0,
                     memory_used_mib=70_000.0, memory_total_mib=81_559.0, temperature_c=66.0, power_w=640.0,
                     power_limit_w=700.0, sm_clock_mhz=1980.0, max_sm_clock_mhz=1980.0)  # fmt: skip


def sample(node: str, ts: float, n: int = 8) -> AttributedSample:
    s = NodeSample(node=node, ts=ts, collector_id="t", source="test", gpus=[gpu(i) for i in range(n)])
    return AttributedSample(sample=s, jobs=[JOB.model_copy(update={"gpu_index": i}) for i in range(n)])


def service(tmp: Path | None = None, **kw: Any) -> tuple[DetectorService, MemoryPublisher]:
    prod = MemoryPublisher()
    s = DetectorSettings(detector_state_file=tmp, **kw)  # type: ignore[arg-type]
    return DetectorService(s, producer=prod), prod  # type: ignore[arg-type]


async def feed(svc: DetectorService, seconds: range, missing_from: int = 20, missing_to: int = 60) -> None:
    for s in seconds:
        for node in ("n1", "n2"):
            n = 7 if node == "n1" and missing_from <= s < missing_to else 8
            await svc.handle("gpu.attributed", sample(node, T0 + s, n))


def opened(prod: MemoryPublisher, pattern: str) -> list[Failure]:
    return [f for f in prod.of("failures") if f.pattern == pattern and f.state is FailureState.OPEN]


def test_guard_bounds() -> None:
    g = EventTimeGuard(max_ahead_s=86400, max_behind_s=365 * 86400, wall=lambda: T0)
    assert g.check(T0) == T0
    for bad in (1e308, math.inf, math.nan, T0 + 2 * 86400, T0 - 400 * 86400):
        with pytest.raises(ValueError):
            g.check(bad)
    assert g.watermark == T0 and g.rejected == 5
    assert g.check(T0 - 3600) == T0 - 3600 and g.watermark == T0  # late but in bounds: kept, no move


async def test_a_poisoned_timestamp_is_rejected_and_does_not_move_the_watermark() -> None:
    svc, prod = service()
    await feed(svc, range(0, 10), missing_from=10**9)
    with pytest.raises(ValueError, match="less than or equal"):
        sample("n1", 1e308)  # the schema itself refuses it (models.MAX_EVENT_TS)
    with pytest.raises(ValueError, match="ahead"):
        await svc.handle("gpu.attributed", sample("n1", 4.0e9))  # in the schema, 2096: the guard refuses it
    assert svc.durable.guard.watermark == T0 + 9
    await feed(svc, range(10, 120), missing_from=10**9)
    # no node looks silent: the watermark never jumped
    assert [f.pattern for f in prod.of("failures")] == []


async def test_a_condition_that_was_opening_opens_once_after_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "detector.state"
    a, pa = service(state)
    # GPU 7 of n1 gone since s=20; gpu-missing opens at s=30 and is published once the pending
    # stage's 60 s for an XID 79 explaining it have passed (s=90)
    await feed(a, range(0, 25))
    assert opened(pa, "gpu-missing") == []
    a.durable.save()  # what the commit hook writes; then kill -9
    b, pb = service(state)
    assert b.durable.restored
    await feed(b, range(25, 100))
    assert len(opened(pb, "gpu-missing")) == 1
    # without the state the restarted detector never learns the node had 8 GPUs
    c, pc = service(None)
    await feed(c, range(25, 100))
    assert opened(pc, "gpu-missing") == []


async def test_an_open_condition_is_not_opened_twice_after_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "detector.state"
    a, pa = service(state)
    await feed(a, range(0, 100), missing_to=200)
    (first,) = opened(pa, "gpu-missing")
    a.durable.save()
    b, pb = service(state)
    await feed(b, range(95, 300), missing_to=200)  # redelivered records after the last commit, then on
    # updates of the same failure only, never a second one
    assert {f.failure_id for f in opened(pb, "gpu-missing")} <= {first.failure_id}
    resolved = [f for f in pb.of("failures") if f.pattern == "gpu-missing" and f.state is FailureState.RESOLVED]
    assert [f.failure_id for f in resolved] == [first.failure_id]


async def test_commit_waits_for_a_state_write(tmp_path: Path) -> None:
    state = tmp_path / "detector.state"
    a, _ = service(state, detector_state_interval_s=3600)
    assert await a.durable.before_commit(False) is True and state.exists()  # first write is due
    assert await a.durable.before_commit(False) is False  # not due: commit deferred
    assert await a.durable.before_commit(True) is True and a.durable.writes == 2


def test_a_bad_state_file_starts_empty(tmp_path: Path) -> None:
    state = tmp_path / "detector.state"
    state.write_bytes(b"not a snapshot")
    svc, _ = service(state)
    assert not svc.durable.restored and svc.detector.episodes == {}


def test_a_restart_with_an_edited_threshold_uses_the_new_catalog(tmp_path: Path) -> None:
    """The state file holds state, never the catalog or what is derived from it: a threshold
    edited between two runs (same rule ids) is the one the restarted detector applies."""

    from gpuwarden.detector import Detector, load_catalog
    from gpuwarden.detector.catalog import __file__ as catalog_py

    shipped = Path(catalog_py).with_name("catalog.yaml").read_text()
    old = "signal: {type: counter-rate, field: ecc_sbe_volatile, min_per_min: 10}"
    assert old in shipped
    edited_path = tmp_path / "catalog.yaml"
    edited_path.write_text(shipped.replace(old, old.replace("min_per_min: 10", "min_per_min: 1000")))
    snap = Detector(load_catalog()).snapshot()  # taken before the edit
    state = orjson.loads(snap)["state"]
    assert not {"catalog", "_conditions", "_by_scope", "_job_rules", "_gpu_rules"} & set(state)

    def storms(d: Detector) -> list[str]:
        out: list[str] = []
        for i in range(200):  # 120 corrected errors per minute: a storm at 10/min, not at 1000/min
            s = NodeSample(node="n1", ts=T0 + i * 5, collector_id="t", source="test",
                           gpus=[GpuSample(index=0, ecc_sbe_volatile=i * 10)])  # fmt: skip
            out += [f.pattern for f in d.on_sample(AttributedSample(sample=s, jobs=[]))]
        return out

    assert "correctable-ecc-storm" in storms(Detector(load_catalog()))
    restored = Detector(load_catalog(edited_path))
    restored.restore(snap)
    assert storms(restored) == []


class _Boom:
    """A pickle that would run ``os.system`` when loaded by a plain unpickler (the format of
    version 1 of the state file)."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return (os.system, ("touch /tmp/gpuwarden-pwned",))


def _state_naming(cls: str, kind: str = "object") -> bytes:
    from gpuwarden.detector import Detector, load_catalog
    from gpuwarden.detector.snapshot import FORMAT, VERSION

    d = Detector(load_catalog())
    ids = sorted(d._conditions) + sorted(r.id for r in d.catalog.rules)
    x = {"$id": 0, "$o": {"args": "touch /tmp/gpuwarden-pwned"}, "$c": cls, "kind": kind}
    return orjson.dumps({"format": FORMAT, "version": VERSION, "rules": ids, "state": {"x": x}})


@pytest.mark.parametrize(
    "payload", ["pickle running os.system", "os:system", "builtins:eval", "a gpuwarden function", "subprocess:Popen"]
)
def test_a_state_file_that_names_code_is_refused_and_runs_nothing(tmp_path: Path, payload: str) -> None:
    """Issue 25: whoever can write the state file cannot run code as the detector: the file is
    JSON (a pickle, even one of the old format, is refused unread), and the classes it may name
    are the detector's state classes only."""
    import pickle

    path = tmp_path / "state.json"
    if payload.startswith("pickle"):
        path.write_bytes(pickle.dumps((1, [], {"x": _Boom()})))
        match = "not JSON"
    elif payload == "a gpuwarden function":
        path.write_bytes(_state_naming("gpuwarden.detector.catalog:load_catalog"))
        match = "not a class"
    else:
        path.write_bytes(_state_naming(payload))
        match = "refused"
    svc, _ = service(path)
    assert not svc.durable.restored and not Path("/tmp/gpuwarden-pwned").exists()
    assert svc.detector.episodes == {}
    with pytest.raises(ValueError, match=match):
        svc.detector.restore(path.read_bytes())


def test_adopt_takes_back_open_event_failures_only() -> None:
    """Detector.adopt (a lost state file, issue 25): an open XID failure is its episode again; a
    resolved one, a condition's, an unknown rule's or one already known is not."""
    from gpuwarden.detector import Detector, load_catalog
    from gpuwarden.shared.models import AttributedEvent, EventKind, FailureState, GpuEvent

    raw = "NVRM: Xid (PCI:0000:44:00): 79, pid=1, GPU has fallen off the bus."
    ev = GpuEvent(event_id="e1", node="n1", ts=T0, kind=EventKind.XID, code=79, gpu_index=2, raw=raw, source="t")
    [f] = Detector(load_catalog()).on_event(AttributedEvent(event=ev))
    d = Detector(load_catalog())
    assert not d.adopt(f.model_copy(update={"state": FailureState.RESOLVED}))
    assert not d.adopt(f.model_copy(update={"rule_id": "no-such-rule"}))
    assert d.adopt(f) and not d.adopt(f)  # once
    [again] = d.on_event(AttributedEvent(event=ev.model_copy(update={"event_id": "e2", "ts": T0 + 300})))
    assert again.failure_id == f.failure_id and again.occurrences == 2
