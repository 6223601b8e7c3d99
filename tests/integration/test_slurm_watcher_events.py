"""The slurm-watcher on the real local Slurm 22.05: exact job/node event sequences, GPU indices.

Uses gpu-node-001/002 only (other tests use the same cluster at the same time). States Slurm
may or may not show depending on when a poll lands (PENDING before the start, COMPLETING
before the end) are removed before comparing; every other state must come in this order.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import pytest

from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.slurm import CliSlurm, RestSlurm, parse_scontrol_job_gpus
from gpuwarden.shared.slurm.rest import AiohttpTransport
from gpuwarden.slurm_watcher import SlurmWatcher, SlurmWatcherSettings

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

NODES = ("gpu-node-001", "gpu-node-002")
TRANSIENT = {"PENDING", "COMPLETING", "CONFIGURING"}
REST_SOCKET = "unix:/run/gpuwarden-slurm/rest/slurmrestd.sock"


class Prod(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def sbatch(*args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null", "-p", "gpu", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return out.strip().split(";")[0]


def scontrol_gpus(job_id: str) -> dict[str, list[int]]:
    out = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True, text=True, timeout=30)
    return parse_scontrol_job_gpus(out.stdout).get(job_id, {})


async def poll_until(w: SlurmWatcher, pred: Any, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "timed out waiting for the watcher to see it"
        await w.poll_once()
        await asyncio.sleep(0.3)


def job_events(prod: Prod, job_id: str) -> list[JobState]:
    return [v for v in prod.of("slurm.jobs") if v.job_id == job_id and not v.snapshot]


def states(prod: Prod, job_id: str) -> list[str]:
    return [j.state for j in job_events(prod, job_id) if j.state not in TRANSIENT]


def ended(prod: Prod, *ids: str) -> bool:
    return all(any(j.confirmed is not None for j in job_events(prod, i)) for i in ids)


async def test_job_and_node_event_sequences(slurm_cluster: list[str]) -> None:
    assert set(NODES) <= set(slurm_cluster)
    prod = Prod()
    w = SlurmWatcher(SlurmWatcherSettings(), client=CliSlurm(timeout_s=15), producer=prod)  # type: ignore[arg-type]
    await w.poll_once()
    one = sbatch("-J", "gw-it-1node", "-N1", "-w", NODES[0], "--gres=gpu:2", "--wrap", "sleep 6")
    two = sbatch("-J", "gw-it-2node", "-N2", "-w", ",".join(NODES), "--gres=gpu:3", "--wrap", "sleep 6")
    fail = sbatch("-J", "gw-it-fail", "-N1", "-w", NODES[1], "--gres=gpu:1", "--wrap", "exit 3")
    cancel = sbatch("-J", "gw-it-cancel", "-N1", "-w", NODES[1], "--gres=gpu:1", "--wrap", "sleep 120")
    ids = (one, two, fail, cancel)
    try:
        await poll_until(w, lambda: all("RUNNING" in states(prod, i) for i in (one, two, cancel)))
        expect = {i: scontrol_gpus(i) for i in (one, two, cancel)}  # independent source: scontrol -d
        running = {i: next(j for j in job_events(prod, i) if j.state == "RUNNING") for i in (one, two, cancel)}
        assert running[one].nodes == [NODES[0]] and running[one].gpus == expect[one]
        assert len(expect[one][NODES[0]]) == 2
        assert running[two].nodes == list(NODES) and running[two].gpus == expect[two]
        assert [len(expect[two][n]) for n in NODES] == [3, 3]
        assert running[cancel].gpus == expect[cancel] and len(expect[cancel][NODES[1]]) == 1
        assert all(running[i].user == "root" and running[i].submit_ts and running[i].start_ts for i in running)
        subprocess.run(["scancel", cancel], check=True, capture_output=True, timeout=30)
        await poll_until(w, lambda: ended(prod, *ids), timeout_s=90)
    finally:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)

    assert states(prod, one) == ["RUNNING", "COMPLETED"]
    assert states(prod, two) == ["RUNNING", "COMPLETED"]
    assert states(prod, cancel) == ["RUNNING", "CANCELLED"]
    assert states(prod, fail)[-1] == "FAILED" and set(states(prod, fail)) <= {"RUNNING", "FAILED"}
    last = {i: job_events(prod, i)[-1] for i in ids}
    assert all(last[i].confirmed for i in ids), {i: last[i].confirmed for i in ids}  # from sacct
    assert last[one].exit_code == 0 and last[fail].exit_code == 3
    assert last[one].gpus == running[one].gpus and last[two].gpus == running[two].gpus  # kept to the end
    assert all(last[i].end_ts and last[i].end_ts >= (last[i].start_ts or 0) for i in ids)

    # drain and resume gpu-node-001 (no job of ours left on it)
    reason = f"gw-it drain {int(time.time())}"
    before = len(prod.of("slurm.nodes"))
    subprocess.run(
        ["scontrol", "update", f"nodename={NODES[0]}", "state=DRAIN", f"reason={reason}"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:

        def drain_seen() -> list[NodeState]:
            return [n for n in prod.of("slurm.nodes")[before:] if n.node == NODES[0] and n.reason == reason]

        await poll_until(w, lambda: bool(drain_seen()))
    finally:
        subprocess.run(["scontrol", "update", f"nodename={NODES[0]}", "state=RESUME"], capture_output=True, timeout=30)
    await poll_until(w, lambda: any(n.node == NODES[0] and not n.drained for n in prod.of("slurm.nodes")[before:][-3:]))
    seq: list[tuple[bool, str | None]] = []
    for n in prod.of("slurm.nodes")[before:]:
        if n.node == NODES[0] and (not seq or seq[-1] != (n.drained, n.reason)):
            seq.append((n.drained, n.reason))
    assert seq == [(True, reason), (False, None)]
    d = drain_seen()[0]
    assert "DRAIN" in d.flags and d.reason_user == "root" and d.reason_ts and abs(d.reason_ts - time.time()) < 300
    assert w.status == "ok"
    wms = prod.of("slurm.watermarks")  # a heartbeat per poll; offsets: see test_slurm_watcher_watermark_kafka
    assert 0 < len(wms) <= w.polls and wms[-1].ts == w.last_poll_ts


async def test_rest_backend_on_real_slurmrestd(slurm_cluster: list[str]) -> None:
    """RestSlurm against the cluster's slurmrestd (unix socket, v0.0.38): same view as the CLI."""
    rest = RestSlurm(AiohttpTransport(REST_SOCKET, timeout_s=15))
    cli = CliSlurm(timeout_s=15)
    job = sbatch("-J", "gw-it-rest", "-N1", "-w", NODES[1], "--gres=gpu:2", "--wrap", "sleep 20")
    try:
        end = time.monotonic() + 60
        while True:
            rj = {j.job_id: j for j in await rest.jobs()}
            if job in rj and rj[job].state == "RUNNING":
                break
            assert time.monotonic() < end, "job did not start"
            await asyncio.sleep(0.3)
        cj = {j.job_id: j for j in await cli.jobs()}
        assert rj[job].gpus == cj[job].gpus == scontrol_gpus(job) and len(rj[job].gpus[NODES[1]]) == 2
        rn = {n.node: n for n in await rest.nodes()}
        assert set(rn) == set(slurm_cluster)
        n1 = await rest.node(NODES[1])
        assert n1 is not None and n1.state in ("MIXED", "ALLOCATED") and n1.gres == "gpu:8"
        assert await rest.node("gpu-node-does-not-exist") is None
        res = await rest.update_node(NODES[1], "DRAIN", "gw-it: v0.0.38 has no update")
        assert res.exit_code == 2  # 22.05's slurmrestd cannot update nodes
    except BaseException:
        await rest.close()
        raise
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
    end = time.monotonic() + 60
    while True:
        acct = {a.job_id: a for a in await rest.accounting([job, "999999999"])}
        if job in acct and acct[job].confirmed:
            break
        assert time.monotonic() < end, "sacct (slurmdb REST) never showed the end"
        await asyncio.sleep(0.5)
    assert acct[job].state == "CANCELLED" and "999999999" not in acct
    await rest.close()
