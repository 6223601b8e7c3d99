"""`gpuwarden analyze --bootstrap-servers`: the same findings through the real services on Kafka
as in-process (the recording's last window aside, which a live pipeline keeps open)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration


def _recording(path: Path) -> None:
    """Two GPUs at 1 Hz for 500 s: GPU 0 trains, GPU 1 is idle with a little memory held."""
    lines = ["timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for t in range(500):
        stamp = f"2025/03/01 10:{t // 60:02d}:{t % 60:02d}.100"
        lines.append(f"{stamp}, 0, {90 + t % 7} %, 30000 MiB, {280 + t % 11}.5 W")
        lines.append(f"{stamp}, 1, 0 %, 420 MiB, 31.0 W")
    path.write_text("\n".join(lines) + "\n")


def test_analyze_through_kafka_finds_what_in_process_finds(kafka_bootstrap: str, tmp_path: Path) -> None:
    rec = tmp_path / "two-gpus.csv"
    _recording(rec)
    reports = {}
    for mode, extra in (("inprocess", []), ("kafka", ["--bootstrap-servers", kafka_bootstrap])):
        report = tmp_path / f"{mode}.json"
        cmd = [
            str(Path(sys.executable).parent / "gpuwarden"),
            "analyze",
            str(rec),
            "--gpu-model",
            "RTX A6000",
            "--report",
            str(report),
            *extra,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        reports[mode] = orjson.loads(report.read_bytes())
    ids = {m: {(f["pattern"], f["gpu_index"], f["failure_id"]) for f in r["failures"]} for m, r in reports.items()}
    assert ("partial-idle-allocation", 1) in {(p, g) for p, g, _ in ids["inprocess"]}
    assert ids["kafka"] == ids["inprocess"]
