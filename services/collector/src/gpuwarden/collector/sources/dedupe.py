"""One XID seen by both NVML events and the kernel log becomes one event: :class:`EventDeduper`."""

from __future__ import annotations

from gpuwarden.shared.models import GpuEvent

__all__ = ["EventDeduper"]


class EventDeduper:
    """Collapse one XID seen by both NVML events and the kernel log into one event.

    The kernel-log event wins (it carries the raw line, pid and channel): an NVML event
    (source ``nvml-event``) is held for ``hold_s`` seconds and dropped if a kernel-log event
    with the same (kind, code, PCI bus id) and event time within ``window_s`` arrives; kernel-log
    events are never dropped (bursts of the same XID are real). Times are event times; ``now``
    is the caller's clock.
    """

    def __init__(self, window_s: float = 10.0, hold_s: float = 2.0) -> None:
        self.window_s = window_s
        self.hold_s = hold_s
        self._seen: dict[tuple[str, int | None, str | None], float] = {}
        self._held: list[tuple[float, GpuEvent]] = []
        self.dropped = 0

    @staticmethod
    def _key(e: GpuEvent) -> tuple[str, int | None, str | None]:
        return (e.kind.value, e.code, e.pci_bus_id)

    def filter(self, events: list[GpuEvent], now: float) -> list[GpuEvent]:
        out = []
        for e in events:
            if e.source == "nvml-event":
                self._held.append((now, e))
                continue
            self._seen[self._key(e)] = e.ts
            out.append(e)
        keep = []
        for since, e in self._held:
            seen = self._seen.get(self._key(e))
            if seen is not None and abs(seen - e.ts) <= self.window_s:
                self.dropped += 1
            elif now - since >= self.hold_s:
                out.append(e)
            else:
                keep.append((since, e))
        self._held = keep
        horizon = now - 10 * self.window_s
        if len(self._seen) > 4096:
            self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
        out.sort(key=lambda e: e.ts)
        return out
