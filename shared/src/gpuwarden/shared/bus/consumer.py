"""Consuming: the validating aiokafka :class:`Consumer` with its dead-letter path and at-least-once commits."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from ..contract import ContractError, EdgeCheck
from ..metrics import ServiceMetrics
from ..settings import BusSettings
from .assignor import AffinityAssignor
from .clients import kafka_consumer
from .codec import decode
from .deadletter import MAX_MESSAGE_BYTES, dead_letter_of
from .errors import DeliveryError, NotAuthorizedError, not_authorized
from .producer import ProducerLike

__all__ = [
    "Consumer",
    "Handler",
]

log = logging.getLogger(__name__)


Handler = Callable[[str, BaseModel, ConsumerRecord], Awaitable[None]]

#: Longest a batch runs without giving the event loop to other tasks, s. A handler that does
#: not suspend (the detector's sample path) would otherwise hold the loop for a whole batch
#: (500 records, 0.2-0.5 s on a loaded machine), and a second consumer in the same process (the
#: detector's event lane) waited that long before it could read an XID.
YIELD_EVERY_S = 0.005


class Consumer:
    """Consume short-named topics in a consumer group, validate, hand to ``handler``.

    At-least-once, and nothing skipped: after each batch the producer's deliveries are
    confirmed, then only the offsets of records that were handled are committed (a record
    dead-lettered counts as handled). Bad messages and handler errors go to ``deadletter``
    and do not stop the loop; a record too large to carry is dead-lettered by reference
    (:data:`DEAD_LETTER_MAX_BYTES`). When the broker does not confirm the outputs, nothing is
    committed and the uncommitted records are read again (after ``retry_s``). A graceful stop
    (:meth:`request_stop`) finishes the record in hand and hands the rest of the batch back
    uncommitted (the next owner of the partition reads it).
    """

    def __init__(
        self,
        settings: BusSettings,
        service: str,
        topics: Iterable[str],
        group_id: str,
        handler: Handler,
        producer: ProducerLike,
        metrics: ServiceMetrics,
        auto_offset_reset: str = "earliest",
        max_records: int = 500,
        retry_s: float = 1.0,
        listener: Any = None,
        commit_interval_s: float = 0.0,
        fetch_min_bytes: int = 1,
        worker_id: str | None = None,
    ) -> None:
        self._settings = settings
        self.service = service
        self.topics = list(topics)
        self._group_id = group_id
        self._handler = handler
        self._producer = producer
        self._metrics = metrics
        self._reset = auto_offset_reset
        self._max_records = max_records
        self._retry_s = retry_s
        self._consumer: AIOKafkaConsumer | None = None
        self._short = {settings.topic(t): t for t in self.topics}
        self._handled: dict[TopicPartition, int] = {}  # next offset after the last handled record
        self._committed: dict[TopicPartition, int] = {}
        #: the first offset handled since the partition's last commit (where a rewind goes when
        #: the partition has no commit yet): a failed delivery re-reads every partition handled
        #: since its commit, not only those of the batch whose commit failed
        self._floor: dict[TopicPartition, int] = {}
        #: records dead-lettered above the committed offset, with their dead letter's delivery:
        #: a record read again (outputs not confirmed, or a rebalance that gave this member its
        #: partition back) whose dead letter the broker confirmed is not dead-lettered twice
        self._dead: dict[TopicPartition, dict[int, asyncio.Future[Any]]] = {}
        self.repeats = 0
        """Records read again whose dead letter was already confirmed (not sent again)."""
        self._stopping = False
        self.before_commit: Callable[[bool], Awaitable[bool]] | None = None
        """Called before offsets are committed (``force`` on stop); False defers the commit."""
        self.checkpoint: Callable[[dict[TopicPartition, int]], Awaitable[dict[TopicPartition, int]]] | None = None
        """Called with the offsets about to be committed, after the outputs are confirmed; makes
        the caller's state durable and returns the offsets that state covers (at most those
        given: a record it still holds keeps its partition's commit below it)."""
        self.on_rewind: Callable[[set[TopicPartition]], Awaitable[None]] | None = None
        """Called when outputs were not confirmed, before the partitions it names are read again
        from their last commit: a caller whose state already took those records in (the
        correlator's open windows) puts that state back to what the commit covers, as at a
        rebalance, or the records are counted twice."""
        self.on_caught_up: Callable[[], Awaitable[None]] | None = None
        """Called whenever this consumer has read every assigned partition to its end (a fetch that
        came back empty, or positions at the highwater after a batch): all that was written to its
        topics before now has been handled. A lane's event-time progress for a join with another
        lane (the detector's pending stage waits on it)."""
        self._listener = listener
        self._commit_interval_s = commit_interval_s
        self._fetch_min_bytes = fetch_min_bytes
        self._drain_soon: Callable[[], Awaitable[None]] | None = getattr(producer, "drain_soon", None)
        self._in_counters: dict[str, Any] = {}
        #: the relative half of the topics' contract (gpuwarden.shared.contract): event time
        #: against the wall clock and each topic's progress; who dead-letters what
        self.edge = EdgeCheck(
            service,
            getattr(settings, "edge_max_ahead_s", 600.0),
            getattr(settings, "edge_max_behind_s", 365 * 86400.0),
        )
        self.rejected = 0
        #: one commit at a time: a revocation's commit (:meth:`commit_now`, from aiokafka's
        #: rebalance listener) waits for the run loop's commit in progress, whose checkpoint has
        #: taken the handled offsets and the state snapshot but not yet confirmed them (returning
        #: at once with nothing to commit, the revocation let the next owner restore a state
        #: without that snapshot and re-emit what it covered)
        self._commit_lock = asyncio.Lock()
        self._last_commit = float("-inf")  # the first commit is due at once (monotonic may start near 0)
        self.handled = 0
        self.handed_back = 0
        self.rewinds = 0
        """Times the handled records were read again because outputs were not confirmed."""
        #: outputs were not confirmed (a commit's flush or checkpoint failed, maybe the rebalance
        #: listener's): :meth:`run` rewinds before its next batch
        self._lost = False
        self.assigned = asyncio.Event()
        #: the service instance's id for :class:`~.assignor.AffinityAssignor` (None: aiokafka's
        #: round robin alone)
        self.worker_id = worker_id

    async def start(self) -> None:
        if self._consumer is not None:
            return
        c = kafka_consumer(
            self._settings,
            *(() if self._listener is not None else self._short),
            client_id=f"{self._settings.client_id}-{self.service}",
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset=self._reset,
            session_timeout_ms=10000,
            heartbeat_interval_ms=1000,
            max_poll_interval_ms=300000,
            fetch_max_wait_ms=100,
            # > 1: the broker answers a fetch when this much is there or 100 ms passed (fewer,
            # larger batches for a high-volume lane; at most 100 ms more latency)
            fetch_min_bytes=self._fetch_min_bytes,
            # a worker's lanes (one group each) get the same partition numbers: a node's samples
            # and events meet on one worker. One assignor only: aiokafka 0.14 sends a JoinGroup
            # per prefix of the list (aio-libs/aiokafka#1168), and the second, with other
            # metadata, starts another rebalance (two workers under load kept a group
            # rebalancing for minutes)
            partition_assignment_strategy=(
                (AffinityAssignor(self.worker_id),) if self.worker_id else (RoundRobinPartitionAssignor,)
            ),
        )
        try:
            await c.start()
            if self._listener is not None:
                c.subscribe(list(self._short), listener=self._listener)
        except BaseException:
            await c.stop()
            raise
        self._consumer = c
        self._stopping = False

    def request_stop(self) -> None:
        """Ask :meth:`run` to return after the record in hand (the rest is handed back)."""
        self._stopping = True

    async def stop(self) -> None:
        """Commit what was handled (only that) and leave the group; safe twice and before ``start``."""
        c, self._consumer = self._consumer, None
        if c is not None:
            try:
                await self._commit(c, force=True)
            except Exception as exc:
                log.warning(
                    "%s: final commit failed (the uncommitted records will be read again): %s", self.service, exc
                )
            await c.stop()

    async def stop_gracefully(self, task: asyncio.Task[Any] | None, grace_s: float = 10.0) -> None:
        """Stop ``task`` (this consumer's :meth:`run`): let it finish the record in hand (up to
        ``grace_s``, then cancel it), then :meth:`stop` (commit the handled records only)."""
        self.request_stop()
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), grace_s)
            except TimeoutError:
                log.warning("%s: the record in hand took over %gs; cancelled (it will be read again)", self.service,
                            grace_s)  # fmt: skip
                task.cancel()
            except Exception:
                pass  # its crash is reported by the service's task guard
            await asyncio.gather(task, return_exceptions=True)
        await self.stop()

    async def _commit(self, c: AIOKafkaConsumer, force: bool = False) -> None:
        """Confirm the outputs, then commit the handled positions of the assigned partitions.

        Raises:
            DeliveryError: outputs not confirmed (nothing committed).
        """
        async with self._commit_lock:
            await self._commit_locked(c, force)

    async def _commit_locked(self, c: AIOKafkaConsumer, force: bool) -> None:
        if not self._handled or self._lost:  # lost outputs: nothing is committed before the rewind
            return
        if not force and time.monotonic() - self._last_commit < self._commit_interval_s:
            return
        self._last_commit = time.monotonic()
        try:
            await self._producer.flush()
        except DeliveryError:
            self._lose()
            raise
        if self.before_commit is not None and not await self.before_commit(force):
            return
        assigned = c.assignment()
        handled, self._handled = self._handled, {}
        offsets = {tp: o for tp, o in handled.items() if tp in assigned}
        if self.checkpoint is not None:
            try:
                covered = await self.checkpoint(offsets)
            except DeliveryError:
                self._lose()
                raise
            # what the state does not cover yet stays to commit next time
            self._handled = {tp: o for tp, o in handled.items() if covered.get(tp, o) < o and tp in assigned}
            offsets = covered
        offsets = {tp: o for tp, o in offsets.items() if tp in c.assignment() and self._committed.get(tp) != o}
        if offsets:
            await c.commit(offsets)
            self._committed.update(offsets)
            self._forget_dead(offsets, c.assignment())
        # a partition lost to a rebalance: its next owner commits it (this member's figure goes stale)
        for tp in [tp for tp in self._committed if tp not in assigned]:
            del self._committed[tp]
        # a partition with nothing left to commit starts its next floor at its next record
        self._floor = {tp: f for tp, f in self._floor.items() if tp in self._handled}

    def _lose(self) -> None:
        """Outputs not confirmed: nothing handled so far may be committed, by any commit (a
        revocation's from the rebalance listener included), until :meth:`run` has rewound."""
        self._handled = {}
        self._lost = True

    async def _rewind(self, c: AIOKafkaConsumer, first: dict[TopicPartition, int]) -> None:
        """Outputs not confirmed: read every assigned partition handled since its last commit
        again from that commit (from the first record handled since, where it has none yet),
        after :attr:`on_rewind`; nothing handled so far is committed. ``first``: the offset of
        each partition's first record in the batch in hand.

        The producer reports a failed delivery once, so every partition whose outputs may be
        among the failed ones is rewound, not only the batch's: a commit at the next interval
        would otherwise cover records whose outputs were lost."""
        back: dict[TopicPartition, int] = {}
        for tp in set(first) | set(self._floor) | set(self._handled):
            if tp not in c.assignment():
                continue
            # the commit is below every record handled since (it covers none); without one, the
            # first record handled since, else (not reached yet in the batch) the batch's first
            off = self._committed.get(tp, self._floor.get(tp, first.get(tp)))
            if off is not None:
                back[tp] = off
        self._handled = {}
        self._floor = {}
        self._lost = False
        if self.on_rewind is not None and back:
            await self.on_rewind(set(back))
        for tp, off in back.items():
            c.seek(tp, off)
        self.rewinds += 1

    def _forget_dead(self, committed: dict[TopicPartition, int], assigned: Any) -> None:
        """Drop the remembered dead letters below the committed offsets, and those of
        partitions no longer assigned (their next owner reads from the commit)."""
        for tp in list(self._dead):
            if tp not in assigned:
                del self._dead[tp]
            elif tp in committed:
                done = self._dead[tp]
                for off in [o for o in done if o < committed[tp]]:
                    del done[off]

    async def commit_now(self, force: bool = True) -> None:
        """Commit what is handled now (a revocation: before the partitions go to another member)."""
        c = self._consumer
        if c is not None:
            await self._commit(c, force=force)

    def owns(self, rec: ConsumerRecord) -> bool:
        """Whether ``rec``'s partition is assigned to this member now (a handler that waited
        across a rebalance checks it before it changes state for that partition)."""
        c = self._consumer
        return c is not None and TopicPartition(rec.topic, rec.partition) in c.assignment()

    def assignment(self) -> dict[str, list[int]]:
        """The partitions assigned to this member now, by short topic name (empty before
        :meth:`start` and between a revocation and the next assignment)."""
        c = self._consumer
        out: dict[str, list[int]] = {}
        for tp in c.assignment() if c is not None else ():
            out.setdefault(self._short.get(tp.topic, tp.topic), []).append(tp.partition)
        return {t: sorted(ps) for t, ps in sorted(out.items())}

    async def lag(self) -> dict[str, int]:
        """Consumer lag per short topic name (messages), summed over assigned partitions."""
        c = self._consumer
        if c is None:
            return {}
        parts = list(c.assignment())
        if not parts:
            return {}
        ends = await c.end_offsets(parts)
        out: dict[str, int] = {}
        for tp in parts:
            pos = await c.position(tp)
            short = self._short.get(tp.topic, tp.topic)
            out[short] = out.get(short, 0) + max(0, ends[tp] - pos)
        return out

    async def run(self) -> None:
        """Consume until cancelled or :meth:`request_stop`."""
        c = self._consumer
        if c is None:
            raise RuntimeError("consumer not started")
        while not self._stopping:
            if self._lost:  # a commit outside this loop (a revocation's) found outputs not confirmed
                await self._rewind(c, {})
            batches: dict[TopicPartition, list[ConsumerRecord]] = await c.getmany(
                timeout_ms=200, max_records=self._max_records
            )
            if c.assignment():
                self.assigned.set()
            if not batches:
                if self.on_caught_up is not None and c.assignment():
                    await self.on_caught_up()
                if self._handled and (self.checkpoint is not None or self.before_commit is not None):
                    # records held by the caller are released without new input, or a commit the
                    # caller deferred (the detector's state write was not due) is due now: commit
                    # them too (else a quiet stream's last records stay uncommitted, lag > 0)
                    try:
                        await self._commit(c)
                    except (DeliveryError, KafkaError) as exc:
                        # the producer reports a lost output once: committing later would cover it
                        self._metrics.errors.labels("delivery").inc()
                        log.warning("%s: commit failed (%s); re-reading from the last commit", self.service, exc)
                        await self._rewind(c, {})
                        await asyncio.sleep(self._retry_s)
                continue
            first = {tp: recs[0].offset for tp, recs in batches.items() if recs}
            clock = time.monotonic
            yield_at = clock() + YIELD_EVERY_S
            try:
                for tp, records in batches.items():
                    short = self._short.get(tp.topic, tp.topic)
                    if records and tp not in self._floor:
                        self._floor[tp] = records[0].offset
                    for i, rec in enumerate(records):
                        if self._listener is not None and tp not in c.assignment():
                            break  # revoked mid-batch: its next owner reads it from the commit
                        if self._stopping:
                            self._hand_back(c, tp, rec.offset, len(records) - i)
                            break
                        await self._one(short, rec)
                        self._handled[tp] = rec.offset + 1
                        self.handled += 1
                        if clock() >= yield_at:
                            await asyncio.sleep(0)  # let the process's other lanes run (YIELD_EVERY_S)
                            yield_at = clock() + YIELD_EVERY_S
                if self._drain_soon is not None:
                    # outputs the handler queued (Producer.queue), batched per partition in the background
                    await self._drain_soon()
                await self._commit(c)
            except (DeliveryError, KafkaError) as exc:
                denied = not_authorized(exc)
                if denied is not None:  # an ACL is missing: retrying would hang, stop loudly
                    self._handled = {}  # its outputs are not on the broker: stop() must not commit it
                    raise NotAuthorizedError(
                        f"{self.service}: Kafka refuses this principal: {type(denied).__name__}: {denied} "
                        "(grant the missing ACL; nothing of this batch was committed)"
                    ) from exc
                # outputs not confirmed: commit nothing, read the uncommitted records again
                self._metrics.errors.labels("delivery").inc()
                log.warning("%s: outputs not delivered (%s); re-reading from the last commit", self.service, exc)
                await self._rewind(c, first)
                await asyncio.sleep(self._retry_s)
                continue
            lag = c.highwater  # per partition highwater: cheap lag estimate from fetch responses
            at_end = True
            for tp in batches:
                if tp not in c.assignment():
                    continue  # revoked by a rebalance mid-batch: aiokafka has no highwater for it
                hw = lag(tp)
                if hw is not None:
                    pos = await c.position(tp)
                    at_end = at_end and pos >= hw
                    self._metrics.consumer_lag.labels(self._short.get(tp.topic, tp.topic), str(tp.partition)).set(
                        max(0, hw - pos)
                    )
                else:
                    at_end = False
            if at_end and self.on_caught_up is not None:
                await self.on_caught_up()

    def _hand_back(self, c: AIOKafkaConsumer, tp: TopicPartition, offset: int, n: int) -> None:
        self.handed_back += n
        log.info("%s: stopping: %d record(s) of %s[%s] from %s handed back uncommitted", self.service, n,
                 tp.topic, tp.partition, offset)  # fmt: skip

    async def _one(self, short: str, rec: ConsumerRecord) -> None:
        counter = self._in_counters.get(short)
        if counter is None:
            counter = self._in_counters[short] = self._metrics.messages_in.labels(short)
        counter.inc()
        if rec.value is not None and len(rec.value) > MAX_MESSAGE_BYTES:
            await self.reject(short, rec, "oversize", f"oversize: {len(rec.value)} bytes (max {MAX_MESSAGE_BYTES})")
            return
        try:
            value = decode(short, rec.value)
        except (ValueError, ValidationError) as exc:
            await self.reject(short, rec, "schema", f"schema: {_short_error(exc)}")
            return
        try:
            self.edge.check(short, value)
        except ContractError as exc:
            await self.reject(short, rec, exc.rule, f"contract {exc.rule}: {exc}")
            return
        try:
            await self._handler(short, value, rec)
        except (asyncio.CancelledError, DeliveryError, KafkaError):
            raise  # not the record's fault: it is not handled, and read again
        except Exception as exc:
            # one line per record, rate-limited per kind (no traceback per record: DEBUG has it)
            log.warning("%s: handler failed on %s[%s]@%s: %s: %s", self.service, short, rec.partition, rec.offset,
                        type(exc).__name__, str(exc)[:300], extra={"rate_limited": True})  # fmt: skip
            log.debug("handler traceback", exc_info=True)
            self._metrics.errors.labels("handler").inc()
            await self.dead_letter(short, rec, f"handler: {type(exc).__name__}: {exc}")

    async def reject(self, short: str, rec: ConsumerRecord, rule: str, error: str) -> None:
        """A record outside its topic's contract (``rule``: ``oversize``, ``schema``,
        ``event-time``): dead-lettered when this service is the topic's edge
        (:attr:`~gpuwarden.shared.topics.TopicSpec.edge`), else dropped; counted either way.

        Raises:
            DeliveryError: the broker did not confirm the dead letter (the record stays unhandled).
        """
        self.rejected += 1
        self._metrics.rejected.labels(short, rule).inc()
        if self.edge.is_edge(short):
            await self.dead_letter(short, rec, error)
            return
        log.info("%s: dropping %s[%s]@%s outside the contract (%s; dead-lettered by its edge service): %s",
                 self.service, short, rec.partition, rec.offset, rule, error[:200],
                 extra={"rate_limited": True})  # fmt: skip

    async def dead_letter(self, short: str, rec: ConsumerRecord, error: str) -> None:
        """Publish ``rec`` to ``deadletter`` with ``error``; logs and counts it. A value over
        :data:`DEAD_LETTER_MAX_BYTES` goes by reference: its size and first bytes, ``truncated``.

        The dead letter is confirmed with the batch's other outputs, before any offset that
        covers ``rec`` is committed (a flood of bad records costs no round trip per record); if
        the broker does not confirm it, nothing is committed and ``rec`` is read again. A record
        read again by this member before its offset is committed (the batch's other outputs were
        not confirmed, or a rebalance gave the partition back) whose dead letter the broker did
        confirm is not dead-lettered again (counted in :attr:`repeats`); after a crash or on
        another member it may be (at-least-once: the dead letter names its source topic,
        partition and offset).
        """
        tp = TopicPartition(rec.topic, rec.partition)
        before = self._dead.get(tp, {}).get(rec.offset)
        if before is not None and before.done() and not before.cancelled() and before.exception() is None:
            self.repeats += 1
            log.info("%s: %s[%s]@%s read again; its dead letter is already on the broker", self.service, short,
                     rec.partition, rec.offset, extra={"rate_limited": True})  # fmt: skip
            return
        log.warning("%s: dead-lettering %s[%s]@%s: %s", self.service, short, rec.partition, rec.offset, error[:300],
                    extra={"rate_limited": True})  # fmt: skip
        self._metrics.dead_lettered.labels(short).inc()
        topic = self._settings.topic(short)
        dl = dead_letter_of(self.service, topic, rec.partition, rec.offset, rec.key, rec.value, error, time.time())
        send = getattr(self._producer, "send", None)
        if send is None:  # a publisher without delivery futures (tests): nothing to remember
            await self._producer.publish("deadletter", topic, dl)
            return
        self._dead.setdefault(tp, {})[rec.offset] = await send("deadletter", topic, dl)


def _short_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors()[:5]
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errs)
    return str(exc)
