"""NVML's own event stream (XID critical errors, ECC events): :class:`NvmlEventWatcher`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, stable_id
from gpuwarden.shared.nvidia.nvml import EVENT_DOUBLE_BIT_ECC, EVENT_SINGLE_BIT_ECC, EVENT_XID, NVML_ERROR_TIMEOUT

from .base import Clock

__all__ = ["NvmlEventWatcher"]

log = logging.getLogger(__name__)


class NvmlEventWatcher:
    """NVML event set in a daemon thread: XID critical errors and single/double-bit ECC events.

    ``start()`` registers every GPU (a GPU or event type NVML refuses is skipped and logged)
    and waits in ``nvmlEventSetWait_v2`` (1 s timeout) until ``stop()``. ``drain(inventory)``
    returns the events seen since the last call as :class:`GpuEvent` (source ``nvml-event``,
    ts = ``clock()`` when NVML delivered it, GPU resolved through ``inventory``).
    """

    XID = EVENT_XID  # nvmlEventTypeXidCriticalError
    SBE = EVENT_SINGLE_BIT_ECC  # nvmlEventTypeSingleBitEccError
    DBE = EVENT_DOUBLE_BIT_ECC  # nvmlEventTypeDoubleBitEccError

    def __init__(self, nvml: Any, node: str, clock: Clock, wait_ms: int = 1000) -> None:
        self.nvml = nvml
        self.node = node
        self.clock = clock
        self.wait_ms = wait_ms
        self._q: list[tuple[float, int, int, int]] = []  # ts, gpu index, event type, data
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._index: dict[int, int] = {}
        self.started = False

    def start(self) -> None:
        n = self.nvml
        self._set = n.nvmlEventSetCreate()
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            self._index[id(h)] = i
            for mask in (self.XID | self.SBE | self.DBE, self.XID):
                try:
                    n.nvmlDeviceRegisterEvents(h, mask, self._set)
                    break
                except n.NVMLError as exc:
                    log.info("NVML events mask %#x refused for GPU %d: %s", mask, i, exc)
        self.started = True
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = self.nvml
        while not self._stop.is_set():
            try:
                d = n.nvmlEventSetWait_v2(self._set, self.wait_ms)
            except n.NVMLError as exc:
                if getattr(exc, "value", None) == NVML_ERROR_TIMEOUT:
                    continue
                log.warning("NVML event wait failed: %s; retrying in 1 s", exc)
                self._stop.wait(1.0)
                continue
            self.push(self._index.get(id(d.device), -1), int(d.eventType), int(d.eventData))

    def push(self, gpu: int, event_type: int, data: int) -> None:
        """Queue one delivered event (called by the thread; tests call it directly)."""
        with self._lock:
            self._q.append((self.clock(), gpu, event_type, data))

    def drain(self, inventory: Sequence[GpuSample]) -> list[GpuEvent]:
        with self._lock:
            q, self._q = self._q, []
        by_index = {g.index: g for g in inventory}
        out = []
        for ts, gpu, etype, data in q:
            g = by_index.get(gpu)
            if etype == self.XID:
                kind, code, msg = EventKind.XID, data, f"XID {data} reported by NVML"
            else:
                kind, code = EventKind.ECC, None
                msg = (
                    "double-bit ECC error reported by NVML"
                    if etype == self.DBE
                    else "single-bit ECC error reported by NVML"
                )
            raw = f"NVML event type={etype} data={data} gpu={gpu}"
            out.append(
                GpuEvent(
                    event_id=stable_id(self.node, ts, kind.value, code, raw),
                    node=self.node,
                    ts=ts,
                    kind=kind,
                    code=code,
                    gpu_index=gpu if gpu >= 0 else None,
                    pci_bus_id=g.pci_bus_id if g else None,
                    gpu_uuid=g.uuid if g else None,
                    message=msg,
                    raw=raw,
                    source="nvml-event",
                )
            )
        return out

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.started:
            self.started = False
            try:
                self.nvml.nvmlEventSetFree(self._set)
            except Exception:  # best effort at shutdown
                log.debug("nvmlEventSetFree failed", exc_info=True)
