"""Value checks of readings parsed from NVIDIA tools: the ranges of the :class:`GpuSample`
fields, read from the model (so they cannot drift).

A reading outside its field's range (a driver's sentinel such as ``4294967295``, a value a tool
printed that the model cannot hold) is **dropped, not fatal**: the field becomes None ("not
reported"), the GPU's other readings and the other GPUs are kept, and the drop is named
(``on_drop``; by default a rate-limited warning). One bad counter must not cost a node its
samples: a collector that raised on it would send nothing, and the node would look silent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from annotated_types import Ge, Le
from pydantic import ValidationError

from gpuwarden.shared.models import GpuSample

__all__ = ["BOUNDS", "OnDrop", "gpu_sample", "kept", "out_of_range", "warn_dropped"]

log = logging.getLogger(__name__)

#: Called with (field name, what was wrong: ``where: field = value ...``) for a dropped reading.
OnDrop = Callable[[str, str], None]


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


#: field name -> (lowest, highest) value the model accepts (only the bounded fields)
BOUNDS = _bounds()


def warn_dropped(field_name: str, message: str) -> None:
    """The default ``on_drop``: one rate-limited warning line, ``<message>: dropped (not reported)``."""
    log.warning("%s: dropped (not reported)", message, extra={"rate_limited": True})


def out_of_range(field_name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the :class:`GpuSample` field's value (``= 150.0 is out of range
    [0, 100]``), or None when it can (also for a field without bounds or a non-number). Pure."""
    b = BOUNDS.get(field_name)
    if b is None or not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{field_name} = {value} is not a finite number"
    if b[0] <= value <= b[1]:
        return None
    return f"{field_name} = {value} is out of range [{b[0]:g}, {b[1]:g}]"


def kept(field_name: str, value: Any, where: str, on_drop: OnDrop | None = None) -> Any:
    """``value`` when the :class:`GpuSample` field can hold it, else None (dropped), with
    ``on_drop(field_name, "<where>: <field> = <value> is out of range [lo, hi]")`` (default: a
    rate-limited warning)."""
    why = out_of_range(field_name, value)
    if why is None:
        return value
    (on_drop or warn_dropped)(field_name, f"{where}: {why}")
    return None


def gpu_sample(
    data: Mapping[str, Any], where: str, model: type[GpuSample] = GpuSample, on_drop: OnDrop | None = None
) -> GpuSample:
    """``model(**data)``, dropping each reading the model refuses (out of range, wrong type, a
    malformed identifier...) with ``on_drop(field, "<where>: GPU <index>: <field> = <value>:
    <pydantic's reason>")`` (default: a rate-limited warning) instead of losing the GPU.

    Raises:
        ValueError: the GPU's ``index`` itself is refused (no sample can name the GPU).
    """
    try:
        return model(**data)
    except ValidationError as exc:
        bad: dict[str, str] = {}
        for err in exc.errors(include_url=False):
            loc = err.get("loc") or ()
            name = str(loc[0]) if loc else ""
            if name not in data or name == "index":
                raise ValueError(f"{where}: {exc}") from exc
            bad.setdefault(name, err.get("msg", "invalid"))
    gpu = data.get("index", "?")
    for name, msg in bad.items():
        (on_drop or warn_dropped)(name, f"{where}: GPU {gpu}: {name} = {data[name]!r}: {msg}")
    rest = {k: v for k, v in data.items() if k not in bad}
    try:
        return model(**rest)
    except ValidationError as exc:  # pragma: no cover - only the dropped fields were refused
        raise ValueError(f"{where}: {exc}") from exc
