"""The input contract of every topic, enforced where a record enters (issue 25).

Two halves:

* **Absolute bounds** live in the models (:mod:`gpuwarden.shared.models`): event times finite and
  before :data:`~gpuwarden.shared.models.MAX_EVENT_TS`, GPUs per node, NVLinks and processes per
  GPU, GPU indices, node names and job ids in Slurm's grammar, identifiers (UUIDs, PCI bus ids)
  as printable tokens, text lengths. The JSON Schemas in ``docs/schemas`` carry the same bounds.
* **Relative bounds** (this module): a record's event time may not be more than
  ``edge_max_ahead_s`` ahead of the reader's wall clock, nor more than ``edge_max_behind_s``
  behind the newest event time accepted on the same topic (the stream's progress). A record
  outside them would move a watermark (one ``ts=1e308`` sample made every healthy node look
  silent) or reopen history.

A record outside the contract is dead-lettered **once**, by the topic's edge service
(:attr:`gpuwarden.shared.topics.TopicSpec.edge`, the first service that reads it); every other
reader drops it without a dead letter, counted in ``gpuwarden_rejected_records_total`` (a site
running only that reader still sees the count). Downstream topics never carry it: the edge
service does not pass it on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .eventtime import EventTimeGuard
from .models import (
    AttributedEvent,
    AttributedSample,
    GpuEvent,
    HealthCheckResult,
    JobState,
    JobWindow,
    NodeSample,
    NodeState,
    SlurmWatermark,
)
from .topics import TOPICS

__all__ = ["EDGE_MAX_AHEAD_S", "EDGE_MAX_BEHIND_S", "ContractError", "EdgeCheck", "event_time_of"]

#: Default of ``GPUWARDEN_EDGE_MAX_AHEAD_S``: an event time this far past the reader's wall clock is
#: refused (a node clock off by more than 10 minutes is broken, not skewed), s.
EDGE_MAX_AHEAD_S = 600.0
#: Default of ``GPUWARDEN_EDGE_MAX_BEHIND_S``: an event time this far behind the topic's newest
#: accepted one is refused (a year: replays of old recordings and week-long backlogs pass), s.
EDGE_MAX_BEHIND_S = 365 * 86400.0


class ContractError(ValueError):
    """A record outside its topic's contract; ``rule`` names the rule it broke (``event-time``)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def event_time_of(value: Any) -> float | None:
    """The event time of a decoded record, epoch s: ``ts`` of a sample, event, job or node state,
    watermark or health result; the sample's/event's ``ts`` of an attributed record; a job
    window's end; None for records without one (failures, reports, remediations)."""
    if isinstance(value, NodeSample | GpuEvent | JobState | NodeState | SlurmWatermark | HealthCheckResult):
        return float(value.ts)
    if isinstance(value, AttributedSample):
        return float(value.sample.ts)
    if isinstance(value, AttributedEvent):
        return float(value.event.ts)
    if isinstance(value, JobWindow):
        return float(value.window_end)
    return None


class EdgeCheck:
    """The relative half of the contract for one reading service: one event-time guard per
    topic (each topic's own progress), and whether this service dead-letters a topic's bad
    records (it is the topic's edge) or only counts them."""

    def __init__(
        self,
        service: str,
        max_ahead_s: float = EDGE_MAX_AHEAD_S,
        max_behind_s: float = EDGE_MAX_BEHIND_S,
        wall: Callable[[], float] | None = time.time,
    ) -> None:
        self.service = service
        self.max_ahead_s = max_ahead_s
        self.max_behind_s = max_behind_s
        self.wall = wall
        self.guards: dict[str, EventTimeGuard] = {}

    def is_edge(self, topic: str) -> bool:
        """True when this service dead-letters ``topic``'s records outside the contract (it is the
        topic's edge, or the topic names no edge: each reader dead-letters)."""
        spec = TOPICS.get(topic)
        return spec is None or spec.edge is None or spec.edge == self.service

    def check(self, topic: str, value: Any) -> None:
        """Accept ``value`` (a decoded record of short-named ``topic``) or raise.

        Raises:
            ContractError: its event time is too far ahead of the wall clock or behind the
                topic's progress (rule ``event-time``); the progress is unchanged.
        """
        ts = event_time_of(value)
        if ts is None:
            return
        guard = self.guards.get(topic)
        if guard is None:
            guard = self.guards[topic] = EventTimeGuard(self.max_ahead_s, self.max_behind_s, self.wall, wall_only=True)
        try:
            guard.check(ts, f"{topic} record")
        except ValueError as exc:
            raise ContractError("event-time", str(exc)) from exc
