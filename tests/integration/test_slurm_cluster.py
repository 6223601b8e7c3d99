"""CliSlurm against a real Slurm 22.05 (the local cluster): jobs with GPU indices, drain, resume."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from gpuwarden.remediator import resume_node
from gpuwarden.shared.slurm import CliSlurm

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


async def _wait(pred, timeout_s: float = 20.0, step: float = 0.2):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while True:
        got = await pred()
        if got:
            return got
        if time.monotonic() > end:
            return got
        await asyncio.sleep(step)


async def test_cli_slurm_jobs_drain_resume(slurm_cluster: list[str]) -> None:
    client = CliSlurm(timeout_s=15, retries=2)
    out = subprocess.run(
        ["sbatch", "--parsable", "-N1", "--gres=gpu:2", "-J", "gpuwarden-it", "-o", "/dev/null", "--wrap", "sleep 60"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    job_id = out.strip().split(";")[0]
    try:

        async def running():  # type: ignore[no-untyped-def]
            return next((j for j in await client.jobs() if j.job_id == job_id and j.state == "RUNNING"), None)

        t0 = time.monotonic()
        job = await _wait(running)
        assert job is not None, f"job {job_id} did not start"
        print(f"job {job_id} RUNNING after {time.monotonic() - t0:.2f}s")
        (node,) = job.nodes
        assert node in slurm_cluster
        assert job.gpus == {node: [0, 1]}
        assert job.user == "root" and job.partition and job.start_ts and job.start_ts <= time.time() + 1

        nodes = {n.node: n for n in await client.nodes()}
        assert set(nodes) == set(slurm_cluster)
        assert nodes[node].state in ("MIXED", "ALLOCATED")

        target = slurm_cluster[-1] if node != slurm_cluster[-1] else slurm_cluster[0]
        reason = f"gpuwarden: it-test gpu=1 failure=it{job_id}"
        t0 = time.monotonic()
        res = await client.update_node(target, "DRAIN", reason)
        assert res.ok, res.output()
        print(f"drain command {res.duration_s * 1000:.0f} ms, argv {res.argv}")
        state = await client.node(target)
        assert state is not None and state.drained and "DRAIN" in state.flags
        assert state.reason == reason and state.reason_user == "root"
        assert state.reason_ts is not None and abs(state.reason_ts - time.time()) < 120

        rc, msg = await resume_node(client, target)
        assert rc == 0, msg

        async def resumed():  # type: ignore[no-untyped-def]
            n = await client.node(target)
            return n is not None and not n.drained and n.reason is None

        assert await _wait(resumed), "node still drained after RESUME"
        assert await client.node("gpu-node-does-not-exist") is None
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)

    async def gone_or_done():  # type: ignore[no-untyped-def]
        return all(j.state != "RUNNING" for j in await client.jobs() if j.job_id == job_id)

    assert await _wait(gone_or_done)


async def test_someone_elses_drain_is_not_resumed(slurm_cluster: list[str]) -> None:
    client = CliSlurm(timeout_s=15)
    target = slurm_cluster[1]
    subprocess.run(
        ["scontrol", "update", f"nodename={target}", "state=DRAIN", "reason=ops: cable check"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        rc, msg = await resume_node(client, target)
        assert rc == 1 and "refused" in msg
        n = await client.node(target)
        assert n is not None and n.drained and n.reason == "ops: cable check"
    finally:
        subprocess.run(["scontrol", "update", f"nodename={target}", "state=RESUME"], capture_output=True, timeout=30)


class _MemProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, object]] = []

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def flush(self) -> None: ...

    async def publish(self, topic: str, key: str | None, value: object) -> None:
        self.sent.append((topic, key, value))


async def test_remediator_and_watcher_on_real_slurm(slurm_cluster: list[str]) -> None:
    """Remediator (enforce) drains through scontrol; the watcher sees the drain; redelivery is skipped."""
    from gpuwarden.remediator import Remediator, RemediatorSettings
    from gpuwarden.shared.models import Action, Category, CostEstimate, Failure, RemediationDecision, Severity
    from gpuwarden.slurm_watcher import SlurmWatcher, SlurmWatcherSettings

    client = CliSlurm(timeout_s=15)
    target = slurm_cluster[2]
    now = time.time()
    f = Failure(
        failure_id=f"it{int(now)}",
        pattern="gpu-fallen-off-bus",
        rule_id="xid-79",
        category=Category.HARDWARE,
        severity=Severity.CRITICAL,
        node=target,
        gpu_index=3,
        first_seen=now,
        last_seen=now,
        verdict="GPU 3 fell off the bus",
        recommended_action=Action.DRAIN,
        cost=CostEstimate(affected_gpus=8, usd_per_hour=26.08, gpu_hours_lost=0.0),
    )
    rprod, wprod = _MemProducer(), _MemProducer()
    rem = Remediator(RemediatorSettings(remediator_enforce=True), client=client, producer=rprod)  # type: ignore[arg-type]
    watcher = SlurmWatcher(SlurmWatcherSettings(), client=client, producer=wprod)  # type: ignore[arg-type]
    try:
        await rem.seed()
        await watcher.poll_once()
        t0 = time.monotonic()
        r1 = await rem.handle_failure(f)
        print(f"failure -> drain decision + scontrol: {(time.monotonic() - t0) * 1000:.0f} ms")
        assert r1.decision == RemediationDecision.EXECUTED and r1.exit_code == 0, r1.reason
        assert (await rem.handle_failure(f)).decision == RemediationDecision.SKIPPED
        wprod.sent.clear()
        await watcher.poll_once()
        changed = [v for t, k, v in wprod.sent if t == "slurm.nodes"]
        # other nodes may change meanwhile (jobs of earlier tests completing): only the target drains
        assert [(n.node, n.drained, n.reason) for n in changed if n.node == target] == [
            (target, True, f"gpuwarden: gpu-fallen-off-bus gpu=3 failure={f.failure_id[:8]}")
        ]
        assert not [n.node for n in changed if n.node != target and n.drained]
    finally:
        await resume_node(client, target)
