"""The latest-value store both exports read: one entry per (node, GPU index), the open
failures, and the failure counts.

Time is event time. The *watermark* is the newest event timestamp seen (samples and
failures); a GPU whose latest sample is older than ``watermark - staleness_s`` is
dropped, and so is an open failure whose ``last_seen`` is older than
``watermark - failure_ttl_s``. So a finished job's or a removed node's series disappear
from OTLP and ``/metrics`` and cardinality stays bounded. A timestamp more than
``max_future_s`` ahead of the wall clock (a node with a broken clock) is stored but does
not move the watermark, so it cannot age out the rest of the cluster.

A *lost* GPU is dropped at once, not after ``staleness_s``: a node's sample lists every GPU
NVML answers for (the collector leaves a GPU that is lost or missing out of it), so a GPU
stored for a node and absent from a newer sample of that node is dropped, and so is a GPU
named by a ``gpu-lost`` event at or after its latest sample (one without a GPU index, NVML
itself failing, drops every GPU of the node), with its event counts, as a stale GPU. An XID
79 alone does not drop it: the collector's next sample (one tick later) leaves the lost GPU
out. Its series then vanish from ``/metrics`` (Prometheus marks them stale at the next
scrape) and from OTLP, instead of repeating the last healthy-looking reading. The GPU comes
back with its next sample.

Thread-safe: the consumer updates it on the event loop while the OTel SDK's periodic
reader calls the observable callbacks from its own thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    EventKind,
    Failure,
    FailureState,
    GpuAttribution,
    GpuSample,
    NodeState,
    Severity,
)

from .logs import node_state_key
from .metrics import (
    AttrValue,
    GpuView,
    error_type_of,
    failure_labels,
    failure_metric_attributes,
    gpu_attributes,
    jobs_by_index,
    prom_gpu_labels,
)

__all__ = ["GpuEntry", "LatestStore", "OpenFailureGroup", "gpu_identity"]

_MAX_JOBS_PER_GPU = 4


def _job_id(job: GpuAttribution | None) -> str | None:
    return None if job is None else job.job_id


class _JobEvents:
    """XID/SXID counts of one GPU under one job, and its latest XID (event time, code)."""

    __slots__ = ("counts", "last_xid", "last_xid_ts")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last_xid: int | None = None
        self.last_xid_ts = float("-inf")


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2, Severity.FATAL: 3}


@dataclass(frozen=True, slots=True)
class GpuEntry:
    """The latest sample of one GPU, with its attributes (OTel) and labels (Prometheus).

    ``identity``: what the attributes and labels are made of beyond node and index (see
    :func:`gpu_identity`); a newer sample with the same identity keeps them (same objects).
    """

    node: str
    index: int
    ts: float
    gpu: GpuSample
    job: GpuAttribution | None
    attributes: dict[str, AttrValue]
    labels: tuple[str, ...]
    identity: tuple[str | None, ...] = field(default=(), repr=False)


def gpu_identity(gpu: GpuSample, job: GpuAttribution | None, driver_version: str | None) -> tuple[str | None, ...]:
    """The fields :func:`~.metrics.gpu_attributes` and :func:`~.metrics.prom_gpu_labels` read
    besides the node and the GPU index: UUID, PCI bus id, model, driver version and the job's
    id, user, partition and account (``tests/unit/test_otlp_bridge_inplace.py`` checks that no other
    field of a sample or attribution changes them)."""
    if job is None:
        return (gpu.uuid, gpu.pci_bus_id, gpu.name, driver_version)
    return (gpu.uuid, gpu.pci_bus_id, gpu.name, driver_version, job.job_id, job.user, job.partition, job.account)


@dataclass(frozen=True, slots=True)
class OpenFailureGroup:
    """Open failures sharing one label set (normally one), as exported on ``failure_open``."""

    labels: tuple[str, ...]
    attributes: dict[str, AttrValue]
    count: int


class LatestStore:
    """Latest value per (node, gpu), open failures, failures counted per (pattern, severity,
    node), XID/SXID counts per GPU and the last state of each Slurm node. See the module
    docstring for staleness.

    Memory is bounded: at most ``max_gpus`` GPUs (a sample of a GPU beyond that is refused
    and counted in ``gpus_refused``), ``max_nodes`` node states, ``seen_failures_max``
    failure ids and ``seen_events_max`` event ids (LRU). Event counts of a GPU are dropped
    with the GPU when it goes stale.

    XID/SXID counts are kept per (GPU, job of the event): a GPU's ``hw.errors`` XID series
    carries the count of its *current* job only. When a sample shows the GPU under another
    job, the counts of every other job are forgotten: the old job's series ends and the new
    job's starts at its own first event (a job's count never continues under the next job's
    attributes). The same holds for the last XID code (dcgm ``DCGM_FI_DEV_XID_ERRORS``).
    """

    def __init__(
        self,
        staleness_s: float = 300.0,
        failure_ttl_s: float = 86400.0,
        max_future_s: float = 300.0,
        seen_failures_max: int = 100_000,
        clock: Callable[[], float] = time.time,
        max_gpus: int = 100_000,
        max_nodes: int = 50_000,
        seen_events_max: int = 100_000,
    ) -> None:
        self.max_gpus = max_gpus
        self.max_nodes = max_nodes
        self._seen_events_max = seen_events_max
        self._seen_events: OrderedDict[str, None] = OrderedDict()
        # (node, gpu index) -> job id (None: no job) -> counts of the GPU's events under that job
        self._event_errors: dict[tuple[str, int], dict[str | None, _JobEvents]] = {}
        self._node_states: OrderedDict[str, tuple[float, tuple[str, tuple[str, ...], str | None]]] = OrderedDict()
        self.gpus_refused = 0
        self.gpus_lost = 0
        """GPUs dropped at once because they were lost (absent from a newer sample of their
        node, or a ``gpu-lost`` event), count."""
        self.nodes_forgotten = 0
        self.staleness_s = staleness_s
        self.failure_ttl_s = failure_ttl_s
        self.max_future_s = max_future_s
        self._seen_max = seen_failures_max
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus: dict[tuple[str, int], GpuEntry] = {}
        #: node -> the GPU indices of ``_gpus`` it has (so a sample touches its own node's GPUs
        #: only: a scan of ``_gpus`` per sample cost O(fleet) and capped the bridge at ~2.5k
        #: GPU samples/s on 3,125 nodes).
        self._node_gpus: dict[str, set[int]] = {}
        self._open: dict[str, Failure] = {}
        self._seen: OrderedDict[str, float | None] = OrderedDict()  # id -> last_seen when resolved
        self._counts: dict[tuple[str, str, str], int] = {}
        self.watermark = 0.0
        self._driver_versions: dict[str, str] = {}

    # -- updates ---------------------------------------------------------------------
    def _advance(self, ts: float) -> None:
        if ts > self.watermark and ts <= self._clock() + self.max_future_s:
            self.watermark = ts

    def update_sample(self, s: AttributedSample) -> int:
        """Store every GPU of ``s`` unless a newer sample of that GPU is already stored.

        Returns how many GPUs were stored.
        """
        sample = s.sample
        node, ts = sample.node, sample.ts
        jobs = jobs_by_index(s)
        gpus = self._gpus
        stored = 0
        with self._lock:
            self._advance(ts)
            # the collector sends the driver version on change (and every few minutes), not in
            # every sample: keep the last one per node so the attribute stays on the series
            if sample.driver_version:
                self._driver_versions[node] = sample.driver_version
            driver_version = self._driver_versions.get(node)
            known = self._node_gpus.get(node, ())
            if known:
                present = {g.index for g in sample.gpus}
                gone = [(node, i) for i in known if i not in present and gpus[(node, i)].ts < ts]
                for k in gone:  # lost / missing: left out of the node's newer sample
                    self._forget(k)
                self.gpus_lost += len(gone)
            for g in sample.gpus:
                key = (node, g.index)
                old = gpus.get(key)
                if old is not None and old.ts > ts:
                    continue  # out of order: keep the newer reading
                if old is None and len(gpus) >= self.max_gpus:
                    self.gpus_refused += 1
                    continue
                job = jobs.get(g.index)
                ident = gpu_identity(g, job, driver_version)
                if old is not None and old.identity == ident:  # a steady GPU: only the reading is new
                    attrs, labels = old.attributes, old.labels
                else:
                    if old is not None and _job_id(old.job) != _job_id(job):
                        self._end_job_events(key, _job_id(job))
                    attrs = gpu_attributes(node, g, job, driver_version)
                    labels = prom_gpu_labels(node, g, job)
                    if old is not None and old.labels == labels and old.attributes == attrs:
                        attrs, labels = old.attributes, old.labels  # same objects: exporters cache per dict
                gpus[key] = GpuEntry(node, g.index, ts, g, job, attrs, labels, ident)
                if old is None:
                    self._node_gpus.setdefault(node, set()).add(g.index)
                stored += 1
        return stored

    def _forget(self, key: tuple[str, int]) -> None:
        """Drop one GPU (its reading, its node's index entry and its event counts)."""
        del self._gpus[key]
        node, index = key
        indices = self._node_gpus.get(node)
        if indices is not None:
            indices.discard(index)
            if not indices:
                del self._node_gpus[node]
        self._event_errors.pop(key, None)

    def _end_job_events(self, key: tuple[str, int], current: str | None) -> None:
        """The GPU's job changed: forget its event counts under every other job, so the old
        job's ``hw.errors`` XID series ends and the new job's starts from its own events."""
        by_job = self._event_errors.get(key)
        if by_job is None:
            return
        for job_id in [j for j in by_job if j != current]:
            del by_job[job_id]
        if not by_job:
            del self._event_errors[key]

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

    def update_event(self, e: AttributedEvent) -> tuple[bool, str | None]:
        """Count an XID/SXID event on its GPU (each ``event_id`` once).

        Returns (new: the event id was not seen before, the ``error.type`` it was counted
        as or None: duplicate, no GPU index, or a kind that is not counted).
        """
        ev = e.event
        etype = error_type_of(e)
        with self._lock:
            self._advance(ev.ts)
            if ev.kind == EventKind.GPU_LOST:
                self._drop_lost(ev.node, ev.gpu_index, ev.ts)
            if ev.event_id in self._seen_events:
                self._seen_events.move_to_end(ev.event_id)
                return False, None
            self._seen_events[ev.event_id] = None
            if len(self._seen_events) > self._seen_events_max:
                self._seen_events.popitem(last=False)
            if etype is None or ev.gpu_index is None:
                return True, None
            key = (ev.node, ev.gpu_index)
            if key not in self._event_errors and len(self._event_errors) >= self.max_gpus:
                self.gpus_refused += 1
                return True, None
            by_job = self._event_errors.setdefault(key, {})
            job_id = _job_id(e.job)
            je = by_job.get(job_id)
            if je is None:
                je = by_job[job_id] = _JobEvents()
                if len(by_job) > _MAX_JOBS_PER_GPU:  # late events of long-gone jobs: keep memory bounded
                    del by_job[next(iter(by_job))]
            je.counts[etype] = je.counts.get(etype, 0) + 1
            if ev.kind == EventKind.XID and ev.code is not None and ev.ts >= je.last_xid_ts:
                je.last_xid_ts, je.last_xid = ev.ts, ev.code
            return True, etype

    def _drop_lost(self, node: str, index: int | None, ts: float) -> None:
        """Drop the lost GPU ``index`` of ``node`` (``None``: every GPU of the node) if its
        latest sample is not newer than the event."""
        candidates = self._node_gpus.get(node, ()) if index is None else [index]
        keys = [(node, i) for i in candidates if (e := self._gpus.get((node, i))) is not None and e.ts <= ts]
        for k in keys:
            self._forget(k)
        self.gpus_lost += len(keys)

    def update_node_state(self, ns: NodeState) -> bool:
        """Remember the node's state; True when it changed (or the node is new), i.e. when
        it deserves a log record. An older message than the one stored is ignored (False)."""
        key = node_state_key(ns)
        with self._lock:
            self._advance(ns.ts)
            old = self._node_states.get(ns.node)
            if old is not None and old[0] > ns.ts:
                return False
            self._node_states[ns.node] = (ns.ts, key)
            self._node_states.move_to_end(ns.node)
            if len(self._node_states) > self.max_nodes:
                self._node_states.popitem(last=False)
                self.nodes_forgotten += 1
            return old is None or old[1] != key

    def hand_over(self, nodes: Collection[str], *, gpus: bool = False, failures: bool = False) -> int:
        """Forget what this bridge exports for ``nodes`` now that another bridge reads their
        partitions (a rebalance): with ``gpus`` their GPUs (readings, ``gpuwarden_gpu_job_info``,
        XID counts), with ``failures`` their open failures. Without it both bridges would export
        the same GPU until it went stale here (``staleness_s``), and a failure that the other
        bridge resolves would stay open here for ``failure_ttl_s``; two ``job_info`` series of
        one GPU break every ``group_left`` join on it. Failures counted stay counted (each
        bridge counts what it read). Returns how many entries were dropped."""
        wanted = set(nodes)
        dropped = 0
        with self._lock:
            if gpus:
                for node in wanted & self._node_gpus.keys():
                    for index in list(self._node_gpus.get(node, ())):
                        self._forget((node, index))
                        dropped += 1
                    self._driver_versions.pop(node, None)
            if failures:
                gone = [fid for fid, f in self._open.items() if f.node in wanted]
                for fid in gone:
                    del self._open[fid]
                dropped += len(gone)
        return dropped

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
            self._forget(k)
        expired = [fid for fid, f in self._open.items() if f.last_seen < fail_cut]
        for fid in expired:
            del self._open[fid]
        return len(stale) + len(expired)

    def gpus(self) -> list[GpuEntry]:
        """The current (non-stale) GPU entries."""
        with self._lock:
            self._prune_locked()
            return list(self._gpus.values())

    def views(self) -> list[tuple[GpuEntry, GpuView]]:
        """The current GPU entries, each with its :class:`GpuView` (event error counts and
        the worst severity of the failures open on it)."""
        with self._lock:
            self._prune_locked()
            entries = list(self._gpus.values())
            events: dict[tuple[str, int], tuple[dict[str, int], int | None]] = {}
            for e in entries:
                je = self._event_errors.get((e.node, e.index), {}).get(_job_id(e.job))
                if je is not None:
                    events[(e.node, e.index)] = (dict(je.counts), je.last_xid)
            worst: dict[tuple[str, int], Severity] = {}
            for f in self._open.values():
                if f.gpu_index is None:
                    continue
                k = (f.node, f.gpu_index)
                if k not in worst or _SEVERITY_RANK[f.severity] > _SEVERITY_RANK[worst[k]]:
                    worst[k] = f.severity
        empty: tuple[dict[str, int], int | None] = ({}, None)
        out = []
        for e in entries:
            k = (e.node, e.index)
            counts, last_xid = events.get(k, empty)
            out.append((e, GpuView(e.gpu, counts, worst.get(k), last_xid)))
        return out

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
