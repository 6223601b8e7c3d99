"""``load_recording``: one node's telemetry recording (any mix of files) -> :class:`Recording`. Pure
apart from reading the given files."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, NodeSample

from ._core import (
    ReadContext,
    Reading,
    TickAggregator,
    attach_gpu_ids,
    merge_sorted_events,
    open_text,
    pci_key,
    read_text,
)

__all__ = ["FORMATS", "Recording", "detect_format", "load_recording"]


@dataclass(frozen=True)
class Recording:
    """One node's recorded telemetry, ready to replay in event time.

    ``samples``: one :class:`NodeSample` per tick that has readings, ts = tick start (UTC epoch
    s), ascending; a field the recording lacks is None in every sample. ``events``: XID/SXID
    events of kernel logs (and DCGM XID changes), original timestamps, ascending. ``fields``:
    the GpuSample fields with at least one reading. ``interval_s``: median source interval of
    one GPU, s. ``gaps``: (start, end) spans, epoch s, without any reading longer than
    max(3 x interval, 2 x tick). ``rows``: source rows (CSV lines, dmon lines, scrape series,
    report GPUs, kernel-log lines) read. ``formats``: file -> detected format. ``notes``: what
    the reader assumed or skipped. ``start_ts``/``end_ts``: first and last reading or event,
    epoch s (None for a recording without either). ``spans``: file -> (first, last) epoch s of
    its readings (a kernel log: of its events; dcgm-exporter scrapes: of the whole series);
    files without any are left out.
    """

    node: str
    samples: list[NodeSample]
    events: list[GpuEvent]
    fields: frozenset[str]
    gpu_indices: list[int]
    start_ts: float | None
    end_ts: float | None
    interval_s: float | None
    gaps: list[tuple[float, float]]
    rows: int
    formats: dict[str, str]
    notes: list[str]
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)


FORMATS = (
    "nvidia-smi-csv",
    "nvidia-smi-dmon",
    "dcgm-exporter",
    "nvidia-smi-table",
    "nvidia-smi-xml",
    "nvidia-smi-q",
    "kernel-log",
    "journalctl-json",
)

_KERNEL_LINE_RE = re.compile(
    r"^(?:\[\s*\d+\.\d+\]|\[\w{3} \w{3} +\d+ [\d:]{8} \d{4}\]|"
    r"\d{4}-\d{2}-\d{2}T[\d:]{8}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})\s|"
    r"\w{3} +\d+ [\d:]{8}|kern\s*:|\d+,\d+,\d+,[^;]*;)"
)
_DMON_RE = re.compile(r"^#\s*(?:Date\s+Time\s+)?(?:Time\s+)?gpu\s+", re.MULTILINE)


def detect_format(head: str) -> str:
    """The format of a recording from its first few KiB of text (see :data:`FORMATS`).

    Raises:
        ValueError: none of the known formats.
    """
    h = head.lstrip("\ufeff")
    s = h.lstrip()
    if s.startswith("<?xml") or "<nvidia_smi_log" in h:
        return "nvidia-smi-xml"
    if "==============NVSMI LOG==============" in h:
        return "nvidia-smi-q"
    if "NVIDIA-SMI " in h and "+---" in h:
        return "nvidia-smi-table"
    if _DMON_RE.search(h):
        return "nvidia-smi-dmon"
    if "DCGM_FI_" in h:
        return "dcgm-exporter"
    if s.startswith("{") and "__REALTIME_TIMESTAMP" in h:
        return "journalctl-json"
    lines = [ln for ln in h.splitlines()[:50] if ln.strip() and not ln.startswith("-- ")]
    if lines and sum(bool(_KERNEL_LINE_RE.match(ln)) for ln in lines) >= max(1, len(lines) // 2):
        return "kernel-log"
    if lines and "," in lines[0]:
        return "nvidia-smi-csv"
    raise ValueError("unknown recording format (not nvidia-smi CSV/dmon/table/-q/-x, dcgm-exporter or a kernel log)")


def _files(paths: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith(".")))
        elif p.exists():
            out.append(p)
        else:
            raise ValueError(f"{p}: no such file or directory")
    return out


def _head(path: Path) -> str:
    with open_text(path) as f:
        return f.read(16384)


def load_recording(
    paths: Sequence[str | Path],
    *,
    node: str = "recorded-node",
    gpus: int | None = None,
    columns: Sequence[str] | None = None,
    tick_s: float = 1.0,
    fmt: str | None = None,
    tz: tzinfo = UTC,
    boot_ts: float | None = None,
) -> Recording:
    """Read a recording of one node: telemetry files and kernel logs, gzipped or not.

    Args:
        paths: files, or folders (their files, sorted by name; dcgm-exporter scrapes may be
            one file per scrape named by time).
        node: node name for the samples and events.
        gpus: GPU count of a CSV log without an index column (else inferred from row timing).
        columns: nvidia-smi field names of a headerless CSV log (``--format=csv,noheader``).
        tick_s: sample period, s; finer readings are summarised per tick
            (:class:`~gpuwarden.recordings._core.TickAggregator`), coarser ones give
            one sample at their own tick and nothing between.
        fmt: force one format of :data:`FORMATS` for every file; None detects each by content.
        tz: zone of timestamps printed without one (nvidia-smi and ``dmesg -T`` print local time).
        boot_ts: boot time, epoch s, for kernel logs with relative ``[ 123.456]`` stamps (else
            they keep seconds since boot, from 0, and a note says so).

    Text is decoded in one place (:func:`~gpuwarden.recordings._core.open_text`):
    UTF-8 with or without BOM, UTF-16LE/BE with BOM (PowerShell's ``>``) or without, CRLF or LF,
    gzipped or not, all read the same. A kernel log's events get the GPU index, UUID and PCI
    bus id of the telemetry GPU with the same PCI bus id (any spelling) or UUID.

    Raises:
        ValueError: a missing file, an unknown format, a malformed line (naming file and line),
            or ``tick_s`` <= 0.
    """
    from .dcgm import read_dcgm_scrapes
    from .dmon import read_dmon
    from .kernel import read_kernel_log
    from .smi import read_smi_q, read_smi_xml
    from .table import read_smi_tables

    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    agg = TickAggregator(tick_s)
    files = _files(paths)
    formats: dict[str, str] = {}
    notes: list[str] = []
    rows = 0
    kernel: list[tuple[Path, str, ReadContext]] = []
    events: list[GpuEvent] = []
    sources: list[str] = []
    dcgm_files: list[Path] = []
    spans: dict[str, tuple[float, float]] = {}
    if not files:
        raise ValueError(f"{', '.join(map(str, paths))}: no recording files (an empty folder?)")
    for path in files:
        head = _head(path)
        if fmt is None and not head.strip():
            raise ValueError(f"{path}: empty file")
        try:
            f = fmt or detect_format(head)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        formats[str(path)] = f
        ctx = ReadContext(path.name, tz)
        readings: Iterator[Reading] | None = None
        before = {g: len(tl) for g, tl in agg.times.items()}
        if f == "nvidia-smi-csv":
            from .csvlog import read_smi_csv_log

            with open_text(path) as fh:
                for ts, gpu, vals in read_smi_csv_log(fh, ctx, columns=columns, gpus=gpus):
                    agg.add(ts, gpu, vals)
        elif f in ("kernel-log", "journalctl-json"):
            kernel.append((path, f, ctx))
            continue
        elif f == "dcgm-exporter":
            dcgm_files.append(path)
            continue
        else:
            text = read_text(path)
            reader: Callable[[str, ReadContext], Iterator[Reading]] = {
                "nvidia-smi-dmon": read_dmon,
                "nvidia-smi-table": read_smi_tables,
                "nvidia-smi-xml": read_smi_xml,
                "nvidia-smi-q": read_smi_q,
            }[f]
            readings = reader(text, ctx)
            for ts, gpu, vals in readings:
                agg.add(ts, gpu, vals)
        new = [t for g, tl in agg.times.items() for t in tl[before.get(g, 0) :]]
        if new:
            spans[str(path)] = (min(new), max(new))
        sources.append(f)
        notes.extend(ctx.notes)
        rows += ctx.rows
    if dcgm_files:
        ctx = ReadContext(dcgm_files[0].name if len(dcgm_files) == 1 else str(dcgm_files[0].parent), tz)
        dcgm_events: list[GpuEvent] = []
        for ts, gpu, vals in read_dcgm_scrapes([(p.name, read_text(p)) for p in dcgm_files], ctx, node, dcgm_events):
            agg.add(ts, gpu, vals)
        events.extend(dcgm_events)
        series = [t for tl in agg.times.values() for t in tl] + [e.ts for e in dcgm_events]
        if series:
            for p in dcgm_files:
                spans[str(p)] = (min(series), max(series))
        sources.append("dcgm-exporter")
        notes.extend(ctx.notes)
        rows += ctx.rows
    interval = agg.interval_s()
    source = sources[0] if len(set(sources)) == 1 else "recording"
    samples = agg.samples(node, source, f"recording:{node}")
    year = datetime.fromtimestamp(samples[0].ts, UTC).year if samples else None
    inventory = [
        GpuSample.model_construct(index=i, pci_bus_id=agg.pci.get(i), uuid=agg.uuid.get(i))
        for i in sorted(set(agg.pci) | set(agg.uuid))
    ]
    known = ({pci_key(g.pci_bus_id) for g in inventory} | {(g.uuid or "").lower() for g in inventory}) - {None, ""}
    absolute = bool(samples) and samples[0].ts >= 1e9
    for path, f, ctx in kernel:
        evs = read_kernel_log(read_text(path), ctx, node, json=f == "journalctl-json", boot_ts=boot_ts, year=year)
        evs = attach_gpu_ids(evs, inventory)
        if inventory:
            strangers = sorted(
                {
                    e.pci_bus_id
                    for e in evs
                    if e.gpu_index is None
                    and e.pci_bus_id
                    and e.kind is not EventKind.SXID
                    and pci_key(e.pci_bus_id) not in known
                    and (e.gpu_uuid or "").lower() not in known
                }
            )
            if strangers:
                ctx.note(
                    f"names GPU{'s' if len(strangers) > 1 else ''} {', '.join(strangers)}, which the telemetry "
                    "does not list (another node's log?): those events carry no GPU index"
                )
        if absolute and evs and evs[0].ts < 1e9:
            ctx.note(
                "its stamps are seconds since boot while the telemetry has wall-clock times: give the boot "
                "time (`gpuwarden analyze --boot-time`) to line the two up"
            )
        if evs:
            spans[str(path)] = (evs[0].ts, evs[-1].ts)
        events.extend(evs)
        notes.extend(ctx.notes)
        rows += ctx.rows
    all_ts = [t for tl in agg.times.values() for t in tl] + [e.ts for e in events]
    return Recording(
        node=node,
        samples=samples,
        events=merge_sorted_events(events),
        fields=frozenset(agg.fields - {"index"}),
        gpu_indices=sorted(agg.times),
        start_ts=min(all_ts) if all_ts else None,
        end_ts=max(all_ts) if all_ts else None,
        interval_s=interval,
        gaps=agg.gaps(interval),
        rows=rows,
        formats=formats,
        notes=notes,
        spans=spans,
    )
