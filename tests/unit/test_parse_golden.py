"""Golden tests of the ``gpuwarden parse`` kinds: every ``tests/fixtures/**/<name>.expected.json``
is the JSON that ``gpuwarden parse KIND <name>.txt`` must print.

The kind of a fixture is the ``kind: KIND`` first line of its ``<name>.md`` sidecar, else its entry
in ``tests/fixtures/kinds.toml``. Adding a fixture is one step: write ``<name>.txt`` and
``<name>.md`` (with ``kind:``), then run

    GPUWARDEN_UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/unit/test_parse_golden.py

which (re)writes the ``.expected.json`` of every fixture that has a kind; review the diff. Without
the variable the test only compares. ``ts`` of Slurm states (the time of parsing: a recorded file
carries no observation time) is left out of the comparison.
"""

from __future__ import annotations

import os
import time
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

FIX = Path(__file__).resolve().parents[1] / "fixtures"
UPDATE = os.environ.get("GPUWARDEN_UPDATE_GOLDEN") == "1"
_PARSE_TIME_TS = {
    "jobcomp-kafka",
    "scontrol-node",
    "scontrol-job",
    "sinfo-json",
    "slurmrestd-nodes",
    "slurmrestd-jobs",
    "squeue-json",
}


def _kinds_map() -> dict[str, str]:
    path = FIX / "kinds.toml"
    return tomllib.loads(path.read_text()) if path.exists() else {}


def kind_of(txt: Path) -> str | None:
    """The parse kind of fixture ``txt``: ``kind: KIND`` on the first line of its sidecar, else kinds.toml."""
    md = txt.with_suffix(".md")
    if md.exists():
        first = md.read_text().lstrip().splitlines()[:1]
        if first and first[0].lower().startswith("kind:"):
            return first[0].split(":", 1)[1].strip()
    return _kinds_map().get(txt.relative_to(FIX).as_posix())


def _default(o: object) -> object:  # as `gpuwarden parse` serialises
    if isinstance(o, BaseModel):
        return o.model_dump(mode="json")
    if hasattr(o, "__dict__"):
        return vars(o)
    raise TypeError(type(o).__name__)


def _drop_parse_time(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _drop_parse_time(v) for k, v in doc.items() if k != "ts"}
    if isinstance(doc, list):
        return [_drop_parse_time(v) for v in doc]
    return doc


def parse_to_json(kind: str, text: str) -> Any:
    """The JSON document ``gpuwarden parse KIND`` prints for ``text`` (through the entry point)."""
    (ep,) = [e for e in entry_points(group="gpuwarden.parsers") if e.name == kind]
    doc = orjson.loads(orjson.dumps(ep.load()(text), default=_default, option=orjson.OPT_NON_STR_KEYS))
    return _drop_parse_time(doc) if kind in _PARSE_TIME_TS else doc


def _cases() -> list[Any]:
    txts = {p.with_name(p.name.removesuffix(".expected.json") + ".txt") for p in FIX.rglob("*.expected.json")}
    if UPDATE:  # also fixtures that have a kind but no golden yet
        txts |= {p for p in FIX.rglob("*.txt") if kind_of(p)}
    return [pytest.param(t, id=t.relative_to(FIX).as_posix()) for t in sorted(txts)]


@pytest.mark.parametrize("txt", _cases())
def test_golden(txt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")  # Slurm prints local times: read them in one zone everywhere
    time.tzset()
    kind = kind_of(txt)
    assert kind, f"{txt}: no 'kind: KIND' first line in {txt.with_suffix('.md').name} and no kinds.toml entry"
    assert txt.exists(), f"golden without its fixture: {txt}"
    got = parse_to_json(kind, txt.read_text())
    golden = txt.with_name(txt.stem + ".expected.json")
    if UPDATE:
        golden.write_bytes(orjson.dumps(got, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    assert golden.exists(), f"no {golden.name}: run with GPUWARDEN_UPDATE_GOLDEN=1 to write it"
    assert got == orjson.loads(golden.read_bytes()), f"{kind} {txt.name}: output differs from {golden.name}"


def test_every_golden_has_a_kind() -> None:
    goldens = list(FIX.rglob("*.expected.json"))
    assert goldens, "no golden fixtures found"
    missing = [g for g in goldens if kind_of(g.with_name(g.name.removesuffix(".expected.json") + ".txt")) is None]
    assert not missing, f"goldens without a parse kind: {missing}"
