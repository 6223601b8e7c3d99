"""The chaos bench's ``windows lost``: every job window the samples on ``gpu.samples`` imply,
checked against what ``job.windows`` carried (issue 25).

The chaos fleet runs one job holding every GPU of every node for the whole run
(:func:`gpuwarden.sim.bench.chaos.chaos_scenario`), so every valid sample of a node must reach a
job window: the window ``(node, GPU index, start)`` with ``start = floor(ts / size) * size``,
holding as many readings as distinct sample times. A window is *lost* when its node's samples
closed it in event time (the node's newest valid sample is at or past ``start + size + grace``,
the correlator's own rule) and ``job.windows`` has no record of it; *readings lost* counts the
readings of the windows that did arrive with fewer readings than their samples.

A sample is valid when it decodes (:func:`gpuwarden.shared.bus.decode`) and is not one of the
records the bench injected as hostile or fuzz (by topic, partition and offset: a hostile record
can be schema-valid and still outside the contract, e.g. a day ahead of the wall clock). The
comparison is against the samples themselves, not against a second run without the hostile
records: a window the faults (broker and service kills, the outage) lost counts too.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import JobWindow, NodeSample

__all__ = ["WindowLedger", "WindowLoss"]

#: (node, GPU index, window start epoch s)
WindowKey = tuple[str, int, float]


@dataclass
class WindowLoss:
    """What :meth:`WindowLedger.loss` found.

    Attributes:
        expected: closed windows the valid samples imply.
        lost: of those, windows ``job.windows`` never carried.
        readings_lost: readings missing from the windows that did arrive (samples of the
            window's GPU at distinct times minus the window's ``samples``, where positive).
        examples: up to 5 lost window keys, for the notes.
        short: up to 5 windows that came with readings missing, as (key, readings it carried,
            readings its samples imply, the missing sample times as offsets in the window, s).
    """

    expected: int = 0
    lost: int = 0
    readings_lost: int = 0
    examples: list[WindowKey] = field(default_factory=list)
    short: list[tuple[WindowKey, int, int, list[float]]] = field(default_factory=list)


class WindowLedger:
    """Feed it the raw records of ``gpu.samples`` and ``job.windows`` (:meth:`observe`), then ask
    for the :meth:`loss`.

    Args:
        size_s: the correlator's window length, s (``GPUWARDEN_CORRELATOR_WINDOW_S``).
        grace_s: its grace after a window's end, s (``GPUWARDEN_CORRELATOR_WINDOW_GRACE_S``).
    """

    def __init__(self, size_s: float = 10.0, grace_s: float = 5.0) -> None:
        self.size_s = size_s
        self.grace_s = grace_s
        #: window -> {(partition, offset) of a sample -> its ts}
        self._samples: dict[WindowKey, dict[tuple[int, int], float]] = defaultdict(dict)
        #: (partition, offset) of each valid sample -> its node and ts (for the exclusions)
        self._sample_at: dict[tuple[int, int], tuple[str, float]] = {}
        #: window -> the most readings any job.windows record of it carried
        self._windows: dict[WindowKey, int] = {}

    def observe(self, short: str, partition: int, offset: int, value: bytes | None) -> None:
        """One record of ``short`` (``gpu.samples`` or ``job.windows``; others are ignored). A
        record that does not decode is ignored (the bench's fuzz)."""
        if short not in ("gpu.samples", "job.windows"):
            return
        try:
            msg = decode(short, value)
        except (ValueError, ValidationError):
            return
        if isinstance(msg, NodeSample):
            if not math.isfinite(msg.ts):  # pragma: no cover - the model refuses it
                return
            start = math.floor(msg.ts / self.size_s) * self.size_s
            self._sample_at[(partition, offset)] = (msg.node, msg.ts)
            for g in msg.gpus:
                self._samples[(msg.node, g.index, start)][(partition, offset)] = msg.ts
        elif isinstance(msg, JobWindow):
            k = (msg.node, msg.gpu_index, msg.window_start)
            self._windows[k] = max(self._windows.get(k, 0), msg.samples)

    def loss(self, exclude: Collection[tuple[int, int]] = ()) -> WindowLoss:
        """Windows lost and readings lost, leaving out the samples at ``exclude`` ((partition,
        offset) of ``gpu.samples`` records the bench injected). Windows a node's valid samples
        have not closed yet (the newest ones at the end of the run) are not counted."""
        skip = set(exclude)
        newest: dict[str, float] = {}
        for at, (node, ts) in self._sample_at.items():
            if at not in skip and ts > newest.get(node, -math.inf):
                newest[node] = ts
        out = WindowLoss()
        for key in sorted(self._samples):
            node, _, start = key
            times = {ts for at, ts in self._samples[key].items() if at not in skip}
            if not times or newest.get(node, -math.inf) < start + self.size_s + self.grace_s:
                continue
            out.expected += 1
            got = self._windows.get(key)
            if got is None:
                out.lost += 1
                if len(out.examples) < 5:
                    out.examples.append(key)
            elif got < len(times):
                out.readings_lost += len(times) - got
                if len(out.short) < 5:
                    out.short.append((key, got, len(times), sorted(round(t - start, 3) for t in times)))
        return out

    def missing_ticks(
        self,
        tick_s: float,
        exclude: Collection[tuple[int, int]] = (),
        excused: Collection[tuple[float, float]] = (),
        node_excused: Mapping[str, Collection[tuple[float, float]]] | None = None,
    ) -> tuple[int, list[tuple[str, float]]]:
        """Samples lost before Kafka: the ticks of each node (every ``tick_s`` s of event time
        from its first valid sample on ``gpu.samples`` to its last) that have no sample there,
        leaving out the samples at ``exclude`` and the ticks inside an excused event-time
        interval ``[from, to)``: one of ``excused`` (every node's: the collector was down, and a
        tick never taken is not a tick lost) or of the node's in ``node_excused`` (ticks its
        source skipped on purpose, e.g. the simulator's logger gaps).

        Returns (missing ticks, up to 5 examples as (node, event time)).
        """
        skip = set(exclude)
        by_node: dict[str, set[float]] = defaultdict(set)
        for at, (node, ts) in self._sample_at.items():
            if at not in skip:
                by_node[node].add(ts)
        missing = 0
        examples: list[tuple[str, float]] = []
        for node in sorted(by_node):
            times = sorted(by_node[node])
            first = times[0]
            have = {round((t - first) / tick_s) for t in times}
            for k in range(round((times[-1] - first) / tick_s) + 1):
                if k in have:
                    continue
                ts = first + k * tick_s
                if any(lo <= ts < hi for lo, hi in excused) or any(
                    lo <= ts < hi for lo, hi in (node_excused or {}).get(node, ())
                ):
                    continue
                missing += 1
                if len(examples) < 5:
                    examples.append((node, ts))
        return missing, examples
