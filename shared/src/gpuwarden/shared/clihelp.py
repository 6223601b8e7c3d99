"""How every gpuwarden command prints its ``--help``.

On a terminal: typer's rich panels. Piped, redirected or captured (no TTY on stdout: a pager,
``| less``, a config-management run, a CI log), rich would lay its panels out at 80 columns and
cut option names and environment variables with "…"; there the help is click's plain text,
which wraps and never cuts.
"""

from __future__ import annotations

import sys
from typing import Literal

__all__ = ["help_markup"]


def help_markup() -> Literal["rich"] | None:
    """``rich_markup_mode`` for a :class:`typer.Typer`: ``"rich"`` when stdout is a terminal,
    None (plain click help) otherwise."""
    try:
        return "rich" if sys.stdout.isatty() else None
    except (AttributeError, ValueError):  # a replaced or closed stdout
        return None
