"""A prometheus_client collector over the latest-value store.

Series are built at scrape time from the store, so a GPU that went stale (or a job
that ended) disappears from ``/metrics`` instead of repeating its last value forever.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .mapping import GPU_METRICS, PROM_FAILURE_LABELS, PROM_GPU_LABELS, MetricSpec
from .store import LatestStore

__all__ = ["PROM_FAILURES_TOTAL", "PROM_FAILURE_OPEN", "PROM_GPU_LAST_SAMPLE", "BridgeCollector"]

PROM_FAILURES_TOTAL = "gpuwarden_failures_total"
PROM_FAILURE_OPEN = "gpuwarden_failure_open"
PROM_GPU_LAST_SAMPLE = "gpuwarden_gpu_last_sample_timestamp_seconds"
FAILURE_COUNT_LABELS = ("pattern", "severity", "node")


def _family(spec: MetricSpec) -> CounterMetricFamily | GaugeMetricFamily:
    if spec.prom_type == "counter":
        return CounterMetricFamily(spec.prom_name.removesuffix("_total"), spec.description, labels=PROM_GPU_LABELS)
    return GaugeMetricFamily(spec.prom_name, spec.description, labels=PROM_GPU_LABELS)


class BridgeCollector(Collector):
    """GPU gauges per (node, gpu), failure counts and open failures, from a :class:`LatestStore`."""

    def __init__(self, store: LatestStore) -> None:
        self.store = store

    def describe(self) -> Iterator[Metric]:
        for spec in GPU_METRICS:
            yield _family(spec)
        yield GaugeMetricFamily(PROM_GPU_LAST_SAMPLE, "", labels=PROM_GPU_LABELS)
        yield CounterMetricFamily(PROM_FAILURES_TOTAL.removesuffix("_total"), "", labels=FAILURE_COUNT_LABELS)
        yield GaugeMetricFamily(PROM_FAILURE_OPEN, "", labels=PROM_FAILURE_LABELS)

    def collect(self) -> Iterator[Metric]:
        entries = self.store.gpus()
        for spec in GPU_METRICS:
            fam = _family(spec)
            for e in entries:
                v = spec.value(e.gpu)
                if v is not None:
                    fam.add_metric(e.labels, v)
            yield fam
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
