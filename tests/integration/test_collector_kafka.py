"""CollectorService in replay mode against a real broker: samples and an appended XID come back."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.settings import CollectorSettings
from gpuwarden.shared.models import GpuEvent, NodeSample

FIX = Path(__file__).resolve().parents[1] / "fixtures"

pytestmark = pytest.mark.integration


async def _read(bootstrap: str, topic: str, want: int, timeout: float = 30) -> list[bytes]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await c.start()
    out: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            batches = await c.getmany(timeout_ms=500)
            out.extend(r.value for recs in batches.values() for r in recs)
    finally:
        await c.stop()
    return out


async def test_replay_collector_publishes_to_kafka(bus_env: dict[str, str], tmp_path: Path) -> None:
    node = tmp_path / "gpu-node-003"
    node.mkdir()
    shutil.copy(FIX / "nvidia-smi" / "rtx3080-xml-v13-595.xml", node / "capture.xml")
    settings = CollectorSettings(collector_source="replay", collector_replay_dir=tmp_path, collector_interval_s=0.2)
    svc = CollectorService(settings)
    await svc.start()
    try:
        await asyncio.sleep(0.5)
        with (node / "kern.log").open("a") as fh:
            fh.write("2025-03-01T10:00:00,000000+00:00 NVRM: Xid (PCI:0000:0c:00): 79, GPU has fallen off the bus.\n")
        prefix = bus_env["GPUWARDEN_TOPIC_PREFIX"]
        boot = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"]
        ev_raw = await _read(boot, f"{prefix}gpu.events", 1)
        s_raw = await _read(boot, f"{prefix}gpu.samples", 1)
    finally:
        await svc.stop()
    sample = NodeSample.model_validate(orjson.loads(s_raw[0]))
    assert sample.node == "gpu-node-003" and sample.gpus[0].power_w == 139.62
    [ev] = [GpuEvent.model_validate(orjson.loads(v)) for v in ev_raw]
    assert (ev.node, ev.code, ev.gpu_index, ev.pci_bus_id) == ("gpu-node-003", 79, 0, "0000:0c:00.0")


class LateForwarder:
    """A TCP port that refuses connections until :meth:`open`, then forwards to ``target``: a
    broker that comes up after its clients (the bootstrap goes through it; Kafka's metadata then
    names the real broker)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.server: asyncio.base_events.Server | None = None
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(*self.target)
        await asyncio.gather(self._pipe(r, uw), self._pipe(ur, w))

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_the_collector_starts_without_kafka_and_delivers_what_it_collected_once_kafka_answers(
    bus_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a node that boots before Kafka (or while it is down) keeps collecting: it starts,
    reports itself degraded, buffers, and delivers the samples of the outage, in order, when the
    broker comes."""
    node = tmp_path / "gpu-node-003"
    node.mkdir()
    shutil.copy(FIX / "nvidia-smi" / "rtx3080-xml-v13-595.xml", node / "capture.xml")
    late = LateForwarder(bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"])
    monkeypatch.setenv("GPUWARDEN_BOOTSTRAP_SERVERS", f"127.0.0.1:{late.port}")
    settings = CollectorSettings(collector_source="replay", collector_replay_dir=tmp_path, collector_interval_s=0.2)
    svc = CollectorService(settings)
    t0 = time.monotonic()
    await svc.start()  # returns at once: nothing answers yet
    try:
        assert time.monotonic() - t0 < 10
        await asyncio.sleep(1.5)
        h = svc.health()
        assert h["status"] == "degraded" and h["broker"] == "unreachable", h
        assert svc.ticks >= 3 and svc.outbox.pending >= 3  # collected and kept
        first_ts = time.time() - (time.monotonic() - t0)
        await late.open()
        got = await _read(
            bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], f"{bus_env['GPUWARDEN_TOPIC_PREFIX']}gpu.samples", 8, 60
        )
        deadline = time.monotonic() + 30
        while svc.health()["status"] != "ok" and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert svc.health()["status"] == "ok", svc.health()
    finally:
        await svc.stop()
        await late.close()
    ts = [NodeSample.model_validate(orjson.loads(v)).ts for v in got]
    assert len(ts) >= 8 and ts == sorted(ts)
    assert ts[0] < first_ts + 1.0  # the first sample is from before the broker answered


async def test_a_service_waits_for_kafka_at_start_when_told_to(
    bus_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GPUWARDEN_KAFKA_START_WAIT_S``: the detector retries while nothing answers (/healthz
    degraded with the reason) and starts once the broker does; 0 fails at once."""
    from aiokafka.errors import KafkaConnectionError

    from gpuwarden.detector.service import DetectorService, DetectorSettings

    late = LateForwarder(bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"])
    monkeypatch.setenv("GPUWARDEN_BOOTSTRAP_SERVERS", f"127.0.0.1:{late.port}")
    fast = DetectorService(DetectorSettings(http_port=0))
    t0 = time.monotonic()
    with pytest.raises(KafkaConnectionError):
        await fast.start()
    await fast.stop()
    assert time.monotonic() - t0 < 15
    svc = DetectorService(DetectorSettings(http_port=0, kafka_start_wait_s=120))
    starting = asyncio.create_task(svc.start())
    try:
        await asyncio.sleep(2.5)
        assert not starting.done()
        h = svc.health()
        assert h["status"] == "degraded" and "no broker answers" in h["broker_error"], h
        await late.open()
        await asyncio.wait_for(starting, 90)
        assert svc.health()["broker_error"] is None
    finally:
        if not starting.done():
            starting.cancel()
        await svc.stop()
        await late.close()
