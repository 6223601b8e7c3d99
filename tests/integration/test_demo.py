"""``gpuwarden demo`` as a user runs it: embedded broker, six service processes, the XID 79
found, attributed and drained, a run report; Ctrl-C leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

GPUWARDEN = str(Path(sys.executable).with_name("gpuwarden"))


def descendants(pid: int) -> set[int]:
    """Every process whose parent chain leads to ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out.update(kids)
        todo.extend(kids)
    return out


def alive(pids: set[int]) -> set[int]:
    left = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(p)
    return left


def demo_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GPUWARDEN_BOOTSTRAP_SERVERS", None)  # the demo's own embedded broker
    return env


def test_demo_finds_attributes_and_drains_within_90_s(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    t0 = time.monotonic()
    proc = subprocess.run(
        [GPUWARDEN, "demo", "--report", str(report), "--no-live"],
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(report.read_text())
    [f] = rep["failures"]
    assert (f["pattern"], f["node"], f["gpu_index"], f["job_id"]) == ("gpu-fallen-off-bus", "gpu-node-003", 5, "1001")
    assert f["evidence"][0]["value"] == 79 and 14.5 <= f["first_seen_s"] <= 16.0
    assert f["cost"]["affected_gpus"] == 64
    [r] = [r for r in rep["remediations"] if r["decision"] == "executed"]
    assert r["node"] == "gpu-node-003" and r["reason"] and "state=DRAIN" in r["argv"]
    assert rep["score"]["passed"] and not rep["score"]["false_positives"]
    assert rep["stats"]["time_to_first_failure_s"] < 90
    assert "gpu-fallen-off-bus" in proc.stdout and "drain" in proc.stdout
    print(f"\ndemo: first failure after {rep['stats']['time_to_first_failure_s']} s, exit after {wall:.1f} s")


def test_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    # The demo ends by itself once the XID 79 (scenario second 15) is found and drained. At
    # --speed 0.1 that is 150 s of wall time after the sources start, so it is still running
    # when the SIGINT lands (at speed 1 it once finished first and exited 0).
    proc = subprocess.Popen(
        [GPUWARDEN, "demo", "--no-live", "--speed", "0.1"],
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        kids: set[int] = set()
        while time.monotonic() < deadline and len(kids) < 7 and proc.poll() is None:  # broker + six services
            kids = descendants(proc.pid)
            time.sleep(0.3)
        if len(kids) < 7 or proc.poll() is not None:
            proc.kill()
            out = proc.communicate()[0][-3000:]
            pytest.fail(
                f"expected the broker and six services of a running demo, saw {len(kids)}, rc {proc.returncode}:\n{out}"
            )
        assert proc.poll() is None, "the demo exited before the SIGINT"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode != 0
        deadline = time.monotonic() + 10
        while alive(kids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(kids), f"left behind: {alive(kids)}\n{out[-2000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
