"""``gpuwarden simulate`` in virtual time: a 64-node scenario at ``--speed 1`` and ``--speed 50``
gives the same failure ids. At 50x the simulated collector cannot keep pace on a small machine;
the run ends when it has published the last tick and the pipeline has drained, never on a
wall-clock deadline, so no tick (and no verdict) is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.shared.scenario import load_scenario

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios" / "fleet-64-xid79.yaml"
GPUWARDEN = str(Path(sys.executable).with_name("gpuwarden"))


def _simulate(speed: float, tmp_path: Path) -> dict:
    report = tmp_path / f"report-{speed:g}.json"
    env = {k: v for k, v in os.environ.items() if k != "GPUWARDEN_BOOTSTRAP_SERVERS"}
    proc = subprocess.run(
        [GPUWARDEN, "simulate", str(SCENARIO), "--speed", f"{speed:g}", "--no-live", "--report", str(report)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(report.read_text())


def test_speed_1_and_50_give_the_same_failure_ids(tmp_path: Path) -> None:
    sc = load_scenario(SCENARIO)
    assert sc.cluster.nodes == 64
    fast = _simulate(50, tmp_path)
    slow = _simulate(1, tmp_path)
    for rep in (fast, slow):
        assert rep["score"]["passed"] and rep["stats"]["deadlettered"] == 0
        # every tick of every node was published and attributed (logger gaps skip some node-ticks)
        assert rep["stats"]["gpu.samples"] == rep["stats"]["gpu.attributed"] > 0.9 * 64 * (sc.duration_s + 1)
    assert fast["stats"]["gpu.samples"] == slow["stats"]["gpu.samples"]
    ids = {f["failure_id"] for f in fast["failures"]}
    assert ids and ids == {f["failure_id"] for f in slow["failures"]}
    assert {(f["pattern"], f["node"], f["gpu_index"]) for f in fast["failures"]} >= {
        ("gpu-fallen-off-bus", "gpu-node-040", 5)
    }
