"""``gpuwarden console``: the read-only web console (settings from ``GPUWARDEN_*``)."""

from __future__ import annotations

from typing import Any

from gpuwarden.shared.cli import service_app


def _service() -> Any:
    from .service import ConsoleService, ConsoleSettings

    return ConsoleService(ConsoleSettings())


app = service_app(
    help="Console: a read-only web page of the fleet, failures, remediations and job verdicts, live.",
    run_help="Serve the console on GPUWARDEN_HTTP_HOST:GPUWARDEN_HTTP_PORT (127.0.0.1) until SIGTERM/Ctrl-C.",
    factory=_service,
)
