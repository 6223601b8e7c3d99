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

I/O part, here: :class:`GrpcMetricTransport` / :class:`HttpMetricTransport` (the OTLP
exporters of ``opentelemetry-exporter-otlp-proto-grpc`` and ``-http`` 1.45, fed
already-built requests) and :class:`DirectMetricExporter` (periodic thread, counts of what
was sent and dropped).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as _GrpcExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as _HttpExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import MetricExportResult

from .encoder import MetricEncoder, count_points
from .store import LatestStore

__all__ = [
    "DirectMetricExporter",
    "ExportStats",
    "GrpcMetricTransport",
    "HttpMetricTransport",
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


class _CountingStub:
    """Wraps the gRPC exporter's ``MetricsServiceStub``: counts attempts and reads the
    partial-success count the exporter ignores."""

    def __init__(self, inner: Any, owner: GrpcMetricTransport) -> None:
        self.inner, self.owner = inner, owner

    def Export(self, request: ExportMetricsServiceRequest, **kwargs: Any) -> Any:
        self.owner.attempts += 1
        response = self.inner.Export(request=request, **kwargs)
        self.owner.rejected += int(response.partial_success.rejected_data_points)
        return response


class GrpcMetricTransport(_GrpcExporter):
    """OTLP/gRPC ``MetricsService/Export`` through the gRPC exporter package's
    ``OTLPMetricExporter`` (channel, TLS credentials, headers, compression, retry with
    exponential backoff from 1 s with jitter on retryable status codes, within ``timeout``
    seconds per request), fed already-built requests. Arguments are the exporter's; keys of a
    ``headers`` mapping are lower-cased (gRPC refuses metadata keys with capitals)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.attempts = 0
        self.rejected = 0
        if isinstance(kwargs.get("headers"), Mapping):
            kwargs["headers"] = {str(k).lower(): v for k, v in kwargs["headers"].items()}
        super().__init__(*args, **kwargs)

    def _initialize_channel_and_stub(self) -> None:
        super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
        self._client = _CountingStub(self._client, self)  # type: ignore[assignment]

    def _translate_data(self, data: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest:  # type: ignore[override]
        return data  # already encoded

    def _count_data(self, data: ExportMetricsServiceRequest) -> int:  # type: ignore[override]
        return count_points(data)

    def send(self, request: ExportMetricsServiceRequest) -> int | None:
        before = self.rejected
        ok = self._export(request) is MetricExportResult.SUCCESS
        return self.rejected - before if ok else None

    def close(self) -> None:
        self.shutdown()


class HttpMetricTransport(_HttpExporter):
    """OTLP/HTTP binary protobuf POST to ``endpoint`` (``.../v1/metrics``) through the HTTP
    exporter package's ``OTLPMetricExporter`` (session, TLS files, headers, gzip/deflate,
    retry with exponential backoff on 429/502/503/504 and connection errors within
    ``timeout`` seconds per request), fed already-built requests. Arguments are the
    exporter's. The HTTP exporter does not read partial success: ``send`` returns 0 rejected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempts = 0
        self.url = self._endpoint
        transport = self._client._transport
        request = transport.request

        def counted(*a: Any, **k: Any) -> Any:
            self.attempts += 1
            return request(*a, **k)

        transport.request = counted  # type: ignore[method-assign]

    def send(self, request: ExportMetricsServiceRequest) -> int | None:
        if self._shutdown:
            return None
        return 0 if self._export_batch(request) is MetricExportResult.SUCCESS else None

    def close(self) -> None:
        self.shutdown()


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
