"""Outage buffering of the collector's messages: a bounded in-order queue with an optional
on-disk spool, replayed when the broker is back; what had to be dropped is counted and logged."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from gpuwarden.shared.models import GpuEvent, NodeSample

__all__ = ["Outbox"]

log = logging.getLogger(__name__)

Send = Callable[[str, str | None, BaseModel], Awaitable[Any]]
_MODELS: dict[str, type[BaseModel]] = {"gpu.samples": NodeSample, "gpu.events": GpuEvent}
#: Topics whose messages are kept longest when the queue is full (dropped only when nothing
#: else is left to drop): events are never dropped before samples.
PRIORITY_TOPICS = frozenset({"gpu.events"})

Item = tuple[str, str | None, BaseModel]

#: journal lines beyond twice the pending messages (plus this) before the spool is rewritten
COMPACT_SLACK = 64


class _Msg(tuple):  # type: ignore[type-arg]
    """An :data:`Item` with its journal sequence number ``seq`` (unpacks as the 3-tuple)."""

    seq: int


def _msg(seq: int, topic: str, key: str | None, value: BaseModel) -> Item:
    m = _Msg((topic, key, value))
    m.seq = seq
    return m


def _forget(fut: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a superseded delivery (asyncio logs an unretrieved exception)."""
    if not fut.cancelled():
        fut.exception()


class Outbox:
    """Send messages in order through ``send``; while they are not delivered, keep them.

    ``send`` either confirms the message itself (returns once delivered, raises otherwise) or
    returns its delivery future (:meth:`gpuwarden.shared.bus.Producer.send`): such a message
    is *in flight* until the future is done; one whose delivery failed or expired goes back
    to the front of the queue, in order, and is counted in ``failures`` (per topic in
    ``failures_by_topic``; ``on_failure(topic, n)`` is called). While the broker is failing
    (``degraded``) only one message at a time is sent, as a probe; the first delivery that
    succeeds replays the rest.

    ``submit()`` first replays what is queued, then sends the new message; the first failure
    stops the replay and queues the rest. Events (:data:`PRIORITY_TOPICS`: XID, SXID, GPU
    lost) are replayed before samples (and are the probe while degraded); within a topic the
    order is kept. A failed delivery is logged the first time, then at most once per
    ``log_interval_s`` with the count so far (the replay line carries it too). The queue holds at
    most ``max_messages``; when full the oldest *sample* is dropped (an event only when the
    queue holds nothing but events), ``dropped`` (per topic) is increased,
    ``on_drop(topic, n)`` is called and a warning is logged (at most one per ``log_every``
    drops). With ``spool`` (a file path) the outbox keeps an append-only journal there: every
    message is appended (a JSON line with its sequence number) *before* it is handed to ``send`` or
    queued, and its confirmed delivery (or drop by the bound) is appended as a ``{"done": [...]}``
    line; a new Outbox with the same path starts with the messages not done, in their order. So
    neither an outage that outlives a restart nor a ``kill -9`` loses a message but what the bound
    drops, counted. A message whose delivery was confirmed just before a ``kill -9`` may be sent
    twice (at-least-once: the correlator folds a reading of the same GPU and ``ts`` once). The
    journal is truncated whenever nothing is pending and rewritten with only the pending messages
    when it holds more than twice as many lines (plus :data:`COMPACT_SLACK`): writes stay
    proportional to the messages, also through a long outage (one append per message, not a
    rewrite of the whole backlog per tick). Exceptions of ``send`` are caught; everything else propagates.
    With ``send_timeout_s`` a ``send`` that does not return in time (a producer whose buffer is
    full while the broker is down) counts as a failed delivery and the message is queued, so the
    caller (the collector's tick) never waits longer than that for one message.

    Order across an outage: a message still in flight when the broker comes back (its batch
    stuck on a connection the outage broke) is older than everything queued. Replaying the
    queue before it is settled would put it behind newer messages of its node if it then fails:
    a sample the correlator finds too late for its window. So the replay waits for those
    messages up to ``reorder_wait_s`` (new messages queue meanwhile); what is still unsettled
    then is sent again ahead of the replay and its first delivery is no longer waited for
    (``superseded``; if that one succeeds too, the message is on Kafka twice: at-least-once).
    """

    def __init__(
        self,
        send: Send,
        max_messages: int = 10_000,
        spool: Path | None = None,
        on_drop: Callable[[str, int], None] | None = None,
        log_every: int = 1000,
        on_failure: Callable[[str, int], None] | None = None,
        log_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        send_timeout_s: float | None = None,
        reorder_wait_s: float = 5.0,
    ) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        self.send = send
        self.max_messages = max_messages
        self.spool = spool
        self.on_drop = on_drop
        self.log_every = log_every
        self.on_failure = on_failure
        self.log_interval_s = log_interval_s
        self._clock = clock
        self.send_timeout_s = send_timeout_s
        self.reorder_wait_s = reorder_wait_s
        #: when the messages in flight last made progress (the first went out, or one was confirmed)
        self.progress_at: float | None = None
        self.queue: deque[Item] = deque()
        self.inflight: deque[tuple[Item, asyncio.Future[Any]]] = deque()
        self.dropped: dict[str, int] = {}
        self.failures = 0
        self.failures_by_topic: dict[str, int] = {}
        self._failures_logged = 0
        self._failure_logged_at: float | None = None
        self.delivered = 0
        #: messages sent again because they were still unsettled ``reorder_wait_s`` after the broker came back
        self.superseded = 0
        self.degraded = False
        #: deliveries in flight since before the broker came back, and when it did (monotonic s)
        self._suspects: list[asyncio.Future[Any]] = []
        self._recovered_at: float | None = None
        self._seq = 0  # the last sequence number given
        self._journal_lines = 0  # lines in the spool file
        self._done: list[int] = []  # sequence numbers settled since the last journal write
        self._events_queued = False  # an event may be in the queue (False: surely none)
        if spool is not None and spool.exists():
            self._load(spool)

    def _load(self, spool: Path) -> None:
        """Read the journal: its messages whose ``done`` line is missing, in sequence order (a
        spool written before the journal, lines without ``seq``, reads in file order)."""
        found: dict[int, Item] = {}
        done: set[int] = set()
        for line in spool.read_bytes().splitlines():
            try:
                d = orjson.loads(line)
                if "done" in d:
                    done.update(int(n) for n in d["done"])
                    continue
                seq = int(d["seq"]) if "seq" in d else self._seq + 1
                found[seq] = _msg(seq, d["topic"], d["key"], _MODELS[d["topic"]].model_validate(d["value"]))
                self._seq = max(self._seq, seq)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("outbox spool %s: skipping a bad line: %s", spool, exc)
        for seq in sorted(found.keys() - done):
            self._enqueue(found[seq])
        self._done.clear()  # what the bound dropped here is written by the rewrite below
        self._rewrite()
        if self.queue:
            log.info("outbox: %d messages from spool %s to replay", len(self.queue), spool)

    @property
    def pending(self) -> int:
        """Messages not yet confirmed: queued plus in flight."""
        return len(self.queue) + len(self.inflight)

    def _drop_one(self) -> str:
        for i, (topic, _, _) in enumerate(self.queue):
            if topic not in PRIORITY_TOPICS:
                self._settled(self.queue[i])
                del self.queue[i]
                return topic
        item = self.queue.popleft()
        self._settled(item)
        return item[0]

    def _settled(self, item: Item) -> None:
        """``item`` needs no spooling any more (delivered, or dropped by the bound)."""
        if self.spool is not None and isinstance(item, _Msg):
            self._done.append(item.seq)

    def _enqueue(self, item: Item) -> None:
        if len(self.queue) >= self.max_messages:
            old_topic = self._drop_one()
            n = self.dropped.get(old_topic, 0) + 1
            self.dropped[old_topic] = n
            if self.on_drop is not None:
                self.on_drop(old_topic, 1)
            total = sum(self.dropped.values())
            if total == 1 or total % self.log_every == 0:
                log.warning(
                    "outbox full (%d messages, broker unreachable): dropped the oldest %s; %d dropped so far",
                    self.max_messages,
                    old_topic,
                    total,
                )
        self.queue.append(item)
        if item[0] in PRIORITY_TOPICS:
            self._events_queued = True

    def _next(self) -> int:
        """Index in the queue of the next message to send: the oldest event, else the oldest."""
        if self._events_queued:
            for i, (topic, _, _) in enumerate(self.queue):
                if topic in PRIORITY_TOPICS:
                    return i
            self._events_queued = False
        return 0

    def _failed(self, topic: str, exc: BaseException) -> None:
        self.failures += 1
        self.failures_by_topic[topic] = self.failures_by_topic.get(topic, 0) + 1
        self.degraded = True
        if self.on_failure is not None:
            self.on_failure(topic, 1)
        now = self._clock()
        if self._failure_logged_at is None or now - self._failure_logged_at >= self.log_interval_s:
            log.warning("delivery to %s failed (%s: %s); buffering (%d failures so far, %d since the last report, "
                        "%d messages pending)", topic, type(exc).__name__, exc, self.failures,
                        self.failures - self._failures_logged, self.pending)  # fmt: skip
            self._failure_logged_at = now
            self._failures_logged = self.failures

    def _recover(self) -> None:
        """A delivery succeeded: leave degraded mode; what is still in flight then has been in
        flight through the outage (while degraded only a lone probe is sent)."""
        if self.degraded:
            self.degraded = False
            self._suspects = [fut for _, fut in self.inflight if not fut.done()]
            self._recovered_at = self._clock()

    def _replay_ready(self) -> bool:
        """Whether the queue may be replayed now: no message in flight through the outage is
        unsettled, or ``reorder_wait_s`` has passed since the broker came back, and then those
        still unsettled are put back at the front of the queue to be sent again (superseded)."""
        self._suspects = [f for f in self._suspects if not f.done()]
        if not self._suspects:
            return True
        assert self._recovered_at is not None
        if self._clock() - self._recovered_at < self.reorder_wait_s:
            return False
        stuck = {id(f) for f in self._suspects}
        back = [item for item, fut in self.inflight if id(fut) in stuck]
        self.inflight = deque((item, fut) for item, fut in self.inflight if id(fut) not in stuck)
        for fut in self._suspects:
            fut.add_done_callback(_forget)
        for item in reversed(back):  # every message in flight is older than every queued one of its topic
            self.queue.appendleft(item)
        if any(t in PRIORITY_TOPICS for t, _, _ in back):
            self._events_queued = True
        self.superseded += len(back)
        self._suspects = []
        log.warning("outbox: %d messages in flight since before the broker came back are still unconfirmed after "
                    "%gs; sending them again ahead of the replay (kept in order; a copy may arrive twice)",
                    len(back), self.reorder_wait_s)  # fmt: skip
        return True

    def reap(self) -> int:
        """Settle the messages in flight whose delivery is done: delivered ones are forgotten,
        failed ones go back to the front of the queue in their order. Returns how many failed."""
        back: list[Item] = []
        keep: deque[tuple[Item, asyncio.Future[Any]]] = deque()
        for item, fut in self.inflight:
            if not fut.done():
                keep.append((item, fut))
            elif fut.cancelled() or fut.exception() is not None:
                exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
                self._failed(item[0], exc or RuntimeError("delivery failed"))
                back.append(item)
            else:
                self.delivered += 1
                self._settled(item)
                self._recover()
                self.progress_at = self._clock()
        self.inflight = keep
        if not keep:
            self.progress_at = None
        for item in reversed(back):
            self.queue.appendleft(item)
        if any(t in PRIORITY_TOPICS for t, _, _ in back):
            self._events_queued = True
        while len(self.queue) > self.max_messages:  # the bound holds for returned messages too
            self._enqueue(self.queue.pop())  # re-adding the newest drops one, by priority
        self._journal()
        return len(back)

    async def _send(self, item: Item) -> bool:
        """Hand one message to ``send``. False when it raised (the caller keeps the message)."""
        try:
            if self.send_timeout_s is None:
                res = await self.send(*item)
            else:
                # never block the caller's tick on a full producer buffer: buffer it here instead
                res = await asyncio.wait_for(self.send(*item), self.send_timeout_s)
        except TimeoutError:
            self._failed(item[0], TimeoutError(f"the producer did not take the message in {self.send_timeout_s:g}s "
                                               "(its buffer is full: broker unreachable?)"))  # fmt: skip
            return False
        except Exception as exc:
            self._failed(item[0], exc)
            return False
        if isinstance(res, asyncio.Future):
            if not self.inflight:
                self.progress_at = self._clock()
            self.inflight.append((item, res))
        else:
            self.delivered += 1
            self._settled(item)
            self._recover()
        return True

    def stalled_s(self) -> float:
        """How long the messages in flight have gone without a confirmation, s (0: none in flight)."""
        return 0.0 if self.progress_at is None or not self.inflight else self._clock() - self.progress_at

    def _may_send(self) -> bool:
        return not self.degraded or not self.inflight  # degraded: one probe at a time

    async def submit(self, topic: str, key: str | None, value: BaseModel) -> bool:
        """Send ``value`` after whatever is queued. True when it (and the queue) was handed to
        ``send`` now (delivery may still be pending: see :meth:`reap`)."""
        self.reap()
        await self.flush()
        self._seq += 1
        item = _msg(self._seq, topic, key, value)
        self._write_ahead(item)
        if self.queue or not self._may_send():
            self._enqueue(item)
            self._journal()
            return False
        sent = await self._send(item)
        if not sent:
            self._enqueue(item)
        self._journal()
        return sent

    async def flush(self) -> int:
        """Replay queued messages, events first, each topic in order, until one fails (while
        degraded: one probe; after an outage not before the messages in flight through it are
        settled, see the class). Returns how many were handed to ``send``."""
        sent = 0
        if self.queue and not self.degraded and not self._replay_ready():
            return 0
        while self.queue and self._may_send():
            i = self._next()
            item = self.queue[i]
            if not await self._send(item):
                break
            if i < len(self.queue) and self.queue[i] is item:
                del self.queue[i]
            else:  # the queue changed while ``send`` waited
                self.queue.remove(item)
            sent += 1
        if sent:
            log.info("outbox: replayed %d buffered messages (%d left, %d delivery failures so far)", sent,
                     len(self.queue), self.failures)  # fmt: skip
            self._journal()
        return sent

    async def settle(self, timeout_s: float = 30.0) -> int:
        """Wait (up to ``timeout_s``) for the messages in flight, then :meth:`reap`; what is
        still unconfirmed stays in flight and in the spool. Returns how many failed."""
        futs = [f for _, f in self.inflight]
        if futs:
            await asyncio.wait(futs, timeout=timeout_s)
        return self.reap()

    @staticmethod
    def _line(item: Item) -> bytes:
        topic, key, value = item
        d: dict[str, Any] = {"topic": topic, "key": key, "value": value.model_dump(mode="json")}
        if isinstance(item, _Msg):
            d["seq"] = item.seq
        return orjson.dumps(d) + b"\n"

    def _append(self, data: bytes, lines: int) -> None:
        assert self.spool is not None
        with self.spool.open("ab") as f:
            f.write(data)
        self._journal_lines += lines

    def _write_ahead(self, item: Item) -> None:
        """Append ``item`` to the journal before it is sent or queued (one append, no rewrite)."""
        if self.spool is not None:
            self._append(self._line(item), 1)

    def _journal(self) -> None:
        """Bring the spool up to date: truncate it when nothing is pending, else append what was
        settled since the last write (one ``done`` line), and rewrite it with the pending messages
        only when its lines exceed twice them plus :data:`COMPACT_SLACK`."""
        if self.spool is None:
            return
        if not self.pending:
            if self._journal_lines:
                self.spool.write_bytes(b"")
                self._journal_lines = 0
            self._done.clear()
            return
        if self._done:
            self._append(orjson.dumps({"done": self._done}) + b"\n", 1)
            self._done = []
        if self._journal_lines > 2 * self.pending + COMPACT_SLACK:
            self._rewrite()

    def _rewrite(self) -> None:
        """Replace the spool with the pending messages, in sequence order (atomic rename)."""
        if self.spool is None:
            return
        items = [i for i, _ in self.inflight] + list(self.queue)
        items.sort(key=lambda i: i.seq if isinstance(i, _Msg) else -1)
        tmp = self.spool.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for item in items:
                f.write(self._line(item))
        tmp.replace(self.spool)
        self._journal_lines = len(items)
        self._done = []
