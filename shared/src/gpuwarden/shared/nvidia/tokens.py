"""The one set of "no value" tokens of NVIDIA tools (nvidia-smi XML, ``-q`` text, CSV, table).

nvidia-smi (drivers 470 .. 595) prints these where a field has no value: ``N/A``, ``[N/A]`` (CSV),
``Not Supported``, ``[Not Supported]``, ``Unknown Error``, ``Requested functionality has been
deprecated``, ``ERR!`` (the table view, a failed read) ... Parsers map every one of them to
None (absent), never to 0 or to the token itself.
"""

from __future__ import annotations

__all__ = ["NA_TOKENS", "is_na", "na_to_none"]

_BARE = (
    "",
    "n/a",
    "not supported",
    "unknown error",
    "unknown",
    "none",
    "requested functionality has been deprecated",
    "err!",
)
NA_TOKENS: frozenset[str] = frozenset(_BARE) | frozenset(f"[{t}]" for t in _BARE if t)
"""Lower-case, whitespace-stripped values that mean "no value" (each also in ``[...]``)."""


def is_na(text: str) -> bool:
    """True when ``text`` (any case, surrounding whitespace ignored) is a "no value" token."""
    return text.strip().lower() in NA_TOKENS


def na_to_none(text: str | None) -> str | None:
    """``text`` stripped, or None when it is None or a "no value" token (:data:`NA_TOKENS`)."""
    if text is None:
        return None
    t = text.strip()
    return None if t.lower() in NA_TOKENS else t
