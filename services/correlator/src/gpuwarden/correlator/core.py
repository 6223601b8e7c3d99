"""The correlator's message handling, without Kafka.

:class:`Correlator` joins samples and events with Slurm's view (:class:`~.slurmview.SlurmView`)
in event time and folds samples into per-(job, node, GPU) windows (:mod:`.windows`). It
returns the messages to publish; the service (:mod:`.service`) moves them.

**The join waits for Slurm** (gated view, the services): a record at ``ts`` is attributed only
once the Slurm watermark has passed ``ts``. Until then it is *held*, in arrival order per node
(a node's records never overtake each other). A held record is released as ``known`` when the
watermark passes its ``ts``, or as ``unknown`` (``attribution="unknown"``, no jobs) when it has
been held ``hold_s`` seconds of wall clock (Slurm's view is not progressing: the watcher is down
or far behind) or the node holds more than ``max_held_per_node`` records. The hold is wall
clock on purpose: it is a liveness bound for a stalled input, not part of the result; while
Slurm's view progresses, the result depends on event time only, at any replay speed. The
service's clock for it (:class:`~gpuwarden.correlator.service.HoldClock`) stands still while the
broker does not answer: a Kafka outage is not a stalled watcher.

Memory bound of the hold: ``max_held_per_node`` records per node (default 600: ten minutes at
1 Hz), each its value bytes plus the decoded model (~2.5 KB + ~6 KB for an 8-GPU sample).

:meth:`Correlator.handle` takes raw bytes (in-process runners, tools); a message that is not
JSON, fails its schema or makes the handler raise becomes a
:class:`~gpuwarden.shared.models.DeadLetter` output there. The service decodes and
dead-letters in the shared consumer and calls :meth:`Correlator.on_sample` /
:meth:`Correlator.on_event` with the decoded model and the record's own bytes.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from prometheus_client import Counter
from pydantic import ValidationError

from gpuwarden.shared.allocations import Allocation, attribute_event, attributions_at
from gpuwarden.shared.bus import dead_letter_of, decode
from gpuwarden.shared.eventtime import InputProgress
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.models import (
    AttributedEvent,
    GpuAttribution,
    GpuEvent,
    JobState,
    JobWindow,
    NodeSample,
    SlurmWatermark,
    dumps,
)

from .slurmview import SlurmView
from .windows import close_due, fold_sample

__all__ = [
    "INPUT_TOPICS",
    "OUTPUT_TOPICS",
    "AllocationStore",
    "Correlator",
    "Held",
    "MemoryAllocationStore",
    "Output",
    "attributed_json",
]

log = logging.getLogger(__name__)

#: Short names of the topics the correlator consumes. ``slurm.jobs`` and ``slurm.watermarks`` are
#: read whole by every worker (:mod:`.slurmview`); ``correlator.windows`` is its changelog, read
#: only to restore. ``gpu.attributed`` is produced, not consumed: a sample is windowed where it
#: is joined.
INPUT_TOPICS = ("slurm.jobs", "slurm.watermarks", "gpu.samples", "gpu.events")
#: Short names of the topics it produces.
OUTPUT_TOPICS = ("gpu.attributed", "gpu.events.attributed", "job.windows", "deadletter", "correlator.windows")

SERVICE = "correlator"


class AllocationStore(Protocol):
    """Per-node JSON state: node -> dict (the open windows of :mod:`.windows`)."""

    def get(self, node: str) -> dict[str, Any] | None: ...

    def set(self, node: str, value: dict[str, Any]) -> None: ...


class MemoryAllocationStore:
    """Dict-backed :class:`AllocationStore` for tests and tools."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, Any]] = {}

    def get(self, node: str) -> dict[str, Any] | None:
        return self.data.get(node)

    def set(self, node: str, value: dict[str, Any]) -> None:
        self.data[node] = value


@dataclass(frozen=True)
class Output:
    """A message to publish: short topic name, key, JSON value bytes."""

    topic: str
    key: str | None
    value: bytes


@dataclass(slots=True)
class Held:
    """A record waiting for the Slurm watermark (see the module docstring)."""

    kind: str  # "gpu.samples" or "gpu.events"
    ts: float
    model: NodeSample | GpuEvent
    value: bytes
    partition: int
    offset: int
    since: float  # monotonic clock when it was held, s


class Correlator:
    """Joins samples and events with Slurm's view; windows samples; returns what to publish.

    Args:
        view: Slurm's view (allocations and watermark); an ungated one (no hold) if not given:
            in-process runs feed ``slurm.jobs`` through :meth:`handle` in event order.
        topic_name: short topic name -> full name (for dead letters), e.g. ``settings.topic``.
        retention_s: keep ended allocations this long in event time (the view's, when built here).
        metrics: counters to update (messages in/out, dead-lettered, errors, held, unknown).
        clock: wall clock, used only for the ``ts`` of a dead letter (when it was rejected).
        windows: the node -> open windows state (:mod:`~gpuwarden.correlator.windows`); a
            dict-backed store if not given.
        window_s: tumbling window length of ``job.windows``, s (event time).
        window_grace_s: how long past its end a window waits for late samples, s (event time).
        hold_s: longest a record waits for the Slurm watermark, s of wall clock, before it goes
            out as ``unknown``.
        max_held_per_node: most records held per node (older ones go out as ``unknown``).
        monotonic: the clock of ``hold_s``, s (the service's stands still during a Kafka outage;
            tests pass a fake).
    """

    def __init__(
        self,
        view: SlurmView | Any = None,
        topic_name: Callable[[str], str] = lambda s: s,
        retention_s: float = 3600.0,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], float] = time.time,
        windows: AllocationStore | None = None,
        window_s: float = 10.0,
        window_grace_s: float = 5.0,
        hold_s: float = 30.0,
        max_held_per_node: int = 600,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(view, SlurmView):
            view = SlurmView(retention_s, gated=False)  # (a legacy store argument is ignored)
        self.view: SlurmView = view
        self.windows: AllocationStore = windows if windows is not None else MemoryAllocationStore()
        self.window_s = window_s
        self.window_grace_s = window_grace_s
        self.hold_s = hold_s
        self.max_held_per_node = max_held_per_node
        self.monotonic = monotonic
        #: Samples (per GPU) that came after their window had closed.
        self.late_samples = 0
        self._late_counter = _late_counter(metrics) if metrics else None
        self.topic_name = topic_name
        self.retention_s = retention_s
        self.metrics = metrics
        self.clock = clock
        self._window_nodes: set[str] = set()
        #: node -> held records, oldest first (samples and events of a node in one queue)
        self.held: dict[str, deque[Held]] = {}
        self.held_count = 0
        #: released as unknown (count), released known after a hold (count)
        self.unknown = 0
        self.released = 0
        #: node -> partition of its input records (for checkpoints and revocation)
        self.partition_of: dict[str, int] = {}
        #: gpu.samples partition -> event-time progress of the samples joined from it (each job
        #: window carries its partition's ``value`` as ``stream_ts``: the detector tells a silent
        #: node from a partition that is behind), robust to a node whose clock runs ahead of its peers
        self.progress: dict[int, InputProgress] = {}
        #: nodes whose window state changed since the last :meth:`take_dirty`
        self.dirty: set[str] = set()
        #: node -> (the allocations dict it was computed from, (coverage, GPU indices) -> attributions):
        #: the attributions of a node only change when its allocations do or a job starts/ends.
        self._attributions: dict[str, tuple[dict[str, Allocation], dict[Any, tuple[list[GpuAttribution], bytes]]]] = {}
        self._handlers: dict[str, Callable[[bytes | None, int, int], list[Output]]] = {
            "slurm.jobs": self._on_job_bytes,
            "slurm.watermarks": self._on_watermark_bytes,
            "gpu.samples": self._on_sample_bytes,
            "gpu.events": self._on_event_bytes,
            # Its own output, looped back by callers that route every output (the in-process
            # runner): already windowed when it was attributed, so it is accepted and ignored.
            "gpu.attributed": _ignore,
        }
        self._in = {t: metrics.messages_in.labels(t) for t in self._handlers} if metrics else {}
        self._out = {t: metrics.messages_out.labels(t) for t in OUTPUT_TOPICS} if metrics else {}
        self._unknown_counter = _counter(metrics, "gpuwarden_correlator_unknown_attributions",
                                         "Records joined as attribution=unknown (the Slurm watermark did not "
                                         "reach their ts within the hold), count") if metrics else None  # fmt: skip

    # -- raw bytes (in-process runners, tools) ----------------------------------------
    def handle(
        self, topic: str, value: bytes | None, key: bytes | None = None, partition: int = 0, offset: int = -1
    ) -> list[Output]:
        """Process one message of the short-named input ``topic``; returns the outputs.

        Never raises for bad input: it becomes a dead-letter output.

        Raises:
            KeyError: ``topic`` is not an input topic of the correlator (a programming error).
        """
        handler = self._handlers[topic]
        if self.metrics:
            self._in[topic].inc()
        try:
            outs = handler(value, partition, offset)
        except (ValueError, ValidationError) as exc:
            outs = [self._dead_letter(topic, value, key, partition, offset, f"schema: {_short_error(exc)}")]
        except Exception as exc:
            log.exception("correlator: handler failed on %s[%s]@%s", topic, partition, offset)
            if self.metrics:
                self.metrics.errors.labels("handler").inc()
            outs = [self._dead_letter(topic, value, key, partition, offset, f"handler: {type(exc).__name__}: {exc}")]
        self.count(outs)
        return outs

    def count(self, outs: list[Output]) -> None:
        if self.metrics:
            for o in outs:
                self._out[o.topic].inc()

    def _on_job_bytes(self, value: bytes | None, partition: int, offset: int) -> list[Output]:
        job = decode("slurm.jobs", value)
        assert isinstance(job, JobState)
        self.view.apply_job(job)
        return self.release()

    def _on_watermark_bytes(self, value: bytes | None, partition: int, offset: int) -> list[Output]:
        wm = decode("slurm.watermarks", value)
        assert isinstance(wm, SlurmWatermark)
        self.view.on_watermark(wm)
        return self.release()

    def _on_sample_bytes(self, value: bytes | None, partition: int, offset: int) -> list[Output]:
        sample = decode("gpu.samples", value)
        assert isinstance(sample, NodeSample) and value is not None
        return self.on_sample(sample, value, partition, offset)

    def _on_event_bytes(self, value: bytes | None, partition: int, offset: int) -> list[Output]:
        event = decode("gpu.events", value)
        assert isinstance(event, GpuEvent) and value is not None
        return self.on_event(event, value, partition, offset)

    # -- decoded records (the service) -----------------------------------------------------
    def on_sample(self, sample: NodeSample, value: bytes, partition: int = 0, offset: int = -1) -> list[Output]:
        """A validated ``gpu.samples`` record and its own bytes: joined now, or held."""
        return self._admit(Held("gpu.samples", sample.ts, sample, value, partition, offset, 0.0))

    def on_event(self, event: GpuEvent, value: bytes, partition: int = 0, offset: int = -1) -> list[Output]:
        """A validated ``gpu.events`` record and its own bytes: joined now, or held."""
        return self._admit(Held("gpu.events", event.ts, event, value, partition, offset, 0.0))

    def _admit(self, rec: Held) -> list[Output]:
        node = rec.model.node
        self.partition_of[node] = rec.partition
        queue = self.held.get(node)
        if queue is None and rec.ts <= self.view.watermark():
            return self._join(rec, True)
        rec.since = self.monotonic()
        if queue is None:
            queue = self.held[node] = deque()
        queue.append(rec)
        self.held_count += 1
        if len(queue) > self.max_held_per_node:
            return self._release_nodes([node], self.view.watermark(), -math.inf)
        return []

    def release(self) -> list[Output]:
        """Release held records: those the watermark has passed (``known``), and those held
        longer than ``hold_s`` (``unknown``), each node's in arrival order, the nodes' merged
        by event time (see :meth:`_release_nodes`)."""
        if not self.held:
            return []
        return self._release_nodes(list(self.held), self.view.watermark(), self.monotonic() - self.hold_s)

    def _release_nodes(self, nodes: list[str], wm: float, expired: float) -> list[Output]:
        """Take the releasable prefix of each node's queue, then join the records merged by
        event time (a node's own arrival order kept, ties by node name).

        One release can span a whole Slurm poll of event time (50 s at a 50x replay). Node by
        node, one node's records would reach a shared ``gpu.attributed`` partition a poll ahead
        of another's, and a reader that measures silence against the partition's newest time
        (the detector's ``telemetry-silent``) would see the second node fall silent for a
        moment. Merged, the nodes of a release advance together (each node's records are in
        event-time order as far as its collector sent them so).

        A join that raises loses that record only: the records after it go back to the front
        of their nodes' queues (held, and holding the commit back) before the error goes on."""
        taken: list[list[tuple[Held, bool]]] = []
        for node in sorted(nodes):  # ties go by node name, not by which node was held first
            queue = self.held[node]
            recs: list[tuple[Held, bool]] = []
            over = len(queue) - self.max_held_per_node
            while queue:
                rec = queue[0]
                if rec.ts <= wm:
                    known = True
                elif rec.since <= expired or over > 0:
                    known = False
                else:
                    break
                queue.popleft()
                over -= 1
                recs.append((rec, known))
            if not queue:
                del self.held[node]
            if recs:
                self.held_count -= len(recs)
                taken.append(recs)
        if not taken:
            return []
        merged = taken[0] if len(taken) == 1 else list(heapq.merge(*taken, key=_held_ts))
        outs: list[Output] = []
        for k, (rec, known) in enumerate(merged):
            try:
                outs += self._join(rec, known)
            except Exception:
                self._requeue([r for r, _ in merged[k + 1 :]])
                raise
        return outs

    def _requeue(self, recs: list[Held]) -> None:
        """Put records taken for a release back at the front of their nodes' queues, in order."""
        for rec in reversed(recs):
            node = rec.model.node
            queue = self.held.get(node)
            if queue is None:
                queue = self.held[node] = deque()
            queue.appendleft(rec)
        self.held_count += len(recs)

    def held_floor(self, partition: int, kind: str = "gpu.samples") -> int | None:
        """The lowest offset of input topic ``kind``'s ``partition`` still held (the commit
        must stay below it)."""
        floor: int | None = None
        for queue in self.held.values():
            for rec in queue:  # the node's oldest record of that topic
                if rec.kind == kind:
                    if rec.partition == partition and (floor is None or rec.offset < floor):
                        floor = rec.offset
                    break
        return floor

    def _join(self, rec: Held, known: bool) -> list[Output]:
        if known:
            self.released += 1
        else:
            self.unknown += 1
            if self._unknown_counter is not None:
                self._unknown_counter.inc()
        if rec.kind == "gpu.samples":
            assert isinstance(rec.model, NodeSample)
            return self._sample(rec.model, rec.value, known)
        assert isinstance(rec.model, GpuEvent)
        return self._event(rec.model, known)

    def _sample(self, sample: NodeSample, value: bytes, known: bool) -> list[Output]:
        """Join the sample with the node's jobs (-> ``gpu.attributed``) and fold it into the
        node's windows (-> ``job.windows`` for the windows it closes), in one pass.

        ``gpu.attributed`` carries the input's own bytes as its ``sample``
        (:func:`attributed_json`) instead of a re-serialisation of it.
        """
        node = sample.node
        if known:
            jobs, jobs_json = self._attribute(node, self.view.allocations(node), sample)
        else:
            jobs, jobs_json = [], b"[]"
        # Unattributed samples fold nothing but still move the node's watermark (and may close windows).
        step = fold_sample(self.windows.get(node), sample, jobs, self.window_s, self.window_grace_s, in_place=True)
        self.windows.set(node, step.state)
        self._window_nodes.add(node)
        self.dirty.add(node)
        if step.late:
            self._late(node, sample.ts, step.late)
        partition = self.partition_of.get(node, 0)
        progress = self.progress.get(partition)
        if progress is None:
            progress = self.progress[partition] = InputProgress()
        progress.observe(node, sample.ts)
        # The windows this sample closed come first: the order in which a consumer of every
        # output in turn (the in-process runner) saw them when they came from gpu.attributed.
        outs = self._window_outputs(node, step.closed)
        outs.append(Output("gpu.attributed", node, attributed_json(value, jobs_json, known)))
        return outs

    def _event(self, event: GpuEvent, known: bool) -> list[Output]:
        if known:
            att = attribute_event(event, self.view.allocations(event.node))
        else:
            att = AttributedEvent(event=event, job=None, node_jobs=[], attribution="unknown")
        return [Output("gpu.events.attributed", event.node, dumps(att))]

    def flush(self) -> list[Output]:
        """The end of a finite stream (a recording, a scenario): release every held record
        (as the watermark allows, else ``unknown``), then close every open window.

        Returns the outputs, oldest window first per node.
        """
        outs: list[Output] = []
        if self.held:
            outs += self._release_nodes(list(self.held), self.view.watermark(), math.inf)
        for node in sorted(self._window_nodes):
            state = self.windows.get(node)
            if not state or not state.get("w"):
                continue
            wm_node = state.get("wm")
            state["wm"] = float("inf")
            step = close_due(state, self.window_grace_s, in_place=True)
            step.state["wm"] = wm_node
            self.windows.set(node, step.state)
            self.dirty.add(node)
            outs += self._window_outputs(node, step.closed)
        return outs

    def _window_outputs(self, node: str, closed: list[JobWindow]) -> list[Output]:
        """``job.windows`` records of ``node``'s closed windows, each with the node's input
        partition and that partition's event-time progress (``stream_partition``, ``stream_ts``)."""
        partition = self.partition_of.get(node, 0)
        progress = self.progress.get(partition)
        update = {"stream_partition": partition, "stream_ts": progress.value if progress is not None else None}
        return [Output("job.windows", w.job_id, dumps(w.model_copy(update=update))) for w in closed]

    # -- checkpoints (the service) ---------------------------------------------------------
    def take_dirty(self) -> list[tuple[int, str, bytes]]:
        """(partition, node, state JSON) of every node whose windows changed since the last
        call: the changelog records of a checkpoint (a snapshot, taken now)."""
        dirty, self.dirty = self.dirty, set()
        out = []
        for node in dirty:
            state = self.windows.get(node)
            if state is not None:
                out.append((self.partition_of.get(node, 0), node, orjson.dumps(state)))
        return out

    def restore(self, node: str, partition: int, state: dict[str, Any] | None) -> None:
        """Put a node's window state back from the changelog (``None``: a tombstone)."""
        if state is None:
            return
        self.windows.set(node, state)
        self.partition_of[node] = partition
        self._window_nodes.add(node)

    def drop(self, partitions: set[int]) -> int:
        """Forget every node of ``partitions`` (revoked: their next owner restores them from the
        changelog and re-reads from the committed offset, held records included); returns how
        many nodes."""
        gone = [n for n, p in self.partition_of.items() if p in partitions]
        data = getattr(self.windows, "data", None)
        for node in gone:
            del self.partition_of[node]
            self.dirty.discard(node)
            self._window_nodes.discard(node)
            self._attributions.pop(node, None)
            if isinstance(data, dict):
                data.pop(node, None)
            queue = self.held.pop(node, None)
            if queue:
                self.held_count -= len(queue)
        for p in partitions:
            self.progress.pop(p, None)
        return len(gone)

    def _attribute(
        self, node: str, allocs: dict[str, Allocation], sample: NodeSample
    ) -> tuple[list[GpuAttribution], bytes]:
        """:func:`~gpuwarden.shared.allocations.attributions_at` of the sample and their JSON
        array (as ``AttributedSample.jobs`` is written), cached per node."""
        indices = tuple(g.index for g in sample.gpus)
        ts = sample.ts
        key = (tuple(a.covers(ts) for a in allocs.values()), indices)
        cached = self._attributions.get(node)
        if cached is None or cached[0] is not allocs:
            cached = (allocs, {})
            self._attributions[node] = cached
        hit = cached[1].get(key)
        if hit is None:
            jobs = attributions_at(allocs, ts, indices)
            hit = cached[1][key] = (jobs, orjson.dumps([j.model_dump(mode="json", exclude_none=True) for j in jobs]))
        return list(hit[0]), hit[1]

    def _late(self, node: str, ts: float, late: list[Any]) -> None:
        for _job, _node, _gpu, _start in late:
            self.late_samples += 1
            if self._late_counter is not None:
                self._late_counter.inc()
        job, _n, gpu, start = late[0]
        log.warning(
            "correlator: late sample for closed window job %s node %s gpu %s window %s (ts %s, grace %ss; %d GPU(s))",
            job,
            node,
            gpu,
            start,
            ts,
            self.window_grace_s,
            len(late),
            extra={"rate_limited": True},  # a backlog after an outage: one line per 30 s, with a count
        )

    def _dead_letter(
        self, topic: str, value: bytes | None, key: bytes | None, partition: int, offset: int, error: str
    ) -> Output:
        full = self.topic_name(topic)
        log.warning("correlator: dead-lettering %s[%s]@%s: %s", topic, partition, offset, error)
        if self.metrics:
            self.metrics.dead_lettered.labels(topic).inc()
        # the shared rule: a value over DEAD_LETTER_MAX_BYTES goes by reference (size, prefix)
        dl = dead_letter_of(SERVICE, full, partition, offset, key, value, error, self.clock())
        return Output("deadletter", full, dumps(dl))


def attributed_json(sample_json: bytes, jobs_json: bytes, known: bool = True) -> bytes:
    """The ``gpu.attributed`` value (an ``AttributedSample``) around a ``gpu.samples`` value that
    was already validated, and the JSON array of its jobs: the sample's own bytes are embedded
    as they came (no re-serialisation: a third of the correlator's cost per sample), so every
    consumer reads exactly what the collector wrote, validated by the same model."""
    head = b'{"schema_version":1,"sample":' + sample_json.strip() + b',"jobs":' + jobs_json
    return head + b"}" if known else head + b',"attribution":"unknown"}'


def _counter(metrics: ServiceMetrics, name: str, doc: str) -> Counter:
    """A counter of ``metrics``' registry, created once per registry."""
    attr = name.removeprefix("gpuwarden_")
    existing = getattr(metrics, attr, None)
    if isinstance(existing, Counter):
        return existing
    c = Counter(name, doc, registry=metrics.registry)
    setattr(metrics, attr, c)
    return c


def _held_ts(item: tuple[Held, bool]) -> float:
    return item[0].ts


def _ignore(value: bytes | None, partition: int = 0, offset: int = -1) -> list[Output]:
    return []


def _short_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors()[:5]
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errs)
    return str(exc)


def _late_counter(metrics: ServiceMetrics) -> Counter:
    """The ``gpuwarden_late_samples`` counter of ``metrics`` (created once per registry)."""
    existing = getattr(metrics, "late_samples", None)
    if isinstance(existing, Counter):
        return existing
    c = Counter(
        "gpuwarden_late_samples",
        "GPU readings that arrived after their job window had closed (not folded in), count",
        registry=metrics.registry,
    )
    metrics.late_samples = c  # type: ignore[attr-defined]
    return c
