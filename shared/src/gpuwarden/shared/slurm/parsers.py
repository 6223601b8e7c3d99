"""``gpuwarden parse NAME FILE`` wrappers of the Slurm parsers (entry points ``gpuwarden.parsers``).

The parsing itself lives in :mod:`.jsonparse` (``--json``, slurmrestd) and :mod:`.textparse`
(``scontrol show``, ``sinfo -R``); this module only adapts them to the ``gpuwarden parse``
contract. Each takes the whole text of a recorded command output and returns JSON-able data;
each raises ``ValueError`` when the text is not that tool's output. ``ts`` of the returned states is the time
of parsing (a recorded file carries no observation time). JSON documents report the OpenAPI
version they were read as (``api_version``: ``v0.0.38`` for Slurm 22.05 up to ``v0.0.42`` for
Slurm 24.11, ``v0.0.43`` for 25.05 and ``v0.0.44`` for 25.11) and the Slurm release
(``meta.Slurm.release``) when present.
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson

from .fields import reason_nodes
from .jobcomp import parse_jobcomp_lines
from .jsonparse import api_version, parse_sacct_json, parse_sinfo_json, parse_squeue_json
from .names import expand_nodes
from .textparse import parse_scontrol_jobs, parse_scontrol_nodes, parse_sinfo_reasons

__all__ = [
    "hostlist",
    "jobcomp_kafka",
    "sacct_json",
    "scontrol_job",
    "scontrol_node",
    "sinfo_json",
    "sinfo_r",
    "slurmrestd_jobs",
    "slurmrestd_nodes",
    "squeue_json",
]


def _json_start(text: str) -> str:
    """Drop a leading ``$ command`` line (the fixtures record the command) before the JSON."""
    i = text.find("{")
    if i < 0:
        raise ValueError("no JSON object in the input")
    return text[i:]


def _meta(text: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    sl = (doc.get("meta") or {}).get("Slurm") or (doc.get("meta") or {}).get("slurm") or {}
    return {"api_version": api_version(doc), "slurm_release": sl.get("release") if isinstance(sl, dict) else None}


def squeue_json(text: str) -> dict[str, Any]:
    """``squeue --json`` (v0.0.38..v0.0.44) -> ``{"api_version", "slurm_release", "jobs": [JobState],
    "need_detail": [job id]}``. Raises ``ValueError``."""
    body = _json_start(text)
    jobs, need = parse_squeue_json(body, time.time())
    return {**_meta(body), "jobs": jobs, "need_detail": need}


def slurmrestd_jobs(text: str) -> dict[str, Any]:
    """slurmrestd ``GET /slurm/vX/jobs`` (v0.0.38 .. v0.0.44, the job objects of ``squeue --json``) -> like
    :func:`squeue_json`; a ``GET /slurmdb/vX/jobs`` document (accounting records, ``state`` an
    object) -> like :func:`sacct_json`. A document with ``errors`` and no ``jobs`` raises
    ``ValueError``."""
    body = _json_start(text)
    if re.search(rb'"state"\s*:\s*\{', body.encode()):
        return sacct_json(body)
    return squeue_json(body)


def sinfo_json(text: str) -> dict[str, Any]:
    """``sinfo --json`` (v0.0.38: ``state`` string + ``state_flags``; v0.0.39+ (23.02) .. v0.0.44
    (25.11): ``sinfo`` list of node groups, ``node.state`` a list) or ``scontrol show nodes --json``
    (``nodes``, ``state`` list)
    -> ``{"api_version", "slurm_release", "nodes": [NodeState]}``. Raises ``ValueError``."""
    body = _json_start(text)
    return {**_meta(body), "nodes": parse_sinfo_json(body, time.time())}


def slurmrestd_nodes(text: str) -> dict[str, Any]:
    """slurmrestd ``GET /slurm/vX/nodes`` or ``/node/NAME`` (v0.0.38 .. v0.0.44) -> like :func:`sinfo_json`
    (``cpus``, ``alloc_cpus``, ``gpus_used_idx`` from ``gres_used`` IDX ranges)."""
    return sinfo_json(text)


def sacct_json(text: str) -> dict[str, Any]:
    """``sacct --json`` (``dbv0.0.38`` of 22.05 .. v0.0.44) -> ``{"api_version", "slurm_release",
    "jobs": [JobState]}`` (``confirmed`` true for end states). Raises ``ValueError``."""
    body = _json_start(text)
    return {**_meta(body), "jobs": parse_sacct_json(body, time.time())}


def scontrol_job(text: str) -> list[Any]:
    """``scontrol show job -d`` (22.05 text) -> ``[JobState]`` with GPU indices per node.
    Raises ``ValueError`` when no ``JobId=`` record is found."""
    jobs = parse_scontrol_jobs(text, time.time())
    if not jobs:
        raise ValueError("no 'JobId=' record (not scontrol show job output)")
    return jobs


def scontrol_node(text: str) -> list[Any]:
    """``scontrol show node [-o] [-d]`` (Slurm 22.05 .. 25.05 text) -> ``[NodeState]``. Raises ``ValueError`` when no
    ``NodeName=`` record is found."""
    nodes = parse_scontrol_nodes(text, time.time())
    if not nodes:
        raise ValueError("no 'NodeName=' record (not scontrol show node output)")
    return nodes


_SINFO_R_HEADER = re.compile(r"REASON\s+USER\s+TIMESTAMP\s+NODELIST\s*$")


def jobcomp_kafka(text: str) -> list[Any]:
    """Records of the ``jobcomp/kafka`` plugin (Slurm 23.02 .. 25.11; start records without
    ``state`` since 25.05), one JSON record a line -> ``[JobState]`` (``gpus`` empty: the records
    carry no GPU indices, the watcher fills them from its poller). Raises ``ValueError``."""
    return parse_jobcomp_lines(text, time.time())


def sinfo_r(text: str) -> list[dict[str, Any]]:
    """Default ``sinfo -R`` (``REASON USER TIMESTAMP NODELIST``; Slurm 22.05 local cluster and a
    ParallelCluster recording) -> ``[{"node", "reason", "user", "reason_ts"}]``, one per expanded
    node; ``reason`` as sinfo prints it (its default width cuts it at 20 characters). Raises
    ``ValueError`` without the header line."""
    if not any(_SINFO_R_HEADER.search(line) for line in text.splitlines()):
        raise ValueError("no 'REASON USER TIMESTAMP NODELIST' header (not default sinfo -R output)")
    return parse_sinfo_reasons(text)


def hostlist(text: str) -> list[dict[str, Any]]:
    """Slurm hostlist expressions as ``scontrol show hostnames`` (Slurm 20.11-25.05) expands them.

    Input: one expression per line (``gpu-[001-003,007],cpu-1``), or the argument of a
    recorded ``$ scontrol show hostnames EXPR`` line -> ``[{"expr", "nodes": [names]}]``, read
    with python-hostlist 1.x/2.x:
    nodes in the given order (never sorted), duplicates of overlapping ranges kept
    (``n[1-3,2-4]`` -> n1 n2 n3 n2 n3 n4), zero padding kept, prefixes with ``+ : _ . -``, several
    bracket groups (``rack[0-1]node[0-1]`` -> rack0node0 rack0node1 rack1node0 rack1node1).
    A line with spaces is a Slurm reason: the hostlist after ``UnavailableNodes:``
    (``ReqNodeNotAvail, UnavailableNodes:d[001-032]``) is expanded -> ``{"expr", "reason",
    "nodes"}``. Lines starting with ``#`` are skipped.

    Raises:
        ValueError: a line is not a valid hostlist (unbalanced brackets, bad range), or a line
            with spaces names no ``UnavailableNodes:``.
    """
    out: list[dict[str, Any]] = []
    in_output = False  # lines after a recorded "$ scontrol show hostnames EXPR" are its output
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("$"):
            parts = s.split()
            in_output = True
            if "hostnames" not in parts or parts[-1] == "hostnames":
                continue
            s = parts[-1]
        elif in_output:
            continue
        if " " in s:
            if "UnavailableNodes:" not in s:
                raise ValueError(f"not a hostlist expression: {s!r}")
            m = re.search(r"UnavailableNodes:(\S*)", s)
            out.append({"expr": m.group(1) if m else "", "reason": s, "nodes": reason_nodes(s)})
            continue
        out.append({"expr": s, "nodes": expand_nodes(s)})
    if not out:
        raise ValueError("no hostlist expression in the input")
    return out
