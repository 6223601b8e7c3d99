"""The OTLP exporter wiring of the bridge: exporters built from the settings, and the wrappers
the bridge puts around the SDK's exporters.

* :func:`build_otlp_exporters` -> :class:`OtlpExporters`: the ``opentelemetry-exporter-otlp``
  gRPC or HTTP exporters (metric readers for the ``sdk`` path, transports for the ``direct``
  path of :mod:`.direct`, log exporters), with endpoint, headers, TLS, compression and timeouts
  from :class:`~.settings.OtlpBridgeSettings`.
* :class:`MetricNameCaseExporter` (with the pure :func:`restore_metric_names`): gives
  ``DCGM_FI_*`` metric names their upper case back after the SDK lower-cased them.
* :class:`CountingLogExporter` and :class:`AdmittingLogRecordProcessor`: count the log records
  exported, dropped by a failed export and refused by a full queue, so that none is lost
  silently.

The bridge core (:class:`~.bridge.OtlpBridge`) takes what is built here; nothing here imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from opentelemetry.sdk._logs import LogRecordProcessor
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)

from .dcgm import DCGM_METRICS
from .direct import Transport
from .settings import OtlpBridgeSettings, parse_key_values

__all__ = [
    "AdmittingLogRecordProcessor",
    "CountingLogExporter",
    "MetricNameCaseExporter",
    "OtlpExporters",
    "build_otlp_exporters",
    "restore_metric_names",
]

log = logging.getLogger(__name__)


class OtlpExporters(NamedTuple):
    """What :func:`build_otlp_exporters` builds: SDK metric readers (``sdk`` path), log
    exporters, and transports for the direct metric path."""

    metric_readers: list[MetricReader]
    log_exporters: list[LogRecordExporter]
    metric_transports: list[Transport]


def build_otlp_exporters(settings: OtlpBridgeSettings) -> OtlpExporters:
    """OTLP exporters for ``settings`` (none without an endpoint).

    Metrics: one transport of the fast path (``otlp_bridge_metrics_path=direct``, the
    default: the exporter packages' OTLP metric exporter fed already-built requests, with
    ``otlp_bridge_retry_s`` as its time per request, retries included; unset: the larger of
    the export timeout and interval) or one ``PeriodicExportingMetricReader`` over the same
    exporter class (``sdk``). Logs: the SDK's OTLP log exporter, wrapped to count what it
    failed to deliver. Endpoint, headers, TLS, compression and timeout are given to every
    exporter the same way.
    """
    endpoint = settings.otlp_bridge_endpoint
    if not endpoint:
        return OtlpExporters([], [], [])
    secret = settings.otlp_bridge_headers
    headers = parse_key_values(secret.get_secret_value()) if secret else None
    timeout = settings.otlp_bridge_timeout_s
    comp = settings.otlp_bridge_compression
    tls = {
        "ca_file": settings.otlp_bridge_certificate_file,
        "client_cert_file": settings.otlp_bridge_client_certificate_file,
        "client_key_file": settings.otlp_bridge_client_key_file,
    }
    direct = settings.otlp_bridge_metrics_path == "direct"
    retry_s = settings.otlp_bridge_retry_s
    fast_timeout = retry_s if retry_s is not None else max(timeout, settings.otlp_bridge_export_interval_s)
    metric_exporter: object | None = None
    transports: list[Transport] = []
    log_exporter: LogRecordExporter
    from .transports import GrpcMetricTransport, HttpMetricTransport  # grpcio: only when exporting

    if settings.otlp_bridge_protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        insecure = settings.otlp_bridge_insecure
        if insecure is None:
            insecure = endpoint.startswith("http://")
        creds = None
        if not insecure and any(tls.values()):
            creds = grpc.ssl_channel_credentials(*(_read(tls[k]) for k in ("ca_file", "client_key_file",
                                                                            "client_cert_file")))  # fmt: skip
        gcomp = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                 "deflate": grpc.Compression.Deflate}[comp]  # fmt: skip
        grpc_headers = {k.lower(): v for k, v in headers.items()} if headers else None  # gRPC wants lower case
        common = {"endpoint": endpoint, "insecure": insecure, "headers": grpc_headers, "timeout": timeout,
                  "credentials": creds, "compression": gcomp}  # fmt: skip
        if direct:
            transports.append(GrpcMetricTransport(**{**common, "timeout": fast_timeout}))
        else:
            metric_exporter = GrpcMetrics(**common)
        log_exporter = GrpcLogs(**common)
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

        base = endpoint.rstrip("/")
        if "://" not in base:
            base = f"http://{base}"
        hcomp = {"none": HttpCompression.NoCompression, "gzip": HttpCompression.Gzip,
                 "deflate": HttpCompression.Deflate}[comp]  # fmt: skip
        http_tls: dict[str, Any] = {"certificate_file": tls["ca_file"],
                                    "client_certificate_file": tls["client_cert_file"],
                                    "client_key_file": tls["client_key_file"]}  # fmt: skip
        if direct:
            transports.append(HttpMetricTransport(endpoint=f"{base}/v1/metrics", headers=headers, timeout=fast_timeout,
                                                  compression=hcomp, **http_tls))  # fmt: skip
        else:
            metric_exporter = HttpMetrics(endpoint=f"{base}/v1/metrics", headers=headers, timeout=timeout,
                                          compression=hcomp, **http_tls)  # fmt: skip
        log_exporter = HttpLogs(endpoint=f"{base}/v1/logs", headers=headers, timeout=timeout,
                                compression=hcomp, **http_tls)  # fmt: skip
    readers: list[MetricReader] = []
    if metric_exporter is not None and settings.otlp_bridge_naming == "dcgm":
        metric_exporter = MetricNameCaseExporter(metric_exporter, (d.name for d in DCGM_METRICS))  # type: ignore[arg-type]
    if metric_exporter is not None:
        readers.append(
            PeriodicExportingMetricReader(
                metric_exporter,  # type: ignore[arg-type]
                export_interval_millis=settings.otlp_bridge_export_interval_s * 1000,
                export_timeout_millis=timeout * 1000,
            )
        )
    return OtlpExporters(readers, [log_exporter], transports)


def restore_metric_names(data: MetricsData, names: dict[str, str]) -> MetricsData:
    """``data`` with each metric name found in ``names`` (lower-case -> wanted spelling)
    replaced (pure). The SDK lower-cases instrument names (the OTel API treats them as
    case-insensitive), but Prometheus and dcgm-exporter dashboards match
    ``DCGM_FI_DEV_GPU_UTIL`` case-sensitively."""
    return MetricsData(
        resource_metrics=[
            dataclasses.replace(rm, scope_metrics=[
                dataclasses.replace(sm, metrics=[
                    dataclasses.replace(m, name=names.get(m.name, m.name)) for m in sm.metrics])
                for sm in rm.scope_metrics])
            for rm in data.resource_metrics
        ]
    )  # fmt: skip


class MetricNameCaseExporter(MetricExporter):
    """Wraps an SDK metric exporter and gives the metric names in ``names`` their spelling
    back (see :func:`restore_metric_names`); used on the ``sdk`` path in dcgm naming."""

    def __init__(self, inner: MetricExporter, names: Iterable[str]) -> None:
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self.inner = inner
        self.names = {n.lower(): n for n in names}

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        return self.inner.export(restore_metric_names(metrics_data, self.names), timeout_millis=timeout_millis,
                                 **kwargs)  # fmt: skip

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis, **kwargs)


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class CountingLogExporter(LogRecordExporter):
    """Wraps a log exporter and counts records exported and dropped (failed exports)."""

    def __init__(self, inner: LogRecordExporter) -> None:
        self.inner = inner
        self.exported = 0
        self.dropped = 0

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        try:
            result = self.inner.export(batch)
        except Exception:
            log.exception("OTLP log export raised; %d records dropped", len(batch))
            result = LogRecordExportResult.FAILURE
        if result == LogRecordExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            self.dropped += len(batch)
            log.warning("OTLP log export failed, %d records dropped", len(batch))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class AdmittingLogRecordProcessor(LogRecordProcessor):
    """The SDK's ``BatchLogRecordProcessor`` behind an admission count, so that no record is
    lost silently in its queue.

    The SDK processor drops a record when its queue (``max_queue_size``) is full, with a
    log line but no count the bridge can read (its ``otel.sdk.processor.log.processed``
    metric exists only with ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` and a meter
    provider of its own). Here a record is admitted only while the records in flight
    (admitted and not yet exported or failed, as counted by ``exporter``) are fewer than
    ``max_queue_size``; so the inner queue never overflows, and every record refused is
    counted in ``dropped``. In flight includes the batch being exported, so under overload
    up to one batch fewer records than ``max_queue_size`` wait.
    """

    def __init__(
        self,
        exporter: CountingLogExporter,
        max_queue_size: int = 2048,
        schedule_delay_millis: float | None = None,
        max_export_batch_size: int | None = None,
    ) -> None:
        self.exporter = exporter
        self.max_queue_size = max_queue_size
        self.admitted = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self.inner = BatchLogRecordProcessor(
            exporter, schedule_delay_millis=schedule_delay_millis, max_queue_size=max_queue_size,
            max_export_batch_size=min(max_export_batch_size or 512, max_queue_size),
        )  # fmt: skip

    def on_emit(self, log_record: Any) -> None:
        with self._lock:
            in_flight = self.admitted - self.exporter.exported - self.exporter.dropped
            if in_flight >= self.max_queue_size:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("OTLP log queue full (%d records in flight): %d records dropped so far",
                                in_flight, self.dropped)  # fmt: skip
                return
            self.admitted += 1
        self.inner.on_emit(log_record)

    def shutdown(self) -> None:
        self.inner.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
