"""The dcgm-exporter source: a site's running dcgm-exporter ``/metrics`` as the collector's telemetry.

For nodes that already run NVIDIA's dcgm-exporter (dcgm-exporter 2.x-4.x, DCGM field names
``DCGM_FI_*``; also the 1.x ``dcgm_*`` names), the collector scrapes it instead of opening NVML
itself: one HTTP GET per tick, mapped to a :class:`NodeSample` through the same field map the
offline reader uses (:mod:`gpuwarden.shared.nvidia.dcgm_exporter`). XIDs still come from the
kernel log (the XID's text, its PCI bus id and its time); DCGM's ``DCGM_FI_DEV_XID_ERRORS``
(the last XID of the GPU, no time) is a fallback only when no kernel log is read.

What dcgm-exporter does not export by default, the samples do not carry (the detector names
such missing inputs): NVLink per-link state, processes, clock event reasons unless
``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` is in its counters file.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gpuwarden.shared.models import GpuEvent, GpuSample, NodeSample
from gpuwarden.shared.nvidia.kernel_log import KernelLogParser
from gpuwarden.shared.nvidia.values import gpu_sample

from .base import Clock, DroppedReadings, LineReader, default_collector_id, resolve_gpu

__all__ = ["DcgmExporterSource", "http_fetcher"]

log = logging.getLogger(__name__)

#: ``fetch()`` -> the scrape's text; raises on any transport or HTTP error.
Fetch = Callable[[], Awaitable[str]]
#: :func:`~gpuwarden.shared.nvidia.dcgm_exporter.gpu_records`' result: (GPU identity, ``gpu`` label) -> fields.
Records = dict[tuple[str, int | None], dict[str, Any]]


def http_fetcher(url: str, timeout_s: float) -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    """A GET of ``url`` (aiohttp, one session, ``timeout_s`` s in all) and its close.

    The fetch raises ``aiohttp.ClientError`` (connection refused, a non-2xx status) or
    ``TimeoutError``."""
    import aiohttp

    session: aiohttp.ClientSession | None = None

    async def fetch() -> str:
        nonlocal session
        if session is None or session.closed:
            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
        async with session.get(url, headers={"Accept": "text/plain"}) as r:
            r.raise_for_status()
            return await r.text()

    async def close() -> None:
        if session is not None and not session.closed:
            await session.close()

    return fetch, close


class DcgmExporterSource:
    """One node's GPUs from its dcgm-exporter endpoint.

    ``collect()`` returns one :class:`NodeSample` (``source="dcgm-exporter"``, ts = ``clock()``,
    GPUs by the ``gpu`` label, driver version from ``DCGM_FI_DRIVER_VERSION`` where exported).

    Raises (from ``collect``, counted by the service, which then reports itself degraded):
        aiohttp.ClientError / TimeoutError: the endpoint cannot be read;
        ValueError: the answer is not Prometheus text, has no ``DCGM_FI_*`` series (not
            dcgm-exporter), or a value is out of range.
    """

    name = "dcgm-exporter"

    def __init__(
        self,
        fetch: Fetch,
        node: str,
        clock: Clock,
        *,
        where: str = "dcgm-exporter",
        kernel_log: LineReader | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
        collector_id: str | None = None,
    ) -> None:
        self._fetch = fetch
        self._close = close
        self.node = node
        self.clock = clock
        self.where = where
        self.kernel_log = kernel_log
        self.collector_id = collector_id or default_collector_id()
        self.inventory: list[GpuSample] = []
        self.problem: str | None = None
        """Why the last scrape failed (None after one that worked); the service's health says it."""
        self._klog = KernelLogParser(node, source="kmsg")
        self._last_xid: dict[int, int] = {}
        self._pending: list[GpuEvent] = []
        #: readings dropped because the model cannot hold them (out of range, a sentinel)
        self.dropped = DroppedReadings()

    async def collect(self) -> list[NodeSample]:
        # the recordings package imports the kernel-log readers of this package: imported here
        from gpuwarden.shared.nvidia.dcgm_exporter import gpu_records, parse_scrape

        ts = self.clock()
        try:
            text = await self._fetch()
            series = parse_scrape(text)
            if not series:
                raise ValueError("no DCGM_FI_* series: is this dcgm-exporter's /metrics?")
            recs = gpu_records(series, self.where, on_drop=self.dropped)
            gpus, driver = self._gpus(recs, ts)
        except Exception as exc:
            self.problem = f"{self.where}: {type(exc).__name__}: {exc}"[:300]
            raise
        self.problem = None
        self.inventory = gpus
        return [
            NodeSample(
                node=self.node,
                ts=ts,
                collector_id=self.collector_id,
                source="dcgm-exporter",
                gpus=gpus,
                driver_version=driver,
            )
        ]

    def _gpus(self, recs: Records, ts: float) -> tuple[list[GpuSample], str | None]:
        gpus: list[GpuSample] = []
        driver: str | None = None
        for i, ((_, label), rec) in enumerate(recs.items()):
            r = dict(rec)
            idx = label if label is not None else i
            xid = r.pop("_xid", None)
            driver = r.pop("driver_version", None) or driver
            r.setdefault("throttle_reasons", [])
            g = gpu_sample({"index": idx, **r}, f"{self.node}: dcgm-exporter GPU {idx}", on_drop=self.dropped)
            gpus.append(g)
            if xid is not None and self.kernel_log is None:
                self._xid_fallback(g, int(xid), ts)
        gpus.sort(key=lambda g: g.index)
        return gpus, driver

    def _xid_fallback(self, g: GpuSample, xid: int, ts: float) -> None:
        """``DCGM_FI_DEV_XID_ERRORS`` changed to a non-zero code: an XID event at this scrape's time
        (DCGM gives no time of its own; the first scrape's value is taken as history, not news)."""
        seen = self._last_xid.get(g.index)
        self._last_xid[g.index] = xid
        if seen is None or xid == 0 or xid == seen:
            return
        from gpuwarden.shared.nvidia.dcgm_exporter import xid_event

        self._pending.append(xid_event(self.node, ts, g.index, xid, g.pci_bus_id, g.uuid, "; no kernel log read"))

    async def events(self) -> list[GpuEvent]:
        out, self._pending = self._pending, []
        if self.kernel_log is not None:
            now = self.clock()
            self._klog.boot_ts = getattr(self.kernel_log, "boot_ts", None)
            for line in self.kernel_log.read_new_lines():
                for ev in self._klog.feed(line, now):
                    out.append(resolve_gpu(ev, self.inventory))
        return out

    async def close(self) -> None:
        if self._close is not None:
            await self._close()
        close = getattr(self.kernel_log, "close", None)
        if close is not None:
            close()
