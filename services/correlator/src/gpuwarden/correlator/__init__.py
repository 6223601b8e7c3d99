"""gpuwarden correlator: attributes GPU samples and events to the Slurm jobs holding the GPUs,
in event time (a join that waits for the Slurm watermark), and windows them per job.

The message handling (join, hold, windows) is in :class:`Correlator` (:mod:`.core`), testable
without a broker; :class:`~.service.CorrelatorService` runs it on the shared consumer.
"""

from __future__ import annotations

from gpuwarden.shared.allocations import (
    Allocation,
    apply_allocation,
    attribute_event,
    attribute_sample,
    attributions_at,
    expire,
    fan_out,
)

from .core import INPUT_TOPICS, OUTPUT_TOPICS, AllocationStore, Correlator, MemoryAllocationStore, Output
from .settings import CorrelatorSettings
from .slurmview import SlurmView

__all__ = [
    "INPUT_TOPICS",
    "OUTPUT_TOPICS",
    "Allocation",
    "AllocationStore",
    "Correlator",
    "CorrelatorService",
    "CorrelatorSettings",
    "MemoryAllocationStore",
    "Output",
    "SlurmView",
    "apply_allocation",
    "attribute_event",
    "attribute_sample",
    "attributions_at",
    "expire",
    "fan_out",
]


def __getattr__(name: str) -> object:
    # aiokafka is imported lazily: the pure parts above need no broker.
    if name == "CorrelatorService":
        from .service import CorrelatorService

        return CorrelatorService
    raise AttributeError(name)
