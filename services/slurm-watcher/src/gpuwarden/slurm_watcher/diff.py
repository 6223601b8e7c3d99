"""Pure change detection between two polls of Slurm (no I/O)."""

from __future__ import annotations

from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.slurm import TERMINAL_JOB_STATES

__all__ = ["GONE_STATE", "diff_jobs", "diff_nodes"]

GONE_STATE = "ENDED"
"""State emitted for a job that left squeue without a terminal state having been seen
(e.g. the watcher was down longer than Slurm's ``MinJobAge``): it ended, how is unknown."""

_IGNORE = {"ts", "snapshot"}


def _same(a: JobState | NodeState, b: JobState | NodeState) -> bool:
    return a.model_dump(exclude=_IGNORE) == b.model_dump(exclude=_IGNORE)


def diff_jobs(
    prev: dict[str, JobState], current: list[JobState], now: float
) -> tuple[list[JobState], dict[str, JobState]]:
    """Job states to publish, and the new "last seen" map.

    Args:
        prev: last seen state per job id (empty on the first poll).
        current: what the scheduler reports now.
        now: observation time of this poll, epoch s (event time).

    Returns:
        ``(changed, seen)``: ``changed`` holds every job that is new or differs in anything
        but ``ts``/``snapshot``, then one final state per job that disappeared while not in
        a terminal state (state :data:`GONE_STATE`, ``end_ts`` = ``now`` unless an earlier
        end is known, ``ts`` = ``now``); ``seen`` maps the current jobs by id.
    """
    seen = {j.job_id: j for j in current}
    changed = [j for jid, j in seen.items() if jid not in prev or not _same(prev[jid], j)]
    for jid, old in prev.items():
        if jid in seen or old.state in TERMINAL_JOB_STATES:
            continue
        end = old.end_ts if old.end_ts is not None and old.end_ts <= now else now
        changed.append(old.model_copy(update={"state": GONE_STATE, "ts": now, "end_ts": end, "snapshot": False}))
    return changed, seen


def diff_nodes(prev: dict[str, NodeState], current: list[NodeState]) -> tuple[list[NodeState], dict[str, NodeState]]:
    """Node states to publish (new, or different in anything but ``ts``/``snapshot``) and the
    new "last seen" map. A node missing from ``current`` is dropped from the map silently."""
    seen = {n.node: n for n in current}
    changed = [n for name, n in seen.items() if name not in prev or not _same(prev[name], n)]
    return changed, seen
