"""One lifecycle for every long-lived component: ``stop()`` is safe before ``start()`` and twice.
(Starting needs a broker; the integration tests start and stop each service for real.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwarden.shared.bus import MemoryPublisher, Producer
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.service import HttpEndpoint, Service
from gpuwarden.shared.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "gpuwarden" / "demo" / "scenarios" / "demo-xid79.yaml"


def _collector() -> object:
    from gpuwarden.collector.service import CollectorService
    from gpuwarden.collector.settings import CollectorSettings

    return CollectorService(
        CollectorSettings(collector_source="simulated", collector_scenario=DEMO), producer=MemoryPublisher()
    )


def _watcher() -> object:
    from gpuwarden.sim.slurm import FakeSlurm
    from gpuwarden.slurm_watcher import SlurmWatcher
    from gpuwarden.slurm_watcher.service import SlurmWatcherSettings

    return SlurmWatcher(SlurmWatcherSettings(), client=FakeSlurm(), producer=MemoryPublisher())


def _correlator() -> object:
    from gpuwarden.correlator import CorrelatorService, CorrelatorSettings

    return CorrelatorService(CorrelatorSettings())


def _detector() -> object:
    from gpuwarden.detector import DetectorService, DetectorSettings

    return DetectorService(DetectorSettings(), producer=MemoryPublisher())


def _bridge() -> object:
    from gpuwarden.otlp_bridge import OtlpBridgeService
    from gpuwarden.otlp_bridge.settings import OtlpBridgeSettings

    return OtlpBridgeService(OtlpBridgeSettings(), producer=MemoryPublisher())


def _remediator() -> object:
    from gpuwarden.remediator import Remediator, RemediatorSettings
    from gpuwarden.sim.slurm import FakeSlurm

    return Remediator(RemediatorSettings(), client=FakeSlurm(), producer=MemoryPublisher())


COMPONENTS: dict[str, Callable[[], object]] = {
    "producer": lambda: Producer(ServiceSettings()),
    "http-endpoint": lambda: HttpEndpoint("127.0.0.1", 0, ServiceMetrics("x"), dict),
    "collector": _collector,
    "slurm-watcher": _watcher,
    "correlator": _correlator,
    "detector": _detector,
    "otlp-bridge": _bridge,
    "remediator": _remediator,
}


@pytest.mark.parametrize("name", sorted(COMPONENTS))
async def test_stop_is_safe_before_start_and_twice(name: str) -> None:
    c = COMPONENTS[name]()
    before = asyncio.all_tasks()
    await c.stop()  # type: ignore[attr-defined]
    await c.stop()  # type: ignore[attr-defined]
    assert asyncio.all_tasks() == before, f"{name}: stop() before start() left tasks behind"
    if isinstance(c, Service):
        assert c.health()["status"] == "stopped", c.health()


async def test_http_endpoint_start_stop_twice_and_serves_health() -> None:
    import aiohttp

    ep = HttpEndpoint("127.0.0.1", 0, ServiceMetrics("x"), lambda: {"status": "ok"})
    await ep.start()
    await ep.start()
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{ep.port}/healthz") as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{ep.port}/metrics") as r:
            assert "gpuwarden_up" in await r.text()
    finally:
        await ep.stop()
        await ep.stop()
