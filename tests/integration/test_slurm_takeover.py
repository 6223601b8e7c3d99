"""CliSlurm.ended_since (the slurm-watcher's takeover recovery) against a real Slurm 22.05."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from gpuwarden.shared.slurm import CliSlurm

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


SBATCH = ["sbatch", "--parsable", "-N1", "-w", "gpu-node-001", "--gres=gpu:1", "-J", "gpuwarden-it-takeover"]


def _sbatch(*wrap: str) -> str:
    out = subprocess.run(
        [*SBATCH, "-o", "/dev/null", "--wrap", *wrap],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


async def test_ended_since_lists_jobs_that_ended_in_the_window(slurm_cluster: list[str]) -> None:
    assert "gpu-node-001" in slurm_cluster
    since = time.time() - 2  # sacct works in whole seconds
    failed = _sbatch("exit 3")
    running = _sbatch("sleep 60")
    try:
        cli = CliSlurm(timeout_s=20)
        got: dict[str, object] = {}
        deadline = time.monotonic() + 40
        while failed not in got and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            got = {j.job_id: j for j in await cli.ended_since(since)}
        assert failed in got, f"job {failed} not in sacct's ended jobs since {since}"
        end = got[failed]
        assert end.state == "FAILED" and end.confirmed is True  # type: ignore[attr-defined]
        assert end.nodes == ["gpu-node-001"] and end.end_ts is not None and end.end_ts >= since  # type: ignore[attr-defined]
        assert running not in got  # still running: not an end
        assert all(j.end_ts is None or j.end_ts >= since for j in got.values())  # type: ignore[attr-defined]
    finally:
        subprocess.run(["scancel", running], capture_output=True, timeout=30)
