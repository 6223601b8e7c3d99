"""The bridge core, without Kafka: models in, OTel metrics/logs and Prometheus series out.

The OTLP exporters themselves (built from the settings) and the wrappers around them are in
:mod:`.exporters`.

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
from opentelemetry.sdk._logs.export import LogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

from gpuwarden.shared.models import AttributedEvent, AttributedSample, Failure, NodeState, Remediation

from .dcgm import DCGM_METRICS, DcgmSpec, dcgm_attributes
from .direct import DirectMetricExporter, Transport
from .encoder import MetricEncoder
from .exporters import AdmittingLogRecordProcessor, CountingLogExporter
from .logs import LogFields, event_log, failure_log, node_state_log, remediation_log
from .metrics import (
    DATA_POINT_ATTRIBUTE_KEYS,
    FAILURE_METRICS,
    GPU_METRICS,
    GPU_MULTI_METRICS,
    OTEL_SHARED_DESCRIPTIONS,
    MetricSpec,
    MultiMetricSpec,
    metric_attributes,
)
from .prom import BridgeCollector
from .store import LatestStore

__all__ = ["DEFAULT_SERVICE_NAME", "OtlpBridge", "build_resource"]

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
        metric_transports: Sequence[Transport] = (),
        export_interval_s: float = 10.0,
        max_request_bytes: int = 4_000_000,
        naming: Literal["otel", "dcgm"] = "otel",
        log_queue_size: int = 2048,
        prom_job_labels: Literal["info", "series"] = "info",
    ) -> None:
        self.resource = resource if resource is not None else build_resource()
        self._readers = list(metric_readers)
        self._log_exporters = [CountingLogExporter(e) for e in log_exporters]
        self._transports = list(metric_transports)
        self._export_interval_s = export_interval_s
        self._max_request_bytes = max_request_bytes
        self.naming = naming
        self.direct_exporters: list[DirectMetricExporter] = []  # every one started (for the counts)
        self._running_direct: list[DirectMetricExporter] = []
        self._log_processor = log_processor
        self._log_queue_size = log_queue_size
        self.log_processors: list[LogRecordProcessor] = []
        self._cardinality_limit = cardinality_limit
        self._clock = clock
        self.store = LatestStore(staleness_s, failure_ttl_s, clock=clock)
        # OTel name -> points left out at the last collection because the instrument would
        # pass the cardinality limit (the SDK would fold them into otel_metric_overflow)
        self.series_over_limit: dict[str, int] = {}
        self.collector = BridgeCollector(self.store, self.series_over_limit, self.export_stats, naming=naming,
                                         job_labels=prom_job_labels)  # fmt: skip
        self.meter_provider: MeterProvider | None = None
        self.logger_provider: LoggerProvider | None = None
        self._logger: Logger | None = None
        self.logs_emitted = 0

    # -- lifecycle ---------------------------------------------------------------------
    def add_exporters(
        self,
        metric_readers: Sequence[MetricReader],
        log_exporters: Sequence[LogRecordExporter],
        metric_transports: Sequence[Transport] = (),
    ) -> None:
        """Add readers/exporters before ``start()`` (the service builds OTLP ones only when it starts,
        since a periodic reader starts a thread when it is created).

        Raises:
            RuntimeError: already started.
        """
        if self.meter_provider is not None:
            raise RuntimeError("add exporters before start()")
        self._readers.extend(metric_readers)
        self._log_exporters.extend(CountingLogExporter(e) for e in log_exporters)
        self._transports.extend(metric_transports)

    def start(self) -> None:
        if self.meter_provider is not None:
            return
        mp = MeterProvider(
            resource=self.resource,
            metric_readers=self._readers,
            views=[View(instrument_name="*", aggregation_cardinality_limit=self._cardinality_limit)],
        )
        meter = mp.get_meter(SCOPE, _VERSION)
        create: Callable[..., object]
        if self.naming == "dcgm":
            for d in DCGM_METRICS:
                create = meter.create_observable_counter if d.kind == "counter" else meter.create_observable_gauge
                create(d.name, callbacks=[self._dcgm_callback(d)], unit="", description=d.help)
        by_name: dict[str, list[MetricSpec]] = {}
        for spec in GPU_METRICS if self.naming == "otel" else ():  # rows may share one OTel name (hw.temperature)
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
        for multi in GPU_MULTI_METRICS if self.naming == "otel" else ():
            create = {
                "gauge": meter.create_observable_gauge,
                "updown": meter.create_observable_up_down_counter,
                "counter": meter.create_observable_counter,
            }[multi.otel_kind]
            create(multi.otel_name, callbacks=[self._multi_callback(multi)], unit=multi.otel_unit,
                   description=multi.description)  # fmt: skip
        fm, fo = FAILURE_METRICS["failures"], FAILURE_METRICS["failure_open"]
        meter.create_observable_counter(fm.name, callbacks=[self._failures_callback], unit=fm.unit,
                                        description=fm.metric_description)  # fmt: skip
        meter.create_observable_gauge(fo.name, callbacks=[self._open_callback], unit=fo.unit,
                                      description=fo.metric_description)  # fmt: skip
        lp = LoggerProvider(resource=self.resource)
        for exp in self._log_exporters:
            proc: LogRecordProcessor = (
                SimpleLogRecordProcessor(exp)
                if self._log_processor == "simple"
                else AdmittingLogRecordProcessor(exp, self._log_queue_size)
            )
            lp.add_log_record_processor(proc)
            self.log_processors.append(proc)
        self._logger = lp.get_logger(SCOPE, _VERSION)
        self.meter_provider, self.logger_provider = mp, lp
        for transport in self._transports:
            encoder = MetricEncoder(self.resource, SCOPE, _VERSION, max_request_bytes=self._max_request_bytes,
                                    cardinality_limit=self._cardinality_limit, naming=self.naming)  # fmt: skip
            exporter = DirectMetricExporter(self.store, encoder, transport, interval_s=self._export_interval_s,
                                            descriptions=OTEL_SHARED_DESCRIPTIONS)  # fmt: skip
            exporter.start()
            self.direct_exporters.append(exporter)
            self._running_direct.append(exporter)

    def export_stats(self) -> dict[str, float]:
        """Counts since start: ``points_exported``, ``points_dropped``, ``export_retries``
        (direct metric path), ``logs_exported``, ``logs_dropped`` (failed exports),
        ``logs_queue_full`` (refused by the full export queue), ``gpus_refused`` (memory
        bound), ``gpus_lost`` (GPUs dropped at once as lost),
        ``series_over_limit`` (points left out at the last export)."""
        out = {
            "points_exported": float(sum(e.stats.points_exported for e in self.direct_exporters)),
            "points_dropped": float(sum(e.stats.points_dropped for e in self.direct_exporters)),
            "export_retries": float(sum(e.stats.retries for e in self.direct_exporters)),
            "logs_exported": float(sum(e.exported for e in self._log_exporters)),
            "logs_dropped": float(sum(e.dropped for e in self._log_exporters)),
            "logs_queue_full": float(
                sum(p.dropped for p in self.log_processors if isinstance(p, AdmittingLogRecordProcessor))
            ),
            "gpus_refused": float(self.store.gpus_refused),
            "gpus_lost": float(self.store.gpus_lost),
        }
        return out

    def stop(self, timeout_s: float = 10.0) -> None:
        """Flush and shut down the providers (blocking: run it off the event loop)."""
        mp, lp = self.meter_provider, self.logger_provider
        self.meter_provider = self.logger_provider = None
        self._logger = None
        exporters, self._running_direct = self._running_direct, []
        for exp in exporters:
            try:
                exp.shutdown(timeout_s)
            except Exception:
                log.exception("direct OTLP metric exporter failed to shut down")
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
        for exp in self._running_direct:
            ok = exp.export_once() and ok
        return ok

    # -- input -------------------------------------------------------------------------
    def on_sample(self, s: AttributedSample) -> int:
        """Record the latest readings of a node's GPUs; returns how many were stored."""
        return self.store.update_sample(s)

    def on_failure(self, f: Failure) -> None:
        """Track the failure (counter, open gauge) and emit it as a log record."""
        self.store.update_failure(f)
        self._emit(failure_log(f))

    def on_event(self, e: AttributedEvent) -> None:
        """Count an XID/SXID on ``hw.errors`` of its GPU and emit the event as a log record
        (a duplicate ``event_id`` is neither counted nor logged again)."""
        new, _ = self.store.update_event(e)
        if new:
            self._emit(event_log(e))

    def on_node_state(self, ns: NodeState) -> bool:
        """Emit a log record when the node's state, flags or reason changed (or the node is
        new); returns whether one was emitted."""
        if not self.store.update_node_state(ns):
            return False
        self._emit(node_state_log(ns))
        return True

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
    def _bounded(self, name: str, out: list[Observation]) -> list[Observation]:
        """At most ``cardinality_limit - 1`` points (the SDK folds the rest into an overflow
        series); what is left out is counted in ``series_over_limit`` and logged."""
        room = self._cardinality_limit - 1
        if len(out) <= room:
            self.series_over_limit[name] = 0
            return out
        self.series_over_limit[name] = len(out) - room
        log.warning("%s: %d series over the cardinality limit %d left out (raise it)",
                    name, len(out) - room, self._cardinality_limit)  # fmt: skip
        return out[:room]

    def _gpu_callback(self, specs: tuple[MetricSpec, ...]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for e in self.store.gpus():
                for spec in specs:
                    v = spec.value(e.gpu)
                    if v is not None:
                        out.append(Observation(v, metric_attributes(spec, e.attributes)))
            return self._bounded(specs[0].otel_name, out)

        return observe

    def _multi_callback(self, spec: MultiMetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for e, view in self.store.views():
                for values, v in spec.points(view):
                    out.append(Observation(v, {**e.attributes, **dict(zip(spec.otel_keys, values, strict=True))}))
            return self._bounded(spec.otel_name, out)

        return observe

    def _dcgm_callback(self, spec: DcgmSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for e, view in self.store.views():
                v = spec.value(view)
                if v is not None:
                    out.append(Observation(float(v), dcgm_attributes(e.attributes)))
            return self._bounded(spec.name, out)

        return observe

    def _failures_callback(self, _: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"gpuwarden.failure.pattern": p, "gpuwarden.failure.severity": s, "host.name": node})
            for (p, s, node), n in self.store.failure_counts().items()
        ]

    def _open_callback(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.count, g.attributes) for g in self.store.open_failures()]
