"""Drains the Slurm health-check wrapper set, and when one of them may be resumed.

The wrapper (deploy/slurm/prolog-gpuwarden.sh) drains a node with a reason starting with one of
:data:`HEALTH_REASON_PREFIXES`. Such a drain may be resumed once a health check of the node
passed after the drain and after its last failed check, with no failed check since (the same
rule as ``require_health_check``), and once the node's health results have settled. This
module only selects; the :class:`~gpuwarden.remediator.service.Remediator` re-reads the node
from Slurm and resumes it only while its reason is still the wrapper's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gpuwarden.shared.models import NodeState

from .policy import History, is_out

__all__ = ["HEALTH_REASON_PREFIXES", "HEALTH_SETTLE_S", "HealthDrain", "HealthDrains"]

#: Drain reasons the Slurm health-check wrapper (deploy/slurm/prolog-gpuwarden.sh) sets. A node
#: drained with one of them is resumed by the remediator after a later passing health check,
#: under the same own-reason rule as its own drains (an operator's reason is never touched).
HEALTH_REASON_PREFIXES = ("gpuwarden prolog:", "gpuwarden epilog:", "gpuwarden periodic:")
#: A health-check run publishes one result per check; a pass counts once no result of the node
#: has arrived for this long (so a failing check of the same run is not missed), wall s.
HEALTH_SETTLE_S = 2.0


@dataclass(frozen=True)
class HealthDrain:
    """A health-check drain due for a resume: ``node``, its drain ``reason`` and ``since``
    (the later of the drain and the node's last failed check, epoch s)."""

    node: str
    reason: str
    since: float

    def why(self, passed_at: float) -> str:
        """The resume's reason text, for a pass at ``passed_at`` (epoch s)."""
        return (
            f"[rule=health-check-passed] drained by the health check ({self.reason[:80]!r}); "
            f"a health check passed at {passed_at:.0f}, after the drain and the last failure"
        )


class HealthDrains:
    """Which health-check drains are due: remembers when each node's last health result
    arrived (monotonic s) and which drains were already resumed or dry-run (a later drain with
    the same text is a new one)."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._done: set[tuple[str, str, float]] = set()

    def note_result(self, node: str) -> None:
        """A health result of ``node`` arrived now."""
        self._seen[node] = time.monotonic()

    def done(self, d: HealthDrain) -> None:
        """``d`` was resumed (or dry-run): never due again."""
        self._done.add((d.node, d.reason, d.since))

    def due(self, nodes: Mapping[str, NodeState], history: History) -> Iterator[HealthDrain]:
        """The drains among ``nodes`` (as last known) that may be resumed by ``history``'s
        health results. Lazy: each node (of a copy of ``nodes`` taken at the first step) is
        checked when the iteration reaches it, against ``history`` as it is then, so a result
        that arrives while the caller handles an earlier node counts."""
        settled = time.monotonic() - HEALTH_SETTLE_S
        for name, cached in list(nodes.items()):
            reason = cached.reason or ""
            if not is_out(cached) or not reason.startswith(HEALTH_REASON_PREFIXES):
                continue
            since = max(cached.reason_ts or 0.0, history.health_fail.get(name, 0.0))
            if (name, reason, since) in self._done or self._seen.get(name, float("inf")) > settled:
                continue
            if since <= 0.0 or not history.health_ok_since(name, since) or history.health_pass[name] <= since:
                continue  # no pass after the drain (a drain of unknown time needs a known failed check)
            yield HealthDrain(name, reason, since)
