"""The XID table: the one classification of every documented NVIDIA XID, as data (``xids.csv``).

``xids.csv`` (package data next to this module, 172 codes) is derived from the reference XID
catalog by ``services/detector/tools/derive_xids.py`` and reviewed as data. Columns:

==========  ==================================================================================
xid         the code (int >= 0)
name        NVIDIA's name (``ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS``)
pattern     gpuwarden's canonical failure pattern (:data:`gpuwarden.shared.models.PATTERNS`)
severity    info / warning / critical / fatal (:class:`~gpuwarden.shared.models.Severity`)
action      recommended action: none, alert, restart-job, reset-gpu, drain, reboot, rma
sticky      1 when the condition lasts until a reset (repeats within an hour are one episode)
category    the reference catalog's cause, in words (``hardware (DRAM/SRAM)``, ``application``)
meaning     what the code means, in one line
health      how a node health check counts it: ``application`` (usually the job's own code:
            WARNING), ``repair`` (a memory repair / correctable-error notice: WARNING),
            ``recovery-action`` (XID 154: judged by the recovery action it names), ``node``
            (anything else: the node is suspect, CRITICAL)
==========  ==================================================================================

Read by the collector (event severity), the health-check (``xid`` check) and the detector (the
rule of an XID without a rule of its own).
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.shared.models import Action, Pattern, Severity

__all__ = [
    "XidEntry",
    "XidHealth",
    "load_xid_table",
    "xid_codes",
    "xid_severities",
    "xid_table",
]

XidHealth = Literal["application", "repair", "recovery-action", "node"]


class XidEntry(BaseModel):
    """One row of the XID table (module docstring: the columns)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    xid: int = Field(ge=0)
    name: str
    pattern: Pattern
    severity: Severity
    action: Action
    sticky: bool
    category: str
    meaning: str
    health: XidHealth = Field("node", description="How a node health check counts the XID (module docstring)")


def _default_text() -> str:
    return files(__package__).joinpath("xids.csv").read_text(encoding="utf-8")


def load_xid_table(path: str | Path | None = None) -> dict[int, XidEntry]:
    """The XID table: the shipped ``xids.csv`` (or the CSV at ``path``), code -> entry.

    A fresh dict on each call (see :func:`xid_table` for the cached shipped one).

    Raises:
        ValueError: unreadable file, or a row that fails validation (the message names the line).
    """
    try:
        text = Path(path).read_text(encoding="utf-8") if path else _default_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path or 'xids.csv'}: cannot read: {exc}") from exc
    out: dict[int, XidEntry] = {}
    for n, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            e = XidEntry.model_validate({**row, "sticky": row.get("sticky") == "1"})
        except ValueError as exc:
            raise ValueError(f"{path or 'xids.csv'} line {n}: {exc}") from exc
        out[e.xid] = e
    return out


@functools.cache
def _shipped() -> Mapping[int, XidEntry]:
    return load_xid_table()


def xid_table() -> Mapping[int, XidEntry]:
    """The shipped XID table, read once per process (read-only: do not mutate)."""
    return _shipped()


def xid_codes(health: XidHealth) -> frozenset[int]:
    """The codes of the shipped table whose ``health`` column is ``health``."""
    return frozenset(code for code, e in xid_table().items() if e.health == health)


@functools.lru_cache(maxsize=4)
def _load_severities(path: str | None) -> dict[int, Severity]:
    if path is None:
        return {code: e.severity for code, e in xid_table().items()}
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    out: dict[int, Severity] = {}
    for n, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            out[int(row["xid"])] = Severity(row["severity"].strip())
        except (KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"XID catalog {path} line {n}: bad xid/severity: {exc}") from exc
    return out


def xid_severities(path: str | None = None) -> dict[int, Severity]:
    """XID code -> :class:`~gpuwarden.shared.models.Severity`: the shipped XID table's, or those of
    the CSV at ``path`` (columns ``xid`` and ``severity``: info/warning/critical/fatal; other
    columns ignored). Cached per path; a fresh dict on each call.

    Raises:
        ValueError: a row of ``path`` whose ``xid`` is not an integer or ``severity`` not a
            known severity.
        OSError: ``path`` cannot be read.
    """
    return dict(_load_severities(path))
