"""``gpuwarden otlp-bridge`` / ``gpuwarden-otlp-bridge``: run the bridge until SIGTERM."""

from __future__ import annotations

import typer

from gpuwarden.shared.clihelp import help_markup

__all__ = ["app"]

app = typer.Typer(
    rich_markup_mode=help_markup(),
    name="otlp-bridge",
    help="Forward gpu.attributed, failures and remediations to OTLP (metrics + logs) and Prometheus /metrics. "
    "Settings: GPUWARDEN_* / GPUWARDEN_OTLP_BRIDGE_* environment variables (see the README).",
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def run(ctx: typer.Context) -> None:
    """Run the otlp-bridge service (graceful stop on SIGTERM/SIGINT: commit, flush OTLP)."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuwarden.shared.service import run_service

    from .service import create_service
    from .settings import OtlpBridgeSettings

    raise typer.Exit(run_service(lambda: create_service(OtlpBridgeSettings())))
