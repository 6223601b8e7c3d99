"""``gpuwarden correlator`` / ``python -m gpuwarden.correlator``: run the correlator until SIGTERM."""

from __future__ import annotations

import logging

import typer

from gpuwarden.shared.clihelp import help_markup

from .service import CorrelatorService
from .settings import CorrelatorSettings

__all__ = ["app", "main"]

log = logging.getLogger(__name__)

app = typer.Typer(
    rich_markup_mode=help_markup(),
    name="correlator",
    help="Join GPU samples and events with the Slurm jobs holding the GPUs, in event time.",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def main(settings: CorrelatorSettings | None = None) -> int:
    """Build the settings from the environment and run until SIGTERM; returns the exit code
    (0 after a signal, 1 after a crash, 2 for bad settings or an unreachable broker)."""
    from gpuwarden.shared.service import run_service

    return run_service(lambda: CorrelatorService(settings or CorrelatorSettings()))


@app.callback()
def run(ctx: typer.Context) -> None:
    """Run the correlator (settings from GPUWARDEN_* environment variables; see the README)."""
    if ctx.invoked_subcommand is None:
        raise typer.Exit(main())
