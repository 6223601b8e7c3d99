"""The correlator service: the shared consumer, a global Slurm view, and a changelog of its own.

Topology (docs/architecture.md#correlation-topology)::

    slurm.jobs + slurm.watermarks  --read whole by every worker-->  SlurmView (allocations, watermark)
    gpu.samples (keyed by node, consumer group)  --held until the watermark passes ts, joined-->
        gpu.attributed, and folded into per-node open windows --> job.windows (keyed by job)
    gpu.events  (keyed by node)  --held, joined-->  gpu.events.attributed
    open windows  -->  correlator.windows (compacted changelog, co-partitioned with gpu.samples)
    bad input  -->  deadletter (the shared consumer's one path)

**Commits** (Kafka Streams' rule): records are consumed in batches (``getmany``) by the shared
:class:`~gpuwarden.shared.bus.Consumer`; at most every ``COMMIT_INTERVAL_S`` a checkpoint
(:meth:`CorrelatorService._checkpoint`) takes, in one synchronous step, the offsets to commit
(each partition's handled position, capped at its oldest record still held) and a snapshot of
every node whose windows changed; it appends the snapshot to the changelog, waits until the
broker confirmed every output and snapshot queued so far, and only then are those offsets
committed. So a committed offset never covers a record whose outputs or window state are not
on the broker, and nothing is acknowledged that the handler has not seen: no framework sits
between the fetch and the handler.

**Stop**: held records are no longer released once ``stop()`` begins (the same rule for the
consumer's final commit and the group leave that follows).

**Rebalance**: on revocation the worker checkpoints and commits, then forgets the revoked
partitions' nodes, with no release of held records in between (a record released after the
checkpoint would be emitted here and again by the next owner); on assignment it restores
their windows from the changelog partitions of the same numbers before any record of them is
handled (aiokafka awaits the listener before it fetches for the new assignment).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Gauge
from pydantic import BaseModel, ValidationError

from gpuwarden.shared.bus import Producer, decode, kafka_client, kafka_consumer
from gpuwarden.shared.models import GpuEvent, JobState, NodeSample, SlurmWatermark
from gpuwarden.shared.retry import retry_async
from gpuwarden.shared.service import Service

from .core import Correlator, MemoryAllocationStore, Output
from .settings import CorrelatorSettings
from .slurmview import SlurmView

__all__ = ["LANES", "CorrelatorService", "HoldClock", "SlurmReader"]

log = logging.getLogger(__name__)

#: Input topics (consumer group) of each ``GPUWARDEN_CORRELATOR_LANE``; every lane also reads
#: ``slurm.jobs`` and ``slurm.watermarks`` whole (:class:`SlurmReader`).
LANES: dict[str, tuple[str, ...]] = {
    "all": ("gpu.samples", "gpu.events"),
    "samples": ("gpu.samples",),
    "events": ("gpu.events",),
}

CHANGELOG = "correlator.windows"
#: ``fetch_min_bytes`` of the samples lane: about 160 8-GPU samples; the broker answers when this
#: much is there or after 100 ms, so a large fleet is read in batches of hundreds of records
#: (the per-batch work is paid once per batch, not once per few records).
SAMPLE_FETCH_MIN_BYTES = 256 * 1024


class HoldClock:
    """The clock of the correlator's hold (``hold_s``): monotonic seconds that stand still while
    the broker does not answer the Slurm reader's fetches.

    The hold's bound is for a stalled slurm-watcher: the broker answers, no watermark comes. In a
    Kafka outage nothing comes either, from Slurm or the collectors; counting it would release the
    records held at its start as ``unknown`` (their readings missing from their job windows: 46 in
    a 60 s outage of the chaos bench), although slurm-watcher's next watermark, right after the
    outage, covers them. So time counts only while the newest fetch answer is at most ``stale_s``
    old (``fetch_age()`` in s; None: no answer yet, counted as answering). Each interval between
    two readings is counted whole or not at all by the state at its end: the hold reads the clock
    at least once a second while it holds anything.
    """

    def __init__(
        self,
        fetch_age: Callable[[], float | None],
        stale_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetch_age = fetch_age
        self.stale_s = stale_s
        self._clock = clock
        self._last = clock()
        self._value = 0.0
        #: seconds not counted because the broker did not answer
        self.paused_s = 0.0

    def __call__(self) -> float:
        now = self._clock()
        age = self.fetch_age()
        if age is None or age <= self.stale_s:
            self._value += now - self._last
        else:
            self.paused_s += now - self._last
        self._last = now
        return self._value


class SlurmReader:
    """Reads every partition of ``slurm.jobs`` and ``slurm.watermarks`` (no consumer group: each
    worker has the whole view) into a :class:`SlurmView`, from ``lookback_s`` of broker time
    ago (0: the start of the topics), and calls ``on_change`` after each batch that changed it.

    ``lookback_s`` must cover the watcher's full-snapshot period (every running job is
    republished then) and the correlator's retention of ended jobs.
    """

    def __init__(self, settings: CorrelatorSettings, view: SlurmView, on_change: Any, lookback_s: float) -> None:
        self.settings = settings
        self.view = view
        self.on_change = on_change
        self.lookback_s = lookback_s
        self.consumer: AIOKafkaConsumer | None = None
        self.bad = 0
        self.caught_up = asyncio.Event()
        self._jobs_topic = settings.topic("slurm.jobs")
        self._wm_topic = settings.topic("slurm.watermarks")

    async def start(self) -> None:
        c = kafka_consumer(
            self.settings,
            client_id=f"{self.settings.client_id}-correlator-slurm",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await c.start()
        self.consumer = c
        tps = []
        md = await _metadata(self.settings)
        for topic in (self._jobs_topic, self._wm_topic):
            parts = md.partitions_for_topic(topic)
            if not parts:
                await self.stop()
                raise RuntimeError(f"topic {topic} does not exist: create the topics first (gpuwarden topics create)")
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        if self.lookback_s > 0:
            since_ms = int((time.time() - self.lookback_s) * 1000)
            try:
                found = await c.offsets_for_times({tp: since_ms for tp in tps})
            except Exception as exc:  # a broker without timestamp lookups: read it all
                log.info("correlator: no offsets by time (%s); reading slurm.jobs from its start", exc)
                found = {}
            for tp, ot in found.items():
                if ot is not None:
                    c.seek(tp, ot.offset)
        self._ends = await c.end_offsets(tps)

    def fetch_age_s(self) -> float | None:
        """Seconds since the broker last answered a fetch of the Slurm topics (an empty answer
        counts), from aiokafka's ``last_poll_timestamp``; None before the first answer."""
        c = self.consumer
        if c is None:
            return None
        stamps = [t for tp in c.assignment() if (t := c.last_poll_timestamp(tp)) is not None]
        return max(0.0, time.time() - max(stamps) / 1000) if stamps else None

    async def stop(self) -> None:
        c, self.consumer = self.consumer, None
        if c is not None:
            # aiokafka's consumer may surface its own cancelled commit-reset task here
            with contextlib.suppress(asyncio.CancelledError):
                await c.stop()

    async def run(self) -> None:
        c = self.consumer
        assert c is not None
        jobs_tps = [tp for tp in c.assignment() if tp.topic == self._jobs_topic]
        while True:
            batches = await c.getmany(timeout_ms=200, max_records=2000)
            changed = False
            for tp, recs in batches.items():
                for rec in recs:
                    changed |= self._one(tp.topic, rec)
            for tp in jobs_tps:
                changed |= self.view.on_position(tp.partition, await c.position(tp))
            if not self.caught_up.is_set():
                positions = {tp: await c.position(tp) for tp in self._ends}
                if all(positions[tp] >= end for tp, end in self._ends.items()):
                    self.caught_up.set()
                    log.info("correlator: Slurm view read (%s)", self.view.stats())
            if changed:
                await self.on_change()

    def _one(self, topic: str, rec: ConsumerRecord) -> bool:
        short = "slurm.jobs" if topic == self._jobs_topic else "slurm.watermarks"
        try:
            value = decode(short, rec.value)
        except (ValueError, ValidationError) as exc:
            # not dead-lettered here: every worker reads it, the detector's consumer dead-letters it once
            self.bad += 1
            if self.bad <= 10 or self.bad % 1000 == 0:
                log.warning("correlator: unreadable %s[%s]@%s ignored (%d so far): %s", short, rec.partition,
                            rec.offset, self.bad, str(exc)[:200])  # fmt: skip
            return False
        if isinstance(value, JobState):
            return bool(self.view.apply_job(value))
        assert isinstance(value, SlurmWatermark)
        return self.view.on_watermark(value)


async def _metadata(settings: CorrelatorSettings, timeout_s: float = 30.0) -> Any:
    """The cluster's metadata (topics and their partitions).

    Raises:
        aiokafka.errors.KafkaError, TimeoutError: no broker answers.
    """
    client = kafka_client(settings, request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(client.bootstrap(), timeout_s)
    try:
        return await asyncio.wait_for(client.fetch_all_metadata(), timeout_s)
    finally:
        await client.close()


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: CorrelatorService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.service.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.service.assigned(set(assigned))


class CorrelatorService(Service):
    """Runs the correlator (lanes: ``GPUWARDEN_CORRELATOR_LANE``) with ``/healthz`` and ``/metrics``.

    ``start()`` returns once the Slurm view is being read and the consumer has joined its
    group; ``stop()`` checkpoints, commits and leaves the group. ``stop()`` is safe before
    ``start()`` and twice.
    """

    name = "correlator"

    def __init__(self, settings: CorrelatorSettings, producer: Producer | None = None) -> None:
        super().__init__(settings, producer)
        self.settings: CorrelatorSettings = settings
        if producer is None:
            self.producer = Producer(
                settings, self.metrics, linger_ms=int(settings.correlator_producer_linger_s * 1000)
            )
        self.view = SlurmView(settings.correlator_retention_s, gated=True)
        self.hold_clock = HoldClock(lambda: self.reader.fetch_age_s())
        self.core = Correlator(
            self.view,
            settings.topic,
            settings.correlator_retention_s,
            self.metrics,
            windows=MemoryAllocationStore(),
            window_s=settings.correlator_window_s,
            window_grace_s=settings.correlator_window_grace_s,
            hold_s=settings.correlator_hold_s,
            max_held_per_node=settings.correlator_max_held_per_node,
            monotonic=self.hold_clock,
        )
        self.reader = SlurmReader(settings, self.view, self._release, settings.correlator_slurm_lookback_s)
        self.first_output_at: float | None = None
        self.restored = 0
        self.checkpoints = 0
        self.rewinds = 0
        self._lane = LANES[settings.correlator_lane]
        self._consumer: Any = None
        #: set while the assigned partitions' windows are restored (aiokafka may hand over records
        #: fetched for the new assignment while the listener still restores: they wait)
        self._restored = asyncio.Event()
        #: held by a revocation from its checkpoint to the drop of the revoked nodes, and by each
        #: release of held records: a record released after the revocation's snapshot (offsets
        #: capped below it, windows not yet folded) would be joined and its windows emitted here,
        #: and again by the next owner, which re-reads it from the committed offset
        self._hold_lock = asyncio.Lock()
        #: set by :meth:`stop` before the consumer's final commit: from then on nothing held is
        #: released (the final checkpoint caps the commit below the held records; released while
        #: the consumer leaves the group, their windows would go out here and again from the next
        #: owner, which re-reads them)
        self._closing = False
        reg = self.metrics.registry
        self._wm_gauge = Gauge("gpuwarden_correlator_slurm_watermark_seconds",
                               "Event time up to which the Slurm view is complete, epoch s", registry=reg)  # fmt: skip
        self._held_gauge = Gauge("gpuwarden_correlator_held_records",
                                 "Records waiting for the Slurm watermark, count", registry=reg)  # fmt: skip
        self._wm_gauge.set_function(lambda: max(0.0, min(self.view.watermark(), 1e12)))
        self._held_gauge.set_function(lambda: float(self.core.held_count))

    @property
    def group(self) -> str:
        return self.settings.app_id

    async def on_start(self) -> None:
        self._closing = False
        if "gpu.samples" in self._lane:
            await self._check_changelog()
        await self.reader.start()
        self.spawn(self.reader.run(), "slurm-view")
        self.spawn(self._tick(), "hold")
        # the shared consumer, with a rebalance listener, commits at the interval, after a checkpoint
        self._consumer = self.consume(
            list(self._lane),
            self._handle,
            group=self.group,
            listener=_Rebalance(self),
            commit_interval_s=self.settings.correlator_commit_interval_s,
            checkpoint=self._checkpoint,
            # the samples-only lane batches its fetches (XIDs never wait: they are not in it)
            fetch_min_bytes=SAMPLE_FETCH_MIN_BYTES if self._lane == LANES["samples"] else 1,
        )
        self._consumer.on_rewind = self._rewound

    async def stop(self) -> None:
        """Graceful: no held record is released from here on (they stay below the final
        commit for the next owner); then the shared stop (final checkpoint and commit, leave the
        group, cancel the Slurm reader and the hold timer)."""
        async with self._hold_lock:  # a release in progress queues its outputs first
            self._closing = True
        await super().stop()

    async def on_stop(self) -> None:
        await self.reader.stop()

    async def _check_changelog(self) -> None:
        """The changelog exists and is co-partitioned with gpu.samples (a node's windows go to
        the changelog partition of the node's samples: same key, same partitioner).

        Raises:
            RuntimeError: it is missing or has another partition count.
        """
        md = await _metadata(self.settings)
        counts = {t: len(md.partitions_for_topic(self.settings.topic(t)) or ()) for t in ("gpu.samples", CHANGELOG)}
        if counts[CHANGELOG] == 0:
            raise RuntimeError(f"topic {self.settings.topic(CHANGELOG)} does not exist: create the topics first "
                               "(gpuwarden topics create)")  # fmt: skip
        if counts[CHANGELOG] != counts["gpu.samples"]:
            raise RuntimeError(f"gpu.samples and {CHANGELOG} must have the same partition count: {counts}")

    # -- records ------------------------------------------------------------------------
    async def _handle(self, topic: str, value: BaseModel, rec: ConsumerRecord) -> None:
        if not self._restored.is_set():
            await self._restored.wait()
            if self._consumer is not None and not self._consumer.owns(rec):
                # revoked while it waited: its new owner reads it from the committed offset
                # (handled here, it would go into the changelog as a node state this worker
                # no longer owns)
                return
        if isinstance(value, NodeSample):
            outs = self.core.on_sample(value, rec.value, rec.partition, rec.offset)
        elif isinstance(value, GpuEvent):
            outs = self.core.on_event(value, rec.value, rec.partition, rec.offset)
        else:  # pragma: no cover - the consumer only delivers the lane's models
            raise TypeError(f"unexpected {type(value).__name__} on {topic}")
        self._queue(outs)

    def _queue(self, outs: list[Output]) -> None:
        """Queue outputs on the producer: the shared consumer drains them after each batch
        (one record batch per topic-partition) and confirms them before a commit."""
        queue = self.producer.queue
        for o in outs:
            queue(o.topic, o.key, o.value)
        if outs and self.first_output_at is None:
            self.first_output_at = time.time()
            log.info("correlator: first output published")

    async def _release(self) -> None:
        async with self._hold_lock:
            if self._closing:
                return
            outs = self.core.release()
            self._queue(outs)
        if outs:
            await self.producer.drain_soon()

    async def _tick(self) -> None:
        """Hold timeouts: release what waited ``hold_s`` as unknown."""
        while True:
            await asyncio.sleep(min(1.0, self.settings.correlator_hold_s / 4))
            await self._release()

    # -- checkpoints and rebalances -------------------------------------------------------
    async def _checkpoint(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Offsets (capped below held records) and the window snapshot, taken together; then
        the snapshot is appended and every output so far confirmed (raises DeliveryError)."""
        covered = {}
        samples = self.settings.topic("gpu.samples")
        for tp, o in offsets.items():
            floor = self.core.held_floor(tp.partition, "gpu.samples" if tp.topic == samples else "gpu.events")
            covered[tp] = o if floor is None else min(o, floor)
        snapshot = self.core.take_dirty()
        for _partition, node, state in snapshot:
            self.producer.queue(CHANGELOG, node, state)
        await self.producer.flush()
        self.checkpoints += 1
        return covered

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        self._restored.clear()
        async with self._hold_lock:  # no release between the checkpoint and the drop
            if self._consumer is not None:
                try:
                    await self._consumer.commit_now()
                except Exception as exc:
                    log.warning("correlator: commit on revocation failed (records will be read again): %s", exc)
            # samples and events are co-partitioned by node: a partition number is one set of nodes
            n = self.core.drop({tp.partition for tp in revoked})
        log.info("correlator: partitions revoked %s (%d nodes dropped)", sorted(tp.partition for tp in revoked), n)

    async def _rewound(self, parts: set[TopicPartition]) -> None:
        """Outputs not confirmed: the consumer reads ``parts`` again from their last commit, so
        their nodes' state goes back to what that commit covers, as at a rebalance: held records
        are forgotten (they are read again) and the open windows come back from the changelog.
        Else a window closed and emitted in the lost outputs was lost: the records read again
        found it closed and counted as late (36 of 1,152 windows in the test of three losses).
        A snapshot the broker took in the failed checkpoint is newer than the commit: its
        windows ignore the readings read again (same ``ts``), as after a crash at that point."""
        nums = sorted({tp.partition for tp in parts})
        async with self._hold_lock:  # no release between the drop and the restore
            self._restored.clear()
            try:
                n = self.core.drop(set(nums))
                if "gpu.samples" in self._lane:
                    # the broker may be what failed: retried (about 2 min), then the worker stops
                    # loudly and its next start restores from the changelog as well
                    self.restored += await retry_async(lambda: self._restore(nums), retries=7, first_delay_s=0.5,
                                                       retry_on=(KafkaError, OSError))  # fmt: skip
            finally:
                self._restored.set()
        self.rewinds += 1
        log.warning("correlator: partitions %s read again from their last commit (%d nodes' state restored)", nums, n)

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        parts = sorted(tp.partition for tp in assigned if tp.topic == self.settings.topic("gpu.samples"))
        if parts:
            self.restored += await self._restore(parts)
        self._restored.set()
        log.info("correlator: partitions assigned %s", sorted((tp.topic, tp.partition) for tp in assigned))

    async def _restore(self, partitions: list[int]) -> int:
        """Read the changelog partitions to their end; the newest state per node wins."""
        topic = self.settings.topic(CHANGELOG)
        c = kafka_consumer(self.settings, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                           fetch_max_wait_ms=100)  # fmt: skip
        await c.start()
        latest: dict[str, tuple[int, bytes | None]] = {}
        try:
            tps = [TopicPartition(topic, p) for p in partitions]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            ends = await c.end_offsets(tps)
            todo = {tp for tp in tps if ends[tp] > 0}
            while todo:
                for tp, recs in (await c.getmany(*todo, timeout_ms=500, max_records=5000)).items():
                    for r in recs:
                        if r.key is not None:
                            latest[r.key.decode()] = (tp.partition, r.value)
                for tp in list(todo):
                    if await c.position(tp) >= ends[tp]:
                        todo.discard(tp)
        finally:
            await c.stop()
        for node, (partition, value) in latest.items():
            try:
                self.core.restore(node, partition, orjson.loads(value) if value is not None else None)
            except orjson.JSONDecodeError:
                log.warning("correlator: unreadable changelog record for node %r ignored", node[:100])
        log.info("correlator: restored the windows of %d nodes from %s %s", len(latest), topic, partitions)
        return len(latest)

    def health(self) -> dict[str, Any]:
        h = super().health()
        wm = self.view.watermark()
        h.update(
            lane=self.settings.correlator_lane,
            first_output_at=self.first_output_at,
            slurm_watermark=wm if wm > 0 else None,
            slurm_view_read=self.reader.caught_up.is_set(),
            held=self.core.held_count,
            unknown=self.core.unknown,
            slurm_fetch_age_s=None if (age := self.reader.fetch_age_s()) is None else round(age, 1),
            hold_paused_s=round(self.hold_clock.paused_s, 1),
            restored_nodes=self.restored,
        )
        return h
