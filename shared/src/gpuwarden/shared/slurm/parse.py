"""Pure parsers of Slurm command output -> :class:`JobState` / :class:`NodeState`.

Read: Slurm 22.05 ``squeue --json`` / ``sinfo --json`` (OpenAPI v0.0.38 documents), the
text of ``scontrol show job -d`` and ``scontrol show node`` (22.05), ``sinfo -R``; node
documents of slurmrestd v0.0.39+ (``state`` as a list, numbers as ``{"set","number"}``,
e.g. v0.0.42 of Slurm 25.05) are accepted too. No I/O here: callers pass the text and the
observation time ``ts`` (epoch s, event time).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import orjson

from ..models import JobState, NodeState
from .names import expand_nodes

__all__ = [
    "KNOWN_OPENAPI_VERSIONS",
    "TERMINAL_JOB_STATES",
    "SinfoJsonParser",
    "SqueueJsonParser",
    "api_version",
    "parse_gres_idx",
    "parse_idx_list",
    "parse_sacct_json",
    "parse_scontrol_job_gpus",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_sinfo_reasons",
    "parse_slurm_time",
    "parse_squeue_json",
    "reason_nodes",
]

log = logging.getLogger(__name__)

KNOWN_OPENAPI_VERSIONS = {"v0.0.37", "v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42"}
TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "ENDED",
    }
)
_warned: set[str] = set()

_IDX_RE = re.compile(r"gpu(?::[^:(),]+)?(?::\d+)?\(IDX:([^)]*)\)")
_REASON_RE = re.compile(r"^(?P<reason>.*?)\s*\[(?P<user>[^@\]]+)@(?P<time>[^\]]+)\]\s*$")


def parse_idx_list(text: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]`` (sorted, unique). ``""`` and ``"N/A"`` give ``[]``.

    Raises:
        ValueError: a part is not an integer or an ``a-b`` range with ``a <= b``.
    """
    text = text.strip()
    if not text or text == "N/A":
        return []
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            lo, hi = int(a), int(b)
            if lo > hi:
                raise ValueError(f"bad index range {part!r}")
            out.update(range(lo, hi + 1))
        else:
            out.add(int(part))
    return sorted(out)


def parse_gres_idx(gres: str) -> list[int]:
    """GPU indices of one node's GRES detail, Slurm 22.05 format.

    ``"gpu:4(IDX:0-3)"`` -> ``[0, 1, 2, 3]``; ``"gpu:a100:2(IDX:0,2)"`` -> ``[0, 2]``;
    several ``gpu`` entries (typed GPUs) are merged; other GRES (``mps:...``) are ignored;
    no ``IDX`` -> ``[]``.
    """
    return list(_gres_idx_cached(gres))


@functools.lru_cache(maxsize=4096)
def _gres_idx_cached(gres: str) -> tuple[int, ...]:
    if "IDX" not in gres:
        return ()
    out: set[int] = set()
    for m in _IDX_RE.finditer(gres):
        out.update(parse_idx_list(m.group(1)))
    return tuple(sorted(out))


def parse_slurm_time(text: str | None) -> float | None:
    """Slurm's ``2026-11-30T07:25:16`` (local time of the machine parsing it) -> epoch s.

    ``Unknown``, ``None``, ``N/A``, ``(null)`` and empty give ``None``.

    Raises:
        ValueError: not an ISO date-time.
    """
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    return datetime.fromisoformat(text).timestamp()


def _num(v: Any) -> float | None:
    """A v0.0.38 plain number or a v0.0.39+ ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if v is None or isinstance(v, bool):
        return None
    return float(v)


def api_version(doc: dict[str, Any]) -> str | None:
    """The OpenAPI version of a Slurm JSON document (``squeue/sinfo/sacct --json`` or slurmrestd).

    Reads ``meta.plugin.data_parser`` (v0.0.40+: ``"data_parser/v0.0.42"``) or
    ``meta.plugin.type`` (v0.0.38/39: ``"openapi/v0.0.38"``, ``"openapi/dbv0.0.38"``).
    Returns ``"v0.0.38"`` ... ``"v0.0.42"`` (or whatever version the document names), ``None``
    when the document has no ``meta.plugin``. An unknown version is logged once; the parsers
    then read it like the nearest known shape (objects for numbers, lists for states are
    accepted whatever the version says).
    """
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    plugin = (meta or {}).get("plugin") or {}
    if not isinstance(plugin, dict):
        return None
    ptype = str(plugin.get("data_parser") or plugin.get("type") or "")
    if not ptype:
        return None
    ver = ptype.rsplit("/", 1)[-1].replace("dbv", "v")
    if ver not in KNOWN_OPENAPI_VERSIONS and ver not in _warned:
        _warned.add(ver)
        log.warning("unknown Slurm OpenAPI version %r (%s); parsing it with the known shapes", ptype, _release(doc))
    return ver


def _release(doc: dict[str, Any]) -> str:
    """``"Slurm 22.05.8"`` from ``meta.Slurm.release`` / ``meta.slurm.release``, or ``"Slurm ?"``."""
    meta = doc.get("meta") or {}
    sl = meta.get("Slurm") or meta.get("slurm") or {}
    rel = sl.get("release") if isinstance(sl, dict) else None
    return f"Slurm {rel or '?'}"


def _version(doc: dict[str, Any]) -> str:
    return api_version(doc) or ""


def _errors(doc: dict[str, Any], what: str) -> None:
    """A slurmrestd / ``--json`` document that carries ``errors`` and no data -> ``ValueError``."""
    errs = doc.get("errors") or []
    if errs and isinstance(errs, list):
        first = errs[0] if isinstance(errs[0], dict) else {"error": str(errs[0])}
        msg = first.get("description") or first.get("error") or str(first)
        raise ValueError(f"{what} ({api_version(doc) or 'unknown API'}, {_release(doc)}): Slurm error: {msg}")


def _load(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{what}: not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{what}: expected a JSON object")
    return doc


def _job_id(job: dict[str, Any]) -> str:
    jid = job.get("job_id")
    arr = _num(job.get("array_job_id"))
    task = _num(job.get("array_task_id"))
    if arr and task is not None:
        return f"{int(arr)}_{int(task)}"
    return str(jid)


def _job_state(v: Any) -> str:
    if isinstance(v, list):
        return str(v[0]).upper() if v else "UNKNOWN"
    return str(v or "UNKNOWN").upper()


def _exit_code(v: Any) -> int | None:
    """v0.0.38 gives the raw wait status (``3:0`` -> 768, SIGTERM -> 15): exit code
    ``status >> 8``, or ``128 + signal`` when a signal ended the job (shell convention)."""
    if isinstance(v, dict):  # sacct v0.0.38, v0.0.39+: {"status", "return_code", "signal": {"id"}}
        sig = v.get("signal") if isinstance(v.get("signal"), dict) else {}
        sig_id = _num((sig or {}).get("id"))
        if sig_id:
            return 128 + int(sig_id)
        return None if (rc := _num(v.get("return_code"))) is None else int(rc)
    n = _num(v)
    if n is None:
        return None
    status = int(n)
    sig = status & 0x7F
    return 128 + sig if sig else (status >> 8) & 0xFF


def _job_gpus(job: dict[str, Any], nodes: list[str]) -> dict[str, list[int]] | None:
    """GPU indices per node from ``gres_detail`` (one entry per allocated node, in the
    order of ``job_resources.allocated_nodes``); ``None`` when they cannot be matched."""
    detail = job.get("gres_detail") or []
    if not detail:
        return {}
    res = job.get("job_resources") or {}
    rnodes = res.get("nodes")
    if isinstance(rnodes, dict):  # v0.0.41+: {"count", "list", "allocation": [{"name"...}]}
        alloc = [n.get("name") for n in rnodes.get("allocation") or [] if isinstance(n, dict)]
    else:  # v0.0.38-40: "allocated_nodes": [{"nodename"...}]
        alloc = [n.get("nodename") for n in res.get("allocated_nodes") or [] if isinstance(n, dict)]
    order: list[str] = [str(n) for n in alloc] if alloc and None not in alloc else nodes
    if len(order) != len(detail):
        return None
    return {n: idx for n, d in zip(order, detail, strict=True) if (idx := parse_gres_idx(str(d)))}


def _wants_gpus(job: dict[str, Any]) -> bool:
    text = " ".join(
        str(job.get(k) or "")
        for k in ("tres_per_node", "tres_per_job", "tres_alloc_str", "tres_per_task", "tres_per_socket")
    )
    return "gpu" in text


def parse_squeue_json(text: str | bytes, ts: float) -> tuple[list[JobState], list[str]]:
    """Parse ``squeue --json`` (Slurm 22.05, OpenAPI v0.0.38; v0.0.39+ numbers accepted).

    Args:
        text: the command's stdout.
        ts: observation time, epoch s (event time of every returned state).

    Returns:
        ``(jobs, need_detail)``: one :class:`JobState` per job squeue reports (every state
        it shows, including recently finished ones it keeps for ``MinJobAge``), with nodes
        expanded and GPU indices per node from ``gres_detail``; ``need_detail`` lists the ids
        of running jobs that hold GPUs whose indices could not be matched to nodes
        (ask ``scontrol show job -d`` and use :func:`parse_scontrol_job_gpus`).
        ``start_ts`` is ``None`` for pending jobs; ``end_ts`` of a running job is its
        time-limit end as Slurm reports it; ``exit_code`` (terminal states only) is the exit
        status, or ``128 + signal`` for a job ended by a signal (v0.0.38 gives the raw status).

    Raises:
        ValueError: not JSON, or not a squeue document.
    """
    doc = _load(text, "squeue --json")
    release = _release(doc)
    out: list[JobState] = []
    need: list[str] = []
    for job in _squeue_records(doc, release):
        state, needs = _squeue_job(job, ts, release)
        out.append(state)
        if needs:
            need.append(state.job_id)
    return out, need


def _squeue_records(doc: dict[str, Any], release: str) -> list[Any]:
    """The ``jobs`` list of a squeue document (``ValueError`` when there is none)."""
    _version(doc)
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        _errors(doc, "squeue --json")
        raise ValueError(f"squeue --json ({release}): no 'jobs' list")
    return jobs


def _squeue_job(job: Any, ts: float, release: str) -> tuple[JobState, bool]:
    """One squeue job record -> its state, and whether its GPU indices need ``scontrol``."""
    if not isinstance(job, dict) or "job_state" not in job:
        raise ValueError(f"squeue --json ({release}): a job without 'job_state' (sacct output?)")
    state = _job_state(job.get("job_state"))
    nodes = expand_nodes(job.get("nodes")) if state != "PENDING" else []
    gpus = _job_gpus(job, nodes) if nodes else {}
    jid = _job_id(job)
    needs = False
    if gpus is None:
        gpus = {}
        needs = state in ("RUNNING", "SUSPENDED", "COMPLETING") and _wants_gpus(job)
    start = _num(job.get("start_time"))
    end = _num(job.get("end_time"))
    submit = _num(job.get("submit_time"))
    return (
        JobState(
            job_id=jid,
            ts=ts,
            state=state,
            name=job.get("name") or None,
            user=job.get("user_name") or None,
            account=job.get("account") or None,
            partition=job.get("partition") or None,
            nodes=nodes,
            gpus=gpus,
            start_ts=start if start and state != "PENDING" else None,
            end_ts=end if end and state != "PENDING" else None,
            exit_code=_exit_code(job.get("exit_code")) if state in TERMINAL_JOB_STATES else None,
            submit_ts=submit or None,
            reason=_reason(job.get("state_reason")),
        ),
        needs,
    )


def _reason(v: Any) -> str | None:
    r = str(v or "").strip()
    return None if r in ("", "None", "(null)") else r


def parse_sacct_json(text: str | bytes, ts: float) -> list[JobState]:
    """Parse ``sacct --json`` (Slurm 22.05: OpenAPI ``dbv0.0.38``; v0.0.39-v0.0.42 shapes too:
    ``state.current`` as a list, numbers as ``{"set","number"}``, ``exit_code.signal``).

    Accounting has no GPU indices: ``gpus`` is ``{}``. Job steps are ignored (allocations
    only). Slurm 22.05's JSON gives ``exit_code`` ``SUCCESS``/0 for a job that exited
    non-zero (the text output shows ``3:0``); a ``FAILED`` job with exit code 0 therefore gets
    ``exit_code=None`` (unknown) rather than a wrong 0.

    Args:
        text: the command's stdout (or a slurmrestd ``/slurmdb/vX/jobs`` document).
        ts: observation time, epoch s.

    Returns:
        One :class:`JobState` per job record (last record wins for a requeued job id),
        ``confirmed=True``, times in epoch s (``None`` when unset/0).

    Raises:
        ValueError: not JSON, or no ``jobs`` list (a Slurm error message is quoted).
    """
    doc = _load(text, "sacct --json")
    _version(doc)
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        _errors(doc, "sacct --json")
        raise ValueError(f"sacct --json ({_release(doc)}): no 'jobs' list")
    out: dict[str, JobState] = {}
    for job in jobs:
        if not isinstance(job, dict) or job.get("job_id") is None:
            raise ValueError(f"sacct --json ({_release(doc)}): job record without job_id")
        st = job.get("state") or {}
        state = _job_state(st.get("current") if isinstance(st, dict) else st)
        arr = job.get("array") or {}
        arr_id = _num(arr.get("job_id"))
        task = _num(arr.get("task_id"))
        jid = f"{int(arr_id)}_{int(task)}" if arr_id and task is not None else str(job["job_id"])
        t = job.get("time") or {}
        submit, start, end = (_num(t.get(k)) for k in ("submission", "start", "end"))
        code = _exit_code(job.get("exit_code")) if state in TERMINAL_JOB_STATES else None
        if state == "FAILED" and code == 0:
            code = None
        assoc = job.get("association") or {}
        out[jid] = JobState(
            job_id=jid,
            ts=ts,
            state=state,
            name=job.get("name") or None,
            user=job.get("user") or assoc.get("user") or None,
            account=job.get("account") or assoc.get("account") or None,
            partition=job.get("partition") or None,
            nodes=expand_nodes(job.get("nodes")) if state != "PENDING" else [],
            gpus={},
            start_ts=start or None,
            end_ts=end or None,
            exit_code=code,
            submit_ts=submit or None,
            reason=_reason(st.get("reason") if isinstance(st, dict) else None),
            confirmed=state in TERMINAL_JOB_STATES,
        )
    return list(out.values())


_UID_RE = re.compile(r"^([^()]*)(?:\(\d+\))?$")


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
                account=_reason(kv.get("Account")),
                partition=_reason(kv.get("Partition")),
                nodes=expand_nodes(kv.get("NodeList")) if state != "PENDING" else [],
                gpus=gpus.get(kv["JobId"], {}),
                start_ts=start,
                end_ts=end,
                exit_code=_scontrol_exit(kv.get("ExitCode")) if state in TERMINAL_JOB_STATES else None,
                submit_ts=parse_slurm_time(kv.get("SubmitTime")),
                reason=_reason(kv.get("Reason")),
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


def _node_state(raw: Any, flags: list[Any] | None) -> tuple[str, list[str]]:
    if isinstance(raw, list):  # v0.0.39+: ["IDLE", "DRAIN"]
        parts = [str(p).upper() for p in raw] or ["UNKNOWN"]
    else:
        parts = str(raw or "UNKNOWN").upper().split("+")
    base, rest = parts[0], parts[1:]
    if base.endswith("*"):
        base = base[:-1]
        rest.append("NOT_RESPONDING")
    all_flags = [*rest, *(str(f).upper() for f in flags or [])]
    if "DRAIN" in all_flags and base in _BUSY and "DRAINING" not in all_flags:
        all_flags.append("DRAINING")  # what sinfo prints as "draining": DRAIN on a node with jobs
    return base, list(dict.fromkeys(all_flags))


_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


def parse_sinfo_json(text: str | bytes, ts: float) -> list[NodeState]:
    """Parse ``sinfo --json`` (Slurm 22.05, OpenAPI v0.0.38: ``state`` string + ``state_flags``)
    or a slurmrestd ``/nodes`` document (v0.0.39+: ``state`` list, numbers as objects).

    Args:
        text: the document.
        ts: observation time, epoch s.

    Returns:
        One :class:`NodeState` per node (first occurrence if a node repeats): base state
        upper-case (``IDLE``), flags (``DRAIN``), reason (``None`` if empty), reason user and
        time, configured and used GRES, partitions.

    Raises:
        ValueError: not JSON or no ``nodes`` list.
    """
    doc = _load(text, "sinfo --json")
    out: dict[str, NodeState] = {}
    for n in _sinfo_records(doc):
        name = str(n.get("name") or "") if isinstance(n, dict) else ""
        if name and name not in out:
            out[name] = _sinfo_node(n, name, ts)
    return list(out.values())


def _sinfo_records(doc: dict[str, Any]) -> list[Any]:
    """The ``nodes`` list of a sinfo / slurmrestd document (``ValueError`` when there is none)."""
    _version(doc)
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        raise ValueError("sinfo --json: no 'nodes' list")
    return nodes


def _sinfo_node(n: dict[str, Any], name: str, ts: float) -> NodeState:
    """One sinfo node record -> its :class:`NodeState`."""
    base, flags = _node_state(n.get("state"), n.get("state_flags"))
    changed = _num(n.get("reason_changed_at"))
    return NodeState(
        node=name,
        ts=ts,
        state=base,
        flags=flags,
        reason=n.get("reason") or None,
        reason_user=n.get("reason_set_by_user") or None,
        reason_ts=changed or None,
        gres=n.get("gres") or None,
        gres_used=n.get("gres_used") or None,
        partitions=[str(p) for p in n.get("partitions") or []],
        cpus=_count(n.get("cpus")),
        alloc_cpus=_count(n.get("alloc_cpus")),
        gpus_used_idx=_used_idx(n.get("gres_used")),
    )


def _count(v: Any) -> int | None:
    """A CPU count: a plain number (v0.0.38-v0.0.42 ``cpus``) or a set/number object; None if absent."""
    x = _num(v)
    return int(x) if x is not None and x >= 0 else None


def _int_or_none(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def _used_idx(gres_used: Any) -> list[int] | None:
    """GPU indices of a ``gres_used`` string with ``IDX`` (``gpu:h100:4(IDX:0-1,4,6)`` -> [0, 1, 4, 6]);
    None when it has no IDX list (``gpu:0``, ``""``, absent: not reported)."""
    if not isinstance(gres_used, str) or "IDX" not in gres_used:
        return None
    return parse_gres_idx(gres_used)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a synchronous parse.

    A 2 MB squeue document is ~10^5 short-lived containers; allocating them triggers
    collections that traverse the whole heap (measured: ~60 % of the parse time of a
    5,000-job poll). They are freed by reference counting when the document is dropped
    (which also lowers the collector's allocation count again), so pausing loses nothing.
    The previous state is restored even on error.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class SqueueJsonParser:
    """:func:`parse_squeue_json` that remembers the records of the previous call.

    A poll of a large cluster repeats most job records unchanged. Each record is fingerprinted
    by its compact JSON bytes (``orjson.dumps``); a record whose bytes are the same as in the
    previous call is not parsed nor validated again: its previous :class:`JobState` is returned
    with ``ts`` set to this call's time. Results equal those of :func:`parse_squeue_json` on
    the same text. Only the records of the last call are kept (memory bounded by one poll).
    No I/O; not thread-safe (one parser per poller).
    """

    def __init__(self) -> None:
        self._cache: dict[bytes, tuple[JobState, bool]] = {}
        self.hits = 0
        """Records reused in the last call."""

    def parse(self, text: str | bytes, ts: float) -> tuple[list[JobState], list[str]]:
        """Same contract as :func:`parse_squeue_json` (``(jobs, need_detail)``; ``ValueError``)."""
        with _gc_paused():
            return self._parse(text, ts)

    def _parse(self, text: str | bytes, ts: float) -> tuple[list[JobState], list[str]]:
        doc = _load(text, "squeue --json")
        release = _release(doc)
        old, new = self._cache, {}
        out: list[JobState] = []
        need: list[str] = []
        dumps = orjson.dumps
        hits = 0
        for job in _squeue_records(doc, release):
            key = dumps(job)
            hit = old.get(key)
            if hit is None:
                hit = _squeue_job(job, ts, release)
                state = hit[0]
            else:
                hits += 1
                state = hit[0].model_copy(update={"ts": ts})
            new[key] = hit
            out.append(state)
            if hit[1]:
                need.append(state.job_id)
        self._cache = new
        self.hits = hits
        return out, need


class SinfoJsonParser:
    """:func:`parse_sinfo_json` that reuses the :class:`NodeState` of node records unchanged
    since the previous call (fingerprint: the record's compact JSON bytes), like
    :class:`SqueueJsonParser`. Results equal those of :func:`parse_sinfo_json`."""

    def __init__(self) -> None:
        self._cache: dict[bytes, NodeState] = {}
        self.hits = 0
        """Records reused in the last call."""

    def parse(self, text: str | bytes, ts: float) -> list[NodeState]:
        """Same contract as :func:`parse_sinfo_json` (one state per node; ``ValueError``)."""
        with _gc_paused():
            return self._parse(text, ts)

    def _parse(self, text: str | bytes, ts: float) -> list[NodeState]:
        doc = _load(text, "sinfo --json")
        old, new = self._cache, {}
        out: dict[str, NodeState] = {}
        hits = 0
        for n in _sinfo_records(doc):
            name = str(n.get("name") or "") if isinstance(n, dict) else ""
            if not name or name in out:
                continue
            key = orjson.dumps(n)
            cached = old.get(key)
            if cached is None:
                cached = _sinfo_node(n, name, ts)
                out[name] = cached
            else:
                hits += 1
                out[name] = cached.model_copy(update={"ts": ts})
            new[key] = cached
        self._cache = new
        self.hits = hits
        return list(out.values())


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
        base, flags = _node_state(kv.get("State"), None)
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
                gpus_used_idx=_used_idx(gres_used_raw),
            )
        )
    return out


_UNAVAILABLE_RE = re.compile(r"\bUnavailableNodes:(?P<expr>[^\s]+)")


def reason_nodes(reason: str | None) -> list[str]:
    """Nodes named by a Slurm pending reason: ``ReqNodeNotAvail, UnavailableNodes:d[001-032]``
    -> ``d001`` .. ``d032`` (the hostlist after ``UnavailableNodes:`` expanded as ``scontrol show
    hostnames`` does). ``[]`` for a reason without one, or with ``UnavailableNodes:`` empty.

    Raises:
        ValueError: the hostlist after ``UnavailableNodes:`` is not valid.
    """
    if not reason:
        return []
    out: list[str] = []
    for m in _UNAVAILABLE_RE.finditer(reason):
        out.extend(expand_nodes(m["expr"].rstrip(",;")))
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
