"""The condition state machine: healthy -> pending -> open -> resolving -> resolved, in event time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuwarden.shared.models import Evidence

from .base import Reading

if TYPE_CHECKING:
    from . import ConditionRule

__all__ = ["Tracker"]


@dataclass
class Tracker:
    """Healthy -> pending -> open -> resolving -> resolved, in event time."""

    bad_since: float | None = None
    good_since: float | None = None
    opened: bool = False
    first_seen: float = 0.0
    last_seen: float = 0.0
    occurrences: int = 0
    evidence: list[Evidence] = field(default_factory=list)
    last_emitted: float = 0.0

    def step(self, rule: ConditionRule, ts: float, reading: Reading, source: str) -> str | None:
        """Feed one reading; returns ``"open"``, ``"update"``, ``"resolved"`` or None."""
        if reading.unhealthy:
            self.good_since = None
            if self.bad_since is None:
                self.bad_since = ts
                self.evidence = []
            # evidence: the onset reading and the four latest
            self.evidence = [*self.evidence[:1], *self.evidence[1:][-3:], reading.evidence(ts, source)]
            self.occurrences += 1
            self.last_seen = ts
            if not self.opened and ts - self.bad_since >= rule.for_s and not reading.unconfirmed:
                # first_seen is when the condition is confirmed (held for_s): the detection time;
                # the evidence keeps the readings from its onset on
                self.opened, self.first_seen = True, ts
                return "open"
            return "update" if self.opened else None
        if not self.opened:
            self.bad_since, self.occurrences = None, 0
            return None
        if self.good_since is None:
            self.good_since = ts
        if ts - self.good_since >= rule.resolve_after_s:
            self.opened, self.bad_since, self.good_since, self.occurrences = False, None, None, 0
            self.last_seen = ts
            return "resolved"
        return None

    def interrupt(self) -> None:
        """A reading that cannot be judged (a job-dependent rule on a sample whose job
        attribution is ``unknown``): it restarts the streak in progress and is no evidence
        either way. A pending condition must hold ``for_s`` again from the next judged
        reading; an open one stays open and needs ``resolve_after_s`` of judged healthy
        readings from the next one on. Nothing is emitted."""
        if self.opened:
            self.good_since = None
        else:
            self.bad_since, self.occurrences = None, 0
