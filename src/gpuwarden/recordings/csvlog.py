"""``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits] -l N / -lms N`` logs. Pure.

Values are read by :mod:`gpuwarden.shared.nvidia.smi_text` (``csv_header``, ``csv_converter``,
``CSV_SAMPLE_FIELDS``: the same code as ``gpuwarden parse nvidia-smi-csv``); this module adds
what a *log* needs: timestamps, which GPU a row belongs to, truncated last lines.
"""

from __future__ import annotations

import csv
import itertools
import statistics
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from gpuwarden.shared.nvidia.smi_text import (
    CSV_SAMPLE_FIELDS,
    SampleKind,
    csv_converter,
    csv_field_name,
    csv_header,
    csv_value_to_field,
)
from gpuwarden.shared.nvidia.values import BOUNDS

from ._core import ReadContext, Reading, TimeParser

__all__ = ["infer_gpu_count", "read_smi_csv_log"]

_INFER_ROWS = 4000
_MAX_GPUS = 16


def infer_gpu_count(times: Sequence[float]) -> int | None:
    """How many GPUs a log without an index column cycles through, from its row times (epoch s).

    nvidia-smi queries the GPUs of one sample a few ms apart and the samples ``-l``/``-lms``
    apart, so with N GPUs every N-th gap is long. Returns the smallest N in 2..16 for which
    the shortest 10 % of the gaps between samples are more than twice the longest 90 % of
    the gaps inside samples, else 1 (one GPU at any interval, 1 ms .. 60 s); None for fewer
    than 3 rows.
    """
    if len(times) < 3:
        return None
    d = [b - a for a, b in itertools.pairwise(times)]
    for n in range(2, _MAX_GPUS + 1):
        if len(d) < 3 * n:
            break
        between = sorted(x for i, x in enumerate(d) if (i + 1) % n == 0)
        within = sorted(x for i, x in enumerate(d) if (i + 1) % n != 0)
        if not between or not within:
            continue
        b10 = between[len(between) // 10]
        w90 = within[min(len(within) - 1, (len(within) * 9) // 10)]
        if b10 > 2 * max(w90, 0.0005):
            return n
    return 1


def _plan(names: list[str]) -> list[tuple[str, list[int], SampleKind, tuple[float, float] | None]]:
    pos = {n: i for i, n in enumerate(names)}
    plan = []
    for fname, keys, kind in CSV_SAMPLE_FIELDS:
        cols = [pos[k] for k in keys if k in pos]
        if cols:
            plan.append((fname, cols, kind, BOUNDS.get(fname)))
    return plan


def read_smi_csv_log(
    lines: Iterable[str], ctx: ReadContext, *, columns: Sequence[str] | None = None, gpus: int | None = None
) -> Iterator[Reading]:
    """Readings of an nvidia-smi ``--query-gpu`` CSV log (nvidia-smi 450 .. 595, any field subset),
    or of a custom logger writing the same values (``timestamp,gpu_index,temperature_C,...``).

    * Header from the file (units in brackets or not), else ``columns`` (nvidia-smi field names).
    * Values with or without units; ``[N/A]``/``N/A``/``[Not Supported]`` -> absent.
    * Timestamps: nvidia-smi's ``YYYY/MM/DD HH:MM:SS.mmm`` (in ``ctx.tz``), ISO-8601, epoch s.
    * GPU of a row: the ``index`` column; else ``pci.bus_id``/``uuid`` numbered in order of first
      appearance; else rows cycle through ``gpus`` GPUs, or through the count
      :func:`infer_gpu_count` reads from the row timing (said in ``ctx.notes``).
    * A ``driver_version`` column goes to the node sample; repeated header lines are skipped.

    Raises:
        ValueError: no header and no ``columns``; no timestamp column; a malformed line (wrong
            column count, text in a numeric field) anywhere but the last line, which is skipped
            with a note (a killed logger's truncated write). A value out of its field's range (a
            driver's sentinel) is dropped with a note (:meth:`ReadContext.drop`), not the file.
    """
    reader = csv.reader(lines, skipinitialspace=True)
    header_cells: list[str] | None = None
    first: list[str] | None = None
    for row in reader:
        if row and any(c.strip() for c in row):
            first = row
            break
    if first is None:
        raise ValueError(f"{ctx.file}: empty CSV")
    hdr = csv_header(first)
    pending: list[tuple[int, list[str]]] = []
    if hdr is not None:
        cols = hdr
        header_cells = [c.strip() for c in first]
    elif columns is not None:
        cols = [csv_field_name(c) or (c, None) for c in columns]
        pending.append((reader.line_num, first))
    else:
        raise ValueError(
            f"{ctx.file}: no CSV header line (nvidia-smi --format=csv,noheader): give the query fields in "
            "order (`gpuwarden analyze --columns timestamp,utilization.gpu,...`)"
        )
    names = [n for n, _ in cols]
    if "timestamp" not in names:
        raise ValueError(f"{ctx.file}: no timestamp column (query timestamp with --query-gpu=timestamp,...)")
    convs = [csv_converter(n, u) for n, u in cols]
    ncol = len(names)
    ts_i = names.index("timestamp")
    idx_i = names.index("index") if "index" in names else None
    ident_i = next((names.index(k) for k in ("pci.bus_id", "uuid", "gpu_bus_id", "gpu_uuid") if k in names), None)
    drv_i = names.index("driver_version") if "driver_version" in names else None
    plan = _plan(names)
    tp = TimeParser(ctx.tz)
    ident_map: dict[str, int] = {}

    def convert(line_no: int, row: list[str]) -> tuple[float, int | None, dict[str, Any]]:
        where = f"{ctx.file}: line {line_no}"
        if len(row) != ncol:
            raise ValueError(f"{where}: {len(row)} values, header has {ncol}")
        try:
            ts = tp.parse(row[ts_i])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        vals = [c(r) for c, r in zip(convs, row, strict=True)]
        out: dict[str, Any] = {}
        for fname, cidx, kind, b in plan:
            for ci in cidx:
                x = vals[ci]
                if x is None:
                    continue
                got = csv_value_to_field(kind, x)
                if got is None:
                    raise ValueError(f"{where}: {names[ci]} = {x!r} is not a {kind}")
                if b is not None and not (b[0] <= got <= b[1]):
                    ctx.drop(fname, f"{where}: {names[ci]} = {got} is out of range [{b[0]:g}, {b[1]:g}]")
                    continue
                out[fname] = got
                break
        if drv_i is not None and vals[drv_i] is not None:
            out["driver_version"] = vals[drv_i]
        gpu: int | None = None
        if idx_i is not None:
            xi = vals[idx_i]
            if not isinstance(xi, float) or xi < 0 or xi != int(xi):
                raise ValueError(f"{where}: GPU index {row[idx_i]!r} is not a GPU index")
            gpu = int(xi)
        elif ident_i is not None:
            key = out.get("pci_bus_id") or out.get("uuid") or vals[ident_i]
            if isinstance(key, str):
                if key not in ident_map:
                    ident_map[key] = len(ident_map)
                gpu = ident_map[key]
        return ts, gpu, out

    # Rows are converted one behind the reader, so the last row's errors become a note.
    converted: list[tuple[float, int | None, dict[str, Any]]] = []
    cycle = gpus
    need_cycle = idx_i is None and ident_i is None
    k = 0

    def emit(item: tuple[float, int | None, dict[str, Any]]) -> Iterator[Reading]:
        nonlocal k
        ts, gpu, out = item
        if gpu is None:
            assert cycle is not None
            gpu = k % cycle
        k += 1
        yield ts, gpu, out

    def rows() -> Iterator[tuple[int, list[str]]]:
        yield from pending
        for r in reader:
            if not r or not any(c.strip() for c in r):
                continue
            if header_cells is not None and len(r) == ncol and [c.strip() for c in r] == header_cells:
                continue
            yield reader.line_num, r

    prev: tuple[int, list[str]] | None = None
    for item in rows():
        if prev is not None:
            ctx.rows += 1
            c = convert(*prev)
            if need_cycle and cycle is None:
                converted.append(c)
                if len(converted) >= _INFER_ROWS:
                    cycle = _infer(converted, ctx)
                    for cv in converted:
                        yield from emit(cv)
                    converted = []
            else:
                yield from emit(c)
        prev = item
    if prev is not None:
        ctx.rows += 1
        try:
            c = convert(*prev)
        except ValueError as exc:
            ctx.note(f"last line {prev[0]} truncated or malformed, skipped ({exc})")
        else:
            if need_cycle and cycle is None:
                converted.append(c)
            else:
                yield from emit(c)
    if need_cycle and cycle is None:
        cycle = _infer(converted, ctx) if converted else 1
    for cv in converted:
        yield from emit(cv)
    if need_cycle and cycle and k % cycle:
        ctx.note(f"{k} rows is not a multiple of {cycle} GPUs: the last sample is partial")


def _infer(rows: list[tuple[float, int | None, dict[str, Any]]], ctx: ReadContext) -> int:
    n = infer_gpu_count([r[0] for r in rows]) or 1
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(rows)]
    med = statistics.median(gaps) if gaps else 0.0
    ctx.note(
        f"no index column: inferred {n} GPU{'s' if n != 1 else ''} from row timing "
        f"(median row gap {med * 1000:.1f} ms); rows assigned to GPUs 0..{n - 1} in turn"
    )
    return n
