"""``nvidia-smi dmon`` logs (drivers 450 .. 595). Pure."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from gpuwarden.shared.fields import by_field, dmon_columns
from gpuwarden.shared.nvidia.values import kept

from ._core import ReadContext, Reading

__all__ = ["DMON_COLUMNS", "read_dmon"]

#: dmon column -> (GpuSample field, factor to the model's unit), from the field registry
#: (``gpuwarden/shared/fields.csv`` ``dmon``/``dmon_scale``). Others (enc, dec, jpg, ofa, pviol,
#: tviol, bar1, ccpm) have no GpuSample field and are skipped.
DMON_COLUMNS: dict[str, tuple[str, float]] = dmon_columns()
_INT_FIELDS = {f for f, _ in DMON_COLUMNS.values() if by_field()[f].type == "int"}


def read_dmon(text: str, ctx: ReadContext) -> Iterator[Reading]:
    """Readings of ``nvidia-smi dmon [-s pucvmet] [-o DT] [-d N]`` output.

    Header lines ``# gpu pwr gtemp ...`` and the units line ``# Idx W C ...`` may repeat (dmon
    reprints them); ``-`` is absent. With ``-o DT`` (``#Date Time gpu ...``, ``YYYYMMDD
    HH:MM:SS``, read in ``ctx.tz``) rows carry their time; without it, sample k (a new sample
    starts when a GPU index repeats) is placed k seconds after 0 (dmon's default ``-d 1``) and a
    note says so. ``fb`` MB is MiB; ``rxpci``/``txpci`` MB/s become KB/s.

    Raises:
        ValueError: a data line before any header, with a wrong column count, or a
            non-number in a numeric column (file and line named).
    """
    cols: list[str] | None = None
    sample = -1
    seen: set[int] = set()
    relative = False
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            toks = s[1:].split()
            if toks and toks[0].lower() in ("gpu", "date", "time") and "gpu" in [t.lower() for t in toks]:
                cols = [t.lower() for t in toks]
            continue
        where = f"{ctx.file}: line {n}"
        if cols is None:
            raise ValueError(f"{where}: dmon data before a '# gpu ...' header line")
        toks = s.split()
        if len(toks) != len(cols):
            if n == len(text.splitlines()):
                ctx.note(f"last line {n} truncated, skipped")
                continue
            raise ValueError(f"{where}: {len(toks)} values, header has {len(cols)}")
        row = dict(zip(cols, toks, strict=True))
        ctx.rows += 1
        try:
            gpu = int(row["gpu"])
        except ValueError as exc:
            raise ValueError(f"{where}: GPU index {row['gpu']!r} is not a number") from exc
        if "date" in row and "time" in row:
            try:
                dt = datetime.strptime(f"{row['date']} {row['time']}", "%Y%m%d %H:%M:%S")
            except ValueError as exc:
                raise ValueError(f"{where}: bad date/time {row['date']} {row['time']}") from exc
            ts = dt.replace(tzinfo=ctx.tz).timestamp()
        else:
            if gpu in seen or sample < 0:
                sample += 1
                seen = set()
            seen.add(gpu)
            ts = float(sample)
            relative = True
        vals: dict[str, Any] = {}
        for col, (fname, factor) in DMON_COLUMNS.items():
            raw = row.get(col)
            if raw is None or raw == "-":
                continue
            try:
                x = float(raw) * factor
            except ValueError as exc:
                raise ValueError(f"{where}: {col} = {raw!r} is not a number") from exc
            v: float | int = int(x) if fname in _INT_FIELDS else x
            if kept(fname, v, where, ctx.drop) is not None:
                vals[fname] = v
        yield ts, gpu, vals
    if relative:
        ctx.note("dmon without -o DT: no timestamps; sample k placed at k s from 0 (assumes dmon -d 1)")
