"""A prometheus_client collector over the latest-value store.

Series are built at scrape time from the store, so a GPU that went stale (or a job
that ended) disappears from ``/metrics`` instead of repeating its last value forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .dcgm import DCGM_LABELS, DCGM_METRICS, dcgm_labels
from .metrics import (
    GPU_METRICS,
    GPU_MULTI_METRICS,
    PROM_FAILURE_LABELS,
    PROM_GPU_ID_LABELS,
    PROM_GPU_LABELS,
    PROM_JOB_INFO_LABELS,
    GpuView,
    MetricSpec,
    MultiMetricSpec,
)
from .store import GpuEntry, LatestStore

__all__ = [
    "PROM_FAILURES_TOTAL",
    "PROM_FAILURE_OPEN",
    "PROM_GPU_JOB_INFO",
    "PROM_GPU_LAST_SAMPLE",
    "PROM_SERIES_OVER_LIMIT",
    "BridgeCollector",
]

PROM_FAILURES_TOTAL = "gpuwarden_failures_total"
PROM_FAILURE_OPEN = "gpuwarden_failure_open"
PROM_GPU_LAST_SAMPLE = "gpuwarden_gpu_last_sample_timestamp_seconds"
PROM_GPU_JOB_INFO = "gpuwarden_gpu_job_info"
_JOB_INFO_HELP = (
    "1 per GPU held by a Slurm job (none for an idle GPU); join: "
    "* on(node, gpu) group_left(job_id, user, partition) gpuwarden_gpu_job_info"
)
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


def _family(
    spec: MetricSpec | MultiMetricSpec, gpu_labels: tuple[str, ...] = PROM_GPU_LABELS
) -> CounterMetricFamily | GaugeMetricFamily:
    labels = gpu_labels + (spec.prom_labels if isinstance(spec, MultiMetricSpec) else ())
    if spec.prom_type == "counter":
        return CounterMetricFamily(spec.prom_name.removesuffix("_total"), spec.description, labels=labels)
    return GaugeMetricFamily(spec.prom_name, spec.description, labels=labels)


class BridgeCollector(Collector):
    """GPU gauges per (node, gpu), failure counts and open failures, from a :class:`LatestStore`;
    ``series_over_limit`` (OTel name -> points left out at the last OTLP collection) is
    exposed as ``gpuwarden_otlp_series_over_limit{metric}``.

    ``job_labels`` (otel naming): ``info`` puts only the GPU's identity
    (:data:`~.metrics.PROM_GPU_ID_LABELS`) on the GPU series and the job on
    ``gpuwarden_gpu_job_info`` (one series per held GPU), so a new job makes no new GPU series;
    ``series`` puts job_id, user and partition on every GPU series. ``gpuwarden_failure_open``
    keeps its job labels either way: it is one series per open failure, not per GPU metric, and
    the job it names must stay readable after the job ended and left ``gpuwarden_gpu_job_info``.
    ``gpu_metrics``: the single-point GPU metrics (:func:`~.metrics.gpu_metrics` of another field
    registry)."""

    def __init__(
        self,
        store: LatestStore,
        series_over_limit: Mapping[str, int] | None = None,
        export_stats: Callable[[], Mapping[str, float]] | None = None,
        naming: Literal["otel", "dcgm"] = "otel",
        job_labels: Literal["info", "series"] = "info",
        gpu_metrics: Sequence[MetricSpec] = GPU_METRICS,
    ) -> None:
        self.store = store
        self.gpu_metrics = gpu_metrics
        self.series_over_limit = series_over_limit if series_over_limit is not None else {}
        self.export_stats = export_stats
        self.naming = naming
        self.job_labels = job_labels
        self._info = naming == "otel" and job_labels == "info"
        self.gpu_labels = PROM_GPU_ID_LABELS if self._info else PROM_GPU_LABELS
        self._n = len(self.gpu_labels)

    def describe(self) -> Iterator[Metric]:
        if self.naming == "dcgm":
            for d in DCGM_METRICS:
                yield GaugeMetricFamily(d.name, d.help, labels=DCGM_LABELS)
        else:
            for spec in self.gpu_metrics:
                yield _family(spec, self.gpu_labels)
            for multi in GPU_MULTI_METRICS:
                yield _family(multi, self.gpu_labels)
            if self._info:
                yield GaugeMetricFamily(PROM_GPU_JOB_INFO, "", labels=PROM_JOB_INFO_LABELS)
        yield GaugeMetricFamily(PROM_SERIES_OVER_LIMIT, "", labels=("metric",))
        for name, _ in _STATS:
            yield CounterMetricFamily(name, "")
        yield GaugeMetricFamily(PROM_GPU_LAST_SAMPLE, "", labels=self.gpu_labels)
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
        n = self._n
        if self.naming == "dcgm":
            yield from self._dcgm(views)
        for spec in self.gpu_metrics if self.naming == "otel" else ():
            fam = _family(spec, self.gpu_labels)
            for e in entries:
                v = spec.value(e.gpu)
                if v is not None:
                    fam.add_metric(e.labels[:n], v)
            yield fam
        for multi in GPU_MULTI_METRICS if self.naming == "otel" else ():
            fam = _family(multi, self.gpu_labels)
            for e, view in views:
                for keys, v in multi.points(view):
                    fam.add_metric((*e.labels[:n], *(str(k) for k in keys)), v)
            yield fam
        if self._info:
            info = GaugeMetricFamily(PROM_GPU_JOB_INFO, _JOB_INFO_HELP, labels=PROM_JOB_INFO_LABELS)
            for e in entries:
                if e.job is not None:
                    info.add_metric((e.node, str(e.index), e.job.job_id, e.job.user or "", e.job.partition or ""), 1)
            yield info
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
            PROM_GPU_LAST_SAMPLE, "Event time of the latest sample of each GPU, epoch seconds", labels=self.gpu_labels
        )
        for e in entries:
            last.add_metric(e.labels[:n], e.ts)
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
