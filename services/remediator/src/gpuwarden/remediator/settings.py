"""Settings of the remediator (``GPUWARDEN_REMEDIATOR_*`` plus the common ``GPUWARDEN_*`` ones)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from gpuwarden.shared.settings import CLUSTER_NAME_PATTERN, ServiceSettings
from gpuwarden.shared.slurm import DEFAULT_SIM_STATE_FILE

from .alerts import RUNBOOK_BASE_URL, AlertmanagerSink, AlertSink, JsonWebhookSink, SlackSink
from .policy import PolicyConfig

__all__ = ["RemediatorSettings"]


class RemediatorSettings(ServiceSettings):
    """Settings of the remediator (``GPUWARDEN_REMEDIATOR_*`` plus the common ones)."""

    remediator_enforce: bool = Field(False, description="Really drain (False = dry-run: decide and record only)")
    remediator_backend: Literal["cli", "simulated"] = Field("cli", description="cli = scontrol; simulated = scenario")
    remediator_scenario: Path | None = Field(None, description="Scenario YAML (backend=simulated)")
    remediator_state_file: Path = Field(
        DEFAULT_SIM_STATE_FILE, description="Drain state file shared with the watcher (backend=simulated)"
    )
    remediator_policy_file: Path | None = Field(None, description="Policy YAML (default: built-in policy)")
    remediator_ledger_file: Path | None = Field(
        None, description="JSON ledger: history, breaker, drained nodes, recent actions (None = memory only)"
    )
    remediator_cluster: str = Field(
        "default",
        min_length=1,
        description="Cluster name (alert label; with GPUWARDEN_REMEDIATOR_LEASE=kafka also the lease topic's, "
        "then [A-Za-z0-9._-]{1,100})",
    )
    remediator_lease: Literal["none", "kafka"] = Field(
        "none", description="none = single replica; kafka = consumer-group lease on a one-partition topic"
    )
    remediator_max_drain_fraction: float = Field(
        0.10, ge=0, le=1, description="Breaker: max share of known nodes drained/down, 0-1"
    )
    remediator_min_drain_allowance: int = Field(1, ge=0, description="Nodes that may always be drained, count")
    remediator_max_drains_per_window: int = Field(5, ge=0, description="Breaker: max drains per window, count")
    remediator_window_s: float = Field(3600.0, gt=0, description="Breaker window, s")
    remediator_max_per_node_per_week: int = Field(3, ge=0, description="Max drains of one node per 7 days, count")
    remediator_command_timeout_s: float = Field(10.0, gt=0, description="Timeout of one scontrol call, s")
    remediator_command_retries: int = Field(
        2,
        ge=0,
        description="Retries of one scontrol command after a timeout or transient error, count (reads: by the "
        "Slurm client; drain/resume: by the remediator, which re-reads the node before each)",
    )
    remediator_retry_backoff_s: float = Field(0.5, ge=0, description="First retry backoff (doubles), s")
    remediator_resume_interval_s: float = Field(5.0, gt=0, description="How often resumes are checked, s")
    remediator_cluster_refresh_s: float = Field(
        0.0,
        ge=0,
        description="Max age of the node list read from Slurm for the breaker's share (0 = read at "
        "every drain decision), s",
    )
    remediator_alertmanager_url: SecretStr | None = Field(None, description="Alertmanager base URL")
    remediator_slack_webhook_url: SecretStr | None = Field(None, description="Slack-compatible webhook URL")
    remediator_webhook_url: SecretStr | None = Field(None, description="Generic JSON webhook URL")
    remediator_webhook_token: SecretStr | None = Field(None, description="Bearer token of the JSON webhook")
    remediator_alert_repeat_s: float = Field(60.0, gt=0, description="Re-send interval to Alertmanager, s")
    remediator_console_url: str | None = Field(
        None, description="Base URL of a console: an alert's generatorURL is <base>/failures/<failure_id>"
    )
    remediator_external_url: str | None = Field(
        None,
        description="How people reach this remediator's HTTP port (e.g. http://central:9475); without a console, "
        "generatorURL is <this>/failures/<failure_id> (the remediator's decisions on that failure, JSON)",
    )
    remediator_runbook_base_url: str = Field(
        RUNBOOK_BASE_URL, description="Base of the per-pattern runbooks: runbook_url is <base>/<pattern>.md"
    )

    def generator_url(self, failure_id: str) -> str | None:
        """The ``generatorURL`` of an alert about ``failure_id`` (None: neither URL is set)."""
        base = self.remediator_console_url or self.remediator_external_url
        return f"{base.rstrip('/')}/failures/{failure_id}" if base else None

    def policy(self) -> PolicyConfig:
        """The safety limits as a :class:`PolicyConfig`."""
        return PolicyConfig(
            enforce=self.remediator_enforce,
            max_drain_fraction=self.remediator_max_drain_fraction,
            min_drain_allowance=self.remediator_min_drain_allowance,
            max_drains_per_window=self.remediator_max_drains_per_window,
            window_s=self.remediator_window_s,
            max_per_node_per_week=self.remediator_max_per_node_per_week,
        )

    @model_validator(mode="after")
    def _lease_topic_name(self) -> RemediatorSettings:
        if self.remediator_lease == "kafka" and not re.fullmatch(CLUSTER_NAME_PATTERN, self.remediator_cluster):
            raise ValueError(
                f"GPUWARDEN_REMEDIATOR_CLUSTER={self.remediator_cluster!r} names the lease topic with "
                "GPUWARDEN_REMEDIATOR_LEASE=kafka: it must be [A-Za-z0-9._-]{1,100}"
            )
        return self

    def alert_sinks(self) -> list[AlertSink]:
        """The configured alert sinks."""
        sinks: list[AlertSink] = []
        if self.remediator_alertmanager_url:
            sinks.append(AlertmanagerSink(self.remediator_alertmanager_url))
        if self.remediator_slack_webhook_url:
            sinks.append(SlackSink(self.remediator_slack_webhook_url))
        if self.remediator_webhook_url:
            sinks.append(
                JsonWebhookSink(
                    self.remediator_webhook_url,
                    self.remediator_webhook_token,
                    external_url=self.remediator_external_url or "",
                )
            )
        return sinks
