"""What makes the detector safe under faults (issue 13): bounded event time and condition
state that survives a restart.

* :class:`DurabilitySettings`: ``GPUWARDEN_DETECTOR_MAX_AHEAD_S`` / ``_MAX_BEHIND_S`` (event
  time bounds) and ``GPUWARDEN_DETECTOR_STATE_FILE`` / ``_STATE_INTERVAL_S``.
* :class:`DetectorDurability`: checks each record's event time (a record out of bounds makes
  the handler raise ``ValueError``, so the consumer dead-letters it and the watermark does not
  move), and writes the engine's snapshot to the state file before offsets are committed (the
  commit waits for a write), so after a crash the state and the committed positions agree and
  the records after them are read again: a condition that was opening still opens once, one
  that was open is not opened twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gpuwarden.shared.bus import Consumer
from gpuwarden.shared.eventtime import EventTimeGuard
from gpuwarden.shared.models import AttributedEvent, AttributedSample, GpuEvent, HealthCheckResult, JobWindow

from .engine import Detector

__all__ = ["DetectorDurability", "DurabilitySettings", "event_time"]

log = logging.getLogger(__name__)


class DurabilitySettings(BaseModel):
    """Event-time bounds and the state file of the detector (mixed into its settings)."""

    detector_max_ahead_s: float = Field(
        86400.0,
        gt=0,
        description="Dead-letter a record whose event time is this far ahead of the stream and the wall clock, s",
    )
    detector_max_behind_s: float = Field(
        365 * 86400.0, gt=0, description="Dead-letter a record whose event time is this far behind the watermark, s"
    )
    detector_state_file: Path | None = Field(
        None,
        description="File keeping condition state and open episodes across restarts, tagged JSON "
        "(gpuwarden.detector.snapshot; a file of an older version, a pickle, is refused and the open failures "
        "are adopted from `failures`); unset = memory only",
    )
    detector_adopt_lookback_s: float = Field(
        7 * 86400.0,
        ge=0,
        description="Without a usable state file, how far back (broker time) the detector reads its own open "
        "failures from `failures` at start to keep their ids (0: never), s",
    )
    detector_state_interval_s: float = Field(
        5.0, ge=0, description="Min wall time between state writes (offsets are committed only with a write), s"
    )


def event_time(value: Any) -> float | None:
    """The event time (epoch s) that moves the detector's clock: a sample's or event's ``ts``,
    a job window's end, a health result's ``ts``; None for other records."""
    if isinstance(value, AttributedSample):
        return value.sample.ts
    if isinstance(value, AttributedEvent):
        return value.event.ts
    if isinstance(value, GpuEvent):  # the event lane's raw copy
        return value.ts
    if isinstance(value, JobWindow):
        return value.window_end
    if isinstance(value, HealthCheckResult):
        return value.ts
    return None


class DetectorDurability:
    """Event-time guard and state file of one :class:`~gpuwarden.detector.engine.Detector`."""

    def __init__(self, detector: Detector, settings: DurabilitySettings) -> None:
        self.detector = detector
        self.settings = settings
        self.guard = EventTimeGuard(settings.detector_max_ahead_s, settings.detector_max_behind_s)
        self.writes = 0
        self.restored = False
        self._written_at = float("-inf")
        if settings.detector_state_file is not None:
            self.restore(settings.detector_state_file)

    def check_time(self, topic: str, value: Any) -> None:
        """Raises ``ValueError`` when the record's event time is out of bounds."""
        ts = event_time(value)
        if ts is not None:
            self.guard.check(float(ts), f"{topic} record")

    def restore(self, path: Path) -> bool:
        """Load the snapshot in ``path`` (absent: start empty). An unusable one is logged and
        ignored (the detector starts empty). True when restored."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return False
        try:
            self.detector.restore(data)
        except ValueError as exc:
            log.error("detector state %s not restored (%s): starting empty", path, exc)
            return False
        self.restored = True
        wm = float(getattr(self.detector, "_watermark", 0.0) or 0.0)
        if wm > 0:
            self.guard.watermark = wm
        log.info("detector state restored from %s (%d episodes)", path, len(self.detector.episodes))
        return True

    def save(self) -> None:
        """Write the snapshot atomically (tmp file, fsync, rename; mode 0600)."""
        path = self.settings.detector_state_file
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.detector.snapshot())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.writes += 1
        self._written_at = time.monotonic()

    async def before_commit(self, force: bool) -> bool:
        """The consumer's commit hook: write the state (at most every ``detector_state_interval_s``
        unless ``force``) and allow the commit; defer the commit when no write is due."""
        if self.settings.detector_state_file is None:
            return True
        if not force and time.monotonic() - self._written_at < self.settings.detector_state_interval_s:
            return False
        self.save()
        return True

    def attach(self, consumer: Consumer) -> None:
        """Make ``consumer`` commit only together with a state write."""
        consumer.before_commit = self.before_commit

    async def adopt_published(self, bus: Any, lookback_s: float, timeout_s: float = 30.0) -> int:
        """With a state file configured but not restored (absent, empty or damaged): read the
        failures published in the last ``lookback_s`` (broker time) from ``failures`` and adopt the
        ones whose latest version is still open (:meth:`Detector.adopt`), so a repeated XID of a
        known episode keeps its ``failure_id``. ``bus``: the service's ``BusSettings``. Returns how
        many were adopted; a broker that does not answer in ``timeout_s`` adopts nothing (logged).
        """
        if self.settings.detector_state_file is None or self.restored or lookback_s <= 0:
            return 0
        from aiokafka import TopicPartition

        from gpuwarden.shared.bus import decode, kafka_consumer
        from gpuwarden.shared.models import Failure

        topic = bus.topic("failures")
        c = kafka_consumer(bus, group_id=None, enable_auto_commit=False)
        latest: dict[str, Failure] = {}
        try:
            await c.start()
            md = await c._client.fetch_all_metadata()  # an unassigned consumer knows no partitions yet
            tps = [TopicPartition(topic, p) for p in sorted(md.partitions_for_topic(topic) or ())]
            c.assign(tps)
            ends = await c.end_offsets(tps) if tps else {}
            since = await c.offsets_for_times({tp: int((time.time() - lookback_s) * 1000) for tp in tps}) if tps else {}
            for tp in tps:
                ot = since.get(tp)
                c.seek(tp, ot.offset if ot is not None else ends[tp])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and any([await c.position(tp) < ends[tp] for tp in tps]):
                for recs in (await c.getmany(timeout_ms=500, max_records=2000)).values():
                    for r in recs:
                        try:
                            f = decode("failures", r.value)
                        except ValueError:
                            continue  # not ours to judge: the topic's readers dead-letter it
                        assert isinstance(f, Failure)
                        latest[f.failure_id] = f
        except Exception as exc:  # the service runs without it: ids may repeat, as before
            log.warning("detector: could not read back open failures (%s: %s)", type(exc).__name__, exc)
        finally:
            # aiokafka's consumer may surface its own cancelled commit-reset task here
            with contextlib.suppress(asyncio.CancelledError):
                await c.stop()
        n = sum(self.detector.adopt(f) for f in latest.values())
        log.info("detector: no usable state file; adopted %d open failures of %d read back from %s", n,
                 len(latest), topic)  # fmt: skip
        return n
