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
    drops). With ``spool`` (a file path) every message is written there (a JSON line) *before* it
    is handed to ``send`` and stays there until its delivery is confirmed, with the queue and the
    messages in flight while the broker is failing; a new Outbox with the same path starts with
    those messages. So neither an outage that outlives a restart nor a ``kill -9`` loses a message
    but what the bound drops, counted. A message whose delivery was confirmed just before a
    ``kill -9`` may be sent twice (at-least-once: the correlator folds a reading of the same GPU and
    ``ts`` once). In steady state the spool holds the one or two messages in flight: one append per
    message and a truncation when nothing is pending. Exceptions of ``send`` are caught; everything else propagates.
    With ``send_timeout_s`` a ``send`` that does not return in time (a producer whose buffer is
    full while the broker is down) counts as a failed delivery and the message is queued, so the
    caller (the collector's tick) never waits longer than that for one message.
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
        self.degraded = False
        self._dirty = False
        self._spooled = False
        self._events_queued = False  # an event may be in the queue (False: surely none)
        if spool is not None and spool.exists():
            self._load(spool)

    def _load(self, spool: Path) -> None:
        for line in spool.read_bytes().splitlines():
            try:
                d = orjson.loads(line)
                model = _MODELS[d["topic"]]
                self._enqueue(d["topic"], d["key"], model.model_validate(d["value"]))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("outbox spool %s: skipping a bad line: %s", spool, exc)
        self._spooled = bool(self.queue)
        if self.queue:
            log.info("outbox: %d messages from spool %s to replay", len(self.queue), spool)

    @property
    def pending(self) -> int:
        """Messages not yet confirmed: queued plus in flight."""
        return len(self.queue) + len(self.inflight)

    def _drop_one(self) -> str:
        for i, (topic, _, _) in enumerate(self.queue):
            if topic not in PRIORITY_TOPICS:
                del self.queue[i]
                return topic
        return self.queue.popleft()[0]

    def _enqueue(self, topic: str, key: str | None, value: BaseModel) -> None:
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
        self.queue.append((topic, key, value))
        self._dirty = True
        if topic in PRIORITY_TOPICS:
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

    def reap(self) -> int:
        """Settle the messages in flight whose delivery is done: delivered ones are forgotten,
        failed ones go back to the front of the queue in their order. Returns how many failed."""
        back: list[Item] = []
        delivered_before = self.delivered
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
                self.degraded = False
                self.progress_at = self._clock()
        self.inflight = keep
        if not keep:
            self.progress_at = None
        for item in reversed(back):
            self.queue.appendleft(item)
        if any(t in PRIORITY_TOPICS for t, _, _ in back):
            self._events_queued = True
        while len(self.queue) > self.max_messages:  # the bound holds for returned messages too
            self._enqueue(*self.queue.pop())  # re-adding the newest drops one, by priority
        delivered = self.delivered != delivered_before
        if back or (self._spooled and (delivered or not self.inflight)):
            self._dirty = True  # the spool holds exactly what is not confirmed
            self._save()
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
            self.degraded = False
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
        if self.queue or not self._may_send():
            self._enqueue(topic, key, value)
            self._save()
            return False
        self._write_ahead((topic, key, value))
        if await self._send((topic, key, value)):
            return True
        self._enqueue(topic, key, value)
        self._save()
        return False

    async def flush(self) -> int:
        """Replay queued messages, events first, each topic in order, until one fails (while
        degraded: one probe). Returns how many were handed to ``send``."""
        sent = 0
        while self.queue and self._may_send():
            i = self._next()
            item = self.queue[i]
            if not await self._send(item):
                break
            if i < len(self.queue) and self.queue[i] is item:
                del self.queue[i]
            else:  # the queue changed while ``send`` waited
                self.queue.remove(item)
            self._dirty = True
            sent += 1
        if sent:
            log.info("outbox: replayed %d buffered messages (%d left, %d delivery failures so far)", sent,
                     len(self.queue), self.failures)  # fmt: skip
            self._save()
        return sent

    async def settle(self, timeout_s: float = 30.0) -> int:
        """Wait (up to ``timeout_s``) for the messages in flight, then :meth:`reap`; what is
        still unconfirmed stays in flight and is written to the spool. Returns how many failed."""
        futs = [f for _, f in self.inflight]
        if futs:
            await asyncio.wait(futs, timeout=timeout_s)
        failed = self.reap()
        if self.inflight:
            self._dirty = True
            self._save()
        return failed

    @staticmethod
    def _line(item: Item) -> bytes:
        topic, key, value = item
        return orjson.dumps({"topic": topic, "key": key, "value": value.model_dump(mode="json")}) + b"\n"

    def _write_ahead(self, item: Item) -> None:
        """Append ``item`` to the spool before it is sent (the spool then holds what is pending
        plus it); one append, no rewrite."""
        if self.spool is None:
            return
        if self._dirty:
            self._save()
        with self.spool.open("ab") as f:
            f.write(self._line(item))
        self._spooled = True

    def _save(self) -> None:
        if self.spool is None or not self._dirty:
            return
        tmp = self.spool.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for item in [i for i, _ in self.inflight] + list(self.queue):
                f.write(self._line(item))
        tmp.replace(self.spool)
        self._dirty = False
        self._spooled = bool(self.inflight or self.queue)
