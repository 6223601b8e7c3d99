"""Shared pieces of the recording readers: readings, timestamps, per-tick summaries. Pure."""

from __future__ import annotations

import calendar
import gzip
import io
import itertools
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from gpuwarden.shared.models import GpuEvent, GpuSample, NodeSample
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id

#: One source reading: (ts epoch s, GPU index, {GpuSample field or "driver_version"/"cuda_version": value}).
Reading = tuple[float, int, dict[str, Any]]

META_KEYS = frozenset({"driver_version", "cuda_version"})
_IDENTITY = frozenset({"index"})


@dataclass
class ReadContext:
    """What a reader reports besides its readings: rows read and notes for :class:`Recording`."""

    file: str
    tz: tzinfo
    notes: list[str] = field(default_factory=list)
    rows: int = 0
    #: field -> readings dropped as out of range (:meth:`drop`)
    dropped: dict[str, int] = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.notes.append(f"{self.file}: {text}")

    def drop(self, field_name: str, message: str) -> None:
        """A reading the model cannot hold was dropped (:mod:`gpuwarden.shared.nvidia.values`):
        noted the first time per field (``message`` names file, line and value), counted after."""
        n = self.dropped.get(field_name, 0)
        self.dropped[field_name] = n + 1
        if n == 0:
            self.notes.append(f"{message}: dropped (not reported), and any later {field_name} reading out of range")


def pci_key(text: str | None) -> str | None:
    """A PCI bus id in the one spelling used to compare GPUs across files (``dddd:bb:dd.f``
    lower-case: ``00000000:9B:00.0``, ``0000:9b:00``, ``PCI:0000:9b:00`` and ``9b:00.0`` are
    one GPU); text that is no bus id is compared lower-cased; None stays None."""
    if not text:
        return None
    try:
        return normalize_pci_bus_id(text)
    except ValueError:
        return text.strip().lower()


def attach_gpu_ids(events: Iterable[GpuEvent], gpus: Sequence[GpuSample]) -> list[GpuEvent]:
    """Events naming a GPU by PCI bus id (any spelling, :func:`pci_key`) or UUID get that GPU's
    index, UUID and bus id from the telemetry's ``gpus`` (one node's inventory: ``index``,
    ``pci_bus_id``, ``uuid``); an event that already has an index, or names a GPU the
    inventory lacks, is returned unchanged. Order is kept."""
    by_pci: dict[str, GpuSample] = {}
    by_uuid: dict[str, GpuSample] = {}
    for gs in gpus:
        if (k := pci_key(gs.pci_bus_id)) is not None:
            by_pci.setdefault(k, gs)
        if gs.uuid:
            by_uuid.setdefault(gs.uuid.lower(), gs)
    out = []
    for e in events:
        g: GpuSample | None = None
        if e.gpu_index is None:
            k = pci_key(e.pci_bus_id)
            g = by_pci.get(k) if k is not None else None
            if g is None and e.gpu_uuid:
                g = by_uuid.get(e.gpu_uuid.lower())
        if g is None:
            out.append(e)
            continue
        out.append(
            e.model_copy(
                update={
                    "gpu_index": g.index,
                    "gpu_uuid": e.gpu_uuid or g.uuid,
                    "pci_bus_id": pci_key(e.pci_bus_id) or pci_key(g.pci_bus_id),
                }
            )
        )
    return out


#: Bytes of a file's start that :func:`detect_encoding` looks at.
ENCODING_PROBE_BYTES = 4096
_GZIP_MAGIC = b"\x1f\x8b"


def detect_encoding(head: bytes) -> tuple[str, int]:
    """The text encoding of a file from its first bytes: ``(codec, BOM length in bytes)``.

    A byte-order mark decides (UTF-8 ``EF BB BF``; UTF-16LE ``FF FE``, as PowerShell's ``>``
    and ``Out-File`` write; UTF-16BE ``FE FF``); without one, UTF-16 is recognised by its NUL
    bytes (ASCII text in UTF-16LE has a NUL at every odd offset, in UTF-16BE at every even one:
    at least 40 % of those offsets NUL and at most 5 % of the others); everything else is read
    as UTF-8 (undecodable bytes become U+FFFD later). Never raises.
    """
    if head.startswith(b"\xef\xbb\xbf"):
        return "utf-8", 3
    if head.startswith(b"\xff\xfe"):
        return "utf-16-le", 2
    if head.startswith(b"\xfe\xff"):
        return "utf-16-be", 2
    sample = head[: len(head) - len(head) % 2]
    n = len(sample) // 2
    if n >= 2:
        even, odd = sample[0::2].count(0), sample[1::2].count(0)
        if odd >= 0.4 * n and even <= 0.05 * n:
            return "utf-16-le", 0
        if even >= 0.4 * n and odd <= 0.05 * n:
            return "utf-16-be", 0
    return "utf-8", 0


def _open_binary(path: Path) -> io.BufferedReader | gzip.GzipFile:
    """``path`` for reading bytes, gunzipped when it starts with the gzip magic (any name)."""
    f = open(path, "rb")  # noqa: SIM115 - returned to the caller
    if f.read(2) == _GZIP_MAGIC:
        f.close()
        return gzip.GzipFile(path, "rb")
    f.seek(0)
    return f


def open_text(path: Path, *, newline: str | None = "") -> io.TextIOBase:
    """``path`` opened for reading text, for streaming readers: the one place recordings are opened.

    Gzip is recognised by its magic bytes (``.gz`` or not) and decompressed; the encoding is
    :func:`detect_encoding`'s on the (decompressed) first :data:`ENCODING_PROBE_BYTES` bytes,
    its byte-order mark skipped; undecodable bytes become U+FFFD. ``newline`` as for
    :func:`open`: ``""`` (the default) keeps ``\\r\\n`` for the :mod:`csv` reader, None
    translates CRLF and CR to ``\\n``.

    Raises:
        OSError: the file cannot be read.
    """
    raw = _open_binary(path)
    try:
        enc, bom = detect_encoding(raw.read(ENCODING_PROBE_BYTES))
        raw.seek(bom)
    except BaseException:
        raw.close()
        raise
    return io.TextIOWrapper(raw, encoding=enc, errors="replace", newline=newline)


def read_text(path: Path) -> str:
    """The whole text of ``path`` as :func:`open_text` decodes it, line ends translated to ``\\n``.

    Raises:
        OSError: the file cannot be read.
    """
    with open_text(path, newline=None) as f:
        return f.read()


# -- timestamps -----------------------------------------------------------------------------

_ZONE_RE = re.compile(r"^(?:[.,](?P<frac>\d{1,9}))?\s*(?P<tz>Z|UTC|[+-]\d{2}:?\d{2})?$")
_CTIME_RE = re.compile(
    r"^(?:\w{3} )?(?P<mon>\w{3}) +(?P<day>\d{1,2}) (?P<t>\d{2}:\d{2}:\d{2})(?P<frac>\.\d+)? (?P<y>\d{4})$"
)


class TimeParser:
    """Reads the timestamps of recordings into UTC epoch s, caching per second (fast on 10 Hz logs).

    Accepted: nvidia-smi's ``YYYY/MM/DD HH:MM:SS.mmm`` (local time of the host: read in ``tz``),
    ISO-8601 with ``T`` or space, optional fraction and zone (``2025-09-24T03:48:33.493Z``,
    ``+00:00``, ``+0000``; no zone: ``tz``), ctime (``Tue Dec  1 13:21:04 2026``, in ``tz``) and
    epoch seconds or milliseconds (a number > 1e11 is ms).
    """

    def __init__(self, tz: tzinfo) -> None:
        self.tz = tz
        self._cache: dict[str, float] = {}

    def _base(self, key: str, zone: str | None) -> float:
        ck = key + (zone or "")
        got = self._cache.get(ck)
        if got is not None:
            return got
        y, mo, d = int(key[0:4]), int(key[5:7]), int(key[8:10])
        h, mi, s = int(key[11:13]), int(key[14:16]), int(key[17:19])
        if zone:
            if zone in ("Z", "UTC"):
                off = 0
            else:
                z = zone.replace(":", "")
                off = (int(z[1:3]) * 3600 + int(z[3:5]) * 60) * (-1 if z[0] == "-" else 1)
            v = float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) - off)
        else:
            v = datetime(y, mo, d, h, mi, s, tzinfo=self.tz).timestamp()
        self._cache[ck] = float(v)
        return float(v)

    def parse(self, text: str) -> float:
        """Epoch s of ``text``.

        Raises:
            ValueError: not a timestamp in one of the accepted forms.
        """
        s = text.strip()
        if len(s) >= 19 and s[4] in "/-" and s[10] in " T" and s[13] == ":":
            tail = s[19:]
            if tail[:1] == "." and tail[1:].isdigit():  # nvidia-smi's own form: no zone, fast path
                got = self._cache.get(s[:19])
                if got is None:
                    got = self._base(s[:19], None)
                return float(got + int(tail[1:]) / 10 ** (len(tail) - 1))
            m = _ZONE_RE.match(tail)
            if m is None:
                raise ValueError(f"not a timestamp: {text!r}")
            try:
                base = self._base(s[:19], m["tz"])
            except ValueError as exc:
                raise ValueError(f"not a timestamp: {text!r}") from exc
            frac = m["frac"]
            return base + (int(frac) / 10 ** len(frac) if frac else 0.0)
        try:
            x = float(s)
        except ValueError:
            pass
        else:
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"not a timestamp: {text!r}")
            return x / 1000.0 if x > 1e11 else x
        if m2 := _CTIME_RE.match(" ".join(s.split())):
            dt = datetime.strptime(f"{m2['y']} {m2['mon']} {m2['day']} {m2['t']}", "%Y %b %d %H:%M:%S")
            frac2 = float(m2["frac"]) if m2["frac"] else 0.0
            return dt.replace(tzinfo=self.tz).timestamp() + frac2
        raise ValueError(f"not a timestamp: {text!r}")


# -- per-tick summaries -----------------------------------------------------------------------

_MEAN = frozenset(
    {
        "utilization_gpu_pct",
        "utilization_memory_pct",
        "power_w",
        "fan_speed_pct",
        "tensor_activity_pct",
        "sm_occupancy_pct",
        "pcie_tx_kbps",
        "pcie_rx_kbps",
    }
)
_MAX = frozenset({"temperature_c", "memory_temperature_c"})
_MIN = frozenset({"sm_clock_mhz", "graphics_clock_mhz", "memory_clock_mhz"})
_ANY = frozenset({"remapped_rows_pending", "remapped_rows_failure", "retired_pages_pending"})
_UNION = frozenset({"throttle_reasons"})


class TickAggregator:
    """Folds readings into one summary per (tick, GPU): mean utilisation/power (and the other
    rates), max temperatures, min clocks, every throttle reason seen, any pending/failed flag,
    the last value of everything else (counters, memory used, names). A tick without readings
    gets no sample; nothing is forward-filled; None values are ignored (absent, not zero).
    """

    def __init__(self, tick_s: float) -> None:
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        self.tick_s = tick_s
        self._acc: dict[tuple[int, int], dict[str, Any]] = {}
        self._meta: dict[int, dict[str, str]] = {}
        self.times: dict[int, list[float]] = {}
        self.fields: set[str] = set()
        self.pci: dict[int, str] = {}
        self.uuid: dict[int, str] = {}

    def add(self, ts: float, gpu: int, values: dict[str, Any]) -> None:
        """Fold one reading of GPU ``gpu`` at ``ts`` (epoch s)."""
        tick = math.floor(ts / self.tick_s)
        tl = self.times.get(gpu)
        if tl is None:
            tl = self.times[gpu] = []
        tl.append(ts)
        key = (tick, gpu)
        acc = self._acc.get(key)
        if acc is None:
            acc = self._acc[key] = {}
        for f, v in values.items():
            if v is None:
                continue
            if f in META_KEYS:
                self._meta.setdefault(tick, {})[f] = v
                continue
            if f in _MEAN:
                st = acc.get(f)
                if st is None:
                    acc[f] = [v, 1]
                else:
                    st[0] += v
                    st[1] += 1
            elif f in _MAX:
                old = acc.get(f)
                acc[f] = v if old is None or v > old else old
            elif f in _MIN:
                old = acc.get(f)
                acc[f] = v if old is None or v < old else old
            elif f in _UNION:
                old = acc.get(f)
                if old is None:
                    acc[f] = list(v)
                else:
                    old.extend(r for r in v if r not in old)
            elif f in _ANY:
                acc[f] = bool(acc.get(f)) or bool(v)
            else:
                acc[f] = v
                if f == "pci_bus_id":
                    self.pci.setdefault(gpu, v)
                elif f == "uuid":
                    self.uuid.setdefault(gpu, v)
            if f not in self.fields:
                self.fields.add(f)

    def samples(self, node: str, source: str, collector_id: str) -> list[NodeSample]:
        """One :class:`NodeSample` per tick with readings, ts = tick start, ascending; GPUs by index.

        Values were range-checked by the readers, so the models are built without validation.
        """
        by_tick: dict[int, list[GpuSample]] = {}
        for (tick, gpu), acc in sorted(self._acc.items()):
            data: dict[str, Any] = {}
            for f, v in acc.items():
                data[f] = v[0] / v[1] if f in _MEAN else v
            if "throttle_reasons" not in data:
                data["throttle_reasons"] = []
            by_tick.setdefault(tick, []).append(GpuSample.model_construct(index=gpu, **data))
        out = []
        for tick, gpus in by_tick.items():
            meta = self._meta.get(tick, {})
            out.append(
                NodeSample.model_construct(
                    node=node,
                    ts=tick * self.tick_s,
                    collector_id=collector_id,
                    source=source,
                    gpus=gpus,
                    driver_version=meta.get("driver_version"),
                    cuda_version=meta.get("cuda_version"),
                )
            )
        return out

    def interval_s(self) -> float | None:
        """Median interval between consecutive readings of the lowest-index GPU, s."""
        if not self.times:
            return None
        ts = sorted(self.times[min(self.times)])
        diffs = [b - a for a, b in itertools.pairwise(ts) if b > a]
        return statistics.median(diffs) if diffs else None

    def gaps(self, interval: float | None) -> list[tuple[float, float]]:
        """Spans (start, end), epoch s, with no reading of any GPU longer than max(3 x interval, 2 x tick)."""
        if interval is None:
            return []
        limit = max(3 * interval, 2 * self.tick_s)
        allts = sorted(t for tl in self.times.values() for t in tl)
        return [(a, b) for a, b in itertools.pairwise(allts) if b - a > limit]


def merge_sorted_events(events: Iterable[Any]) -> list[Any]:
    """Events sorted by ts (stable), duplicates (same event_id) dropped."""
    seen: set[str] = set()
    out = []
    for e in sorted(events, key=lambda e: e.ts):
        if e.event_id in seen:
            continue
        seen.add(e.event_id)
        out.append(e)
    return out
