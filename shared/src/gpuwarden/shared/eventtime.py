"""Bounded event time: a timestamp far from a stream's watermark is rejected (the consumer
dead-letters it) instead of moving the watermark (one ``ts=1e308`` sample would otherwise make
every healthy node look silent forever)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["LIVE_ROUNDS", "PROGRESS_LEAD_S", "EventTimeGuard", "InputProgress"]

DAY_S = 86400.0
#: How far an input's progress may run ahead of the upper median of its live sources' newest
#: event times, s (:class:`InputProgress`): more than one collector tick of normal spread.
PROGRESS_LEAD_S = 5.0
#: A source is live while one of its input's last ``LIVE_ROUNDS`` x (sources) records is its own.
LIVE_ROUNDS = 3


class EventTimeGuard:
    """Accept event times near the watermark; the watermark is the newest accepted time.

    A time is rejected when it is not finite, more than ``max_ahead_s`` ahead of the newer of
    the watermark and the wall clock (``wall``; ``None``: the watermark alone), or more than
    ``max_behind_s`` behind the watermark. Times are epoch s.

    With ``wall_only`` (the contract's edge check, :mod:`gpuwarden.shared.contract`) the ahead
    bound is taken from the wall clock alone, so accepted records cannot ratchet it forward.
    """

    def __init__(
        self,
        max_ahead_s: float = DAY_S,
        max_behind_s: float = 365 * DAY_S,
        wall: Callable[[], float] | None = time.time,
        wall_only: bool = False,
    ) -> None:
        if max_ahead_s <= 0 or max_behind_s <= 0:
            raise ValueError("max_ahead_s and max_behind_s must be > 0")
        self.max_ahead_s = max_ahead_s
        self.max_behind_s = max_behind_s
        self.wall = wall
        self.wall_only = wall_only and wall is not None
        self.watermark: float | None = None
        self.rejected = 0

    def check(self, ts: float, what: str = "record") -> float:
        """Return ``ts`` and advance the watermark, or raise.

        Raises:
            ValueError: ``ts`` is not finite or outside the bounds (the watermark is unchanged).
        """
        if not math.isfinite(ts):
            self.rejected += 1
            raise ValueError(f"event time of the {what} is not finite: {ts!r}")
        refs = [
            r for r in (None if self.wall_only else self.watermark, self.wall() if self.wall else None) if r is not None
        ]
        if refs and ts > max(refs) + self.max_ahead_s:
            self.rejected += 1
            ref = "wall clock" if self.wall_only else "stream"
            raise ValueError(
                f"event time of the {what} ({ts:.6g}) is {ts - max(refs):.6g}s ahead of the {ref} "
                f"(max {self.max_ahead_s:g}s): not allowed to move the watermark"
            )
        if self.watermark is not None and ts < self.watermark - self.max_behind_s:
            self.rejected += 1
            raise ValueError(
                f"event time of the {what} ({ts:.6g}) is {self.watermark - ts:.6g}s behind the watermark "
                f"(max {self.max_behind_s:g}s)"
            )
        if self.watermark is None or ts > self.watermark:
            self.watermark = ts
        return ts


@dataclass
class InputProgress:
    """Event-time progress of one ordered input (a Kafka partition) that several sources (GPU
    nodes) write to, robust to a minority of sources whose clock is wrong.

    The progress is the newest event time read, but at most ``lead_s`` past the upper median of
    the newest times of the *live* sources (those with a record among the input's last
    ``rounds`` x (sources) records): one node whose clock runs minutes ahead does not carry the
    input, and through it every other node of the fleet, past where its peers are (they would
    all look silent). A source that runs behind, or replays a backlog, is below the median and
    moves nothing. With one or two live sources it is the newest time read (two sources cannot
    outvote each other: :meth:`live` still tells which of them keeps sending). Monotone.

    The median is taken once per round (as many records as there are live sources), so a record
    costs a few dict operations. Liveness is counted in records of this input, never in wall
    time: the same input read at any speed gives the same progress. Memory: a float and an int
    per source ever seen (a fleet's nodes; a node that left is not forgotten: a few hundred
    bytes each).

    Attributes:
        value: the progress, epoch s (``-inf`` before the first record).
        count: records read.
    """

    lead_s: float = PROGRESS_LEAD_S
    rounds: int = LIVE_ROUNDS
    latest: dict[str, float] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    count: int = 0
    high: float = -math.inf
    bound: float = math.inf
    next_round: int = 0
    value: float = -math.inf

    def __post_init__(self) -> None:
        if self.lead_s < 0 or self.rounds < 1:
            raise ValueError("lead_s must be >= 0 and rounds >= 1")

    def observe(self, source: str, ts: float) -> float:
        """Read one record of ``source`` at event time ``ts`` (epoch s); returns :attr:`value`."""
        self.count += 1
        self.seen[source] = self.count
        if ts > self.latest.get(source, -math.inf):
            self.latest[source] = ts
        if ts > self.high:
            self.high = ts
        if self.count >= self.next_round:
            horizon = self.count - self.rounds * len(self.seen)
            live = sorted(self.latest[s] for s, c in self.seen.items() if c > horizon)
            self.bound = live[len(live) // 2] + self.lead_s
            self.next_round = self.count + len(live)
        v = self.high if self.high <= self.bound else self.bound
        if v > self.value:
            self.value = v
        return self.value

    def live(self, source: str) -> bool:
        """Whether ``source`` has a record among this input's last ``rounds`` x (sources) records
        (False for a source never read)."""
        c = self.seen.get(source)
        return c is not None and self.count - c < self.rounds * len(self.seen)
