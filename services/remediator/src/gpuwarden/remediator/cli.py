"""``gpuwarden remediator``: run the remediator, or resume a node gpuwarden drained."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

app = typer.Typer(
    help="Remediator: failures -> policy-checked Slurm drains -> remediations (audit).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@app.callback()
def run(ctx: typer.Context) -> None:
    """Run the remediator until SIGTERM/Ctrl-C (dry-run unless GPUWARDEN_REMEDIATOR_ENFORCE=true)."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuwarden.shared.service import run_service

    from .service import Remediator, RemediatorSettings

    s = RemediatorSettings()
    raise typer.Exit(run_service(lambda: Remediator(s), s.log_level))


@app.command("resume")
def resume(
    node: Annotated[str, typer.Argument(help="Node to resume, e.g. gpu-node-002")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be done")] = False,
) -> None:
    """Resume NODE, but only if gpuwarden drained it (reason starts with 'gpuwarden:')."""
    from gpuwarden.shared.slurm import SlurmError

    from .service import RemediatorSettings, make_client, resume_node

    try:
        client, _ = make_client(RemediatorSettings())
        rc, msg = asyncio.run(resume_node(client, node, dry_run=dry_run))
    except (SlurmError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(msg, err=rc != 0)
    raise typer.Exit(rc)
