"""Shared pieces of the recording readers: readings, timestamps, per-tick summaries. Pure."""

from __future__ import annotations

import calendar
import gzip
import io
import itertools
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from annotated_types import Ge, Le

from gpuwarden.shared.models import GpuSample, NodeSample

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

    def note(self, text: str) -> None:
        self.notes.append(f"{self.file}: {text}")


def read_text(path: Path) -> str:
    """The text of ``path``; ``.gz`` files are decompressed. Undecodable bytes become U+FFFD."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", errors="replace", newline="") as f:
            return f.read()
    return path.read_text(errors="replace")


def open_text(path: Path) -> io.TextIOBase:
    """``path`` opened for reading text (``.gz`` transparently), for streaming readers."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", errors="replace", newline="")
    return open(path, errors="replace", newline="")


# -- bounds of GpuSample fields (from the model, so they cannot drift) ----------------------


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
