"""Job records of Slurm's ``jobcomp/kafka`` plugin -> :class:`JobState` (optional job source).

Sites that run ``JobCompType=jobcomp/kafka`` get one JSON record per finished job on a Kafka
topic (Slurm 23.02+), and, since Slurm 25.05 with ``JobCompParams=enable_job_start``, one
record when a job starts running (on ``topic_job_start``, same topic by default). The record
is the ``jobcomp`` field subset (the fields of ``jobcomp/elasticsearch``): ``jobid``,
``job_name``, ``username``, ``account``, ``partition``, ``nodes`` (a hostlist), ``state``
(absent in a start record), ``exit_code`` / ``derived_ec`` (``"CODE:SIGNAL"``), ``@submit``,
``@start``, ``@end`` (ISO 8601 times, UTC), ``array_job_id`` / ``array_task_id``, ``tres_alloc``
... It has **no GPU indices** (no ``gres_detail``): :func:`fill_gpus` copies them from the
poller's last :class:`JobState` of the same job (squeue / slurmrestd ``gres_detail``); a job
the poller never saw while running (shorter than a poll period) keeps ``gpus={}``.

No Kafka client here (none is a dependency): the consumer hands each message value to
:func:`parse_jobcomp_record`; :func:`parse_jobcomp_lines` reads a recording (one JSON record
a line, as ``kcat -C`` prints them). No I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import orjson

from ..models import JobState
from .fields import TERMINAL_JOB_STATES, base_job_state
from .names import expand_nodes

__all__ = ["fill_gpus", "parse_jobcomp_lines", "parse_jobcomp_record"]

_NO_VAL = 0xFFFFFFFE  # Slurm NO_VAL as printed for unset 32-bit ids


def _time(v: Any) -> float | None:
    """``"2025-06-01T12:00:05"`` (UTC, what the plugin prints), with ``Z`` or an offset too,
    or an epoch number -> epoch s; ``None`` for missing / unparsable / 0."""
    if v is None or v == "":
        return None
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v) or None
    try:
        t = dt.datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def _exit_code(v: Any) -> int | None:
    """``"CODE:SIGNAL"`` -> the exit code, or ``128 + signal`` when a signal ended the job."""
    if v is None:
        return None
    code, _, sig = str(v).partition(":")
    try:
        c, s = int(code), int(sig or 0)
    except ValueError:
        return None
    return 128 + s if s else c


def _int(v: Any) -> int | None:
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return None if n in (_NO_VAL, _NO_VAL + 1) else n


def parse_jobcomp_record(record: str | bytes | Mapping[str, Any], ts: float) -> JobState:
    """One ``jobcomp/kafka`` record (the message value, or its decoded object) -> :class:`JobState`.

    A record without ``state`` is a job start record (Slurm 25.05+ ``enable_job_start``):
    ``RUNNING``, no end time. An end record's ``state`` (``COMPLETED``, ``FAILED``,
    ``CANCELLED`` ...; a trailing ``by UID`` is dropped) gives the state, ``exit_code`` the
    exit status (``128 + signal`` for a signal), ``confirmed=True`` for an end state (the
    controller's own completion record). ``gpus`` is always ``{}`` (the record has no
    indices; see :func:`fill_gpus`). An array task gets the id ``ARRAY_TASK``.

    Raises:
        ValueError: not a JSON object, or no ``jobid``.
    """
    if isinstance(record, str | bytes):
        try:
            rec = orjson.loads(record)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"jobcomp/kafka record: not JSON: {exc}") from exc
    else:
        rec = record
    if not isinstance(rec, Mapping):
        raise ValueError("jobcomp/kafka record: expected a JSON object")
    jid = _int(rec.get("jobid"))
    if jid is None:
        raise ValueError("jobcomp/kafka record: no 'jobid'")
    arr, task = _int(rec.get("array_job_id")), _int(rec.get("array_task_id"))
    job_id = f"{arr}_{task}" if arr and task is not None else str(jid)
    raw_state = rec.get("state")
    start_record = raw_state is None
    state = "RUNNING" if start_record else base_job_state(str(raw_state).split(" ", 1)[0])
    end = None if start_record else _time(rec.get("@end"))
    terminal = state in TERMINAL_JOB_STATES
    name = rec.get("job_name") or rec.get("jobname")
    return JobState(
        job_id=job_id,
        ts=ts,
        state=state,
        name=str(name) if name else None,
        user=rec.get("username") or None,
        account=rec.get("account") or None,
        partition=rec.get("partition") or None,
        nodes=expand_nodes(rec.get("nodes")),
        gpus={},
        start_ts=_time(rec.get("@start")),
        end_ts=end,
        exit_code=_exit_code(rec.get("exit_code")) if terminal else None,
        submit_ts=_time(rec.get("@submit")),
        confirmed=True if terminal else None,
    )


def parse_jobcomp_lines(text: str | bytes, ts: float) -> list[JobState]:
    """A recording of ``jobcomp/kafka`` messages, one JSON record a line (blank lines and
    ``#`` / ``$`` comment lines skipped) -> one :class:`JobState` per record, in order.

    Raises:
        ValueError: a line is not a record (its line number is given).
    """
    raw = text.decode() if isinstance(text, bytes) else text
    out: list[JobState] = []
    for i, line in enumerate(raw.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(("#", "$")):
            continue
        try:
            out.append(parse_jobcomp_record(s, ts))
        except ValueError as exc:
            raise ValueError(f"line {i}: {exc}") from exc
    if not out:
        raise ValueError("jobcomp/kafka: no record")
    return out


def fill_gpus(job: JobState, polled: Mapping[str, JobState]) -> JobState:
    """``job`` (from a ``jobcomp/kafka`` record, ``gpus={}``) with the GPU indices of the
    poller's last state of the same job id (``polled``: job id -> :class:`JobState` from
    squeue / slurmrestd), restricted to the nodes the record names; ``job`` itself when the
    poller has none for it."""
    seen = polled.get(job.job_id)
    if job.gpus or seen is None or not seen.gpus:
        return job
    nodes = set(job.nodes)
    gpus = {n: list(idx) for n, idx in seen.gpus.items() if not nodes or n in nodes}
    return job.model_copy(update={"gpus": gpus}) if gpus else job
