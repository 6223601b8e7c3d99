"""Settings of the detector, from ``GPUWARDEN_*`` environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpuwarden.shared.settings import ServiceSettings

from .state import DurabilitySettings

__all__ = ["DetectorSettings"]


class DetectorSettings(ServiceSettings, DurabilitySettings):
    """Environment: ``GPUWARDEN_DETECTOR_CATALOG``, ``GPUWARDEN_DETECTOR_PRICE_USD_PER_GPU_HOUR``,
    ``GPUWARDEN_DETECTOR_UPDATE_INTERVAL_S`` plus the common ``GPUWARDEN_*`` bus settings."""

    detector_catalog: Path | None = Field(None, description="Failure catalog YAML (default: the shipped one)")
    detector_price_usd_per_gpu_hour: float = Field(3.26, ge=0, description="Price of one GPU-hour, USD")
    detector_update_interval_s: float = Field(
        30.0, ge=0, description="Min event-time gap between re-emitted updates of one failure, s"
    )
    detector_report_interval_s: float = Field(
        300.0, ge=0, description="Event time between running reports of a job on job.reports, s (0: only at the end)"
    )
    detector_report_admin_comment: bool = Field(
        False,
        description="Write each final report's one-line summary to the job's Slurm AdminComment "
        "(scontrol update JobId=... AdminComment=...; needs Slurm operator rights)",
    )
