"""The proof: real components only, end to end.

A real Slurm 22.05 cluster (``deploy/slurm/start-local-slurm.sh``), real Apache Kafka
(``deploy/kafka.sh``), and the collector replaying a real ``nvidia-smi -q -x`` capture and
a real XID 79 kernel-log line. An ``sbatch`` GPU job runs on one node; an XID 79 for that
job's GPU must become a ``gpu-fallen-off-bus`` Failure carrying the job id, the remediator
(enforcing) must drain exactly that node with a ``gpuwarden:`` reason, a second delivery of
the same failure must change nothing, and the node is resumed at the end.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gpuwarden.demo.runner import ServiceProc, spawn_service, stop_services, wait_healthy
from gpuwarden.shared.models import AttributedSample, Failure, Remediation
from gpuwarden.sim.brokers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

FIX = Path(__file__).resolve().parents[1] / "fixtures"
XML = FIX / "nvidia-smi" / "tesla-t4-xml-v11-processes.xml"  # real capture: one Tesla T4
XID79 = (FIX / "xid-logs" / "xid79-fallen-off-bus-short.txt").read_text().strip()  # real line, PCI 0000:44:00


def scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True, timeout=30).stdout


def node_field(node: str, key: str) -> str:
    """One field of ``scontrol show node`` (Slurm 22.05); Reason runs to the end of its line."""
    text = scontrol("show", "node", node)
    pattern = r"\bReason=(.*)$" if key == "Reason" else rf"\b{key}=(\S*)"
    m = re.search(pattern, text, re.M)
    return m.group(1).strip() if m else ""


class Topics:
    """Follows topics from the beginning (no consumer group) for assertions."""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.bootstrap, self.prefix = bootstrap, prefix
        self.seen: dict[str, list[bytes]] = {}
        self._c: AIOKafkaConsumer | None = None

    async def start(self, *short: str) -> None:
        self._c = AIOKafkaConsumer(
            *(self.prefix + s for s in short),
            bootstrap_servers=self.bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await self._c.start()

    async def stop(self) -> None:
        if self._c:
            await self._c.stop()

    async def wait_for(self, short: str, pred: Callable[[bytes], Any], timeout_s: float, what: str) -> Any:
        assert self._c is not None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for v in self.seen.get(short, []):
                hit = pred(v)
                if hit:
                    return hit
            for tp, recs in (await self._c.getmany(timeout_ms=300)).items():
                self.seen.setdefault(tp.topic.removeprefix(self.prefix), []).extend(r.value for r in recs)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture
def replay_dir(tmp_path: Path) -> Path:
    return tmp_path / "replay"


async def test_xid79_on_a_real_slurm_job_is_found_attributed_and_drained_once(
    slurm_cluster: list[str], kafka_bootstrap: str, topic_prefix: str, replay_dir: Path, tmp_path: Path
) -> None:
    node = slurm_cluster[-1]  # the last node: least likely to hold other tests' jobs
    assert "DRAIN" not in node_field(node, "State"), f"{node} is drained before the test"
    (replay_dir / node).mkdir(parents=True)
    shutil.copy(XML, replay_dir / node / "nvidia-smi.xml")
    kern = replay_dir / node / "kern.log"
    kern.write_text("")

    env = {
        **os.environ,
        "GPUWARDEN_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GPUWARDEN_TOPIC_PREFIX": topic_prefix,
        "GPUWARDEN_LOG_LEVEL": "INFO",
    }
    per = {
        "correlator": ("gpuwarden.correlator", {}),
        "detector": ("gpuwarden.detector", {}),
        "remediator": (
            "gpuwarden.remediator",
            {"GPUWARDEN_REMEDIATOR_ENFORCE": "true", "GPUWARDEN_REMEDIATOR_BACKEND": "cli"},
        ),
        "slurm-watcher": (
            "gpuwarden.slurm_watcher",
            {"GPUWARDEN_SLURM_WATCHER_BACKEND": "cli", "GPUWARDEN_SLURM_WATCHER_POLL_S": "0.5"},
        ),
        "collector": (
            "gpuwarden.collector",
            {
                "GPUWARDEN_COLLECTOR_SOURCE": "replay",
                "GPUWARDEN_COLLECTOR_REPLAY_DIR": str(replay_dir),
                "GPUWARDEN_COLLECTOR_NODE": node,
                "GPUWARDEN_COLLECTOR_INTERVAL_S": "0.5",
            },
        ),
    }
    procs: list[ServiceProc] = []
    topics = Topics(kafka_bootstrap, topic_prefix)
    job_id = None
    try:
        for name, (module, extra) in per.items():
            procs.append(spawn_service(name, module, {**env, **extra}, tmp_path / "logs" / f"{name}.log", free_port()))
        await wait_healthy(procs, timeout_s=120)
        await topics.start("gpu.attributed", "failures", "remediations")

        out = subprocess.run(
            ["sbatch", "--parsable", "-N1", "-w", node, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        job_id = out.strip().split(";")[0]
        deadline = time.monotonic() + 30
        while (idx := re.search(r"IDX:(\d+)", scontrol("show", "job", "-d", job_id))) is None:
            assert time.monotonic() < deadline, f"job {job_id} did not start: {scontrol('show', 'job', job_id)}"
            await asyncio.sleep(0.2)
        gpu = int(idx.group(1))
        assert gpu == 0, "the replayed capture has one GPU, index 0"

        # the pipeline knows the job holds that GPU once an attributed sample says so
        def attributed(v: bytes) -> bool:
            a = AttributedSample.model_validate_json(v)
            return a.sample.node == node and any(j.job_id == job_id and j.gpu_index == gpu for j in a.jobs)

        await topics.wait_for("gpu.attributed", attributed, 60, f"a sample of {node} attributed to job {job_id}")

        # a real XID 79 line, its PCI address set to the replayed GPU's (00000000:xx:00.0 -> 0000:xx:00)
        bus = re.search(r"<pci_bus_id>([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)\.", XML.read_text())
        assert bus
        pci = f"{bus.group(1)[-4:]}:{bus.group(2)}:{bus.group(3)}".lower()
        t_xid = time.time()
        with kern.open("a") as fh:
            fh.write(XID79.replace("PCI:0000:44:00", f"PCI:{pci}") + "\n")

        def failure(v: bytes) -> Failure | None:
            f = Failure.model_validate_json(v)
            return f if f.pattern == "gpu-fallen-off-bus" and f.node == node else None

        f = await topics.wait_for("failures", failure, 60, "a gpu-fallen-off-bus failure")
        latency = time.time() - t_xid
        assert f.job_id == job_id and f.gpu_index == gpu and f.severity.value == "fatal"
        assert f.evidence and "Xid" in f.evidence[0].source

        def executed(v: bytes) -> Remediation | None:
            r = Remediation.model_validate_json(v)
            return r if r.decision.value == "executed" and f.failure_id in r.failure_ids else None

        r = await topics.wait_for("remediations", executed, 60, "an executed drain")
        assert r.node == node and not r.dry_run
        assert r.argv[:2] == ["scontrol", "update"] and f"nodename={node}" in r.argv
        assert "DRAIN" in node_field(node, "State")
        reason = node_field(node, "Reason")
        assert reason.startswith("gpuwarden:") and f"failure={f.failure_id[:8]}" in reason
        others = [n for n in slurm_cluster if n != node and "DRAIN" in node_field(n, "State")]
        assert not others, f"only {node} may be drained, also drained: {others}"

        # a second delivery of the same failure changes nothing
        p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await p.start()
        try:
            await p.send_and_wait(f"{topic_prefix}failures", f.to_json(), key=node.encode())
        finally:
            await p.stop()

        def second_decision(v: bytes) -> Remediation | None:
            x = Remediation.model_validate_json(v)
            # an intent record precedes every command (issue 13): the decision is the outcome after it
            return x if f.failure_id in x.failure_ids and x.decision.value not in ("executed", "intent") else None

        again = await topics.wait_for("remediations", second_decision, 30, "the decision on the redelivery")
        assert again.decision.value == "skipped"
        executed_n = sum(1 for v in topics.seen.get("remediations", []) if executed(v))
        assert executed_n == 1
        assert node_field(node, "Reason") == reason
        print(f"\nXID 79 appended -> failure on Kafka: {latency:.2f} s (replay interval 0.5 s)")
    finally:
        await topics.stop()
        await stop_services(procs)
        if job_id:
            subprocess.run(["scancel", job_id], check=False, timeout=30)
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=RESUME"], check=False, capture_output=True, timeout=30
        )
        for sp in procs:
            if sp.proc is not None and sp.proc.returncode not in (0, -15):
                print(f"--- {sp.name} exited {sp.proc.returncode}:\n{sp.log_tail(30)}")
    deadline = time.monotonic() + 15
    while "DRAIN" in node_field(node, "State") and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
    assert "DRAIN" not in node_field(node, "State"), "the node must be resumed at the end"
