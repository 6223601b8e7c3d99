"""Settings of the console, from ``GPUWARDEN_*`` environment variables."""

from __future__ import annotations

from pydantic import Field

from gpuwarden.shared.settings import ServiceSettings

__all__ = ["ConsoleSettings"]


class ConsoleSettings(ServiceSettings):
    """Environment: ``GPUWARDEN_CONSOLE_TOKEN``, ``GPUWARDEN_CONSOLE_PUSH_INTERVAL_S``,
    ``GPUWARDEN_CONSOLE_SERIES_POINTS`` plus the common ``GPUWARDEN_*`` settings (the page is on
    ``GPUWARDEN_HTTP_HOST``/``GPUWARDEN_HTTP_PORT``)."""

    console_token: str | None = Field(
        None,
        description="Bearer token the API requires (Authorization: Bearer TOKEN, or ?token=TOKEN); unset: open",
    )
    console_push_interval_s: float = Field(0.5, gt=0, description="Least time between two live updates, s")
    console_series_points: int = Field(
        360, ge=10, description="Windows kept per GPU for the plots, count (10 s each: 360 = 1 h)"
    )
