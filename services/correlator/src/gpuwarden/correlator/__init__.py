"""gpuwarden correlator: attributes GPU samples and events to the Slurm jobs holding the GPUs.

A faust-streaming app (:func:`create_app`) whose agents only move bytes; the join is pure
(:mod:`gpuwarden.shared.allocations`) and the message handling (decode, join, dead-letter) is
in :class:`Correlator`, testable without a broker.
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

__all__ = [
    "INPUT_TOPICS",
    "OUTPUT_TOPICS",
    "Allocation",
    "AllocationStore",
    "Correlator",
    "CorrelatorApp",
    "CorrelatorService",
    "CorrelatorSettings",
    "MemoryAllocationStore",
    "Output",
    "apply_allocation",
    "attribute_event",
    "attribute_sample",
    "attributions_at",
    "create_app",
    "expire",
    "fan_out",
]


def __getattr__(name: str) -> object:
    # faust is imported lazily: the pure parts above need neither faust nor a broker.
    if name in {"create_app", "CorrelatorApp", "CorrelatorService"}:
        from . import app

        return getattr(app, name)
    raise AttributeError(name)
