"""Two otlp-bridges on a real broker (issue 26: a GPU exported twice): when the second bridge
joins, the first forgets the nodes whose ``gpu.attributed`` and ``failures`` partitions it no
longer reads, so every GPU's ``gpuwarden_gpu_job_info`` (and its other series) and every open
failure is on exactly one bridge's ``/metrics``. Before, the first kept exporting them until
they went stale (300 s; a day for an open failure), and two ``job_info`` series of one GPU make
the shipped ``group_left`` joins fail."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable

import pytest
from prometheus_client import generate_latest

from gpuwarden.otlp_bridge import OtlpBridgeService, OtlpBridgeSettings
from gpuwarden.shared.bus import kafka_producer
from gpuwarden.shared.models import (
    Action,
    AttributedSample,
    Category,
    CostEstimate,
    Failure,
    GpuAttribution,
    GpuSample,
    NodeSample,
    Severity,
)
from gpuwarden.shared.topics import create_topics

pytestmark = pytest.mark.integration

NODES = [f"gpu-node-{i:03d}" for i in range(12)]
JOB_INFO = re.compile(r'^gpuwarden_gpu_job_info\{gpu="(\d+)",job_id="[^"]*",node="([^"]+)"', re.M)
OPEN = re.compile(r'^gpuwarden_failure_open\{[^}]*node="([^"]+)"[^}]*\} 1\.0', re.M)


async def _until(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.2)


def _series(svc: OtlpBridgeService) -> tuple[set[tuple[str, str]], set[str]]:
    text = generate_latest(svc.metrics.registry).decode()
    return {(n, g) for g, n in JOB_INFO.findall(text)}, set(OPEN.findall(text))


async def _send(bootstrap: str, settings: OtlpBridgeSettings, failures: bool = False) -> None:
    p = kafka_producer(bootstrap)
    await p.start()
    now = time.time()
    try:
        for node in NODES:
            s = AttributedSample(
                sample=NodeSample(node=node, ts=now, collector_id="t", source="simulated",
                                  gpus=[GpuSample(index=i, uuid=f"GPU-{node}-{i}", power_w=300.0) for i in (0, 1)]),
                jobs=[GpuAttribution(gpu_index=i, job_id="41", user="u", partition="gpu") for i in (0, 1)],
            )  # fmt: skip
            await p.send(settings.topic("gpu.attributed"), s.to_json(), key=node.encode())
            if failures:
                f = Failure(failure_id=f"f-{node}", pattern="thermal-throttle", rule_id="thermal-throttle",
                            category=Category.HARDWARE, severity=Severity.WARNING, node=node, gpu_index=0,
                            first_seen=now - 5, last_seen=now, verdict="hot", recommended_action=Action.ALERT,
                            cost=CostEstimate(affected_gpus=1, usd_per_hour=1.0, gpu_hours_lost=0.0))  # fmt: skip
                await p.send(settings.topic("failures"), f.to_json(), key=node.encode())
        await p.flush()
    finally:
        await p.stop()


async def test_a_gpu_is_on_one_bridge_after_a_second_joins(kafka_bootstrap: str, monkeypatch) -> None:
    prefix = f"h{uuid.uuid4().hex[:8]}."
    await create_topics(kafka_bootstrap, prefix, partitions=6)
    monkeypatch.setenv("GPUWARDEN_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("GPUWARDEN_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("GPUWARDEN_CONSUMER_GROUP", f"{prefix}bridge")
    settings = OtlpBridgeSettings()
    everything = {(n, g) for n in NODES for g in ("0", "1")}
    a = OtlpBridgeService(settings, metric_readers=[], log_exporters=[])
    b = OtlpBridgeService(settings, metric_readers=[], log_exporters=[])
    await a.start()
    try:
        await _send(kafka_bootstrap, settings, failures=True)
        await _until(lambda: _series(a) == (everything, set(NODES)))
        await b.start()  # the group rebalances: a keeps some partitions, b takes the rest
        await _until(lambda: bool(b._consumers and b._consumers[0].assignment()))
        await _send(kafka_bootstrap, settings)  # b learns its nodes' GPUs (not the old failures)
        await _until(lambda: _series(a)[0] | _series(b)[0] == everything and len(_series(b)[0]) > 0)
        gpus_a, open_a = _series(a)
        gpus_b, _ = _series(b)
        assert not gpus_a & gpus_b, f"exported by both bridges: {sorted(gpus_a & gpus_b)[:4]}"
        assert 0 < a.nodes_handed_over < 2 * len(NODES)
        # a's open failures are those of the failures partitions it still reads
        kept = {p for t, ps in a._consumers[0].assignment().items() if t == "failures" for p in ps}
        assert open_a == {n for n, p in a._read_from["failures"].items() if p in kept} != set(NODES)
    finally:
        await b.stop()
        await a.stop()
