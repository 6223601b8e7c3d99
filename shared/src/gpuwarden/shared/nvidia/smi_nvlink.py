"""Parser of ``nvidia-smi nvlink --status`` (``-s``): text in, plain data out, no I/O.

Reads the per-GPU link list that the NVIDIA driver's ``nvidia-smi`` prints: tested on one 8x A100
HGX recording, whose source gives no driver version (A100 needs the r450 branch or later):
:func:`parse_nvidia_smi_nvlink` -> one :class:`NvlinkGpu` per GPU with its :class:`NvlinkLink`
records; link rates in GB/s (bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NvlinkGpu", "NvlinkLink", "parse_nvidia_smi_nvlink"]


@dataclass(frozen=True)
class NvlinkLink:
    """One NVLink: ``active`` False when printed ``<inactive>``; ``gbps`` in GB/s (bytes) as printed."""

    link: int
    active: bool
    gbps: float | None


@dataclass(frozen=True)
class NvlinkGpu:
    """One GPU block: ``index`` and ``name`` as printed, ``uuid`` (``GPU-...``; None when the line has
    no ``(UUID: ...)``), ``links`` in the order printed (empty for a GPU without NVLink)."""

    index: int
    name: str
    uuid: str | None
    links: list[NvlinkLink]


def parse_nvidia_smi_nvlink(text: str) -> list[NvlinkGpu]:
    """Parse ``nvidia-smi nvlink --status`` (``-s``; tested on an 8x A100 HGX recording whose
    source gives no driver version): ``GPU N: NAME (UUID: GPU-...)`` then one
    ``Link N: 25 GB/s`` or ``Link N: <inactive>`` line per link (any indentation). A GPU
    without NVLink has no link lines (empty ``links``).

    Raises:
        ValueError: no ``GPU N: ...`` line, or a ``Link`` line that is neither a rate nor inactive.
    """
    gpus: list[NvlinkGpu] = []
    for raw in text.splitlines():
        ln = raw.strip()
        m = re.match(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?$", ln)
        if m:
            gpus.append(NvlinkGpu(index=int(m.group(1)), name=m.group(2), uuid=m.group(3), links=[]))
            continue
        m = re.match(r"^Link (\d+): (.*)$", ln)
        if m and gpus:
            val = m.group(2).strip()
            r = re.match(r"^(\d+(?:\.\d+)?) GB/s$", val)
            if r:
                gpus[-1].links.append(NvlinkLink(link=int(m.group(1)), active=True, gbps=float(r.group(1))))
            elif "inactive" in val.lower():
                gpus[-1].links.append(NvlinkLink(link=int(m.group(1)), active=False, gbps=None))
            else:
                raise ValueError(f"nvidia-smi nvlink: unreadable link line {ln!r}")
    if not gpus:
        raise ValueError("not nvidia-smi nvlink --status output: no 'GPU N: ...' line")
    return gpus
