"""``gpuwarden slurm-watcher``: run the watcher, or print what Slurm reports once."""

from __future__ import annotations

import asyncio
from typing import Any

import typer

from gpuwarden.shared.cli import service_app


def _service() -> Any:
    from .service import SlurmWatcher, SlurmWatcherSettings

    return SlurmWatcher(SlurmWatcherSettings())


app = service_app(
    help="Slurm watcher: job and node state changes -> slurm.jobs / slurm.nodes.",
    run_help="Run the slurm-watcher until SIGTERM/Ctrl-C (settings from GPUWARDEN_* variables).",
    factory=_service,
)


@app.command("once")
def once() -> None:
    """Poll Slurm once and print jobs and nodes as JSON lines (no Kafka)."""
    from gpuwarden.shared.slurm import SlurmError

    from .service import SlurmWatcherSettings, make_client

    client, _ = make_client(SlurmWatcherSettings())

    async def go() -> None:
        for j in await client.jobs():
            typer.echo(j.model_dump_json())
        for n in await client.nodes():
            typer.echo(n.model_dump_json())
        close = getattr(client, "close", None)
        if close is not None:
            await close()

    try:
        asyncio.run(go())
    except (SlurmError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
