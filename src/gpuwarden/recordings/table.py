"""Recorded plain ``nvidia-smi`` tables (a file of them, each under its date line) as readings
of a :class:`~gpuwarden.recordings.Recording`; the table parser is
:mod:`gpuwarden.shared.nvidia.smi_table`."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwarden.shared.nvidia.smi_table import parse_nvidia_smi_table

from ._core import ReadContext, Reading, TimeParser

__all__ = ["read_smi_tables"]


def read_smi_tables(text: str, ctx: ReadContext) -> Iterator[Reading]:
    """Readings of a file of ``nvidia-smi`` tables, each at its date line (in ``ctx.tz``).

    Raises:
        ValueError: a table without a date line above it, or as :func:`parse_nvidia_smi_table`.
    """
    tp = TimeParser(ctx.tz)
    try:
        tables = parse_nvidia_smi_table(text)
    except ValueError as exc:
        raise ValueError(f"{ctx.file}: {exc}") from exc
    for n, t in enumerate(tables, start=1):
        if t.timestamp is None:
            raise ValueError(f"{ctx.file}: table {n} has no date line ('Tue Dec  1 13:21:04 2026') above it")
        ts = tp.parse(t.timestamp)
        for g in t.gpus:
            vals = g.model_dump(exclude_none=True, exclude={"index"})
            if not vals.get("throttle_reasons"):
                vals.pop("throttle_reasons", None)
            vals["driver_version"] = t.driver_version
            vals["cuda_version"] = t.cuda_version
            ctx.rows += 1
            yield ts, g.index, vals
