"""``job.windows`` from correlator worker processes on a real broker: restart recovery of the
open windows (the correlator.windows changelog) and two workers splitting the partitions."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from gpuwarden.shared.models import GpuSample, JobState, JobWindow, NodeSample, SlurmWatermark
from gpuwarden.sim.brokers import free_port

pytestmark = pytest.mark.integration

T0 = float(int(time.time()) // 10 * 10 - 3600)  # event time: an hour ago, window-aligned


class Workers:
    """Correlator worker processes of one consumer group; all killed at teardown."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[tuple[subprocess.Popen[bytes], int]] = []

    def start(self) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        # The log goes to a file: a pipe nobody reads fills (64 KiB of INFO lines under load)
        # and blocks the worker on its next log line.
        fd, path = tempfile.mkstemp(prefix="correlator-worker-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwarden.correlator"],
                env={**self.env, "GPUWARDEN_HTTP_PORT": str(port)},
                start_new_session=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        LOGS[proc.pid] = path
        self.procs.append((proc, port))
        return proc, port

    def stop(self, proc: subprocess.Popen[bytes]) -> str:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        out = log_of(proc)
        assert rc == 0, out[-4000:]
        return out

    def logs(self) -> str:
        """The tail of every worker's log (for a failure message)."""
        return "".join(f"\n--- worker {p.pid} ({LOGS[p.pid]}) ---\n{log_of(p)[-3000:]}" for p, _ in self.procs)

    def kill_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


#: worker pid -> its log file
LOGS: dict[int, str] = {}


def log_of(proc: subprocess.Popen[bytes]) -> str:
    """A worker's log so far."""
    with open(LOGS[proc.pid], "rb") as f:
        return f.read().decode(errors="replace")


@pytest.fixture
def workers(bus_env: dict[str, str], topic_prefix: str) -> Iterator[Workers]:
    env = {
        **os.environ,
        **bus_env,
        "GPUWARDEN_CONSUMER_GROUP": f"gpuwarden-correlator-{topic_prefix.rstrip('.')}",
        "GPUWARDEN_LOG_LEVEL": "INFO",
        "GPUWARDEN_CORRELATOR_WINDOW_S": "10",
        "GPUWARDEN_CORRELATOR_WINDOW_GRACE_S": "5",
    }
    w = Workers(env)
    try:
        yield w
    finally:
        w.kill_all()


def metric(port: int, name: str, topic: str | None = None) -> float:
    """One sample of a worker's ``/metrics`` (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    want = f'{name}{{topic="{topic}"}}' if topic else name
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


async def wait_for(cond: Any, what: str, procs: list[subprocess.Popen[bytes]], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, log_of(p)[-4000:]
        try:
            if await asyncio.to_thread(cond):
                return
        except OSError:
            pass  # HTTP endpoint not up yet
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


async def produce(bootstrap: str, items: list[tuple[str, bytes, bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks=1, linger_ms=5)
    await p.start()
    try:
        offsets: dict[str, dict[int, int]] = {}
        for topic, key, value in items:
            if topic.endswith("slurm.jobs"):
                md = await p.send_and_wait(topic, value=value, key=key)
                offsets.setdefault(topic, {})[md.partition] = md.offset + 1
            else:
                await p.send(topic, value=value, key=key)
        for topic, jobs_offsets in offsets.items():
            # what slurm-watcher says after its poll: the view is complete (here: for good)
            wm = SlurmWatermark(cluster="test", ts=T0 + 10**6, jobs_offsets=jobs_offsets)
            await p.send_and_wait(topic.removesuffix("jobs") + "watermarks", value=wm.to_json(), key=b"test")
        await p.flush()
    finally:
        await p.stop()


def job(job_id: str, nodes: list[str]) -> JobState:
    return JobState(
        job_id=job_id,
        ts=T0 - 30,
        state="RUNNING",
        user="alice",
        partition="gpu",
        nodes=nodes,
        gpus={n: [0, 1] for n in nodes},
        start_ts=T0 - 60,
    )


def samples(node: str, seconds: range) -> list[NodeSample]:
    return [
        NodeSample(
            node=node,
            ts=T0 + t,
            collector_id="test",
            source="simulated",
            gpus=[GpuSample(index=i, utilization_gpu_pct=float(t), memory_used_mib=100.0 * t) for i in range(3)],
        )
        for t in seconds
    ]


async def read_windows(
    bootstrap: str, topic: str, expected: int, timeout: float = 60.0
) -> list[tuple[bytes, JobWindow]]:
    """Every message of ``topic`` until ``expected`` have come and 2 s more pass quietly."""
    c = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", fetch_max_wait_ms=100
    )
    await c.start()
    out: list[tuple[bytes, JobWindow]] = []
    try:
        deadline = time.monotonic() + timeout
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            batches = await c.getmany(timeout_ms=500)
            for recs in batches.values():
                out += [(r.key, JobWindow.model_validate_json(r.value)) for r in recs]
            if len(out) >= expected:
                quiet_until = quiet_until or time.monotonic() + 2
                if time.monotonic() >= quiet_until:
                    break
    finally:
        await c.stop()
    return out


async def _attributed_seconds(bootstrap: str, topic: str) -> list[tuple[int, float, list[str]]]:
    """(offset, second from T0, job ids) of every ``gpu.attributed`` message so far."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    await c.start()
    out: list[tuple[int, float, list[str]]] = []
    try:
        for _ in range(6):
            for recs in (await c.getmany(timeout_ms=500)).values():
                for r in recs:
                    d = orjson.loads(r.value)
                    out.append((r.offset, d["sample"]["ts"] - T0, sorted({j["job_id"] for j in d["jobs"]})))
    finally:
        await c.stop()
    return sorted(out)


def key(w: JobWindow) -> tuple[str, str, int, float]:
    return (w.job_id, w.node, w.gpu_index, w.window_start)


async def test_open_windows_survive_a_worker_restart(workers: Workers, kafka_bootstrap: str, topic_prefix: str) -> None:
    t = lambda short: f"{topic_prefix}{short}"
    node = "gpu-node-001"
    a, port_a = workers.start()
    await produce(kafka_bootstrap, [(t("slurm.jobs"), b"2001", job("2001", [node]).to_json())])
    await wait_for(lambda: metric(port_a, "gpuwarden_correlator_slurm_watermark_seconds") > 0, "Slurm view", [a])
    # 0..7 s: window [T0, T0+10) is open when the worker stops.
    await produce(kafka_bootstrap, [(t("gpu.samples"), node.encode(), s.to_json()) for s in samples(node, range(8))])
    # Attributed and windowed in the sample handler (gpu.attributed is not consumed back).
    await wait_for(
        lambda: metric(port_a, "gpuwarden_messages_out_total", "gpu.attributed") >= 8, "8 windowed samples", [a]
    )
    out_a = workers.stop(a)

    b, port_b = workers.start()
    # 8..16 s: 16 >= T0 + 10 + grace closes the first window, which must hold all 10 samples.
    await produce(
        kafka_bootstrap, [(t("gpu.samples"), node.encode(), s.to_json()) for s in samples(node, range(8, 17))]
    )
    await wait_for(lambda: metric(port_b, "gpuwarden_messages_out_total", "job.windows") >= 2, "the first window", [b])
    wins = await read_windows(kafka_bootstrap, t("job.windows"), 2)
    got = sorted((k, w.job_id, w.gpu_index, w.window_start, w.samples) for k, w in wins)
    if got != [(b"2001", "2001", 0, T0, 10), (b"2001", "2001", 1, T0, 10)]:
        out_b = workers.stop(b)
        raise AssertionError(f"{got}\n--- a ---\n{out_a[-3000:]}\n--- b ---\n{out_b[-5000:]}")
    w0 = next(w for _, w in wins if w.gpu_index == 0)
    # Readings from before the restart are in the summary (recovered from the changelog).
    assert (w0.memory_used_mib_first, w0.memory_used_mib_last, w0.utilization_gpu_pct_min) == (0.0, 900.0, 0.0)
    assert w0.utilization_gpu_pct_mean == 4.5
    # (gpuwarden_late_samples may be > 0 here: after a rebalance faust seeks back to the last
    # committed offset, and readings redelivered after their window closed count as late.)
    workers.stop(b)


async def _committed(bootstrap: str, group: str, topic: str) -> int:
    """Sum of the group's committed offsets on ``topic`` (0 when none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return sum(max(o.offset, 0) for tp, o in offsets.items() if tp.topic == topic)
    finally:
        await admin.close()


async def test_open_windows_survive_a_worker_crash_after_a_commit(
    workers: Workers, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The windows table is written to its changelog when a commit starts, not per sample:
    a worker killed without a graceful stop must still have put everything the committed
    offsets cover into the changelog (the rest is redelivered and folded by the next worker)."""
    t = lambda short: f"{topic_prefix}{short}"
    group = workers.env["GPUWARDEN_CONSUMER_GROUP"]
    node = "gpu-node-002"
    a, port_a = workers.start()
    await produce(kafka_bootstrap, [(t("slurm.jobs"), b"2002", job("2002", [node]).to_json())])
    await wait_for(lambda: metric(port_a, "gpuwarden_correlator_slurm_watermark_seconds") > 0, "Slurm view", [a])
    await produce(kafka_bootstrap, [(t("gpu.samples"), node.encode(), s.to_json()) for s in samples(node, range(8))])
    await wait_for(
        lambda: metric(port_a, "gpuwarden_messages_out_total", "gpu.attributed") >= 8, "8 windowed samples", [a]
    )
    # faust commits the offset of the last processed message (it resumes after it).
    await wait_for(
        lambda: asyncio.run(_committed(kafka_bootstrap, group, t("gpu.samples"))) >= 7, "the samples committed", [a]
    )
    committed_before_kill = await _committed(kafka_bootstrap, group, t("gpu.samples"))
    os.killpg(a.pid, signal.SIGKILL)  # no graceful stop: no final commit, no flush
    a.wait(10)

    b, port_b = workers.start()
    await produce(
        kafka_bootstrap, [(t("gpu.samples"), node.encode(), s.to_json()) for s in samples(node, range(8, 17))]
    )
    await wait_for(
        lambda: metric(port_b, "gpuwarden_messages_out_total", "job.windows") >= 2, "the first window", [b], 120
    )
    wins = await read_windows(kafka_bootstrap, t("job.windows"), 2)
    got = sorted((k, w.job_id, w.gpu_index, w.window_start, w.samples) for k, w in wins)
    w0 = next(w for _, w in wins if w.gpu_index == 0)
    if got != [(b"2002", "2002", 0, T0, 10), (b"2002", "2002", 1, T0, 10)] or (
        w0.memory_used_mib_first,
        w0.memory_used_mib_last,
        w0.utilization_gpu_pct_mean,
    ) != (0.0, 900.0, 4.5):
        # what worker b saw, for the failure message (a lost reading was seen twice in CI: 9 of
        # 10). Sample t has utilization t, so the missing second is 45 - samples x mean.
        seen = {
            "committed before the kill": committed_before_kill,
            "b: gpu.samples in": metric(port_b, "gpuwarden_messages_in_total", "gpu.samples"),
            "b: Slurm watermark": metric(port_b, "gpuwarden_correlator_slurm_watermark_seconds"),
            "b: late samples": metric(port_b, "gpuwarden_late_samples"),
            "windows (gpu, samples, mem first, mem last, util mean)": [
                (w.gpu_index, w.samples, w.memory_used_mib_first, w.memory_used_mib_last, w.utilization_gpu_pct_mean)
                for _, w in wins
            ],
            "missing second(s)": [
                round(45 - w.samples * (w.utilization_gpu_pct_mean or 0), 3) for _, w in wins if w.samples == 9
            ],
            # (offset, second, jobs) of what the workers published on gpu.attributed: a reading
            # published without its job was not windowed into the job's window
            "gpu.attributed": await _attributed_seconds(kafka_bootstrap, t("gpu.attributed")),
            # past the lost reading's offset when faust acked it unhandled (below)
            "b: committed": await _committed(kafka_bootstrap, group, t("gpu.samples")),
        }
        os.killpg(b.pid, signal.SIGKILL)
        b.wait(10)
        log = log_of(b)
        marks = ("ecover", "esum", "changelog", "first", "ssign", "|")
        keep = [ln for ln in log.splitlines() if any(k in ln for k in marks)]
        full = LOGS[b.pid]
        pytest.fail(
            f"worker b lost a reading: {seen}\nworker b's log ({full}; recovery lines):\n" + "\n".join(keep[-80:])
        )
    workers.stop(b)


async def _group_members(bootstrap: str, group: str) -> tuple[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [resp] = await admin.describe_consumer_groups([group])
        g = resp.groups[0]
        return g[2], len(g[5])
    except KafkaError:  # a fresh broker has no group coordinator until __consumer_offsets exists
        return "", 0
    finally:
        await admin.close()


async def test_two_workers_split_partitions_and_produce_each_window_once(
    workers: Workers, kafka_bootstrap: str, topic_prefix: str
) -> None:
    t = lambda short: f"{topic_prefix}{short}"
    group = workers.env["GPUWARDEN_CONSUMER_GROUP"]
    part = DefaultPartitioner()
    nodes: list[str] = []
    per_part = {0: 0, 1: 0}
    i = 0
    while min(per_part.values()) < 3:
        n = f"gpu-node-{i:03d}"
        p = part(n.encode(), [0, 1], [0, 1])
        if per_part[p] < 3:
            per_part[p] += 1
            nodes.append(n)
        i += 1
    (a, port_a), (b, port_b) = workers.start(), workers.start()

    def balanced() -> bool:
        state, members = asyncio.run(_group_members(kafka_bootstrap, group))
        return state == "Stable" and members == 2

    await wait_for(balanced, "a stable group of two", [a, b])
    await produce(kafka_bootstrap, [(t("slurm.jobs"), b"3001", job("3001", nodes).to_json())])

    def views() -> bool:
        return all(metric(p, "gpuwarden_correlator_slurm_watermark_seconds") > 0 for p in (port_a, port_b))

    await wait_for(views, "the Slurm view of both workers", [a, b])
    items = [(t("gpu.samples"), n.encode(), s.to_json()) for n in nodes for s in samples(n, range(25))]
    items += [(t("gpu.samples"), n.encode(), s.to_json()) for n in nodes for s in samples(n, range(100, 101))]
    await produce(kafka_bootstrap, items)
    expected = len(nodes) * 2 * 3  # 2 held GPUs x windows [0,10) [10,20) [20,30)
    wins = await read_windows(kafka_bootstrap, t("job.windows"), expected)

    keys = [key(w) for _, w in wins]
    assert len(keys) == len(set(keys)), "a window was produced twice" + workers.logs()
    want = sorted(("3001", n, g, T0 + s) for n in nodes for g in (0, 1) for s in (0.0, 10.0, 20.0))
    assert sorted(keys) == want, f"missing {sorted(set(want) - set(keys))}" + workers.logs()
    assert all(k == b"3001" for k, _ in wins)
    assert sorted({w.samples for _, w in wins}) == [5, 10]
    assert all(w.job_gpus == 2 * len(nodes) for _, w in wins)
    # Both workers got partitions and windowed samples.
    got = [metric(p, "gpuwarden_messages_out_total", "gpu.attributed") for p in (port_a, port_b)]
    assert all(g > 0 for g in got), got
    assert sum(got) == len(nodes) * 26
    for p in (a, b):
        workers.stop(p)
