"""The detector service: attributed events and samples, job windows, Slurm state and health
check results -> ``failures``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from gpuwarden.shared.bus import Producer
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    Failure,
    HealthCheckResult,
    JobState,
    JobWindow,
    NodeState,
)
from gpuwarden.shared.service import Service
from gpuwarden.shared.settings import ServiceSettings

from .catalog import load_catalog
from .engine import Detector

__all__ = ["DetectorService", "DetectorSettings"]


class DetectorSettings(ServiceSettings):
    """Environment: ``GPUWARDEN_DETECTOR_CATALOG``, ``GPUWARDEN_DETECTOR_PRICE_USD_PER_GPU_HOUR``,
    ``GPUWARDEN_DETECTOR_UPDATE_INTERVAL_S`` plus the common ``GPUWARDEN_*`` bus settings."""

    detector_catalog: Path | None = Field(None, description="Failure catalog YAML (default: the shipped one)")
    detector_price_usd_per_gpu_hour: float = Field(3.26, ge=0, description="Price of one GPU-hour, USD")
    detector_update_interval_s: float = Field(
        30.0, ge=0, description="Min event-time gap between re-emitted updates of one failure, s"
    )


class DetectorService(Service):
    name = "detector"

    def __init__(self, settings: DetectorSettings, producer: Producer | None = None) -> None:
        super().__init__(settings, producer)
        self.detector = Detector(
            load_catalog(settings.detector_catalog),
            settings.detector_price_usd_per_gpu_hour,
            settings.detector_update_interval_s,
        )
        self.failures_out = 0

    async def on_start(self) -> None:
        self.consume(
            ["gpu.events.attributed", "gpu.attributed", "slurm.jobs", "slurm.nodes", "job.windows", "health"],
            self.handle,
        )

    async def handle(self, topic: str, value: Any, _record: Any = None) -> None:
        """Apply the engine to one decoded message and publish what it yields."""
        if isinstance(value, AttributedEvent):
            out = self.detector.on_event(value)
        elif isinstance(value, AttributedSample):
            out = self.detector.on_sample(value, getattr(_record, "partition", None))
        elif isinstance(value, JobState):
            out = self.detector.on_job(value)
        elif isinstance(value, JobWindow):
            out = self.detector.on_window(value)
        elif isinstance(value, NodeState):
            out = self.detector.on_node(value)
        elif isinstance(value, HealthCheckResult):
            out = self.detector.on_health(value)
        else:  # pragma: no cover - the consumer only delivers registered models
            raise TypeError(f"unexpected {type(value).__name__} on {topic}")
        for f in out:
            await self.emit(f)

    async def emit(self, failure: Failure) -> None:
        await self.publish("failures", failure.node, failure)
        await self.producer.flush()  # failures are rare and latency matters: deliver now
        self.failures_out += 1
