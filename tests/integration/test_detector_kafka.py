"""Detector on a real broker: an attributed XID 79 becomes one Failure; redelivery adds none;
malformed messages on each input topic are dead-lettered and the service keeps running."""

from __future__ import annotations

import asyncio
import base64

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from kafkatools import read

from gpuwarden.detector import DetectorService, DetectorSettings
from gpuwarden.shared.models import AttributedEvent, EventKind, Failure, GpuAttribution, GpuEvent, stable_id

pytestmark = pytest.mark.integration

RAW = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"


async def test_detector_end_to_end_on_kafka(bus_env: dict[str, str]) -> None:
    bs, prefix = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"]
    svc = DetectorService(DetectorSettings())
    await svc.start()
    p = AIOKafkaProducer(bootstrap_servers=bs)
    await p.start()
    try:
        ev = GpuEvent(
            event_id=stable_id("n", 1),
            node="gpu-node-001",
            ts=1000.0,
            kind=EventKind.XID,
            code=79,
            gpu_index=1,
            pci_bus_id="0000:44:00.0",
            message="GPU has fallen off the bus",
            raw=RAW,
            source="test",
        )
        msg = AttributedEvent(event=ev, job=GpuAttribution(gpu_index=1, job_id="7", user="u", job_gpus=2)).to_json()
        for _ in range(2):  # redelivery
            await p.send_and_wait(f"{prefix}gpu.events.attributed", msg, key=b"gpu-node-001")
        await p.send_and_wait(f"{prefix}gpu.events.attributed", b"{not json", key=b"gpu-node-001")
        await p.send_and_wait(f"{prefix}gpu.attributed", orjson.dumps({"sample": {"node": 3}}), key=b"x")
        dls = [orjson.loads(v) for v in await read(bs, f"{prefix}deadletter", 2)]
        assert sorted(d["source_topic"] for d in dls) == [f"{prefix}gpu.attributed", f"{prefix}gpu.events.attributed"]
        assert any(base64.b64decode(d["value_b64"]) == b"{not json" for d in dls)
        assert all(d["service"] == "detector" and d["error"] for d in dls)
        # still alive: a later good event is processed
        ev2 = ev.model_copy(update={"code": 48, "event_id": "x2", "ts": 1001.0})
        await p.send_and_wait(f"{prefix}gpu.events.attributed", AttributedEvent(event=ev2).to_json(), key=b"n")
        fails = [Failure.model_validate_json(v) for v in await read(bs, f"{prefix}failures", 2)]
        assert sorted(f.pattern for f in fails) == ["gpu-fallen-off-bus", "uncorrectable-ecc"]
        assert next(f for f in fails if f.pattern == "gpu-fallen-off-bus").job_id == "7"
        await asyncio.sleep(1)
        assert len(await read(bs, f"{prefix}failures", 3, timeout_s=2)) == 2  # redelivery changed nothing
        assert svc.health()["status"] == "ok"
    finally:
        await p.stop()
        await svc.stop()
        await svc.stop()  # stop twice is safe
