"""Parsers of Slurm's text output -> :class:`JobState` / :class:`NodeState` / reason rows.

Read: ``scontrol show job -d [-o]`` (Slurm 22.05), ``scontrol show node [-o] [-d]`` (Slurm
22.05 .. 25.05; values with spaces kept whole) and default ``sinfo -R``
(``REASON USER TIMESTAMP NODELIST``, Slurm 22.05). Times are Slurm's ``2026-11-30T07:25:16``
in the local time of the parsing machine. JSON documents (``--json``, slurmrestd) are read by
:mod:`.jsonparse`. No I/O here: callers pass the text and the observation time ``ts`` (epoch s).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from ..models import JobState, NodeState
from .fields import TERMINAL_JOB_STATES, clean_reason, node_state, parse_gres_idx, used_gres_idx
from .names import expand_nodes

__all__ = [
    "parse_scontrol_job_gpus",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_reasons",
    "parse_slurm_time",
]

_REASON_RE = re.compile(r"^(?P<reason>.*?)\s*\[(?P<user>[^@\]]+)@(?P<time>[^\]]+)\]\s*$")
_UID_RE = re.compile(r"^([^()]*)(?:\(\d+\))?$")


def parse_slurm_time(text: str | None) -> float | None:
    """Slurm's ``2026-11-30T07:25:16`` (local time of the machine parsing it) -> epoch s.

    ``Unknown``, ``None``, ``N/A``, ``(null)`` and empty give ``None``.

    Raises:
        ValueError: not an ISO date-time.
    """
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    return datetime.fromisoformat(text).timestamp()


def _scontrol_exit(v: str | None) -> int | None:
    """``"3:0"`` -> 3; ``"0:15"`` (signal 15) -> 143; missing -> ``None``."""
    if not v or ":" not in v:
        return None
    code, sig = v.split(":", 1)
    try:
        return 128 + int(sig) if int(sig) else int(code)
    except ValueError:
        return None


def parse_scontrol_jobs(text: str, ts: float) -> list[JobState]:
    """Parse ``scontrol show job -d`` (Slurm 22.05, multi-line or ``-o`` one-line records).

    Reads ``JobId``, ``ArrayJobId``/``ArrayTaskId``, ``JobName``, ``UserId=name(uid)``,
    ``Account``, ``Partition``, ``JobState``, ``Reason``, ``SubmitTime``/``StartTime``/
    ``EndTime`` (local time of the parsing machine), ``ExitCode=code:signal``, ``NodeList``
    and the per-node ``Nodes=... GRES=gpu:N(IDX:...)`` detail lines (GPU indices per node).

    Returns:
        One :class:`JobState` per ``JobId=`` record (``[]`` for none).

    Raises:
        ValueError: a record without ``JobState`` (not scontrol job output).
    """
    out: list[JobState] = []
    gpus = parse_scontrol_job_gpus(text)
    for rec in _records(text, "JobId"):
        kv: dict[str, str] = {}
        for line in rec:
            for k, v in re.findall(r"(\S+?)=(\S*)", line):
                kv.setdefault(k, v)
        if "JobState" not in kv:
            raise ValueError(f"scontrol show job: record JobId={kv.get('JobId')} has no JobState")
        state = kv["JobState"].upper()
        jid = kv["JobId"]
        if kv.get("ArrayTaskId") not in (None, "N/A") and kv.get("ArrayJobId"):
            jid = f"{kv['ArrayJobId']}_{kv['ArrayTaskId']}"
        m = _UID_RE.match(kv.get("UserId", ""))
        start = parse_slurm_time(kv.get("StartTime")) if state != "PENDING" else None
        end = parse_slurm_time(kv.get("EndTime")) if state != "PENDING" else None
        out.append(
            JobState(
                job_id=jid,
                ts=ts,
                state=state,
                name=kv.get("JobName") or None,
                user=(m.group(1) if m else None) or None,
                account=clean_reason(kv.get("Account")),
                partition=clean_reason(kv.get("Partition")),
                nodes=expand_nodes(kv.get("NodeList")) if state != "PENDING" else [],
                gpus=gpus.get(kv["JobId"], {}),
                start_ts=start,
                end_ts=end,
                exit_code=_scontrol_exit(kv.get("ExitCode")) if state in TERMINAL_JOB_STATES else None,
                submit_ts=parse_slurm_time(kv.get("SubmitTime")),
                reason=clean_reason(kv.get("Reason")),
            )
        )
    return out


def parse_scontrol_job_gpus(text: str) -> dict[str, dict[str, list[int]]]:
    """GPU indices per node of every job in ``scontrol show job -d [-o]`` output (Slurm 22.05).

    Reads ``JobId=`` and the detail lines ``Nodes=gpu-node-[002-003] CPU_IDs=0 Mem=1024
    GRES=gpu:8(IDX:0-7)`` (a job may have several such lines; a hostlist applies the IDX
    to each of its nodes). Works on the multi-line and the one-line (``-o``) format.

    Returns:
        ``{job id: {node: [gpu indices]}}``; jobs without GPUs map to ``{}``.
    """
    out: dict[str, dict[str, list[int]]] = {}
    current: str | None = None
    tokens = re.findall(r"(JobId|Nodes|GRES)=(\S*)", text)
    pending_nodes: list[str] = []
    for key, val in tokens:
        if key == "JobId":
            current = val
            out.setdefault(current, {})
            pending_nodes = []
        elif key == "Nodes" and current is not None:
            pending_nodes = expand_nodes(val)
        elif key == "GRES" and current is not None and pending_nodes:
            idx = parse_gres_idx(val)
            if idx:
                for n in pending_nodes:
                    out[current][n] = sorted(set(out[current].get(n, [])) | set(idx))
            pending_nodes = []
    return out


def _int_or_none(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def _records(text: str, first_key: str) -> list[list[str]]:
    recs: list[list[str]] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(f"{first_key}="):
            recs.append([s])
        elif recs and s:
            recs[-1].append(s)
    return recs


# a key of scontrol's Key=Value output: CamelCase at a word start (``OS``, ``CfgTRES``,
# ``CurrentWatts``, ``LastBusyTime``); ``cpu=64`` inside ``CfgTRES=cpu=64,mem=...`` is not one
_SCONTROL_KEY_RE = re.compile(r"(?:^|(?<=\s))(?P<key>[A-Z][A-Za-z0-9_]*(?:/[A-Za-z0-9_]+)?)=")
# values that run to the end of their line in the multi-line format (they may hold "Key=" text)
_SCONTROL_LINE_KEYS = ("Reason=", "Comment=", "Extra=")


def _scontrol_pairs(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one line of ``scontrol show node`` (multi-line or ``-o`` one-line):
    a value runs to the next key, so values with spaces (``OS=Linux 5.10.0-21-amd64 #1 SMP Debian
    5.10.162-1 (2023-01-21)``, ``Reason=Kill task failed [root@...]``) are kept whole, stripped."""
    s = line.strip()
    if s.startswith(_SCONTROL_LINE_KEYS):
        k, v = s.split("=", 1)
        return {k: v.strip()}
    out: dict[str, str] = {}
    keys = list(_SCONTROL_KEY_RE.finditer(s))
    for i, m in enumerate(keys):
        if m["key"] in out:
            continue
        end = keys[i + 1].start() if i + 1 < len(keys) else len(s)
        value = s[m.end() : end].strip()
        if m["key"] + "=" in _SCONTROL_LINE_KEYS:  # -o one-line form: Reason= runs to the end
            value = s[m.end() :].strip()
            out[m["key"]] = value
            break
        out[m["key"]] = value
    return out


def parse_scontrol_nodes(text: str, ts: float) -> list[NodeState]:
    """Parse ``scontrol show node [NAME]`` (Slurm 22.05 .. 25.05; multi-line format and ``-o``
    one record per line). Values may contain spaces (``OS=Linux 5.10.0-21-amd64 #1 SMP Debian
    5.10.162-1 (2023-01-21)``): a value runs to the next ``Key=``; ``Reason``, ``Comment`` and
    ``Extra`` run to the end of their line. ``cpus``/``alloc_cpus`` from ``CPUTot``/``CPUAlloc``;
    ``gpus_used_idx`` from ``GresUsed=gpu:h100:4(IDX:0-1,4,6)`` (``scontrol -d``).

    ``State=MIXED+DRAIN`` gives state ``MIXED`` and flags ``["DRAIN"]`` (a trailing ``*``
    becomes the flag ``NOT_RESPONDING``); ``Reason=text [user@2026-11-30T07:25:16]`` gives
    reason, reason user and reason time (local time of the parsing machine, as Slurm prints
    it); ``gres_used`` is ``gpu:N`` from ``AllocTRES`` ``gres/gpu=N``.

    Args:
        text: stdout of the command (lines before the first ``NodeName=`` are ignored).
        ts: observation time, epoch s.

    Returns:
        One :class:`NodeState` per ``NodeName=`` record; ``[]`` for none.
    """
    out: list[NodeState] = []
    for rec in _records(text, "NodeName"):
        kv: dict[str, str] = {}
        for line in rec:
            for k, v in _scontrol_pairs(line).items():
                kv.setdefault(k, v)
        base, flags = node_state(kv.get("State"), None)
        reason = reason_user = None
        reason_ts = None
        if raw := kv.get("Reason"):
            m = _REASON_RE.match(raw)
            if m:
                reason, reason_user = m.group("reason") or None, m.group("user")
                try:
                    reason_ts = parse_slurm_time(m.group("time"))
                except ValueError:
                    reason_ts = None
            else:
                reason = raw.strip() or None
        gres = kv.get("Gres")
        used = re.search(r"gres/gpu=(\d+)", kv.get("AllocTRES", ""))
        parts = kv.get("Partitions")
        gres_used_raw = kv.get("GresUsed")
        out.append(
            NodeState(
                node=kv["NodeName"],
                ts=ts,
                state=base,
                flags=flags,
                reason=reason,
                reason_user=reason_user,
                reason_ts=reason_ts,
                gres=gres if gres and gres != "(null)" else None,
                gres_used=f"gpu:{used.group(1)}" if used else ("gpu:0" if gres and "gpu" in gres else None),
                partitions=parts.split(",") if parts else [],
                cpus=_int_or_none(kv.get("CPUTot")),
                alloc_cpus=_int_or_none(kv.get("CPUAlloc")),
                gpus_used_idx=used_gres_idx(gres_used_raw),
            )
        )
    return out


def parse_sinfo_reasons(text: str) -> list[dict[str, Any]]:
    """Parse default ``sinfo -R`` output (``REASON USER TIMESTAMP NODELIST``; the reason may
    contain spaces, so the last three columns are split off from the right).

    Returns:
        ``[{"node", "reason", "user", "reason_ts"}]``, one entry per expanded node.
        ``reason_ts`` is epoch s (local time of the parsing machine) or ``None``.
    """
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        s = line.rstrip()
        if not s.strip() or re.search(r"(^|\s)REASON\s+USER\s+TIMESTAMP\s+NODELIST\s*$", s):
            continue
        parts = s.rsplit(None, 3)
        if len(parts) != 4:
            continue
        reason, user, when, nodelist = parts
        try:
            rts = parse_slurm_time(when)
        except ValueError:
            rts = None
        for node in expand_nodes(nodelist):
            out.append({"node": node, "reason": reason.strip(), "user": user, "reason_ts": rts})
    return out
