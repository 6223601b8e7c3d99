"""Validated Slurm node names and hostlist expansion (python-hostlist)."""

from __future__ import annotations

import functools
import re

import hostlist

__all__ = ["NODE_NAME_RE", "expand_nodes", "validate_node_name"]

NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_node_name(name: str) -> str:
    """Return ``name`` unchanged if it is a safe Slurm node name.

    Allowed: ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}`` (1-64 characters, no spaces, ``=``,
    commas, brackets or shell metacharacters), so a name can be put into an argv element
    like ``nodename=<name>`` without changing its meaning.

    Raises:
        ValueError: ``name`` is not a string matching the pattern.
    """
    if not isinstance(name, str) or NODE_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid node name {name!r}: must match {NODE_NAME_RE.pattern}")
    return name


def expand_nodes(expr: str | None) -> list[str]:
    """Expand a Slurm hostlist (``gpu-node-[001-002,004],other-[1-2]``) into node names.

    Order and duplicates are kept as ``scontrol show hostnames`` prints them
    (``b-[3,1,1]`` -> ``b-3, b-1, b-1``); zero padding is kept (``[009-011]`` -> ``009``...).
    Empty, ``None``, ``(null)`` and ``None assigned`` give ``[]``.

    Raises:
        ValueError: the expression is not a valid hostlist.
    """
    if not expr or expr in ("(null)", "None assigned", "N/A"):
        return []
    return list(_expand_cached(expr))


@functools.lru_cache(maxsize=8192)
def _expand_cached(expr: str) -> tuple[str, ...]:
    if "[" not in expr and "," not in expr:
        return (expr,)
    try:
        # as `scontrol show hostnames`: duplicates and the given order kept (never sorted)
        return tuple(hostlist.expand_hostlist(expr, allow_duplicates=True, sort=False))
    except hostlist.BadHostlist as exc:
        raise ValueError(f"bad hostlist {expr!r}: {exc}") from exc
