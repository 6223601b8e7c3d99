"""Writing the JSON report of ``demo``, ``simulate`` and ``analyze`` (``--report FILE``), with a
one-line error instead of a traceback when the file cannot be written; :func:`iso_utc`, the one
spelling of absolute times in reports and terminal output."""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["WALL_CLOCK_MIN_TS", "check_report_path", "iso_utc", "write_report"]

#: Timestamps below this (epoch s, 2001-09-09) are not wall-clock times: seconds since boot of
#: a kernel log read without its boot time.
WALL_CLOCK_MIN_TS = 1e9


def iso_utc(ts: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC: ``2024-05-01T12:03:04Z``, with milliseconds
    (``2024-05-01T12:03:04.250Z``) when the time has a fraction of a second (rounded to 1 ms).

    Returns None for None, a non-finite number, or a time before :data:`WALL_CLOCK_MIN_TS`
    (seconds since boot, no wall-clock time to print)."""
    if ts is None or not math.isfinite(ts) or ts < WALL_CLOCK_MIN_TS:
        return None
    ms = round(ts * 1000)
    dt = datetime.fromtimestamp(ms // 1000, UTC)
    frac = ms % 1000
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac:03d}Z" if frac else "Z")


def check_report_path(path: Path | None, console: Console) -> None:
    """Before a run: exit 2 with one line if ``path``'s folder does not exist, is not one, or
    this user may not write there (so a long run is not lost at its end). ``None``: no report
    asked for."""
    if path is None:
        return
    why = None
    if not path.parent.is_dir():
        why = f"{path.parent} is not a folder"
    elif path.is_dir():
        why = "it is a folder"
    elif not os.access(path if path.exists() else path.parent, os.W_OK):
        why = f"no write permission on {path if path.exists() else path.parent}"
    if why is not None:
        console.print(f"[red]error:[/] cannot write the report {escape(str(path))}: {escape(why)}")
        raise typer.Exit(2)


def write_report(path: Path, report: dict[str, Any], console: Console) -> None:
    """Write ``report`` as indented JSON to ``path``; exit 2 with one line on an OS error."""
    try:
        path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    except OSError as exc:
        console.print(f"[red]error:[/] cannot write the report {escape(str(path))}: {escape(exc.strerror or str(exc))}")
        raise typer.Exit(2) from exc
    console.print(f"report written to {escape(str(path))}")
