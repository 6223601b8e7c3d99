"""Settings of the slurm-watcher (``GPUWARDEN_SLURM_WATCHER_*`` plus the common ones)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gpuwarden.shared.settings import CLUSTER_NAME_PATTERN, ServiceSettings
from gpuwarden.shared.slurm import DEFAULT_SIM_STATE_FILE
from gpuwarden.shared.slurm.factory import DEFAULT_REST_URL

__all__ = ["SlurmWatcherSettings"]


class SlurmWatcherSettings(ServiceSettings):
    """Settings of the slurm-watcher (``GPUWARDEN_SLURM_WATCHER_*`` plus the common ones)."""

    slurm_watcher_backend: Literal["cli", "simulated", "rest"] = Field(
        "cli",
        description="cli = squeue/sinfo/sacct/scontrol of Slurm 22.05; rest = slurmrestd; "
        "simulated = scenario state machine",
    )
    slurm_watcher_rest_url: str = Field(
        DEFAULT_REST_URL, description="slurmrestd: unix:/path/to/socket or http://host:port (backend=rest)"
    )
    slurm_watcher_rest_token: str | None = Field(None, description="X-SLURM-USER-TOKEN (auth/jwt), none = no header")
    slurm_watcher_rest_user: str | None = Field(None, description="X-SLURM-USER-NAME sent with the token")
    slurm_watcher_rest_version: str = Field(
        "v0.0.38",
        description="slurmrestd OpenAPI version of the paths: v0.0.38 (Slurm 22.05) .. v0.0.42 (24.11), "
        "v0.0.43 (25.05), v0.0.44 (25.11); v0.0.40/v0.0.41 are deprecated (a warning is logged)",
    )
    slurm_watcher_poll_s: float = Field(2.0, gt=0, description="Poll period, s")
    slurm_watcher_snapshot_s: float = Field(60.0, gt=0, description="Full snapshot period (wall clock), s")
    slurm_watcher_scenario: Path | None = Field(None, description="Scenario YAML (backend=simulated)")
    slurm_watcher_state_file: Path = Field(
        DEFAULT_SIM_STATE_FILE, description="Drain state file shared with the remediator (backend=simulated)"
    )
    slurm_watcher_command_timeout_s: float = Field(10.0, gt=0, description="Timeout of one Slurm command, s")
    slurm_watcher_command_retries: int = Field(2, ge=0, description="Retries of a failed Slurm read")
    slurm_watcher_lease: Literal["auto", "kafka", "none"] = Field(
        "auto",
        description="Single publisher per cluster: kafka = consumer-group lease; none = not enforced; "
        "auto = kafka for the cli/rest backends, none for simulated",
    )
    slurm_watcher_cluster: str = Field(
        "default",
        pattern=CLUSTER_NAME_PATTERN,
        description="Cluster name, [A-Za-z0-9._-]{1,100} (one lease, one publisher per cluster; the key and "
        "cluster field of its slurm.watermarks)",
    )
    slurm_watcher_lease_session_ms: int = Field(
        10_000, ge=1000, description="How long a dead lease holder keeps the lease (Kafka session timeout), ms"
    )
    slurm_watcher_max_backoff_s: float = Field(
        60.0, gt=0, description="Longest poll period while Slurm is unreachable (doubles per failed poll), s"
    )
    slurm_watcher_gone_grace_polls: int = Field(
        5, ge=1, description="Polls a vanished job waits for sacct to confirm its end before ENDED is published"
    )
    slurm_watcher_takeover_lookback_s: float = Field(
        900.0,
        ge=0,
        description="On taking the lease: publish the ends sacct has since this long ago (or since this "
        "instance's own last poll, if later) of jobs no longer in squeue; 0 = off, s",
    )
    slurm_watcher_jobcomp_topic: str | None = Field(
        None,
        description="Kafka topic of slurmctld's jobcomp/kafka plugin (its JobCompLoc; read as named, no "
        "topic prefix, from the end, by the lease holder; with GPUWARDEN_SLURM_WATCHER_LEASE=none by every "
        "instance): a job's end is published at once instead of at "
        "the next poll, with the GPU indices of the poller's view; unset = the poller only",
    )
