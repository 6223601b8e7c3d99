"""Pure change detection between two polls of Slurm (no I/O)."""

from __future__ import annotations

from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.slurm import TERMINAL_JOB_STATES

__all__ = ["GONE_STATE", "carry_gpus", "diff_jobs", "diff_nodes", "resolve_ends"]

GONE_STATE = "ENDED"
"""State emitted for a job that left squeue without a terminal state having been seen
(e.g. the watcher was down longer than Slurm's ``MinJobAge``): it ended, how is unknown."""

_IGNORE = {"ts", "snapshot"}


def _same(a: JobState | NodeState, b: JobState | NodeState) -> bool:
    """Equal in every field but ``ts``/``snapshot`` (one C-level dict comparison; values
    shared between polls by the caching parsers compare by identity first)."""
    da, db = a.__dict__, b.__dict__  # field values (plain data: str, float, list, dict)
    if type(a) is not type(b):
        return False
    if all(da.get(k) == db.get(k) for k in _IGNORE):
        return da == db
    db = dict(db)
    for k in _IGNORE:
        if k in da:
            db[k] = da[k]
    return da == db


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


def _merge_end(base: JobState, acct: JobState, now: float) -> JobState:
    """``base`` (squeue's last view: nodes, GPU indices) with the end accounting reports."""
    return base.model_copy(
        update={
            "state": acct.state,
            "ts": now,
            "start_ts": acct.start_ts or base.start_ts,
            "end_ts": acct.end_ts or base.end_ts,
            "exit_code": acct.exit_code if acct.exit_code is not None else base.exit_code,
            "submit_ts": base.submit_ts or acct.submit_ts,
            "reason": acct.reason or base.reason,
            "nodes": base.nodes or acct.nodes,
            "confirmed": True,
            "snapshot": False,
        }
    )


def resolve_ends(
    changed: list[JobState],
    seen: dict[str, JobState],
    prev: dict[str, JobState],
    accounting: dict[str, JobState] | None,
    misses: dict[str, int],
    grace_polls: int,
    now: float,
) -> tuple[list[JobState], dict[str, JobState]]:
    """Confirm the end states of a :func:`diff_jobs` result with accounting (``sacct``).

    Args:
        changed, seen: the result of :func:`diff_jobs` for this poll.
        prev: the "last seen" map before this poll.
        accounting: sacct's records by job id for the ended jobs of ``changed``; ``None`` when
            accounting could not be read this poll.
        misses: per job id, polls a vanished job has gone unconfirmed (updated in place).
        grace_polls: after this many unconfirmed polls a vanished job is published as
            :data:`GONE_STATE` with ``confirmed=False``.
        now: observation time, epoch s.

    Returns:
        ``(changed, seen)``: an end (a terminal state squeue shows, or a job that left squeue)
        is published once accounting has the job ended: accounting's state, times and exit
        code (squeue's exit code when accounting has none), squeue's nodes and GPU indices,
        ``confirmed=True``. While accounting is unreachable, still lists the job as running,
        or does not know it, nothing is published and the last good state stays in ``seen``
        (never a false "ended"); after ``grace_polls`` such polls the end is published as
        squeue gave it (:data:`GONE_STATE` for a vanished job) with ``confirmed=False``.
    """
    out: list[JobState] = []
    seen = dict(seen)
    for j in changed:
        if j.state not in TERMINAL_JOB_STATES:
            out.append(j)
            continue
        a = (accounting or {}).get(j.job_id)
        ended = a is not None and a.state in TERMINAL_JOB_STATES
        if ended and a:
            misses.pop(j.job_id, None)
            base = j if j.state != GONE_STATE else prev.get(j.job_id, j)
            out.append(_merge_end(base, a, now))
            continue
        n = misses.get(j.job_id, 0) + 1
        if n >= grace_polls:
            misses.pop(j.job_id, None)
            out.append(j.model_copy(update={"confirmed": False}))
        else:  # keep the last good state (nothing published); the end is seen again next poll
            misses[j.job_id] = n
            if j.job_id in prev:
                seen[j.job_id] = prev[j.job_id]
            else:
                seen.pop(j.job_id, None)
    return out, seen


def carry_gpus(prev: dict[str, JobState], current: list[JobState]) -> list[JobState]:
    """Keep the GPU indices (and nodes) of a job through its end.

    Slurm 22.05 drops ``gres_detail`` once a job is completing or finished, so squeue shows
    such a job with ``gpus={}``. A job of ``current`` that is not ``RUNNING``/``PENDING`` and
    has no GPU indices gets the ones of its last seen state in ``prev``. Pure; returns a new list.
    """
    out: list[JobState] = []
    for j in current:
        old = prev.get(j.job_id)
        if not j.gpus and old is not None and old.gpus and j.state not in ("RUNNING", "PENDING"):
            j = j.model_copy(update={"gpus": old.gpus, "nodes": j.nodes or old.nodes})
        out.append(j)
    return out
