"""The correlator's message handling, without Kafka or faust.

:class:`Correlator` takes one raw message of an input topic (bytes, as consumed), decodes
and validates it, runs the pure join logic of :mod:`gpuwarden.shared.allocations` against an
:class:`AllocationStore` (a faust Table in the service, a dict in tests) and returns the
messages to publish. A message that is not JSON, fails its schema or makes the handler
raise becomes a :class:`~gpuwarden.shared.models.DeadLetter` output instead: nothing is
dropped and the caller keeps going.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from prometheus_client import Counter
from pydantic import ValidationError

from gpuwarden.shared.allocations import (
    Allocation,
    apply_allocation,
    attribute_event,
    attributions_at,
    dump_allocations,
    expire,
    fan_out,
    load_allocations,
)
from gpuwarden.shared.bus import dead_letter_of, decode
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.models import (
    AttributedSample,
    GpuAttribution,
    GpuEvent,
    JobState,
    NodeSample,
    dumps,
)

from .windows import add_sample, close_due

__all__ = [
    "INPUT_TOPICS",
    "OUTPUT_TOPICS",
    "AllocationStore",
    "Correlator",
    "MemoryAllocationStore",
    "Output",
    "attributed_json",
]

log = logging.getLogger(__name__)

#: Short names of the topics the correlator consumes (``allocations`` is its own repartition).
#: ``gpu.attributed`` is produced, not consumed: a sample is windowed where it is joined.
INPUT_TOPICS = ("slurm.jobs", "allocations", "gpu.samples", "gpu.events")
#: Short names of the topics it produces.
OUTPUT_TOPICS = ("allocations", "gpu.attributed", "gpu.events.attributed", "job.windows", "deadletter")

SERVICE = "correlator"


class AllocationStore(Protocol):
    """Per-node allocations: node -> JSON dict (job id -> allocation dict)."""

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


class Correlator:
    """Routes raw input messages through the join logic; returns what to publish.

    Args:
        store: the node -> allocations table.
        topic_name: short topic name -> full name (for dead letters), e.g. ``settings.topic``.
        retention_s: keep ended allocations this long in event time, so late samples attribute.
        metrics: counters to update (messages in/out, dead-lettered, errors).
        clock: wall clock, used only for the ``ts`` of a dead letter (when it was rejected).
        windows: the node -> open windows table (:mod:`~gpuwarden.correlator.windows` state);
            a dict-backed store if not given.
        window_s: tumbling window length of ``job.windows``, s (event time).
        window_grace_s: how long past its end a window waits for late samples, s (event time).
    """

    def __init__(
        self,
        store: AllocationStore,
        topic_name: Callable[[str], str],
        retention_s: float = 3600.0,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], float] = time.time,
        windows: AllocationStore | None = None,
        window_s: float = 10.0,
        window_grace_s: float = 5.0,
    ) -> None:
        self.store = store
        self.windows: AllocationStore = windows if windows is not None else MemoryAllocationStore()
        self.window_s = window_s
        self.window_grace_s = window_grace_s
        #: Samples (per GPU) that came after their window had closed.
        self.late_samples = 0
        self._late_counter = _late_counter(metrics) if metrics else None
        self.topic_name = topic_name
        self.retention_s = retention_s
        self.metrics = metrics
        self.clock = clock
        self._parsed: dict[str, tuple[Any, dict[str, Allocation]]] = {}
        self._window_nodes: set[str] = set()
        #: node -> (the allocations dict it was computed from, (coverage, GPU indices) -> attributions):
        #: the attributions of a node only change when its allocations do or a job starts/ends.
        self._attributions: dict[str, tuple[dict[str, Allocation], dict[Any, tuple[list[GpuAttribution], bytes]]]] = {}
        self._handlers: dict[str, Callable[[bytes | None], list[Output]]] = {
            "slurm.jobs": self._on_job,
            "allocations": self._on_allocation,
            "gpu.samples": self._on_sample,
            "gpu.events": self._on_event,
            # Its own output, looped back by callers that route every output (the in-process
            # runner): already windowed when it was attributed, so it is accepted and ignored.
            "gpu.attributed": _ignore,
        }
        self._in = {t: metrics.messages_in.labels(t) for t in self._handlers} if metrics else {}
        self._out = {t: metrics.messages_out.labels(t) for t in OUTPUT_TOPICS} if metrics else {}

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
            outs = handler(value)
        except (ValueError, ValidationError) as exc:
            outs = [self._dead_letter(topic, value, key, partition, offset, f"schema: {_short_error(exc)}")]
        except Exception as exc:
            log.exception("correlator: handler failed on %s[%s]@%s", topic, partition, offset)
            if self.metrics:
                self.metrics.errors.labels("handler").inc()
            outs = [self._dead_letter(topic, value, key, partition, offset, f"handler: {type(exc).__name__}: {exc}")]
        if self.metrics:
            for o in outs:
                self._out[o.topic].inc()
        return outs

    # -- per topic ----------------------------------------------------------------
    def _on_job(self, value: bytes | None) -> list[Output]:
        job = decode("slurm.jobs", value)
        assert isinstance(job, JobState)
        return [Output("allocations", a.node, orjson.dumps(a.model_dump(mode="json"))) for a in fan_out(job)]

    def _on_allocation(self, value: bytes | None) -> list[Output]:
        if value is None:
            raise ValueError("empty value (tombstone)")
        try:
            data = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        alloc = Allocation.model_validate(data)
        current = self._allocations(alloc.node)
        new = expire(apply_allocation(current, alloc), alloc.ts, self.retention_s)
        if new != current:
            self._store(alloc.node, new)
        return []

    def _on_sample(self, value: bytes | None) -> list[Output]:
        """Join the sample with the node's jobs (-> ``gpu.attributed``) and fold it into the
        node's windows (-> ``job.windows`` for the windows it closes), in one pass.

        The input is validated once (:func:`~gpuwarden.shared.bus.decode`); what is built from
        it afterwards is not validated again, and ``gpu.attributed`` carries the input's own
        bytes as its ``sample`` (:func:`attributed_json`) instead of a re-serialisation of it.
        """
        sample = decode("gpu.samples", value)
        assert isinstance(sample, NodeSample) and value is not None
        node = sample.node
        allocs = self._expired(node, sample.ts)
        jobs, jobs_json = self._attribute(node, allocs, sample)
        att = AttributedSample.model_construct(sample=sample, jobs=jobs)
        # Unattributed samples fold nothing but still move the node's watermark (and may close windows).
        step = add_sample(self.windows.get(node), att, self.window_s, self.window_grace_s, in_place=True)
        self.windows.set(node, step.state)
        self._window_nodes.add(node)
        if step.late:
            self._late(node, sample.ts, step.late)
        # The windows this sample closed come first: the order in which a consumer of every
        # output in turn (the in-process runner) saw them when they came from gpu.attributed.
        outs = [Output("job.windows", w.job_id, dumps(w)) for w in step.closed]
        outs.append(Output("gpu.attributed", node, attributed_json(value, jobs_json)))
        return outs

    def flush(self) -> list[Output]:
        """Close every open window now: the end of a finite stream (a recording, a scenario).

        Returns the ``job.windows`` outputs, oldest window first per node.
        """
        outs: list[Output] = []
        for node in sorted(self._window_nodes):
            state = self.windows.get(node)
            if not state or not state.get("w"):
                continue
            wm = state.get("wm")
            state["wm"] = float("inf")
            step = close_due(state, self.window_grace_s, in_place=True)
            step.state["wm"] = wm
            self.windows.set(node, step.state)
            outs += [Output("job.windows", w.job_id, dumps(w)) for w in step.closed]
        return outs

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
        for job, _node, gpu, start in late:
            self.late_samples += 1
            if self._late_counter is not None:
                self._late_counter.inc()
            log.warning(
                "correlator: late sample for closed window job %s node %s gpu %s window %s (ts %s, grace %ss)",
                job,
                node,
                gpu,
                start,
                ts,
                self.window_grace_s,
            )

    def _on_event(self, value: bytes | None) -> list[Output]:
        event = decode("gpu.events", value)
        assert isinstance(event, GpuEvent)
        allocs = self._expired(event.node, event.ts)
        return [Output("gpu.events.attributed", event.node, dumps(attribute_event(event, allocs)))]

    # -- helpers --------------------------------------------------------------------
    def _allocations(self, node: str) -> dict[str, Allocation]:
        raw = self.store.get(node)
        cached = self._parsed.get(node)
        if cached is not None and cached[0] is raw:
            return cached[1]
        parsed = load_allocations(raw)
        self._parsed[node] = (raw, parsed)
        return parsed

    def _store(self, node: str, allocs: dict[str, Allocation]) -> None:
        raw = dump_allocations(allocs)
        self.store.set(node, raw)
        self._parsed[node] = (self.store.get(node), allocs)

    def _expired(self, node: str, ts: float) -> dict[str, Allocation]:
        """The node's allocations, dropping (and storing the drop of) those expired at ``ts``."""
        allocs = self._allocations(node)
        kept = expire(allocs, ts, self.retention_s)
        if len(kept) != len(allocs):
            self._store(node, kept)
            return kept
        return allocs  # unchanged: the same object, so per-node caches stay valid

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


def attributed_json(sample_json: bytes, jobs_json: bytes) -> bytes:
    """The ``gpu.attributed`` value (an ``AttributedSample``) around a ``gpu.samples`` value that
    was already validated, and the JSON array of its jobs: the sample's own bytes are embedded
    as they came (no re-serialisation: a third of the correlator's cost per sample), so every
    consumer reads exactly what the collector wrote, validated by the same model."""
    return b'{"schema_version":1,"sample":' + sample_json.strip() + b',"jobs":' + jobs_json + b"}"


def _ignore(value: bytes | None) -> list[Output]:
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
