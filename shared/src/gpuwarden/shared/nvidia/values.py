"""Value checks of readings parsed from NVIDIA tools: the ranges of the :class:`GpuSample`
fields, read from the model (so they cannot drift). Pure."""

from __future__ import annotations

import math
from typing import Any

from annotated_types import Ge, Le

from gpuwarden.shared.models import GpuSample

__all__ = ["BOUNDS", "check_value"]


def _bounds() -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for name, info in GpuSample.model_fields.items():
        lo, hi = -math.inf, math.inf
        for m in info.metadata:
            if isinstance(m, Ge):
                lo = float(m.ge)  # type: ignore[arg-type]
            elif isinstance(m, Le):
                hi = float(m.le)  # type: ignore[arg-type]
        if lo != -math.inf or hi != math.inf:
            out[name] = (lo, hi)
    return out


BOUNDS = _bounds()


def check_value(field_name: str, value: Any, where: str) -> None:
    """Raise ValueError when a number is outside the :class:`GpuSample` field's range.

    Raises:
        ValueError: ``where`` names the file and line.
    """
    b = BOUNDS.get(field_name)
    if b is not None and isinstance(value, int | float) and not isinstance(value, bool) and not b[0] <= value <= b[1]:
        raise ValueError(f"{where}: {field_name} = {value} is out of range [{b[0]:g}, {b[1]:g}]")
