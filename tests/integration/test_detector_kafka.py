"""Detector on a real broker: an attributed XID 79 becomes one Failure; redelivery adds none;
malformed messages on each input topic are dead-lettered and the service keeps running."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

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


@pytest.mark.parametrize("damage", [b"", b"\x80\x04 not a snapshot", None], ids=["empty", "damaged", "missing"])
async def test_a_lost_state_file_keeps_the_failure_id_of_an_open_episode(
    bus_env: dict[str, str], tmp_path: Path, damage: bytes | None
) -> None:
    """Issue 25, point 4: XID 79 opens a failure; the detector stops and its state file is then
    empty, damaged or gone; the same GPU's XID 79 again (inside the rule's burst window) after the
    restart is the same failure (same id, two occurrences), read back from `failures`, not a
    second one."""
    bs, prefix = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"]
    state = tmp_path / "detector.state"
    ev = GpuEvent(event_id="a1", node="gpu-node-001", ts=1000.0, kind=EventKind.XID, code=79, gpu_index=1,
                  pci_bus_id="0000:44:00.0", message="GPU has fallen off the bus", raw=RAW, source="test")  # fmt: skip
    job = GpuAttribution(gpu_index=1, job_id="7", user="u", job_gpus=2)
    p = AIOKafkaProducer(bootstrap_servers=bs)
    await p.start()
    try:
        svc = DetectorService(DetectorSettings(detector_state_file=state))
        await svc.start()
        try:
            await p.send_and_wait(f"{prefix}gpu.events.attributed", AttributedEvent(event=ev, job=job).to_json(),
                                  key=b"gpu-node-001")  # fmt: skip
            [first] = [Failure.model_validate_json(v) for v in await read(bs, f"{prefix}failures", 1)]
        finally:
            await svc.stop()
        if damage is None:
            state.unlink(missing_ok=True)
        else:
            state.write_bytes(damage)
        svc = DetectorService(DetectorSettings(detector_state_file=state))
        await svc.start()
        try:
            assert not svc.durable.restored and len(svc.detector.episodes) == 1  # adopted from `failures`
            again = ev.model_copy(update={"event_id": "a2", "ts": 1400.0})
            await p.send_and_wait(f"{prefix}gpu.events.attributed", AttributedEvent(event=again, job=job).to_json(),
                                  key=b"gpu-node-001")  # fmt: skip
            fails = [Failure.model_validate_json(v) for v in await read(bs, f"{prefix}failures", 2)]
        finally:
            await svc.stop()
    finally:
        await p.stop()
    assert [f.failure_id for f in fails] == [first.failure_id] * 2, fails
    assert fails[1].occurrences == 2 and fails[1].last_seen == 1400.0 and fails[1].job_id == "7"


async def test_with_a_state_file_the_last_records_of_a_quiet_stream_are_committed(
    bus_env: dict[str, str], tmp_path: Path
) -> None:
    """The state file's commit hook defers a commit until a state write is due; a deferred
    commit after the stream's last record was never retried while no new record came, so the
    detector's group stayed behind forever (found by the chaos bench once its detector ran with
    the shipped state file: the run never drained)."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    bs, prefix = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"]
    settings = DetectorSettings(detector_state_file=tmp_path / "detector.state", detector_state_interval_s=2.0)
    svc = DetectorService(settings)
    await svc.start()
    p = AIOKafkaProducer(bootstrap_servers=bs)
    await p.start()
    admin = AIOKafkaAdminClient(bootstrap_servers=bs)
    await admin.start()
    topic = f"{prefix}gpu.events.attributed"
    try:
        for i in range(3):  # one after the other: the 2nd and 3rd land inside the state interval
            ev = GpuEvent(event_id=f"q{i}", node="gpu-node-001", ts=1000.0 + i, kind=EventKind.XID, code=13,
                          gpu_index=0, message="Graphics Exception", raw=f"NVRM: Xid (PCI:0000:18:00): 13, {i}",
                          source="test")  # fmt: skip
            await p.send_and_wait(topic, AttributedEvent(event=ev).to_json(), key=b"gpu-node-001")
            await asyncio.sleep(0.3)
        group = f"{settings.consumer_group or 'gpuwarden-detector'}-events"
        committed: dict[TopicPartition, int] = {}
        for _ in range(60):  # the state interval (2 s) and a commit interval later, without new input
            offs = await admin.list_consumer_group_offsets(group)
            committed = {tp: m.offset for tp, m in offs.items() if tp.topic == topic}
            if sum(committed.values()) >= 3:
                break
            await asyncio.sleep(0.25)
        assert sum(committed.values()) == 3, committed
        assert svc.durable.writes >= 1
    finally:
        await admin.close()
        await p.stop()
        await svc.stop()
