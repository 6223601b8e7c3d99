"""gpuwarden collector: NVML samples and XID/SXID events of GPU nodes -> ``gpu.samples``/``gpu.events``."""

from .parsers import SmiReport, parse_nvidia_smi_xml
from .service import CollectorService
from .settings import CollectorSettings
from .sources import SOURCES, NvmlSource, ReplaySource, Source

__all__ = [
    "SOURCES",
    "CollectorService",
    "CollectorSettings",
    "NvmlSource",
    "ReplaySource",
    "SmiReport",
    "Source",
    "parse_nvidia_smi_xml",
]
