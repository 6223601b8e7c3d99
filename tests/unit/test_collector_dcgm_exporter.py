"""The dcgm-exporter collector source against recorded dcgm-exporter scrapes served over real HTTP
(aiohttp on 127.0.0.1): what it maps, XIDs from the kernel log or DCGM's fallback, a dead or wrong
endpoint, and the collector's /healthz while NVML or the endpoint is unusable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gpuwarden.collector.service import CollectorService, build_source
from gpuwarden.collector.settings import CollectorSettings
from gpuwarden.collector.sources import DcgmExporterSource
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import EventKind
from prerequisites import SHARED, need_path

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
RTX3090 = FIX / "dcgm-exporter-rtx3090-pci-bus-id-xid-labels.txt"  # dcgm-exporter 3.3.x, one RTX 3090
T0 = 1_750_000_000.0


class Exporter:
    """A stand-in dcgm-exporter: serves ``body`` at /metrics (``status`` settable)."""

    def __init__(self, body: str) -> None:
        self.body, self.status, self.hits = body, 200, 0
        self.url = ""

    async def metrics(self, _req: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(text=self.body, status=self.status, content_type="text/plain")


@pytest.fixture
async def exporter() -> AsyncIterator[Exporter]:
    ex = Exporter(RTX3090.read_text())
    app = web.Application()
    app.router.add_get("/metrics", ex.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    ex.url = f"http://127.0.0.1:{port}/metrics"
    try:
        yield ex
    finally:
        await runner.cleanup()


def _settings(url: str, **kw: object) -> CollectorSettings:
    return CollectorSettings(
        collector_source="dcgm-exporter", collector_dcgm_exporter_url=url, collector_node="node-a", **kw
    )


async def test_a_recorded_scrape_over_http_is_the_node_sample(exporter: Exporter, tmp_path: Path) -> None:
    klog = tmp_path / "kern.log"
    klog.write_text("")
    src = build_source(_settings(exporter.url, collector_kernel_log=str(klog)))
    assert isinstance(src, DcgmExporterSource)
    try:
        [s] = await src.collect()
        assert (s.node, s.source, len(s.gpus)) == ("node-a", "dcgm-exporter", 1)
        g = s.gpus[0]
        # the sidecar's reading: gpu 0, PCI 0000:08:00.0, RTX 3090, 24268 MiB free, XID 0 = none
        assert (g.index, g.pci_bus_id, g.name, g.memory_free_mib) == (
            0,
            "0000:08:00.0",
            "NVIDIA GeForce RTX 3090",
            24268,
        )
        assert await src.events() == []  # DCGM's XID field is not read while a kernel log is
        with klog.open("a") as f:
            f.write("[ 8212.0] NVRM: Xid (PCI:0000:08:00): 79, pid='<unknown>', name=<unknown>, ")
            f.write("GPU has fallen off the bus.\n")
        [ev] = await src.events()
        assert (ev.kind, ev.code, ev.gpu_index, ev.gpu_uuid) == (EventKind.XID, 79, 0, g.uuid)  # by PCI bus id
    finally:
        await src.close()


async def test_mig_instances_and_mixed_models_of_a_real_scrape(exporter: Exporter) -> None:
    exporter.body = need_path(SHARED / "fixtures" / "dcgm" / "dcgm-exporter-metrics-mixed-model-mig.txt").read_text()
    src = build_source(_settings(exporter.url, collector_kernel_log=""))
    try:
        [s] = await src.collect()
    finally:
        await src.close()
    temps = {g.index: g.temperature_c for g in s.gpus}
    assert temps == {0: 50, 1: 44, 2: 45}  # the sidecar: GI 3 series of gpu 0, RTX 2000 Ada, A30 GI 3
    g0 = next(g for g in s.gpus if g.index == 0)
    assert (g0.memory_used_mib, g0.mig_mode, g0.pci_bus_id) == (3744, True, "0000:65:00.0")


async def test_dcgm_xid_field_is_the_fallback_without_a_kernel_log(exporter: Exporter) -> None:
    now = [T0]
    src = build_source(_settings(exporter.url, collector_kernel_log=""))
    assert isinstance(src, DcgmExporterSource)
    src.clock = lambda: now[0]
    try:
        await src.collect()
        assert await src.events() == []  # XID 0: none; the first value is history, not news
        exporter.body = exporter.body.replace('err_msg="Unknown Error"} 0', 'err_msg="Unknown Error"} 79')
        now[0] = T0 + 1
        await src.collect()
        [ev] = await src.events()
        assert (ev.code, ev.gpu_index, ev.ts, ev.source, ev.pci_bus_id) == (
            79,
            0,
            T0 + 1,
            "dcgm-exporter",
            "0000:08:00.0",
        )
        now[0] = T0 + 2
        await src.collect()
        assert await src.events() == []  # the same last XID again is not a new one
    finally:
        await src.close()


async def test_a_dead_or_wrong_endpoint_makes_the_collector_degraded_and_comes_back(exporter: Exporter) -> None:
    svc = CollectorService(_settings(exporter.url, collector_kernel_log=""), producer=MemoryPublisher())
    svc._started = True  # health as while running; ticks are driven by hand
    try:
        assert await svc.tick() == (1, 0)
        assert svc.health()["status"] == "ok"
        exporter.status = 503
        assert await svc.tick() == (0, 0)
        h = svc.health()
        assert h["status"] == "degraded" and "503" in h["source_problem"] and exporter.url in h["source_problem"]
        exporter.status, exporter.body = 200, "# HELP up node_exporter\n# TYPE up gauge\nup 1\n"
        await svc.tick()
        assert "no DCGM_FI_* series" in svc.health()["source_problem"]  # not dcgm-exporter: said so
        exporter.body = RTX3090.read_text()
        assert await svc.tick() == (1, 0)
        assert svc.health()["status"] == "ok" and "source_problem" not in svc.health()
    finally:
        await svc.source.close()


async def test_a_closed_port_is_a_source_problem_not_a_crash() -> None:
    svc = CollectorService(_settings("http://127.0.0.1:1/metrics", collector_kernel_log=""), producer=MemoryPublisher())
    svc._started = True
    try:
        assert await svc.tick() == (0, 0)
        h = svc.health()
        assert h["status"] == "degraded" and "ClientConnectorError" in h["source_problem"]
    finally:
        await svc.source.close()


def test_the_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="collector_dcgm_exporter_url"):
        _settings("file:///etc/passwd")
