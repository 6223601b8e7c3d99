"""``gpuwarden health-check epilog`` publishes one HealthCheckResult per check to ``health`` on a
real broker, keyed by node, with the job id; the exit code does not depend on Kafka."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from gpuwarden.health_check.suite import select_checks
from gpuwarden.shared.models import HealthCheckResult

pytestmark = pytest.mark.integration


async def _read(bootstrap: str, topic: str, n: int) -> list[tuple[bytes | None, HealthCheckResult]]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await c.start()
    out: list[tuple[bytes | None, HealthCheckResult]] = []
    try:
        async with asyncio.timeout(30):
            while len(out) < n:
                for recs in (await c.getmany(timeout_ms=500)).values():
                    out += [(r.key, HealthCheckResult.model_validate(orjson.loads(r.value))) for r in recs]
    finally:
        await c.stop()
    return out


def test_epilog_results_reach_the_health_topic(bus_env: dict[str, str], tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(
        "name: t\nduration_s: 10\ncluster: {nodes: 4}\n"
        "faults:\n  - {at_s: 0, kind: zombie-process, node: gpu-node-002, gpu: 1}\n"
    )
    env = {
        **os.environ,
        **bus_env,
        "SLURMD_NODENAME": "gpu-node-002",
        "SLURM_JOB_ID": "4711",
        "SLURM_JOB_GPUS": "0,1",
        "GPUWARDEN_HEALTH_SCENARIO": str(sc),
        "GPUWARDEN_HEALTH_STATE_DIR": str(tmp_path / "st"),
        "GPUWARDEN_HEALTH_KERNEL_LOG": str(tmp_path / "kern.log"),
        "GPUWARDEN_HEALTH_PUBLISH_TIMEOUT_S": "10",
    }
    (tmp_path / "kern.log").touch()
    exe = Path(sys.executable).with_name("gpuwarden")
    p = subprocess.run([str(exe), "health-check", "epilog"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stdout.startswith("CRITICAL: processes: GPU 1: 1 leftover process(es)")
    n = len(select_checks("epilog"))
    got = asyncio.run(_read(bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"] + "health", n))
    assert {k for k, _ in got} == {b"gpu-node-002"}
    by = {m.check: m for _, m in got}
    assert len(by) == n and all(m.phase == "epilog" and m.job_id == "4711" for m in by.values())
    assert by["processes"].passed is False and by["processes"].gpu_index == 1
    assert all(m.passed for c, m in by.items() if c != "processes")
