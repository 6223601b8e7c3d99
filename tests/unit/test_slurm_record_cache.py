"""SqueueJsonParser / SinfoJsonParser: same results as the stateless parsers, records reused."""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path

import pytest

from gpuwarden.shared.slurm import SinfoJsonParser, SqueueJsonParser, parse_sinfo_json, parse_squeue_json

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
LOCAL = FIX / "local-22.05"


def _dump(states: list) -> list[dict]:
    return [s.model_dump() for s in states]


@pytest.mark.parametrize("name", ["local-22.05/squeue.json", "synthetic/squeue-v0.0.42.json"])
def test_squeue_parser_equals_stateless_and_reuses_unchanged(name: str) -> None:
    text = (FIX / name).read_text()
    p = SqueueJsonParser()
    first = p.parse(text, 1.0)
    assert _dump(first[0]) == _dump(parse_squeue_json(text, 1.0)[0])
    assert first[1] == parse_squeue_json(text, 1.0)[1]
    assert p.hits == 0
    second_jobs, second_need = p.parse(text, 2.0)
    assert p.hits == len(second_jobs) > 0
    assert _dump(second_jobs) == _dump(parse_squeue_json(text, 2.0)[0])
    assert {j.ts for j in second_jobs} == {2.0}
    assert second_need == first[1]


def test_squeue_parser_reparses_a_changed_record_only() -> None:
    doc = json.loads((LOCAL / "squeue.json").read_text())
    assert len(doc["jobs"]) >= 2
    p = SqueueJsonParser()
    p.parse(json.dumps(doc), 1.0)
    changed = copy.deepcopy(doc)
    changed["jobs"][0]["job_state"] = "CANCELLED"
    jobs, _ = p.parse(json.dumps(changed), 2.0)
    assert p.hits == len(doc["jobs"]) - 1
    assert jobs[0].state == "CANCELLED"
    assert _dump(jobs) == _dump(parse_squeue_json(json.dumps(changed), 2.0)[0])


def test_sinfo_parser_equals_stateless_and_reuses_unchanged() -> None:
    text = (LOCAL / "sinfo-with-drained.json").read_text()
    p = SinfoJsonParser()
    assert _dump(p.parse(text, 1.0)) == _dump(parse_sinfo_json(text, 1.0))
    again = p.parse(text, 2.0)
    assert p.hits == len(again) > 0
    assert _dump(again) == _dump(parse_sinfo_json(text, 2.0))
    doc = json.loads(text)
    doc["nodes"][0]["reason"] = "changed by test"
    third = p.parse(json.dumps(doc), 3.0)
    assert p.hits == len(again) - 1
    assert third[0].reason == "changed by test"


def test_parsers_raise_like_stateless_and_restore_gc() -> None:
    assert gc.isenabled()
    with pytest.raises(ValueError, match="squeue --json"):
        SqueueJsonParser().parse("squeue: error: Invalid user", 1.0)
    with pytest.raises(ValueError, match="no 'nodes' list"):
        SinfoJsonParser().parse('{"meta": {}, "errors": []}', 1.0)
    assert gc.isenabled()
    gc.disable()
    try:
        SqueueJsonParser().parse((LOCAL / "squeue.json").read_text(), 1.0)
        assert not gc.isenabled()  # a caller's paused collector stays paused
    finally:
        gc.enable()
