"""The latest-value store both exports read: one entry per (node, GPU index), the open
failures, and the failure counts.

Time is event time. The *watermark* is the newest event timestamp seen (samples and
failures); a GPU whose latest sample is older than ``watermark - staleness_s`` is
dropped, and so is an open failure whose ``last_seen`` is older than
``watermark - failure_ttl_s``. So a finished job's or a removed node's series disappear
from OTLP and ``/metrics`` and cardinality stays bounded. A timestamp more than
``max_future_s`` ahead of the wall clock (a node with a broken clock) is stored but does
not move the watermark, so it cannot age out the rest of the cluster.

Thread-safe: the consumer updates it on the event loop while the OTel SDK's periodic
reader calls the observable callbacks from its own thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gpuwarden.shared.models import AttributedSample, Failure, FailureState, GpuAttribution, GpuSample

from .mapping import (
    AttrValue,
    failure_labels,
    failure_metric_attributes,
    gpu_attributes,
    jobs_by_index,
    prom_gpu_labels,
)

__all__ = ["GpuEntry", "LatestStore", "OpenFailureGroup"]


@dataclass(frozen=True, slots=True)
class GpuEntry:
    """The latest sample of one GPU, with its attributes (OTel) and labels (Prometheus)."""

    node: str
    index: int
    ts: float
    gpu: GpuSample
    job: GpuAttribution | None
    attributes: dict[str, AttrValue]
    labels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OpenFailureGroup:
    """Open failures sharing one label set (normally one), as exported on ``failure_open``."""

    labels: tuple[str, ...]
    attributes: dict[str, AttrValue]
    count: int


class LatestStore:
    """Latest value per (node, gpu), open failures, and failures counted per
    (pattern, severity, node). See the module docstring for staleness."""

    def __init__(
        self,
        staleness_s: float = 300.0,
        failure_ttl_s: float = 86400.0,
        max_future_s: float = 300.0,
        seen_failures_max: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.staleness_s = staleness_s
        self.failure_ttl_s = failure_ttl_s
        self.max_future_s = max_future_s
        self._seen_max = seen_failures_max
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus: dict[tuple[str, int], GpuEntry] = {}
        self._open: dict[str, Failure] = {}
        self._seen: OrderedDict[str, float | None] = OrderedDict()  # id -> last_seen when resolved
        self._counts: dict[tuple[str, str, str], int] = {}
        self.watermark = 0.0

    # -- updates ---------------------------------------------------------------------
    def _advance(self, ts: float) -> None:
        if ts > self.watermark and ts <= self._clock() + self.max_future_s:
            self.watermark = ts

    def update_sample(self, s: AttributedSample) -> int:
        """Store every GPU of ``s`` unless a newer sample of that GPU is already stored.

        Returns how many GPUs were stored.
        """
        sample = s.sample
        jobs = jobs_by_index(s)
        stored = 0
        with self._lock:
            self._advance(sample.ts)
            for g in sample.gpus:
                key = (sample.node, g.index)
                old = self._gpus.get(key)
                if old is not None and old.ts > sample.ts:
                    continue  # out of order: keep the newer reading
                job = jobs.get(g.index)
                self._gpus[key] = GpuEntry(
                    sample.node, g.index, sample.ts, g, job,
                    gpu_attributes(sample.node, g, job, sample.driver_version),
                    prom_gpu_labels(sample.node, g, job),
                )  # fmt: skip
                stored += 1
        return stored

    def update_failure(self, f: Failure) -> bool:
        """Track ``f`` (open until a ``resolved`` message); count it if its id is new.

        Returns True when this failure episode was not seen before (it was counted).
        """
        with self._lock:
            self._advance(f.last_seen)
            new = f.failure_id not in self._seen
            if new:
                self._seen[f.failure_id] = None
                if len(self._seen) > self._seen_max:
                    self._seen.popitem(last=False)
                key = (f.pattern, str(f.severity.value), f.node)
                self._counts[key] = self._counts.get(key, 0) + 1
            else:
                self._seen.move_to_end(f.failure_id)
            old = self._open.get(f.failure_id)
            resolved_at = self._seen[f.failure_id]
            if (old is not None and old.last_seen > f.last_seen) or (
                resolved_at is not None and resolved_at >= f.last_seen
            ):
                return new  # an older update of a known episode
            if f.state == FailureState.RESOLVED:
                self._open.pop(f.failure_id, None)
                self._seen[f.failure_id] = f.last_seen
            else:
                self._seen[f.failure_id] = None
                self._open[f.failure_id] = f
            return new

    # -- reads (each prunes first) ------------------------------------------------------
    def prune(self) -> int:
        """Drop stale GPUs and expired open failures; returns how many were dropped."""
        with self._lock:
            return self._prune_locked()

    def _prune_locked(self) -> int:
        gpu_cut = self.watermark - self.staleness_s
        fail_cut = self.watermark - self.failure_ttl_s
        stale = [k for k, e in self._gpus.items() if e.ts < gpu_cut]
        for k in stale:
            del self._gpus[k]
        expired = [fid for fid, f in self._open.items() if f.last_seen < fail_cut]
        for fid in expired:
            del self._open[fid]
        return len(stale) + len(expired)

    def gpus(self) -> list[GpuEntry]:
        """The current (non-stale) GPU entries."""
        with self._lock:
            self._prune_locked()
            return list(self._gpus.values())

    def open_failures(self) -> list[OpenFailureGroup]:
        """Open, unexpired failures grouped by their Prometheus label set."""
        with self._lock:
            self._prune_locked()
            failures = list(self._open.values())
        groups: dict[tuple[str, ...], OpenFailureGroup] = {}
        for f in failures:
            labels = failure_labels(f)
            g = groups.get(labels)
            groups[labels] = OpenFailureGroup(
                labels, g.attributes if g else failure_metric_attributes(f), (g.count if g else 0) + 1
            )
        return list(groups.values())

    def failure_counts(self) -> dict[tuple[str, str, str], int]:
        """Failure episodes counted so far per (pattern, severity, node); monotonic."""
        with self._lock:
            return dict(self._counts)

    def __len__(self) -> int:
        with self._lock:
            return len(self._gpus)
