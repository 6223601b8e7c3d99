"""gpuwarden collector: NVML samples and XID/SXID events of GPU nodes -> ``gpu.samples``/``gpu.events``."""

from .service import CollectorService
from .settings import CollectorSettings
from .sources import SOURCES, NvmlSource, ReplaySource, Source

__all__ = [
    "SOURCES",
    "CollectorService",
    "CollectorSettings",
    "NvmlSource",
    "ReplaySource",
    "Source",
]
