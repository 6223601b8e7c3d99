"""PCI bus ids as NVIDIA tools print them, normalised to one spelling (pure)."""

from __future__ import annotations

import re

__all__ = ["normalize_pci_bus_id"]

_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def normalize_pci_bus_id(text: str) -> str:
    """Normalise a PCI bus id to ``dddd:bb:dd.f`` lower-case (4-digit domain).

    Accepts the spellings of nvidia-smi/NVML (``00000000:0C:00.0``), the kernel log
    (``0000:44:00``, no function: ``.0`` is assumed) and ``PCI:``-prefixed forms.

    Raises:
        ValueError: ``text`` is not a PCI bus id.
    """
    m = _PCI_RE.match(text.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {text!r}")
    dom = int(m["dom"] or "0", 16)
    return f"{dom:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{m['fn'] or '0'}"
