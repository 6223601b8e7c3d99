"""``gpuwarden correlator`` / ``python -m gpuwarden.correlator``: run the correlator until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

import typer

from .app import CorrelatorService
from .settings import CorrelatorSettings

__all__ = ["app", "main", "serve"]

log = logging.getLogger(__name__)

app = typer.Typer(
    name="correlator",
    help="Join GPU samples and events with the Slurm jobs holding the GPUs (faust-streaming).",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


async def serve(service: CorrelatorService) -> int:
    """Run ``service`` until SIGTERM/SIGINT (exit code 0) or until the faust app crashes (1)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
        stopped = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(service.wait_failed())
        done, pending = await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        rc = 0
        if failed in done:
            log.error("correlator: stopping after a crash: %r", failed.result())
            rc = 1
        return rc
    finally:
        await service.stop()


def main(settings: CorrelatorSettings | None = None) -> int:
    """Build the settings from the environment, configure logging and run; returns the exit code."""
    s = settings or CorrelatorSettings()
    logging.basicConfig(
        level=getattr(logging, s.log_level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s [{socket.gethostname()}:%(process)d] %(name)s: %(message)s",
    )
    return asyncio.run(serve(CorrelatorService(s)))


@app.callback()
def run(ctx: typer.Context) -> None:
    """Run the correlator (settings from GPUWARDEN_* environment variables; see the README)."""
    if ctx.invoked_subcommand is None:
        raise typer.Exit(main())
