"""Writing the JSON report of ``demo``, ``simulate`` and ``analyze`` (``--report FILE``), with a
one-line error instead of a traceback when the file cannot be written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["check_report_path", "write_report"]


def check_report_path(path: Path | None, console: Console) -> None:
    """Before a run: exit 2 with one line if ``path``'s folder does not exist or is not one
    (so a long run is not lost at its end). ``None``: no report asked for."""
    if path is not None and not path.parent.is_dir():
        console.print(
            f"[red]error:[/] cannot write the report {escape(str(path))}: {escape(str(path.parent))} is not a folder"
        )
        raise typer.Exit(2)


def write_report(path: Path, report: dict[str, Any], console: Console) -> None:
    """Write ``report`` as indented JSON to ``path``; exit 2 with one line on an OS error."""
    try:
        path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    except OSError as exc:
        console.print(f"[red]error:[/] cannot write the report {escape(str(path))}: {escape(exc.strerror or str(exc))}")
        raise typer.Exit(2) from exc
    console.print(f"report written to {escape(str(path))}")
