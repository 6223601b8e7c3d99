"""Parsers of Slurm's JSON documents -> :class:`JobState` / :class:`NodeState`.

Read: ``squeue --json``, ``sinfo --json``, ``scontrol show nodes --json`` and ``sacct --json``
of Slurm 22.05 (OpenAPI v0.0.38 / dbv0.0.38) up to 25.11 (v0.0.44; 25.05 is v0.0.43), and the
matching slurmrestd documents (``GET /slurm/vX/jobs``, ``/slurm/vX/nodes``,
``/slurm/vX/node/NAME``, ``/slurmdb/vX/jobs``): v0.0.39+ shapes (``state`` as a list,
numbers as ``{"set","infinite","number"}``, ``exit_code.signal``) are accepted whatever the
version says, and so is the ``sinfo --json`` of 23.02+ (a ``sinfo`` list of node groups
instead of ``nodes``); an unknown version is logged once. Text output
(``scontrol show``, ``sinfo -R``) is read by :mod:`.textparse`. No I/O here: callers pass the
text and the observation time ``ts`` (epoch s, event time).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from typing import Any

import orjson

from ..models import JobState, NodeState
from .fields import TERMINAL_JOB_STATES, base_job_state, clean_reason, node_state, parse_gres_idx, used_gres_idx
from .names import expand_nodes

__all__ = [
    "KNOWN_OPENAPI_VERSIONS",
    "SinfoJsonParser",
    "SqueueJsonParser",
    "api_version",
    "parse_sacct_json",
    "parse_sinfo_json",
    "parse_squeue_json",
]

log = logging.getLogger(__name__)

KNOWN_OPENAPI_VERSIONS = {
    "v0.0.37",
    "v0.0.38",
    "v0.0.39",
    "v0.0.40",
    "v0.0.41",
    "v0.0.42",
    "v0.0.43",  # Slurm 25.05
    "v0.0.44",  # Slurm 25.11
}
_warned: set[str] = set()


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
    return base_job_state(v)


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
            reason=clean_reason(job.get("state_reason")),
        ),
        needs,
    )


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
            reason=clean_reason(st.get("reason") if isinstance(st, dict) else None),
            confirmed=state in TERMINAL_JOB_STATES,
        )
    return list(out.values())


def parse_sinfo_json(text: str | bytes, ts: float) -> list[NodeState]:
    """Parse ``sinfo --json`` (Slurm 22.05, OpenAPI v0.0.38: ``state`` string + ``state_flags``;
    Slurm 23.02+: a ``sinfo`` list of partition/node groups), ``scontrol show nodes --json`` or a
    slurmrestd ``/nodes`` document (v0.0.39 .. v0.0.44: ``state`` list, numbers as objects).

    Args:
        text: the document.
        ts: observation time, epoch s.

    Returns:
        One :class:`NodeState` per node (first occurrence if a node repeats): base state
        upper-case (``IDLE``), flags (``DRAIN``), reason (``None`` if empty), reason user and
        time, configured and used GRES, partitions.

    Raises:
        ValueError: not JSON, or neither a ``nodes`` nor a ``sinfo`` list.
    """
    doc = _load(text, "sinfo --json")
    out: dict[str, NodeState] = {}
    for n in _sinfo_records(doc):
        name = str(n.get("name") or "") if isinstance(n, dict) else ""
        if name and name not in out:
            out[name] = _sinfo_node(n, name, ts)
    return list(out.values())


def _sinfo_records(doc: dict[str, Any]) -> list[Any]:
    """The node records of a sinfo / slurmrestd document (``ValueError`` when there are none):
    its ``nodes`` list (v0.0.38 ``sinfo --json``, slurmrestd, ``scontrol show nodes --json``), or
    the ``sinfo`` list of ``sinfo --json`` of Slurm 23.02+ turned into records of that shape
    (:func:`_sinfo_groups`)."""
    _version(doc)
    nodes = doc.get("nodes")
    if isinstance(nodes, list):
        return nodes
    groups = doc.get("sinfo")
    if isinstance(groups, list):
        return _sinfo_groups(groups)
    _errors(doc, "sinfo --json")
    raise ValueError("sinfo --json: no 'nodes' list (nor the 'sinfo' list of 23.02+)")


def _sinfo_groups(groups: list[Any]) -> list[dict[str, Any]]:
    """``sinfo --json`` of Slurm 23.02+ (v0.0.39 .. v0.0.44): one entry per (partition, node
    group): ``{"node": {"state": [...]}, "nodes": {"nodes": [names]}, "partition": {"name"},
    "cpus": {"total", "allocated", "minimum", "maximum"}, "gres": {"total", "used"},
    "reason": {"description", "user", "time"}}`` (``reason`` a plain string in some builds) ->
    one record per node in the shape of ``/nodes`` (``name``, ``state``, ``cpus`` ...), the
    partitions of a node listed in several entries merged. CPU counts, used GRES and their
    IDX belong to one node only when the entry has one node (``sinfo -N --json``); for a group
    of several nodes ``cpus`` is the per-node count when all are equal and ``alloc_cpus`` /
    ``gres_used`` are left unset (the entry sums them over the group)."""
    out: dict[str, dict[str, Any]] = {}
    for g in groups:
        if not isinstance(g, dict):
            continue
        nd = g.get("nodes") if isinstance(g.get("nodes"), dict) else {}
        names: list[str] = []
        for expr in (nd or {}).get("nodes") or []:
            names.extend(expand_nodes(str(expr)))
        if not names:
            continue
        node = g.get("node") if isinstance(g.get("node"), dict) else {}
        cpus = g.get("cpus") if isinstance(g.get("cpus"), dict) else {}
        gres = g.get("gres") if isinstance(g.get("gres"), dict) else {}
        reason = g.get("reason")
        if isinstance(reason, dict):
            why, who, when = reason.get("description"), reason.get("user"), reason.get("time")
        else:
            why, who, when = reason, None, None
        part = g.get("partition") if isinstance(g.get("partition"), dict) else {}
        pname = (part or {}).get("name")
        single = len(names) == 1
        lo, hi = _num((cpus or {}).get("minimum")), _num((cpus or {}).get("maximum"))
        per_node = (cpus or {}).get("total") if single else (hi if lo is not None and lo == hi else None)
        for name in names:
            rec = out.get(name)
            if rec is None:
                out[name] = {
                    "name": name,
                    "state": (node or {}).get("state"),
                    "reason": why,
                    "reason_set_by_user": who,
                    "reason_changed_at": when,
                    "gres": (gres or {}).get("total"),
                    "gres_used": (gres or {}).get("used") if single else None,
                    "partitions": [pname] if pname else [],
                    "cpus": per_node,
                    "alloc_cpus": (cpus or {}).get("allocated") if single else None,
                }
            elif pname and pname not in rec["partitions"]:
                rec["partitions"].append(pname)
    return list(out.values())


def _sinfo_node(n: dict[str, Any], name: str, ts: float) -> NodeState:
    """One sinfo node record -> its :class:`NodeState`."""
    base, flags = node_state(n.get("state"), n.get("state_flags"))
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
        gpus_used_idx=used_gres_idx(n.get("gres_used")),
    )


def _count(v: Any) -> int | None:
    """A CPU count: a plain number (v0.0.38-v0.0.42 ``cpus``) or a set/number object; None if absent."""
    x = _num(v)
    return int(x) if x is not None and x >= 0 else None


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
