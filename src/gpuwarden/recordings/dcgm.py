"""Recorded dcgm-exporter scrapes (a series of ``/metrics`` files) as readings of a
:class:`~gpuwarden.recordings.Recording`; the scrape parser itself is
:mod:`gpuwarden.shared.nvidia.dcgm_exporter` (the collector's dcgm-exporter source uses it too)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from gpuwarden.shared.models import GpuEvent
from gpuwarden.shared.nvidia.dcgm_exporter import DcgmSeries, gpu_records, parse_scrape, xid_event

from ._core import ReadContext, Reading, TimeParser

__all__ = ["read_dcgm_scrapes"]

_SCRAPE_AT_RE = re.compile(r"^#\s*scrape(?:d)?\s+at\s+(?P<t>\S.*?)\s*$", re.MULTILINE | re.IGNORECASE)
_NAME_ISO_RE = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})[T_ -]?(\d{2})[:\-]?(\d{2})[:\-]?(\d{2})(Z)?")
_NAME_EPOCH_RE = re.compile(r"(?<!\d)(\d{13}|\d{10}(?:\.\d+)?)(?!\d)")


def _split_scrapes(name: str, text: str, tp: TimeParser) -> list[tuple[float | None, str]]:
    marks = list(_SCRAPE_AT_RE.finditer(text))
    if marks:
        out: list[tuple[float | None, str]] = []
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            out.append((tp.parse(m["t"]), text[m.end() : end]))
        return out
    if nm := _NAME_ISO_RE.search(name):
        y, mo, d, h, mi, sec, z = nm.groups()
        return [(tp.parse(f"{y}-{mo}-{d}T{h}:{mi}:{sec}{z or ''}"), text)]
    if ne := _NAME_EPOCH_RE.search(name):
        return [(tp.parse(ne.group(1)), text)]
    return [(None, text)]


def read_dcgm_scrapes(
    files: Sequence[tuple[str, str]], ctx: ReadContext, node: str, events: list[GpuEvent]
) -> Iterator[Reading]:
    """Readings of a series of dcgm-exporter scrapes: files ``(name, text)``, each holding one
    scrape or several concatenated. A scrape's time: its ``# scrape at <ISO or epoch>`` comment,
    else its samples' timestamps (ms; scrapes are then grouped by timestamp), else the time in
    the file name (``metrics-2025-01-21T02:21:33Z.txt``, ``1737426093.prom``). An XID event
    is appended to ``events`` when ``DCGM_FI_DEV_XID_ERRORS`` changes to a non-zero code.

    Raises:
        ValueError: a scrape with no time at all, or not Prometheus text (file named).
    """
    tp = TimeParser(ctx.tz)
    last_xid: dict[tuple[str, int | None], int] = {}
    index_of: dict[tuple[str, int | None], int] = {}
    for name, text in files:
        for ts, chunk in _split_scrapes(name, text, tp):
            try:
                series = parse_scrape(chunk)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from exc
            groups: dict[float, list[DcgmSeries]] = {}
            for s in series:
                t = ts if ts is not None else s.timestamp
                if t is None:
                    raise ValueError(
                        f"{name}: scrape without a time (no '# scrape at', sample timestamps or time in the name)"
                    )
                groups.setdefault(t, []).append(s)
            for t, grp in sorted(groups.items()):
                ctx.rows += len(grp)
                for key, r in gpu_records(grp, name, on_drop=ctx.drop).items():
                    if key not in index_of:
                        index_of[key] = key[1] if key[1] is not None else len(index_of)
                    idx = index_of[key]
                    xid = r.pop("_xid", None)
                    if xid is not None:
                        if xid != 0 and last_xid.get(key) != xid:
                            events.append(xid_event(node, t, idx, xid, r.get("pci_bus_id"), r.get("uuid")))
                        last_xid[key] = xid
                    yield t, idx, r
