"""``python -m gpuwarden.collector [OPTIONS]``: run the collector (settings from the environment,
options override them) through :func:`gpuwarden.shared.service.run_service`; ``--help`` lists options."""

from __future__ import annotations

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m gpuwarden.collector")
