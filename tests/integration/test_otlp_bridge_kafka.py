"""The otlp-bridge service on a real broker, with the SDK's in-memory reader/exporter injected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import generate_latest

from gpuwarden.otlp_bridge import OtlpBridgeService, OtlpBridgeSettings
from gpuwarden.shared.models import (
    Action,
    AttributedSample,
    Category,
    CostEstimate,
    DeadLetter,
    Failure,
    GpuAttribution,
    GpuSample,
    NodeSample,
    Severity,
)

pytestmark = pytest.mark.integration


async def _until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


def _power_points(reader: InMemoryMetricReader) -> list[tuple[dict[str, object], float]]:
    data = reader.get_metrics_data()
    out = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "hw.power":
                    out += [(dict(p.attributes), p.value) for p in m.data.data_points]
    return out


async def test_bridge_consumes_kafka_and_dead_letters_bad_messages(bus_env: dict[str, str]) -> None:
    settings = OtlpBridgeSettings()
    reader, logs = InMemoryMetricReader(), InMemoryLogRecordExporter()
    svc = OtlpBridgeService(settings, metric_readers=[reader], log_exporters=[logs], log_processor="simple")
    now = time.time()
    attributed = AttributedSample(
        sample=NodeSample(node="n1", ts=now, collector_id="test", source="simulated",
                          gpus=[GpuSample(index=0, uuid="GPU-0", power_w=321.0, utilization_gpu_pct=40.0)]),
        jobs=[GpuAttribution(gpu_index=0, job_id="77", user="alice", partition="gpu")],
    )  # fmt: skip
    fail = Failure(
        failure_id="f-int", pattern="gpu-fallen-off-bus", rule_id="xid-79", category=Category.HARDWARE,
        severity=Severity.FATAL, node="n1", gpu_index=0, gpu_uuid="GPU-0", job_id="77", first_seen=now - 5,
        last_seen=now, verdict="GPU 0 fell off the bus", recommended_action=Action.DRAIN,
        cost=CostEstimate(affected_gpus=1, usd_per_hour=2.0, gpu_hours_lost=0.0),
    )  # fmt: skip
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await svc.start()
    await producer.start()
    try:
        await producer.send_and_wait(settings.topic("gpu.attributed"), attributed.to_json(), key=b"n1")
        # same key: same partition, so the good failure comes after the bad ones
        await producer.send_and_wait(settings.topic("failures"), b"{not json", key=b"n1")
        await producer.send_and_wait(settings.topic("failures"), orjson.dumps({"schema_version": 1}), key=b"n1")
        await producer.send_and_wait(settings.topic("failures"), fail.to_json(), key=b"n1")

        await _until(lambda: len(logs.get_finished_logs()) >= 1 and bool(_power_points(reader)))
        (rec,) = logs.get_finished_logs()
        assert rec.log_record.severity_text == "FATAL"
        assert rec.log_record.timestamp == round(now * 1e9)
        assert dict(rec.log_record.attributes or {})["gpuwarden.failure.id"] == "f-int"
        ((attrs, value),) = _power_points(reader)
        assert value == 321.0
        assert (attrs["host.name"], attrs["hw.id"], attrs["slurm.job.id"]) == ("n1", "GPU-0", "77")
        text = generate_latest(svc.metrics.registry).decode()
        assert 'gpuwarden_gpu_power_watts{gpu="0",model="",node="n1"' in text
        assert 'gpuwarden_gpu_job_info{gpu="0",job_id="77",node="n1",partition="gpu",user="alice"} 1.0' in text
        assert 'gpuwarden_failures_total{node="n1",pattern="gpu-fallen-off-bus",severity="fatal"} 1.0' in text

        dead: list[DeadLetter] = []
        consumer = AIOKafkaConsumer(settings.topic("deadletter"), bootstrap_servers=settings.bootstrap_servers,
                                    auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip
        await consumer.start()
        try:
            deadline = time.monotonic() + 30
            while len(dead) < 2 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                dead += [DeadLetter.model_validate_json(r.value) for rs in batch.values() for r in rs]
        finally:
            await consumer.stop()
        assert len(dead) == 2
        assert {d.service for d in dead} == {"otlp-bridge"}
        assert {d.source_topic for d in dead} == {settings.topic("failures")}
        assert all(d.error.startswith("schema:") for d in dead)
        assert svc.health()["status"] == "ok"
    finally:
        await producer.stop()
        await svc.stop()
    await svc.stop()  # twice is safe
