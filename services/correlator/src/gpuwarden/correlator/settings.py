"""Typed settings of the correlator (``GPUWARDEN_*`` and ``GPUWARDEN_CORRELATOR_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gpuwarden.shared.settings import ServiceSettings

__all__ = ["CorrelatorSettings"]

DEFAULT_APP_ID = "gpuwarden-correlator"


class CorrelatorSettings(ServiceSettings):
    """Bus, HTTP and logging settings of every service, plus the correlator's own.

    The faust app id (also the Kafka consumer group) is ``GPUWARDEN_CONSUMER_GROUP``,
    default ``gpuwarden-correlator``.
    """

    correlator_partitions: int = Field(
        0, ge=0, description="Partitions of the input topics; 0 = read them from the broker (gpu.samples)"
    )
    correlator_retention_s: float = Field(
        3600.0, gt=0, description="Keep ended job allocations this long (event time, s) so late samples attribute"
    )
    correlator_window_s: float = Field(10.0, gt=0, description="Tumbling window length of job.windows, s (event time)")
    correlator_window_grace_s: float = Field(
        5.0, ge=0, description="A window closes when the node's sample watermark passes its end + this, s"
    )
    correlator_session_timeout_s: float = Field(
        6.0, gt=0, description="Kafka consumer session timeout, s (a restart on Tansu waits this long)"
    )
    correlator_heartbeat_interval_s: float = Field(1.0, gt=0, description="Kafka heartbeat interval, s")
    correlator_commit_interval_s: float = Field(1.0, gt=0, description="How often consumed offsets are committed, s")
    correlator_stop_timeout_s: float = Field(15.0, gt=0, description="Give up a graceful stop after this long, s")
    correlator_replication_factor: int | None = Field(
        None,
        ge=1,
        description="Replicas of the table changelog topics faust creates (None: 3 on a cluster of "
        ">= 3 brokers, else 1; min.insync.replicas 2 with 3 replicas)",
    )
    correlator_producer_linger_s: float = Field(
        0.02,
        ge=0,
        description="How long the producer waits to fill a batch, s (fewer, larger produce requests; "
        "adds at most this to each output's latency)",
    )
    correlator_producer_batch_bytes: int = Field(
        512 * 1024,
        ge=16 * 1024,
        le=1_000_000,
        description="Largest producer batch per partition, bytes (at most the broker's message.max.bytes)",
    )
    correlator_lane: Literal["all", "samples", "events"] = Field(
        "all",
        description="What this worker consumes: all inputs; samples (slurm.jobs, allocations, gpu.samples); or "
        "events (allocations, gpu.events) in its own consumer group <app id>-events, so XIDs never wait "
        "behind a sample backlog (run one samples and one events worker)",
    )
    correlator_datadir: Path | None = Field(
        None, description="faust data directory (default: a folder under the system temp dir)"
    )

    @property
    def app_id(self) -> str:
        """faust app id = Kafka consumer group (``<group>-events`` for the events lane)."""
        group = self.consumer_group or DEFAULT_APP_ID
        return f"{group}-events" if self.correlator_lane == "events" else group
