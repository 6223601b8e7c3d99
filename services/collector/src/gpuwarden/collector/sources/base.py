"""What every collector source shares: the :class:`Source` interface, the registry, helpers.

A source knows nothing of Kafka: ``collect()`` returns one :class:`NodeSample` per node it
watches, ``events()`` returns the discrete :class:`GpuEvent` s seen since the last call.
The service runs them, measures each call and publishes the results. Sources register by
name in :data:`SOURCES` (see :func:`register_source`); kernel-log readers are
:class:`LineReader` s.
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from gpuwarden.shared.models import GpuEvent, GpuSample, NodeSample
from gpuwarden.shared.nvidia.values import warn_dropped

__all__ = [
    "SOURCES",
    "Clock",
    "LineReader",
    "Paced",
    "Source",
    "default_collector_id",
    "register_source",
    "resolve_gpu",
]

Clock = Callable[[], float]


def default_collector_id() -> str:
    """``<short hostname>:<pid>``: which collector process produced a sample."""
    return f"{socket.gethostname().split('.')[0]}:{os.getpid()}"


@runtime_checkable
class Source(Protocol):
    """A telemetry source: ``collect()`` one sample per node, ``events()`` new discrete events.

    Both may raise; the runner counts the error and goes on with the next tick.
    """

    name: str

    async def collect(self) -> list[NodeSample]: ...

    async def events(self) -> list[GpuEvent]: ...

    async def close(self) -> None: ...


@runtime_checkable
class Paced(Protocol):
    """A source that sets its own tick times (the simulator): wall epoch s of the next tick,
    None once it has nothing more to produce."""

    def next_due(self) -> float | None: ...


class DroppedReadings:
    """The ``on_drop`` of a source that builds samples from a driver's values
    (:func:`gpuwarden.shared.nvidia.values.gpu_sample`): each reading the model refused (out of
    range, a sentinel) is counted per field in :attr:`counts` (the collector exports them as
    ``gpuwarden_collector_readings_dropped_total{field}``) and warned about (rate-limited)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, field_name: str, message: str) -> None:
        self.counts[field_name] += 1
        warn_dropped(field_name, message)


SOURCES: dict[str, Callable[..., Source]] = {}


def register_source(name: str) -> Callable[[Callable[..., Source]], Callable[..., Source]]:
    """Decorator: register a factory ``f(settings) -> Source`` under ``name``."""

    def deco(factory: Callable[..., Source]) -> Callable[..., Source]:
        SOURCES[name] = factory
        return factory

    return deco


def resolve_gpu(event: GpuEvent, gpus: Sequence[GpuSample]) -> GpuEvent:
    """Fill ``gpu_index``/``gpu_uuid`` of an event from the node's inventory by PCI bus id.

    Returns the event unchanged when its bus id is unknown (e.g. an NVSwitch SXID).
    """
    if event.pci_bus_id is None or event.gpu_index is not None:
        return event
    for g in gpus:
        if g.pci_bus_id == event.pci_bus_id:
            return event.model_copy(update={"gpu_index": g.index, "gpu_uuid": g.uuid})
    return event


class LineReader(Protocol):
    """Returns the complete lines written since the previous call."""

    def read_new_lines(self) -> list[str]: ...
