"""The fast path's transports: the OTLP exporter packages' own ``OTLPMetricExporter`` (gRPC and
HTTP), fed requests :mod:`.encoder` already built.

Imported only when a bridge builds its exporters (:func:`~gpuwarden.otlp_bridge.exporters.build_otlp_exporters`):
the gRPC exporter pulls in grpcio, which the rest of the ``gpuwarden`` CLI does not need.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as _GrpcExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as _HttpExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import MetricExportResult

from .encoder import count_points

__all__ = ["GrpcMetricTransport", "HttpMetricTransport"]


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
    exporter's. The exporter itself ignores the response body; this reads its partial success
    (``ExportMetricsServiceResponse.partial_success.rejected_data_points`` of a 200 answer), as
    the gRPC transport does, so ``send`` returns the points the receiver rejected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempts = 0
        self.rejected = 0
        self.url = self._endpoint
        transport = self._client._transport
        request = transport.request

        def counted(*a: Any, **k: Any) -> Any:
            self.attempts += 1
            result = request(*a, **k)
            if getattr(result, "status_code", None) == 200:
                self.rejected += _rejected_points(result)
            return result

        transport.request = counted  # type: ignore[method-assign]

    def send(self, request: ExportMetricsServiceRequest) -> int | None:
        if self._shutdown:
            return None
        before = self.rejected
        ok = self._export_batch(request) is MetricExportResult.SUCCESS
        return self.rejected - before if ok else None

    def close(self) -> None:
        self.shutdown()


def _rejected_points(result: Any) -> int:
    """Rejected data points of an OTLP/HTTP 200 answer (its body, an ``ExportMetricsServiceResponse``
    in binary protobuf; empty or not protobuf, e.g. JSON from some receivers: 0)."""
    try:
        body = result.content()
        if not body:
            return 0
        return int(ExportMetricsServiceResponse.FromString(body).partial_success.rejected_data_points)
    except Exception:  # a body that is not the response message: nothing known to be rejected
        return 0
