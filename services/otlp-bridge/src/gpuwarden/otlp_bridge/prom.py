"""A prometheus_client collector over the latest-value store.

Series are built at scrape time from the store, so a GPU that went stale (or a job
that ended) disappears from ``/metrics`` instead of repeating its last value forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .dcgm import DCGM_LABELS, DCGM_METRICS, dcgm_labels
from .metrics import (
    GPU_METRICS,
    GPU_MULTI_METRICS,
    PROM_FAILURE_LABELS,
    PROM_GPU_LABELS,
    GpuView,
    MetricSpec,
    MultiMetricSpec,
)
from .store import GpuEntry, LatestStore

__all__ = [
    "PROM_FAILURES_TOTAL",
    "PROM_FAILURE_OPEN",
    "PROM_GPU_LAST_SAMPLE",
    "PROM_SERIES_OVER_LIMIT",
    "BridgeCollector",
]

PROM_FAILURES_TOTAL = "gpuwarden_failures_total"
PROM_FAILURE_OPEN = "gpuwarden_failure_open"
PROM_GPU_LAST_SAMPLE = "gpuwarden_gpu_last_sample_timestamp_seconds"
PROM_SERIES_OVER_LIMIT = "gpuwarden_otlp_series_over_limit"
# Prometheus name (without _total) -> key of OtlpBridge.export_stats()
_STATS = (
    ("gpuwarden_otlp_points_exported", "points_exported"),
    ("gpuwarden_otlp_points_dropped", "points_dropped"),
    ("gpuwarden_otlp_export_retries", "export_retries"),
    ("gpuwarden_otlp_log_records_exported", "logs_exported"),
    ("gpuwarden_otlp_log_records_dropped", "logs_dropped"),
    ("gpuwarden_otlp_log_records_queue_full", "logs_queue_full"),
    ("gpuwarden_gpus_refused", "gpus_refused"),
    ("gpuwarden_gpus_lost", "gpus_lost"),
)
_STATS_HELP = (
    ("points_exported", "OTLP metric data points accepted by the receiver (direct path)"),
    ("points_dropped", "OTLP metric data points dropped: receiver down past the retry time, refused or rejected"),
    ("export_retries", "OTLP metric requests retried after a retryable error"),
    ("logs_exported", "OTLP log records exported"),
    ("logs_dropped", "OTLP log records whose export failed (after the exporter's own retries)"),
    ("logs_queue_full", "OTLP log records dropped because the export queue was full (receiver slow or down)"),
    ("gpus_refused", "GPU samples/events refused because the store holds max_gpus GPUs (memory bound)"),
    ("gpus_lost", "GPUs whose series were dropped at once as lost (left out of a newer sample, or gpu-lost)"),
)
FAILURE_COUNT_LABELS = ("pattern", "severity", "node")


def _family(spec: MetricSpec | MultiMetricSpec) -> CounterMetricFamily | GaugeMetricFamily:
    labels = PROM_GPU_LABELS + (spec.prom_labels if isinstance(spec, MultiMetricSpec) else ())
    if spec.prom_type == "counter":
        return CounterMetricFamily(spec.prom_name.removesuffix("_total"), spec.description, labels=labels)
    return GaugeMetricFamily(spec.prom_name, spec.description, labels=labels)


class BridgeCollector(Collector):
    """GPU gauges per (node, gpu), failure counts and open failures, from a :class:`LatestStore`;
    ``series_over_limit`` (OTel name -> points left out at the last OTLP collection) is
    exposed as ``gpuwarden_otlp_series_over_limit{metric}``."""

    def __init__(
        self,
        store: LatestStore,
        series_over_limit: Mapping[str, int] | None = None,
        export_stats: Callable[[], Mapping[str, float]] | None = None,
        naming: Literal["otel", "dcgm"] = "otel",
    ) -> None:
        self.store = store
        self.series_over_limit = series_over_limit if series_over_limit is not None else {}
        self.export_stats = export_stats
        self.naming = naming

    def describe(self) -> Iterator[Metric]:
        if self.naming == "dcgm":
            for d in DCGM_METRICS:
                yield GaugeMetricFamily(d.name, d.help, labels=DCGM_LABELS)
        else:
            for spec in GPU_METRICS:
                yield _family(spec)
            for multi in GPU_MULTI_METRICS:
                yield _family(multi)
        yield GaugeMetricFamily(PROM_SERIES_OVER_LIMIT, "", labels=("metric",))
        for name, _ in _STATS:
            yield CounterMetricFamily(name, "")
        yield GaugeMetricFamily(PROM_GPU_LAST_SAMPLE, "", labels=PROM_GPU_LABELS)
        yield CounterMetricFamily(PROM_FAILURES_TOTAL.removesuffix("_total"), "", labels=FAILURE_COUNT_LABELS)
        yield GaugeMetricFamily(PROM_FAILURE_OPEN, "", labels=PROM_FAILURE_LABELS)

    def _dcgm(self, views: list[tuple[GpuEntry, GpuView]]) -> Iterator[Metric]:
        for d in DCGM_METRICS:
            fam = GaugeMetricFamily(d.name, d.help, labels=DCGM_LABELS)
            for e, view in views:
                v = d.value(view)
                if v is not None:
                    fam.add_metric(dcgm_labels(e.attributes), v)
            yield fam

    def collect(self) -> Iterator[Metric]:
        views = self.store.views()
        entries = [e for e, _ in views]
        if self.naming == "dcgm":
            yield from self._dcgm(views)
        for spec in GPU_METRICS if self.naming == "otel" else ():
            fam = _family(spec)
            for e in entries:
                v = spec.value(e.gpu)
                if v is not None:
                    fam.add_metric(e.labels, v)
            yield fam
        for multi in GPU_MULTI_METRICS if self.naming == "otel" else ():
            fam = _family(multi)
            for e, view in views:
                for keys, v in multi.points(view):
                    fam.add_metric((*e.labels, *(str(k) for k in keys)), v)
            yield fam
        over = GaugeMetricFamily(
            PROM_SERIES_OVER_LIMIT,
            "OTLP points left out at the last export because the instrument would pass the cardinality limit",
            labels=("metric",),
        )
        for name, n in sorted(dict(self.series_over_limit).items()):
            over.add_metric((name,), n)
        yield over
        stats = self.export_stats() if self.export_stats is not None else {}
        for name, (key, help_) in zip((n for n, _ in _STATS), _STATS_HELP, strict=True):
            yield CounterMetricFamily(name, help_, value=stats.get(key, 0.0))
        last = GaugeMetricFamily(
            PROM_GPU_LAST_SAMPLE, "Event time of the latest sample of each GPU, epoch seconds", labels=PROM_GPU_LABELS
        )
        for e in entries:
            last.add_metric(e.labels, e.ts)
        yield last
        total = CounterMetricFamily(
            PROM_FAILURES_TOTAL.removesuffix("_total"),
            "Failure episodes seen (each failure_id once), by pattern, severity and node",
            labels=FAILURE_COUNT_LABELS,
        )
        for (pattern, severity, node), n in sorted(self.store.failure_counts().items()):
            total.add_metric((pattern, severity, node), n)
        yield total
        open_ = GaugeMetricFamily(
            PROM_FAILURE_OPEN, "Open failures (not yet resolved or expired) per label set", labels=PROM_FAILURE_LABELS
        )
        for g in self.store.open_failures():
            open_.add_metric(g.labels, g.count)
        yield open_
