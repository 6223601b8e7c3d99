"""The fast OTLP metric path (``GPUWARDEN_OTLP_BRIDGE_METRICS_PATH=direct``): the latest-value
store turned straight into ``opentelemetry.proto`` export requests, sent by the OTLP exporter
packages' own gRPC/HTTP transports (with their retry and backoff).

Why not the SDK path: for a 1,000-node fleet the SDK spends its time building an
``Observation`` and hashing a frozenset of its attributes per point (aggregation), then
encoding every attribute of every point again on each export, although a GPU's attributes
only change when its job changes. Here the encoder (:class:`~.encoder.MetricEncoder`, pure)
keeps the last export's request messages and, while the series stay the same, only sets
each point's time and value before the transport serialises them. See ``gpuwarden bench
bridge``.

I/O part, here: :class:`DirectMetricExporter` (periodic thread, counts of what was sent and
dropped) over a :class:`Transport`. The transports themselves are in :mod:`.transports`
(``GrpcMetricTransport`` / ``HttpMetricTransport``: the OTLP exporters of
``opentelemetry-exporter-otlp-proto-grpc`` and ``-http`` 1.45, fed already-built requests),
imported only when exporters are built, so loading the bridge does not load grpcio.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from .encoder import MetricEncoder, count_points
from .store import LatestStore

__all__ = [
    "DirectMetricExporter",
    "ExportStats",
    "MetricEncoder",
    "Transport",
    "count_points",
]

log = logging.getLogger(__name__)


@dataclass
class ExportStats:
    """What the direct exporter did (monotonic counts since start; points, requests)."""

    points_exported: int = 0
    points_dropped: int = 0
    requests_sent: int = 0
    requests_failed: int = 0
    retries: int = 0
    last_export_points: int = 0


# -- transports: the OTLP exporter packages' own, fed already-built requests ------------------


class Transport(Protocol):
    """Sends one ``ExportMetricsServiceRequest`` (retrying as the exporter packages do).

    ``send`` returns the data points the receiver rejected (partial success; 0 where the
    protocol's exporter does not report it), or None when the request was not delivered.
    ``attempts`` counts the requests put on the wire, retries included."""

    attempts: int

    def send(self, request: ExportMetricsServiceRequest) -> int | None: ...

    def close(self) -> None: ...


# -- the exporter ----------------------------------------------------------------------


class DirectMetricExporter:
    """Every ``interval_s``, encodes the store with :class:`MetricEncoder` and sends the
    requests through ``transport`` (which retries within its own timeout).

    Points of a request that was not delivered, and points the receiver rejected, are
    counted in ``stats.points_dropped``; ``stats.retries`` counts attempts beyond the first.
    ``start()`` runs the loop in a daemon thread; ``shutdown()`` stops it after a last export.
    """

    def __init__(
        self,
        store: LatestStore,
        encoder: MetricEncoder,
        transport: Transport,
        *,
        interval_s: float = 10.0,
        descriptions: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.encoder = encoder
        self.transport = transport
        self.interval_s = interval_s
        self.descriptions = descriptions
        self.stats = ExportStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def export_once(self) -> bool:
        """Export the current store now; True when every request was accepted in full."""
        with self._lock:
            views = self.store.views()
            opens = [(g.attributes, g.count) for g in self.store.open_failures()]
            requests, n = self.encoder.encode(views, self.store.failure_counts(), opens,
                                              descriptions=self.descriptions)  # fmt: skip
            self.stats.last_export_points = n
            ok = True
            for req, points in requests:
                ok = self._send(req, points) and ok
            return ok

    def _send(self, req: ExportMetricsServiceRequest, points: int) -> bool:
        before = self.transport.attempts
        try:
            rejected = self.transport.send(req)
        except Exception:
            log.exception("OTLP metric export raised")
            rejected = None
        self.stats.retries += max(self.transport.attempts - before - 1, 0)
        if rejected is None:
            self.stats.requests_failed += 1
            self.stats.points_dropped += points
            log.warning("OTLP metric export failed, %d data points dropped", points)
            return False
        self.stats.requests_sent += 1
        self.stats.points_exported += points - rejected
        if rejected:
            self.stats.points_dropped += rejected
            log.warning("OTLP receiver rejected %d data points", rejected)
            return False
        return True

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="otlp-direct-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.export_once()
            except Exception:  # keep exporting: one bad cycle must not end the thread
                log.exception("OTLP metric export cycle failed")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop, export a last time, close the transport."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        try:
            self.export_once()
        finally:
            self.transport.close()
