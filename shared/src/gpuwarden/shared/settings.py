"""Typed settings shared by every service, read from ``GPUWARDEN_*`` environment variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["BusSettings", "ServiceSettings", "describe_settings_error"]


def describe_settings_error(exc: ValidationError, prefix: str = "GPUWARDEN_") -> str:
    """One line per bad setting, named by its environment variable, e.g.
    ``GPUWARDEN_HTTP_PORT='x': Input should be a valid integer``."""
    lines = []
    for e in exc.errors():
        field = "_".join(str(p) for p in e["loc"]) or "?"
        got = e.get("input")
        shown = f"={got!r}" if isinstance(got, str | int | float) else ""
        name = field.upper() if field.upper().startswith(prefix) else f"{prefix}{field.upper()}"
        lines.append(f"{name}{shown}: {e['msg']}")
    return "invalid settings: " + "; ".join(lines)


class BusSettings(BaseSettings):
    """Where Kafka is and how topics are named.

    Environment: ``GPUWARDEN_BOOTSTRAP_SERVERS`` (default ``127.0.0.1:9092``),
    ``GPUWARDEN_TOPIC_PREFIX`` (default ``gpuwarden.``).
    """

    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_", extra="ignore")

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, host:port[,...]")
    topic_prefix: str = Field("gpuwarden.", description="Prefix of every topic name")
    client_id: str = Field("gpuwarden", description="Kafka client id prefix")

    def topic(self, name: str) -> str:
        """Full name of a registered topic (see ``gpuwarden.shared.topics``)."""
        from .topics import topic

        return topic(name, self.topic_prefix)


class ServiceSettings(BusSettings):
    """Settings every long-running service has: bus, HTTP health/metrics port, logging."""

    http_host: str = Field("127.0.0.1", description="Bind address of /healthz and /metrics")
    http_port: int = Field(0, ge=0, le=65535, description="Port of /healthz and /metrics (0 = a free port)")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="Python logging level"
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    consumer_group: str | None = Field(None, description="Kafka consumer group (default: gpuwarden-<service>)")
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a new consumer group starts: earliest|latest"
    )
