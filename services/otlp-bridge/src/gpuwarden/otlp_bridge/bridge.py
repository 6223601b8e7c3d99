"""The bridge core, without Kafka: models in, OTel metrics/logs and Prometheus series out.

Metric readers and log processors are injected (OTLP exporters in production, the SDK's
``InMemoryMetricReader`` / ``InMemoryLogExporter`` in tests). Every GPU metric is an
observable instrument whose callback reads the :class:`LatestStore`, so only current
(node, gpu, job) series are exported and stale ones vanish.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

from opentelemetry._logs import Logger
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

from gpuwarden.shared.models import AttributedSample, Failure, Remediation

from .mapping import (
    DATA_POINT_ATTRIBUTE_KEYS,
    GPU_METRICS,
    OTEL_SHARED_DESCRIPTIONS,
    LogFields,
    MetricSpec,
    failure_log,
    metric_attributes,
    remediation_log,
)
from .prom import BridgeCollector
from .settings import OtlpBridgeSettings, parse_key_values
from .store import LatestStore

__all__ = ["DEFAULT_SERVICE_NAME", "OtlpBridge", "build_otlp_exporters", "build_resource"]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "gpuwarden-otlp-bridge"
SCOPE = "gpuwarden.otlp_bridge"

try:
    _VERSION = version("gpuwarden-otlp-bridge")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    _VERSION = "0"


def build_resource(service_name: str | None = None, extra: dict[str, str] | None = None) -> Resource:
    """The OTel resource: ``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME``, then ``extra``,
    ``service.name`` (``service_name`` or the default) and ``service.instance.id``.

    Keys the bridge puts on data points (``host.name``, ``hw.id``...) are removed with a
    warning: the same key on resource and data point makes Prometheus reject the write.
    """
    attrs: dict[str, str] = {"service.namespace": "gpuwarden",
                             "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}  # fmt: skip
    attrs.update(extra or {})
    if service_name:
        attrs["service.name"] = service_name
    res = Resource.create(attrs)
    if str(res.attributes.get("service.name", "")).startswith("unknown_service"):
        res = res.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    clash = sorted(k for k in res.attributes if k in DATA_POINT_ATTRIBUTE_KEYS)
    if clash:
        log.warning("dropping resource attributes also used on data points: %s", ", ".join(clash))
        res = Resource({k: v for k, v in res.attributes.items() if k not in DATA_POINT_ATTRIBUTE_KEYS}, res.schema_url)
    return res


def build_otlp_exporters(settings: OtlpBridgeSettings) -> tuple[list[MetricReader], list[LogRecordExporter]]:
    """OTLP metric reader + log exporter for ``settings`` (none without an endpoint)."""
    endpoint = settings.otlp_bridge_endpoint
    if not endpoint:
        return [], []
    secret = settings.otlp_bridge_headers
    headers = parse_key_values(secret.get_secret_value()) if secret else None
    timeout = settings.otlp_bridge_timeout_s
    metric_exporter: object
    log_exporter: LogRecordExporter
    if settings.otlp_bridge_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        insecure = settings.otlp_bridge_insecure
        metric_exporter = GrpcMetrics(endpoint=endpoint, insecure=insecure, headers=headers, timeout=timeout)
        log_exporter = GrpcLogs(endpoint=endpoint, insecure=insecure, headers=headers, timeout=timeout)
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

        base = endpoint.rstrip("/")
        if "://" not in base:
            base = f"http://{base}"
        metric_exporter = HttpMetrics(endpoint=f"{base}/v1/metrics", headers=headers, timeout=timeout)
        log_exporter = HttpLogs(endpoint=f"{base}/v1/logs", headers=headers, timeout=timeout)
    reader = PeriodicExportingMetricReader(
        metric_exporter,  # type: ignore[arg-type]
        export_interval_millis=settings.otlp_bridge_export_interval_s * 1000,
        export_timeout_millis=timeout * 1000,
    )
    return [reader], [log_exporter]


class OtlpBridge:
    """Feeds a :class:`LatestStore` and emits OTel log records; owns the OTel providers.

    ``start()`` builds the meter and logger providers (readers start their threads
    there); ``stop()`` shuts them down, which flushes a last export. Both are safe to
    call twice, and ``stop()`` before ``start()``. The Prometheus ``collector`` works
    without ``start()``.
    """

    def __init__(
        self,
        *,
        resource: Resource | None = None,
        metric_readers: Sequence[MetricReader] = (),
        log_exporters: Sequence[LogRecordExporter] = (),
        log_processor: Literal["batch", "simple"] = "batch",
        staleness_s: float = 300.0,
        failure_ttl_s: float = 86400.0,
        cardinality_limit: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.resource = resource if resource is not None else build_resource()
        self._readers = list(metric_readers)
        self._log_exporters = list(log_exporters)
        self._log_processor = log_processor
        self._cardinality_limit = cardinality_limit
        self._clock = clock
        self.store = LatestStore(staleness_s, failure_ttl_s, clock=clock)
        self.collector = BridgeCollector(self.store)
        self.meter_provider: MeterProvider | None = None
        self.logger_provider: LoggerProvider | None = None
        self._logger: Logger | None = None
        self.logs_emitted = 0

    # -- lifecycle ---------------------------------------------------------------------
    def add_exporters(self, metric_readers: Sequence[MetricReader], log_exporters: Sequence[LogRecordExporter]) -> None:
        """Add readers/exporters before ``start()`` (the service builds OTLP ones only when it starts,
        since a periodic reader starts a thread when it is created).

        Raises:
            RuntimeError: already started.
        """
        if self.meter_provider is not None:
            raise RuntimeError("add exporters before start()")
        self._readers.extend(metric_readers)
        self._log_exporters.extend(log_exporters)

    def start(self) -> None:
        if self.meter_provider is not None:
            return
        mp = MeterProvider(
            resource=self.resource,
            metric_readers=self._readers,
            views=[View(instrument_name="*", aggregation_cardinality_limit=self._cardinality_limit)],
        )
        meter = mp.get_meter(SCOPE, _VERSION)
        by_name: dict[str, list[MetricSpec]] = {}
        for spec in GPU_METRICS:  # several rows may share one OTel name (hw.temperature sensors)
            by_name.setdefault(spec.otel_name, []).append(spec)
        for name, specs in by_name.items():
            first = specs[0]
            create = {
                "gauge": meter.create_observable_gauge,
                "updown": meter.create_observable_up_down_counter,
                "counter": meter.create_observable_counter,
            }[first.otel_kind]
            desc = OTEL_SHARED_DESCRIPTIONS.get(name, first.description)
            create(name, callbacks=[self._gpu_callback(tuple(specs))], unit=first.otel_unit, description=desc)
        meter.create_observable_counter(
            "gpuwarden.failures", callbacks=[self._failures_callback], unit="{failure}",
            description="Failure episodes seen (each failure_id once), by pattern, severity and node",
        )  # fmt: skip
        meter.create_observable_gauge(
            "gpuwarden.failure.open", callbacks=[self._open_callback], unit="{failure}",
            description="Open failures (not resolved, not expired)",
        )  # fmt: skip
        lp = LoggerProvider(resource=self.resource)
        for exp in self._log_exporters:
            proc: LogRecordProcessor = (
                SimpleLogRecordProcessor(exp) if self._log_processor == "simple" else BatchLogRecordProcessor(exp)
            )
            lp.add_log_record_processor(proc)
        self._logger = lp.get_logger(SCOPE, _VERSION)
        self.meter_provider, self.logger_provider = mp, lp

    def stop(self, timeout_s: float = 10.0) -> None:
        """Flush and shut down the providers (blocking: run it off the event loop)."""
        mp, lp = self.meter_provider, self.logger_provider
        self.meter_provider = self.logger_provider = None
        self._logger = None
        if lp is not None:
            try:
                lp.force_flush(int(timeout_s * 1000))
            finally:
                lp.shutdown()
        if mp is not None:
            mp.shutdown(timeout_millis=timeout_s * 1000)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is pending now (logs queued by the batch processor, metrics)."""
        ok = True
        if self.logger_provider is not None:
            ok = self.logger_provider.force_flush(int(timeout_s * 1000)) and ok
        if self.meter_provider is not None:
            ok = self.meter_provider.force_flush(int(timeout_s * 1000)) and ok
        return ok

    # -- input -------------------------------------------------------------------------
    def on_sample(self, s: AttributedSample) -> int:
        """Record the latest readings of a node's GPUs; returns how many were stored."""
        return self.store.update_sample(s)

    def on_failure(self, f: Failure) -> None:
        """Track the failure (counter, open gauge) and emit it as a log record."""
        self.store.update_failure(f)
        self._emit(failure_log(f))

    def on_remediation(self, r: Remediation) -> None:
        """Emit a remediation decision as a log record."""
        self._emit(remediation_log(r))

    def _emit(self, fields: LogFields) -> None:
        if self._logger is None:
            return
        self._logger.emit(
            timestamp=fields.timestamp_ns,
            observed_timestamp=time.time_ns(),
            severity_number=fields.severity_number,
            severity_text=fields.severity_text,
            body=fields.body,
            attributes=fields.attributes,
            event_name=fields.event_name,
        )
        self.logs_emitted += 1

    # -- observable callbacks (run on the reader's thread) ------------------------------
    def _gpu_callback(self, specs: tuple[MetricSpec, ...]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for e in self.store.gpus():
                for spec in specs:
                    v = spec.value(e.gpu)
                    if v is not None:
                        out.append(Observation(v, metric_attributes(spec, e.attributes)))
            return out

        return observe

    def _failures_callback(self, _: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"gpuwarden.failure.pattern": p, "gpuwarden.failure.severity": s, "host.name": node})
            for (p, s, node), n in self.store.failure_counts().items()
        ]

    def _open_callback(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.count, g.attributes) for g in self.store.open_failures()]
