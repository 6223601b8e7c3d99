"""A sample of the scored scenario suite through the real services (`gpuwarden simulate`:
embedded broker, six processes) at 10x speed: the same verdicts as the in-process run,
since detection works in event time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.demo.inprocess import run_inprocess
from gpuwarden.shared.scenario import load_scenario

pytestmark = pytest.mark.integration

SUITE = Path(__file__).resolve().parents[1] / "scenarios"
GPUWARDEN = str(Path(sys.executable).with_name("gpuwarden"))


@pytest.mark.parametrize("name", ["thermal-throttle", "idle-allocation", "gpu-fallen-off-bus-negative"])
def test_scenario_through_the_real_pipeline_matches_in_process(name: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "GPUWARDEN_BOOTSTRAP_SERVERS"}
    proc = subprocess.run(
        [GPUWARDEN, "simulate", str(SUITE / f"{name}.yaml"), "--speed", "10", "--no-live", "--report", str(report)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert rep["score"]["passed"] and rep["stats"]["deadlettered"] == 0
    inproc = run_inprocess(load_scenario(SUITE / f"{name}.yaml")).report()
    expected = {(f["pattern"], f["node"]) for f in inproc["score"]["found"]}
    assert {(f["pattern"], f["node"]) for f in rep["score"]["found"]} == expected
