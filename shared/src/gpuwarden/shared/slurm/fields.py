"""Field grammar shared by the Slurm JSON and text parsers (no I/O, no documents).

The pieces both :mod:`.jsonparse` and :mod:`.textparse` read the same way: the terminal job
states, GPU index lists (``IDX:0,2-3``) of GRES strings, node state words (``MIXED+DRAIN``,
``["IDLE", "DRAIN"]``), reason cleaning and the nodes a pending reason names. Formats as
Slurm 22.05 .. 25.11 print them (text and OpenAPI v0.0.38 .. v0.0.44 alike).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from .names import expand_nodes

__all__ = [
    "JOB_BASE_STATES",
    "NODE_BASE_STATES",
    "TERMINAL_JOB_STATES",
    "base_job_state",
    "clean_reason",
    "node_state",
    "parse_gres_idx",
    "parse_idx_list",
    "reason_nodes",
    "used_gres_idx",
]

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

JOB_BASE_STATES = TERMINAL_JOB_STATES | {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING"}
"""Job states that are a base state (``job_state[0]`` of v0.0.39+); the others of a ``job_state``
list (``REQUEUED``, ``CONFIGURING``, ``SIGNALING``, ``STAGE_OUT``, ``UPDATE_DB`` ...) are flags."""

NODE_BASE_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})
"""Node states that are a base state (the first of ``["MIXED", "DRAIN", "COMPLETING"]``)."""


def base_job_state(v: Any) -> str:
    """A job state -> its base state, upper-case: ``"RUNNING"`` (v0.0.38 string) or
    ``["RUNNING"]`` / ``["PENDING", "REQUEUED"]`` (v0.0.39+ list, base first; a list whose first
    entry is a flag gets its first base-state entry). Empty / missing -> ``"UNKNOWN"``."""
    if isinstance(v, list):
        parts = [str(p).upper() for p in v if p]
        if not parts:
            return "UNKNOWN"
        return next((p for p in parts if p in JOB_BASE_STATES), parts[0])
    return str(v or "UNKNOWN").upper()


_IDX_RE = re.compile(r"gpu(?::[^:(),]+)?(?::\d+)?\(IDX:([^)]*)\)")


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


def clean_reason(v: Any) -> str | None:
    """A Slurm reason / name field: stripped, ``None`` for empty, ``None`` or ``(null)``."""
    r = str(v or "").strip()
    return None if r in ("", "None", "(null)") else r


_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


def node_state(raw: Any, flags: list[Any] | None) -> tuple[str, list[str]]:
    """A node's state -> ``(base, flags)``: ``"MIXED+DRAIN"`` (text, v0.0.38 JSON with
    ``state_flags``) or ``["MIXED", "DRAIN"]`` (v0.0.39+) -> ``("MIXED", ["DRAIN", "DRAINING"])``;
    a trailing ``*`` becomes the flag ``NOT_RESPONDING``; ``DRAINING`` is added for DRAIN on a
    busy node (what sinfo prints as "draining"). Missing -> ``("UNKNOWN", [])``."""
    if isinstance(raw, list):  # v0.0.39+: ["IDLE", "DRAIN"], ["MIXED", "DRAIN", "COMPLETING"]
        parts = [str(p).upper() for p in raw if p] or ["UNKNOWN"]
        if parts[0].rstrip("*") not in NODE_BASE_STATES:  # flags first (not what Slurm prints): base to the front
            i = next((k for k, p in enumerate(parts) if p.rstrip("*") in NODE_BASE_STATES), None)
            if i is not None:
                parts.insert(0, parts.pop(i))
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


def used_gres_idx(gres_used: Any) -> list[int] | None:
    """GPU indices of a ``gres_used`` string with ``IDX`` (``gpu:h100:4(IDX:0-1,4,6)`` -> [0, 1, 4, 6]);
    None when it has no IDX list (``gpu:0``, ``""``, absent: not reported)."""
    if not isinstance(gres_used, str) or "IDX" not in gres_used:
        return None
    return parse_gres_idx(gres_used)


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
