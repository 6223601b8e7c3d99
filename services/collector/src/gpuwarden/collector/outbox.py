"""Outage buffering of the collector's messages: a bounded in-order queue with an optional
on-disk spool, replayed when the broker is back; what had to be dropped is counted and logged."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from pydantic import BaseModel

from gpuwarden.shared.models import GpuEvent, NodeSample

__all__ = ["Outbox"]

log = logging.getLogger(__name__)

Send = Callable[[str, str | None, BaseModel], Awaitable[None]]
_MODELS: dict[str, type[BaseModel]] = {"gpu.samples": NodeSample, "gpu.events": GpuEvent}


class Outbox:
    """Send messages in order through ``send``; while it fails, keep them.

    ``submit()`` first replays what is queued (oldest first), then sends the new message; the
    first failure stops the replay and queues the rest, so order is kept. The queue holds at
    most ``max_messages``; when full the oldest message is dropped, ``dropped`` (per topic) is
    increased, ``on_drop(topic, n)`` is called and a warning is logged (at most one per
    ``log_every`` drops). With ``spool`` (a file path) the queue is also written there as JSON
    lines, and a new Outbox with the same path starts with those messages (so an outage that
    outlives a restart loses nothing but what the bound drops). Exceptions of ``send`` are
    caught; everything else propagates.
    """

    def __init__(
        self,
        send: Send,
        max_messages: int = 10_000,
        spool: Path | None = None,
        on_drop: Callable[[str, int], None] | None = None,
        log_every: int = 1000,
    ) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        self.send = send
        self.max_messages = max_messages
        self.spool = spool
        self.on_drop = on_drop
        self.log_every = log_every
        self.queue: deque[tuple[str, str | None, BaseModel]] = deque()
        self.dropped: dict[str, int] = {}
        self.failures = 0
        self._dirty = False
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
        if self.queue:
            log.info("outbox: %d messages from spool %s to replay", len(self.queue), spool)

    def _enqueue(self, topic: str, key: str | None, value: BaseModel) -> None:
        if len(self.queue) >= self.max_messages:
            old_topic, _, _ = self.queue.popleft()
            n = self.dropped.get(old_topic, 0) + 1
            self.dropped[old_topic] = n
            if self.on_drop is not None:
                self.on_drop(old_topic, 1)
            total = sum(self.dropped.values())
            if total == 1 or total % self.log_every == 0:
                log.warning(
                    "outbox full (%d messages, broker unreachable): dropped the oldest; %d dropped so far",
                    self.max_messages,
                    total,
                )
        self.queue.append((topic, key, value))
        self._dirty = True

    async def submit(self, topic: str, key: str | None, value: BaseModel) -> bool:
        """Send ``value`` after whatever is queued. True when it (and the queue) went out now."""
        await self.flush()
        if self.queue:
            self._enqueue(topic, key, value)
            self._save()
            return False
        try:
            await self.send(topic, key, value)
            return True
        except Exception as exc:
            self.failures += 1
            if self.failures == 1 or self.failures % self.log_every == 0:
                log.warning("publish to %s failed (%s: %s); buffering", topic, type(exc).__name__, exc)
            self._enqueue(topic, key, value)
            self._save()
            return False

    async def flush(self) -> int:
        """Replay queued messages in order until one fails. Returns how many went out."""
        sent = 0
        while self.queue:
            topic, key, value = self.queue[0]
            try:
                await self.send(topic, key, value)
            except Exception:
                break
            self.queue.popleft()
            self._dirty = True
            sent += 1
        if sent:
            log.info("outbox: replayed %d buffered messages (%d left)", sent, len(self.queue))
            self._save()
        return sent

    def _save(self) -> None:
        if self.spool is None or not self._dirty:
            return
        tmp = self.spool.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for topic, key, value in self.queue:
                f.write(orjson.dumps({"topic": topic, "key": key, "value": value.model_dump(mode="json")}) + b"\n")
        tmp.replace(self.spool)
        self._dirty = False
