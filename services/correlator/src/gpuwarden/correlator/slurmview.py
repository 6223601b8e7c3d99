"""The correlator's view of Slurm: every node's GPU allocations and how far they are complete.

:class:`SlurmView` is pure (no Kafka): it takes ``slurm.jobs`` records (``JobState``), the
``slurm.watermarks`` records (``SlurmWatermark``) and the reader's position in each
``slurm.jobs`` partition, and answers two questions in event time:

* who held GPU ``g`` of node ``n`` at ``ts`` (:meth:`allocations`, then
  :func:`~gpuwarden.shared.allocations.attributions_at`);
* up to which event time that answer is complete (:meth:`watermark`): the newest
  watermark whose ``jobs_offsets`` the reader has reached in every partition. Before it passes a
  record's ``ts``, "no job holds this GPU" cannot be told from "Slurm has not told me yet", so
  the correlator holds the record (:mod:`.core`).

Every correlator worker reads all of ``slurm.jobs`` (a global table, as Kafka Streams'
``GlobalKTable``): a few thousand jobs are small next to one second of samples, and the
watermark is then exact, with no repartition topic to order against. A JobState that arrives
late with an earlier ``start_ts`` changes the answer for records still held.
"""

from __future__ import annotations

import math
from typing import Any

from gpuwarden.shared.allocations import Allocation, apply_allocation, fan_out
from gpuwarden.shared.models import JobState, SlurmWatermark

__all__ = ["SlurmView"]

_EMPTY: dict[str, Allocation] = {}


class SlurmView:
    """Per-node allocations from ``slurm.jobs`` and the Slurm watermark.

    Args:
        retention_s: ended allocations are forgotten once the watermark (or, without one, the
            newest job ``ts``) is this far past their end, s of event time: late records up to
            that age still attribute.
        gated: True in the services (the watermark is what :meth:`watermark` says); False for
            in-process runs fed in event order (a recording, a scenario): the view is then
            always complete (:meth:`watermark` is +inf).

    Memory: one :class:`Allocation` per (job, node), about 1 KiB each.
    """

    def __init__(self, retention_s: float = 3600.0, gated: bool = True) -> None:
        self.retention_s = retention_s
        self.gated = gated
        self._allocs: dict[str, dict[str, Allocation]] = {}
        #: slurm.jobs partition -> offset after the last record read (the reader's position)
        self.positions: dict[int, int] = {}
        #: watermarks read but not yet reached (offsets ahead of the positions), oldest first
        self._pending: list[SlurmWatermark] = []
        self._wm: float | None = None
        self._newest_job_ts = -math.inf
        self._expired_at = -math.inf
        #: JobStates applied, watermarks read (counts)
        self.jobs_in = 0
        self.watermarks_in = 0

    # -- input ----------------------------------------------------------------------
    def apply_job(self, job: JobState) -> set[str]:
        """Apply one JobState; returns the nodes whose allocations changed."""
        self.jobs_in += 1
        self._newest_job_ts = max(self._newest_job_ts, job.ts)
        changed: set[str] = set()
        for a in fan_out(job):
            current = self._allocs.get(a.node, _EMPTY)
            new = apply_allocation(current, a)
            if new != current:
                self._allocs[a.node] = new
                changed.add(a.node)
        self._maybe_expire()
        return changed

    def on_watermark(self, wm: SlurmWatermark) -> bool:
        """A ``slurm.watermarks`` record; True if the watermark advanced."""
        self.watermarks_in += 1
        if self._wm is not None and wm.ts <= self._wm:
            return False
        self._pending.append(wm)
        self._pending.sort(key=lambda w: w.ts)
        return self._advance()

    def on_position(self, partition: int, next_offset: int) -> bool:
        """The reader's position in a ``slurm.jobs`` partition moved; True if the watermark advanced."""
        if next_offset > self.positions.get(partition, -1):
            self.positions[partition] = next_offset
        return self._advance() if self._pending else False

    # -- answers ----------------------------------------------------------------------
    def watermark(self) -> float:
        """Event time up to which the view is complete, epoch s (-inf before the first
        watermark is reached; +inf when not gated)."""
        if not self.gated:
            return math.inf
        return -math.inf if self._wm is None else self._wm

    def allocations(self, node: str) -> dict[str, Allocation]:
        """The node's allocations (job id -> allocation). The same object until they change, so
        callers may cache by identity. Do not modify."""
        return self._allocs.get(node, _EMPTY)

    def nodes(self) -> int:
        return len(self._allocs)

    def stats(self) -> dict[str, Any]:
        return {
            "watermark": self._wm,
            "pending_watermarks": len(self._pending),
            "nodes": len(self._allocs),
            "jobs_in": self.jobs_in,
            "watermarks_in": self.watermarks_in,
        }

    # -- internals --------------------------------------------------------------------
    def _advance(self) -> bool:
        reached = None
        pos = self.positions
        for i, wm in enumerate(self._pending):
            if all(pos.get(p, 0) >= o for p, o in wm.jobs_offsets.items()):
                reached = i
        if reached is None:
            return False
        self._wm = max(self._wm if self._wm is not None else -math.inf, self._pending[reached].ts)
        del self._pending[: reached + 1]
        self._maybe_expire()
        return True

    def _maybe_expire(self) -> None:
        """Forget allocations ended more than ``retention_s`` ago (checked once per minute of
        event time)."""
        now = self._wm if (self.gated and self._wm is not None) else self._newest_job_ts
        if now - self._expired_at < 60.0:
            return
        self._expired_at = now
        horizon = now - self.retention_s
        for node in list(self._allocs):
            allocs = self._allocs[node]
            kept = {j: a for j, a in allocs.items() if a.end_ts is None or a.end_ts > horizon}
            if len(kept) != len(allocs):
                if kept:
                    self._allocs[node] = kept
                else:
                    del self._allocs[node]
