"""Typed settings of the correlator (``GPUWARDEN_*`` and ``GPUWARDEN_CORRELATOR_*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuwarden.shared.settings import ServiceSettings

__all__ = ["CorrelatorSettings"]

DEFAULT_APP_ID = "gpuwarden-correlator"


class CorrelatorSettings(ServiceSettings):
    """Bus, HTTP and logging settings of every service, plus the correlator's own.

    The Kafka consumer group is ``GPUWARDEN_CONSUMER_GROUP``, default ``gpuwarden-correlator``
    (``-events`` appended for the events lane).
    """

    correlator_retention_s: float = Field(
        3600.0, gt=0, description="Keep ended job allocations this long (event time, s) so late samples attribute"
    )
    correlator_window_s: float = Field(10.0, gt=0, description="Tumbling window length of job.windows, s (event time)")
    correlator_window_grace_s: float = Field(
        5.0, ge=0, description="A window closes when the node's sample watermark passes its end + this, s"
    )
    correlator_hold_s: float = Field(
        30.0,
        gt=0,
        description="Longest a sample or event waits for the Slurm watermark to pass its ts, s of wall clock "
        "while the broker answers (a Kafka outage does not count); then it goes out with attribution=unknown "
        "(a liveness bound for a stalled slurm-watcher)",
    )
    correlator_max_held_per_node: int = Field(
        600,
        ge=1,
        description="Most records held per node while waiting for the Slurm watermark (older ones go out as "
        "unknown): the hold's memory bound, about 8.5 KB per held 8-GPU sample",
    )
    correlator_slurm_lookback_s: float = Field(
        7200.0,
        ge=0,
        description="At start, read slurm.jobs from this long ago (broker time, s; 0 = from the start of the "
        "topic): must cover slurm-watcher's snapshot period and RETENTION_S",
    )
    correlator_commit_interval_s: float = Field(
        5.0,
        ge=0,
        description="How often consumed offsets are committed (after a checkpoint of the windows), s: each "
        "checkpoint writes one changelog record per node whose windows changed, so at 1 Hz samples this "
        "divides the changelog traffic; a crash re-reads up to this much (redelivered readings are ignored)",
    )
    correlator_producer_linger_s: float = Field(
        0.02,
        ge=0,
        description="How long the producer waits to fill a batch, s (fewer, larger produce requests; "
        "adds at most this to each output's latency)",
    )
    correlator_lane: Literal["all", "samples", "events"] = Field(
        "all",
        description="What this worker consumes: all inputs; samples (gpu.samples); or events (gpu.events) in "
        "its own consumer group <group>-events, so XIDs never wait behind a sample backlog (every lane reads "
        "slurm.jobs and slurm.watermarks whole)",
    )

    @property
    def app_id(self) -> str:
        """The consumer group (``<group>-events`` for the events lane)."""
        group = self.consumer_group or DEFAULT_APP_ID
        return f"{group}-events" if self.correlator_lane == "events" else group
