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
