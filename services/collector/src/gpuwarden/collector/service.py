"""The collector service: runs one telemetry source per tick and publishes what it returns.

Each tick: ``source.collect()`` -> one ``NodeSample`` per node on ``gpu.samples`` (key: node),
``source.events()`` -> every ``GpuEvent`` on ``gpu.events`` (key: node). Each call is
measured (duration, outcome ok / error / no_data) in Prometheus metrics of the service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import hostlist
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel

from gpuwarden.shared.bus import Producer, Publisher
from gpuwarden.shared.plugins import load_plugin
from gpuwarden.shared.service import Service

from .outbox import Outbox
from .settings import CollectorSettings
from .sources import (
    SOURCES,
    DcgmExporterSource,
    EventDeduper,
    LineReader,
    NvmlEventWatcher,
    NvmlSource,
    Paced,
    ReplaySource,
    Source,
    http_fetcher,
    open_kernel_log,
    register_source,
)

__all__ = ["CollectorService", "build_source"]

log = logging.getLogger(__name__)


def _nodes(expr: str | None) -> list[str] | None:
    return list(hostlist.expand_hostlist(expr)) if expr else None


@register_source("nvml")
def _nvml_source(settings: CollectorSettings) -> Source:

    import pynvml

    reader: LineReader | None = None
    kl = settings.collector_kernel_log
    if kl:
        # kmsg stamps are CLOCK_MONOTONIC microseconds: boot epoch = now - monotonic now;
        # an unreadable /dev/kmsg falls back to `journalctl -k -f`
        reader = open_kernel_log(kl, settings.collector_kmsg_state, boot_ts=time.time() - time.monotonic())
    watcher = NvmlEventWatcher(pynvml, settings.collector_node, time.time) if settings.collector_nvml_events else None
    return NvmlSource(
        pynvml,
        settings.collector_node,
        time.time,
        kernel_log=reader,
        event_watcher=watcher,
        dedupe=EventDeduper() if watcher is not None else None,
        nvlink_every=settings.collector_nvlink_every or 1,
    )


@register_source("dcgm-exporter")
def _dcgm_exporter_source(settings: CollectorSettings) -> Source:
    reader: LineReader | None = None
    if settings.collector_kernel_log:
        reader = open_kernel_log(
            settings.collector_kernel_log, settings.collector_kmsg_state, boot_ts=time.time() - time.monotonic()
        )
    url = settings.collector_dcgm_exporter_url
    fetch, close = http_fetcher(url, settings.collector_dcgm_exporter_timeout_s)
    return DcgmExporterSource(fetch, settings.collector_node, time.time, where=url, kernel_log=reader, close=close)


@register_source("replay")
def _replay_source(settings: CollectorSettings) -> Source:
    assert settings.collector_replay_dir is not None  # checked by the settings validator
    return ReplaySource(settings.collector_replay_dir, _nodes(settings.collector_nodes), time.time)


@register_source("simulated")
def _simulated_source(settings: CollectorSettings) -> Source:
    """The simulation layer's source (entry point ``gpuwarden.collector_sources: simulated``,
    :func:`gpuwarden.sim.collector.simulated_source`); PluginMissing when it is not installed."""
    factory = load_plugin("gpuwarden.collector_sources", "simulated", "the simulated collector source")
    source: Source = factory(settings)
    return source


def build_source(settings: CollectorSettings) -> Source:
    """The source named by ``settings.collector_source`` (see ``SOURCES``).

    Raises:
        KeyError: no source of that name. Source-specific errors (missing scenario file:
            FileNotFoundError; bad scenario: ValueError; ``simulated`` without the simulation
            layer installed: :class:`~gpuwarden.shared.plugins.PluginMissing`, a ValueError).
    """
    return SOURCES[settings.collector_source](settings)


class CollectorService(Service):
    """Collect GPU samples and events of one node (nvml) or many (replay, simulated).

    ``source`` and ``producer`` may be injected (tests pass a fake source and a
    :class:`~gpuwarden.shared.bus.MemoryPublisher`); by default they come from ``settings``.
    ``tick()`` does one round; the background loop calls it every ``collector_interval_s``
    wall seconds, or when a paced source (the simulator) says the next tick is due, and
    stops when a paced source is finished.
    """

    name = "collector"
    starts_without_broker = True  # collect and buffer (outbox, spool) while Kafka is not there yet

    def __init__(
        self,
        settings: CollectorSettings,
        producer: Producer | Publisher | None = None,
        source: Source | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        super().__init__(settings, producer)  # type: ignore[arg-type]
        self.cs = settings
        self.source = source if source is not None else build_source(settings)
        self._sleep = sleep
        self.ticks = 0
        self.collect_error: str | None = None
        """Why the last ``collect()`` raised (None after one that worked): /healthz says it."""
        self.finished = asyncio.Event()
        r = self.metrics.registry
        self.m_duration = Histogram(
            "gpuwarden_collector_source_duration_seconds",
            "Duration of a source call, s",
            ["source", "call"],
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
        )
        self.m_calls = Counter(
            "gpuwarden_collector_source_calls",
            "Source calls by outcome (ok, error, no_data)",
            ["source", "call", "outcome"],
            registry=r,
        )
        self.m_gpus = Gauge("gpuwarden_collector_gpus", "GPUs in the last sample, by node", ["node"], registry=r)
        self.m_events = Counter("gpuwarden_collector_events", "GPU events published, by kind", ["kind"], registry=r)
        self.m_dropped = Counter(
            "gpuwarden_collector_dropped",
            "Messages dropped because the outage buffer was full, by topic",
            ["topic"],
            registry=r,
        )
        self.m_readings_dropped = Counter(
            "gpuwarden_collector_readings_dropped",
            "Readings the sample model refused (out of range, a driver's sentinel) and left out, by field; "
            "the GPU's other readings were sent",
            ["field"],
            registry=r,
        )
        #: field -> readings dropped already counted in m_readings_dropped
        self._dropped_seen: dict[str, int] = {}
        self.m_buffered = Gauge("gpuwarden_collector_buffered", "Messages waiting in the outage buffer", registry=r)
        self.m_delivery_failures = Counter(
            "gpuwarden_collector_delivery_failures",
            "Deliveries that failed or expired (the message went back to the outage buffer), by topic",
            ["topic"],
            registry=r,
        )
        self.outbox = Outbox(
            self._deliver,
            max_messages=settings.collector_buffer_messages,
            spool=settings.collector_spool,
            on_drop=lambda topic, n: self.m_dropped.labels(topic).inc(n),
            on_failure=lambda topic, n: self.m_delivery_failures.labels(topic).inc(n),
            send_timeout_s=settings.collector_send_timeout_s,
        )

    async def _deliver(self, topic: str, key: str | None, value: BaseModel) -> Any:
        """Queue one message; returns its delivery future when the producer tracks deliveries
        (the outbox re-queues it if the broker does not confirm it)."""
        send = getattr(self.producer, "send", None)
        if send is not None:
            return await send(topic, key, value)
        await self.producer.publish(topic, key, value)
        return None

    async def on_start(self) -> None:
        self.spawn(self.run_loop(), "collect")

    async def on_stop(self) -> None:
        """Wait for the messages in flight (they stay in the spool if not confirmed), close the source."""
        await self.outbox.settle(self.cs.collector_stop_timeout_s)
        self.m_buffered.set(self.outbox.pending)
        await self.source.close()

    def health(self) -> dict[str, Any]:
        """Health plus source, ticks, and the outbox: ``degraded`` while deliveries fail
        (``buffered`` messages waiting, ``dropped`` per topic, delivery ``failures``, messages
        ``resent_after_outage`` because still unconfirmed when the broker came back)."""
        h = super().health()
        h.update(
            source=self.source.name,
            ticks=self.ticks,
            finished=self.finished.is_set(),
            buffered=self.outbox.pending,
            dropped=dict(self.outbox.dropped),
            delivery_failures=self.outbox.failures,
            resent_after_outage=self.outbox.superseded,
        )
        problem = self.collect_error or getattr(self.source, "problem", None)
        if problem:
            # NVML unusable, the dcgm-exporter endpoint down, a source raising every tick: the
            # node sends no (or empty) samples, so it is not ok whatever the broker says
            h["source_problem"] = problem
            if h["status"] == "ok":
                h["status"] = "degraded"
        if h["status"] == "ok" and self.outbox.degraded:
            h["status"] = "degraded"
            h["broker"] = "unreachable"
        elif h["status"] == "ok" and (stalled := self.outbox.stalled_s()) > self.cs.collector_stall_s:
            # deliveries neither confirmed nor failed yet (the producer still retries): not ok
            h["status"] = "degraded"
            h["broker"] = f"no delivery confirmed for {stalled:.0f}s"
        return h

    async def _measured(self, call: str, fn: Callable[[], Awaitable[list[Any]]]) -> list[Any]:
        t0 = time.perf_counter()
        try:
            out = await fn()
        except Exception as exc:
            self.m_calls.labels(self.source.name, call, "error").inc()
            self.metrics.errors.labels(f"source_{call}").inc()
            if call == "collect":
                self.collect_error = f"{call} failed: {type(exc).__name__}: {exc}"[:300]
            log.warning("source %s: %s failed: %s: %s", self.source.name, call, type(exc).__name__, exc,
                        extra={"rate_limited": True})  # fmt: skip
            return []
        finally:
            self.m_duration.labels(self.source.name, call).observe(time.perf_counter() - t0)
        if call == "collect":
            self.collect_error = None
        self.m_calls.labels(self.source.name, call, "ok" if out else "no_data").inc()
        return out

    async def tick(self) -> tuple[int, int]:
        """One round: collect and publish samples, then events. Returns (samples, events) published.

        Source errors are counted and logged, never raised. Publish failures (broker
        unreachable) buffer the messages in :attr:`outbox` (bounded, optional spool, replayed on
        a later tick, events first; drops counted in ``gpuwarden_collector_dropped_total{topic}``,
        failed deliveries in ``gpuwarden_collector_delivery_failures_total{topic}``).
        """
        samples = await self._measured("collect", self.source.collect)
        dropped = getattr(self.source, "dropped", None)
        if dropped is not None:  # a DroppedReadings: readings the model refused, per field
            for name, n in dropped.counts.items():
                if n > self._dropped_seen.get(name, 0):
                    self.m_readings_dropped.labels(name).inc(n - self._dropped_seen.get(name, 0))
                    self._dropped_seen[name] = n
        events = await self._measured("events", self.source.events)
        for s in samples:
            await self.outbox.submit("gpu.samples", s.node, s)
            self.m_gpus.labels(s.node).set(len(s.gpus))
        for e in events:
            await self.outbox.submit("gpu.events", e.node, e)
            self.m_events.labels(e.kind.value).inc()
        self.outbox.reap()
        self.m_buffered.set(self.outbox.pending)
        self.ticks += 1
        return len(samples), len(events)

    async def run_loop(self) -> None:
        """Tick until cancelled, or until a paced source has nothing more to produce; then replay
        what the outbox still holds (every ``collector_interval_s``, at most 1 s) until it is
        all delivered, and only then set :attr:`finished`."""
        interval = self.cs.collector_interval_s
        nxt = time.time()
        while True:
            if isinstance(self.source, Paced):
                due = self.source.next_due()
                if due is None:
                    log.info("source %s finished after %d ticks", self.source.name, self.ticks)
                    await self.drain_outbox(min(interval, 1.0))
                    self.finished.set()
                    return
            else:
                due = nxt
            delay = due - time.time()
            if delay > 0:
                await self._sleep(delay)
            await self.tick()
            nxt = max(nxt + interval, time.time() - interval)  # no bursts after a stall

    async def drain_outbox(self, every_s: float) -> None:
        """Replay the outbox every ``every_s`` s until nothing is pending (a source that ended
        with a backlog: no tick would replay it). Returns at once when nothing is pending."""
        if self.outbox.pending:
            log.info("outbox: %d messages pending after the last tick; replaying them", self.outbox.pending)
        while True:
            self.outbox.reap()
            await self.outbox.flush()
            self.m_buffered.set(self.outbox.pending)
            if not self.outbox.pending:
                return
            await self._sleep(every_s)
