"""The scored scenario suite (tests/scenarios): every pattern has a positive scenario where it
must be found (right node, GPU and job, within the stated delay) and a negative one where it
must not; mixed scenarios combine faults. Run in-process through the pipeline's own logic
(simulated collector and Slurm, correlator, detector); `gpuwarden bench detect` prints the
same as recall/precision per pattern, and the integration suite runs a sample of them
through the real services."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.demo.inprocess import run_inprocess
from gpuwarden.shared.models import PATTERNS
from gpuwarden.shared.scenario import load_scenario

SUITE = Path(__file__).resolve().parents[1] / "scenarios"
FILES = sorted(SUITE.glob("*.yaml"))


def test_every_pattern_has_a_positive_and_a_negative_scenario() -> None:
    assert FILES, f"no scenarios in {SUITE}"
    names = {f.stem for f in FILES}
    for p in PATTERNS:
        assert p in names and f"{p}-negative" in names, p
        assert any(e.pattern == p for e in load_scenario(SUITE / f"{p}.yaml").expect)
        assert not any(e.pattern == p for e in load_scenario(SUITE / f"{p}-negative.yaml").expect)


def test_the_generator_writes_exactly_the_committed_suite(tmp_path: Path) -> None:
    """make_suite.py is the suite's source ("edit them here and regenerate"): a scenario edited
    only in its YAML would be lost, or silently changed back, at the next regeneration (two
    were, until 2026-12-07: partial-idle-allocation's job-level expectation and
    partial-idle-large-job)."""
    out = tmp_path / "suite"
    subprocess.run([sys.executable, str(SUITE / "make_suite.py"), str(out)], check=True, capture_output=True)
    made = {p.name: p.read_text() for p in out.glob("*.yaml")}
    committed = {p.name: p.read_text() for p in FILES}
    assert sorted(made) == sorted(committed)
    assert [n for n in sorted(made) if made[n] != committed[n]] == []


@pytest.mark.scored
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_scenario(path: Path) -> None:
    report = run_inprocess(load_scenario(path)).report()
    score = report["score"]
    assert score["passed"], f"missed {score['missed']}, false positives {score['false_positives']}"
