"""Bounded event time: a timestamp far from a stream's watermark is rejected (the consumer
dead-letters it) instead of moving the watermark (one ``ts=1e308`` sample would otherwise make
every healthy node look silent forever)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["EventTimeGuard"]

DAY_S = 86400.0


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
