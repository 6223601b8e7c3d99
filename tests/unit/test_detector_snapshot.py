"""The detector's state file format (:mod:`gpuwarden.detector.snapshot`): tagged JSON that says
every container and state class the detector keeps, keeps shared references shared, writes
catalog rules by id, and refuses what it cannot name. The whole-detector round trip runs on a
scenario of tests/scenarios (an XID 79 with its episode open)."""

from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

import gpuwarden.demo.inprocess as inprocess
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector import snapshot as sf
from gpuwarden.detector.conditions import Reading
from gpuwarden.detector.engine import Episode
from gpuwarden.shared.models import GpuSample, Severity
from gpuwarden.shared.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def no_rules(obj: Any) -> str | None:
    return None


H = b'{"format": "gpuwarden-detector-state", "version": 2, "rules": [], "state": '


def roundtrip(state: dict[str, Any], rules: dict[str, Any] | None = None) -> dict[str, Any]:
    data = sf.dumps(
        ["r"], state, no_rules if rules is None else (lambda o: next((k for k, v in rules.items() if v is o), None))
    )
    orjson.loads(data)  # plain JSON
    ids, out = sf.loads(data, rules or {})
    assert ids == ["r"]
    return out


def test_containers_and_values_come_back_equal_and_of_their_type() -> None:
    dq: collections.deque[float] = collections.deque([1.0, 2.0], maxlen=5)
    dd: collections.defaultdict[str, list[int]] = collections.defaultdict(list, {"a": [1]})
    state = {
        "floats": [math.inf, -math.inf, 0.1, 1e308],
        "tuple_keys": {("n1", 0): "x", ("n1", 1): None},
        "deque": dq,
        "dd": dd,
        "counter": collections.Counter({"a": 2}),
        "sets": ({"a", "b"}, frozenset({1, 2})),
        "enum": Severity.CRITICAL,
        "named": Reading(True, "power", 412.5, "W", math.inf),
        "bytes": b"\x00\xff",
        "model": GpuSample(index=3, power_w=412.5, throttle_reasons=["sw_power_cap"]),
    }
    out = roundtrip(state)
    assert out["floats"][:2] == [math.inf, -math.inf] and out["floats"][2:] == [0.1, 1e308]
    assert out["tuple_keys"] == state["tuple_keys"]
    assert type(out["deque"]) is collections.deque and out["deque"].maxlen == 5 and list(out["deque"]) == [1.0, 2.0]
    assert type(out["dd"]) is collections.defaultdict and out["dd"]["b"] == [] and out["dd"]["a"] == [1]
    assert type(out["counter"]) is collections.Counter and out["counter"] == {"a": 2}
    assert out["sets"] == state["sets"] and type(out["sets"][1]) is frozenset
    assert out["enum"] is Severity.CRITICAL
    assert type(out["named"]) is Reading and out["named"] == state["named"]
    assert out["bytes"] == b"\x00\xff"
    assert out["model"] == state["model"] and type(out["model"]) is GpuSample
    assert math.isnan(roundtrip({"x": math.nan})["x"])


def test_a_shared_object_stays_one_object() -> None:
    shared: list[int] = [1]
    out = roundtrip({"a": {"k": shared}, "b": [shared, shared]})
    assert out["a"]["k"] is out["b"][0] is out["b"][1]
    out["a"]["k"].append(2)
    assert out["b"][1] == [1, 2]


def test_a_cycle_comes_back_as_a_cycle() -> None:
    a: list[Any] = []
    a.append(a)
    out = roundtrip({"a": a})
    assert out["a"][0] is out["a"]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (lambda: 1, "not a state class"),
        (Path("/tmp"), "not a state class"),
        (collections.defaultdict(lambda: 0), "not a state factory"),
    ],
)
def test_what_the_format_cannot_name_is_refused_when_written(value: Any, match: str) -> None:
    with pytest.raises(sf.SnapshotError, match=match):
        sf.dumps([], {"x": value}, no_rules)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\x80\x04K\x01.", "not JSON"),
        (b'{"format": "other"}', "not a gpuwarden-detector-state"),
        (b'{"format": "gpuwarden-detector-state", "version": 1, "rules": [], "state": {}}', "version 1"),
        (H + b'{"x": {"$ref": 7}}}', "to nothing"),
        (H + b'{"x": {"$rule": "nope"}}}',
         "not in the catalog"),
        (H + b'{"x": {"$dd": [], "factory": "os.system"}}}',
         "refused"),
        (H + b'{"x": {"$e": 1, "$c": "gpuwarden.shared.models:GpuSample"}}}',
         "not an enum"),
    ],
)  # fmt: skip
def test_a_damaged_or_foreign_file_is_refused_with_the_reason(body: bytes, match: str) -> None:
    with pytest.raises(sf.SnapshotError, match=match):
        sf.loads(body, {})


def _run(name: str) -> Detector:
    got: list[Detector] = []

    class Capture(Detector):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            got.append(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(inprocess, "Detector", Capture)
    try:
        inprocess.run_inprocess(load_scenario(SCENARIOS / name))
    finally:
        mp.undo()
    return got[0]


def _state(d: Detector) -> dict[str, Any]:
    out = {k: v for k, v in vars(d).items() if k not in d._NOT_STATE}
    out["_stage"] = vars(out["_stage"])  # a plain object: compared by its attributes
    return out


def test_a_detector_with_an_open_xid79_comes_back_whole_with_the_current_catalogs_rules() -> None:
    d = _run("gpu-fallen-off-bus.yaml")
    assert d.episodes, "the scenario leaves its XID 79 episode open"
    data = d.snapshot()
    assert orjson.loads(data)["format"] == sf.FORMAT
    fresh = Detector(load_catalog())
    fresh.restore(data)
    assert _state(fresh) == _state(d)
    rules = {r.id: r for r in fresh.catalog.rules}
    for ep in fresh.episodes.values():
        assert isinstance(ep, Episode)
        assert ep.rule is rules[ep.rule.id]  # the catalog of the restarted detector, not a copy
    assert fresh.snapshot() == data or len(fresh.snapshot()) == len(data)


def test_a_restored_open_condition_still_resolves_on_healthy_readings() -> None:
    """The sample loop skips a healthy reading of a GPU without a condition tracker (a count per
    GPU that is derived, not state): a restore must rebuild it, or an open condition whose GPU
    recovered after the restart would never resolve."""
    from gpuwarden.shared.models import AttributedSample, NodeSample

    t0 = 1_760_000_000.0

    def sample(ts: float, reasons: list[str]) -> AttributedSample:
        gpu = GpuSample(
            index=0, utilization_gpu_pct=95.0, sm_clock_mhz=900.0 if reasons else 1980.0, max_sm_clock_mhz=1980.0,
            power_w=300.0,
            power_limit_w=700.0, temperature_c=90.0, throttle_reasons=reasons,
        )  # fmt: skip
        return AttributedSample(sample=NodeSample(node="gpu-node-001", ts=ts, collector_id="c", source="s", gpus=[gpu]))

    d = Detector(load_catalog())
    opened = []
    for i in range(120):
        opened += d.on_sample(sample(t0 + i, ["hw_thermal_slowdown"]), 0)
    opened += d.flush()
    assert any(f.state.value == "open" and f.gpu_index == 0 for f in opened), "the thermal slowdown opens"
    assert d._tracked == {("gpu-node-001", 0): len([k for k in d._trackers if k[1:3] == ("gpu-node-001", 0)])}
    fresh = Detector(load_catalog())
    fresh.restore(d.snapshot())
    assert fresh._tracked == d._tracked
    out = []
    for i in range(120, 400):
        out += fresh.on_sample(sample(t0 + i, []), 0)
    out += fresh.flush()
    resolved = {f.failure_id for f in out if f.state.value == "resolved"}
    assert {f.failure_id for f in opened if f.state.value == "open"} <= resolved
    assert fresh._tracked == {} and fresh._trackers == {}


def test_the_repeat_history_survives_a_restart_and_an_older_file_s_history_still_counts() -> None:
    """An application XID under one job before the restart and one under another job after it
    make a repeat offender; a state file written before the history kept its events (a list of
    ``(ts, job id)`` per GPU) is read into the current form and its jobs still count."""
    from gpuwarden.shared.models import AttributedEvent, EventKind, GpuAttribution, GpuEvent

    def xid(ts: float, job: str) -> AttributedEvent:
        ev = GpuEvent(event_id=f"e{ts}", node="n1", ts=ts, kind=EventKind.XID, code=13, gpu_index=2,
                      raw=f"NVRM: Xid (PCI:0000:1b:00): 13, Graphics Exception {ts}", source="t")  # fmt: skip
        return AttributedEvent(event=ev, job=GpuAttribution(gpu_index=2, job_id=job, user="u"))

    d = Detector(load_catalog())
    d.on_event(xid(1000.0, "A"))
    fresh = Detector(load_catalog())
    fresh.restore(d.snapshot())
    assert fresh._app_xids[("n1", 2)]["e1000.0"].event == d._app_xids[("n1", 2)]["e1000.0"].event
    out = fresh.on_event(xid(5000.0, "B")) + fresh.flush()
    assert {(f.rule_id, f.first_seen, f.job_id) for f in out if f.pattern == "repeat-offender-gpu"} == {
        ("repeat-offender-gpu", 5000.0, "B")
    }
    old = Detector(load_catalog())
    old._app_xids = {("n1", 2): [(1000.0, "A")]}  # type: ignore[dict-item]  # the older file's form
    older = Detector(load_catalog())
    older.restore(old.snapshot())
    out = older.on_event(xid(5000.0, "B")) + older.flush()
    assert {f.job_id for f in out if f.pattern == "repeat-offender-gpu"} == {"B"}
