"""Telemetry sources of the collector, each behind the tiny :class:`Source` interface.

A source knows nothing of Kafka: ``collect()`` returns one :class:`NodeSample` per node it
watches, ``events()`` returns the discrete :class:`GpuEvent` s seen since the last call.
The service runs them, measures each call and publishes the results.

* :class:`NvmlSource` - NVML through the narrow :class:`Nvml` protocol (``pynvml`` in
  production, :class:`~gpuwarden.collector.sim.FakeNvml` in tests and the demo), plus an
  optional kernel-log :class:`LineReader` for XIDs.
* :class:`ReplaySource` - ``<root>/<node>/*.xml`` (``nvidia-smi -q -x`` captures) and
  ``<root>/<node>/kern.log`` followed like ``tail -f``.
* ``SimulatedSource`` lives in :mod:`gpuwarden.collector.sim`.

Sources register by name in :data:`SOURCES` (see :func:`register_source`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, NodeSample, stable_id

from .parsers import normalize_pci_bus_id, parse_kernel_log_line, parse_nvidia_smi_xml

__all__ = [
    "SOURCES",
    "THROTTLE_BITS",
    "FileFollower",
    "KmsgReader",
    "LineReader",
    "Nvml",
    "NvmlSource",
    "Paced",
    "ReplaySource",
    "Source",
    "default_collector_id",
    "register_source",
    "resolve_gpu",
]

log = logging.getLogger(__name__)

Clock = Callable[[], float]


def default_collector_id() -> str:
    """``<short hostname>:<pid>``: which collector process produced a sample."""
    return f"{socket.gethostname().split('.')[0]}:{os.getpid()}"


@runtime_checkable
class Source(Protocol):
    """A telemetry source: ``collect()`` one sample per node, ``events()`` new discrete events.

    Both may raise; the runner counts the error and goes on with the next tick.
    """

    name: str

    async def collect(self) -> list[NodeSample]: ...

    async def events(self) -> list[GpuEvent]: ...

    async def close(self) -> None: ...


@runtime_checkable
class Paced(Protocol):
    """A source that sets its own tick times (the simulator): wall epoch s of the next tick,
    None once it has nothing more to produce."""

    def next_due(self) -> float | None: ...


SOURCES: dict[str, Callable[..., Source]] = {}


def register_source(name: str) -> Callable[[Callable[..., Source]], Callable[..., Source]]:
    """Decorator: register a factory ``f(settings) -> Source`` under ``name``."""

    def deco(factory: Callable[..., Source]) -> Callable[..., Source]:
        SOURCES[name] = factory
        return factory

    return deco


def resolve_gpu(event: GpuEvent, gpus: Sequence[GpuSample]) -> GpuEvent:
    """Fill ``gpu_index``/``gpu_uuid`` of an event from the node's inventory by PCI bus id.

    Returns the event unchanged when its bus id is unknown (e.g. an NVSwitch SXID).
    """
    if event.pci_bus_id is None or event.gpu_index is not None:
        return event
    for g in gpus:
        if g.pci_bus_id == event.pci_bus_id:
            return event.model_copy(update={"gpu_index": g.index, "gpu_uuid": g.uuid})
    return event


# -- kernel log readers ---------------------------------------------------------------


class LineReader(Protocol):
    """Returns the complete lines written since the previous call."""

    def read_new_lines(self) -> list[str]: ...


class FileFollower:
    """Follow a text file like ``tail -f``: each call returns the complete lines appended since
    the last call. Starts at the beginning (``from_end=False``) or at the current end.
    A file that shrank (truncated or rotated) is read again from the start; a missing file
    reads as no lines."""

    def __init__(self, path: Path, from_end: bool = False) -> None:
        self.path = path
        self.offset = 0
        if from_end and path.exists():
            self.offset = path.stat().st_size

    def read_new_lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset = 0
        if size == self.offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:
            return []  # an incomplete line: wait for its newline
        self.offset += end + 1
        return data[: end + 1].decode("utf-8", errors="replace").splitlines()


class KmsgReader:
    """Read new records from ``/dev/kmsg`` (non-blocking), starting at the end of the ring
    buffer so a restart does not replay boot-time messages with wrong event times.

    Raises:
        PermissionError: the process may not read ``/dev/kmsg`` (needs CAP_SYSLOG or root
            when ``kernel.dmesg_restrict=1``).
    """

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.path = path
        self._fd: int | None = None

    def read_new_lines(self) -> list[str]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)
        lines = []
        while True:
            try:
                rec = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten records: skip on
                    continue
                raise
            if not rec:
                break
            lines.append(rec.decode("utf-8", errors="replace").split("\n", 1)[0])
        return lines

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


# -- NVML --------------------------------------------------------------------------------


class Nvml(Protocol):
    """The NVML calls the collector uses, named as in nvidia-ml-py (``import pynvml``).

    Units as NVML returns them: power mW, memory bytes, clocks MHz, temperature C, energy mJ.
    Errors are raised as ``NVMLError`` whose ``value`` is the NVML return code.
    """

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...


# NVML constants (nvml.h); the same numbers in pynvml and the fake.
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0

THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class GpuLost(Exception):
    """NVML answered ``NVML_ERROR_GPU_IS_LOST`` for a device."""


class NvmlSource:
    """One node's GPUs through NVML, and XID lines of its kernel log.

    ``collect()`` returns ``[NodeSample]`` with ts = ``clock()`` (epoch s). A field NVML
    cannot read (``NVMLError``, e.g. NOT_SUPPORTED) is None. A GPU that answers
    ``GPU_IS_LOST`` is left out of the sample and reported once as a ``gpu-lost`` event
    (again only after it came back). NVML calls run in a worker thread: a sick GPU can make
    them block for seconds.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: Nvml,
        node: str,
        clock: Clock,
        kernel_log: LineReader | None = None,
        collector_id: str | None = None,
        sample_source: str = "nvml",
        event_source: str = "kmsg",
    ) -> None:
        self.nvml = nvml
        self.node = node
        self.clock = clock
        self.kernel_log = kernel_log
        self.collector_id = collector_id or default_collector_id()
        self.sample_source = sample_source
        self.event_source = event_source
        self.inventory: list[GpuSample] = []
        self._inited = False
        self._lost: set[int] = set()
        self._pending: list[GpuEvent] = []
        self._driver: str | None = None
        self._known_pci: dict[int, tuple[str | None, str | None]] = {}

    async def collect(self) -> list[NodeSample]:
        return [await asyncio.to_thread(self.collect_sync)]

    def collect_sync(self) -> NodeSample:
        """Synchronous body of :meth:`collect` (also used by the simulator without threads)."""
        n = self.nvml
        if not self._inited:
            n.nvmlInit()
            self._inited = True
            try:
                self._driver = _str(n.nvmlSystemGetDriverVersion())
            except n.NVMLError:
                self._driver = None
        ts = self.clock()
        gpus = []
        for i in range(n.nvmlDeviceGetCount()):
            try:
                gpus.append(self._gpu(i))
                self._lost.discard(i)
            except GpuLost as exc:
                if i not in self._lost:
                    self._lost.add(i)
                    self._pending.append(self._lost_event(i, ts, str(exc)))
        if gpus:  # keep lost GPUs in the inventory: their XIDs still need an index
            known = {g.index: g for g in self.inventory}
            known.update({g.index: g for g in gpus})
            self.inventory = sorted(known.values(), key=lambda g: g.index)
        return NodeSample(
            node=self.node,
            ts=ts,
            collector_id=self.collector_id,
            source=self.sample_source,
            gpus=gpus,
            driver_version=self._driver,
        )

    async def events(self) -> list[GpuEvent]:
        out, self._pending = self._pending, []
        if self.kernel_log is not None:
            out.extend(self.parse_lines(self.kernel_log.read_new_lines()))
        return out

    def parse_lines(self, lines: list[str]) -> list[GpuEvent]:
        """Kernel-log lines -> XID/SXID events with the GPU resolved from the last inventory."""
        out = []
        now = self.clock()
        for line in lines:
            ev = parse_kernel_log_line(line, self.node, now, source=self.event_source)
            if ev is not None:
                out.append(resolve_gpu(ev, self.inventory))
        return out

    async def close(self) -> None:
        if self._inited:
            self._inited = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", exc)
        close = getattr(self.kernel_log, "close", None)
        if close is not None:
            close()

    def _lost_event(self, index: int, ts: float, why: str) -> GpuEvent:
        pci, uuid = self._known_pci.get(index, (None, None))
        raw = f"NVML: GPU {index} ({pci or 'unknown PCI'}) is lost: {why}"
        return GpuEvent(
            event_id=stable_id(self.node, ts, EventKind.GPU_LOST.value, index, raw),
            node=self.node,
            ts=ts,
            kind=EventKind.GPU_LOST,
            gpu_index=index,
            pci_bus_id=pci,
            gpu_uuid=uuid,
            message=f"NVML reports GPU {index} lost ({why})",
            raw=raw,
            source="nvml",
        )

    def _gpu(self, i: int) -> GpuSample:
        n = self.nvml

        def call(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(*args)
            except n.NVMLError as exc:
                if getattr(exc, "value", None) == NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost(str(exc) or "NVML_ERROR_GPU_IS_LOST") from exc
                return None

        h = call(n.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            raise GpuLost("no handle")
        uuid = call(n.nvmlDeviceGetUUID, h)
        pci = call(n.nvmlDeviceGetPciInfo, h)
        pci_id = normalize_pci_bus_id(_str(pci.busId)) if pci is not None else None
        uuid = _str(uuid) if uuid is not None else None
        self._known_pci[i] = (pci_id, uuid)
        name = call(n.nvmlDeviceGetName, h)
        util = call(n.nvmlDeviceGetUtilizationRates, h)
        mem = call(n.nvmlDeviceGetMemoryInfo, h)
        power = call(n.nvmlDeviceGetPowerUsage, h)
        limit = call(n.nvmlDeviceGetEnforcedPowerLimit, h)
        reasons = call(n.nvmlDeviceGetCurrentClocksEventReasons, h)
        rows = call(n.nvmlDeviceGetRemappedRows, h)
        energy = call(n.nvmlDeviceGetTotalEnergyConsumption, h)
        mib = 1024 * 1024
        return GpuSample(
            index=i,
            uuid=uuid,
            pci_bus_id=pci_id,
            name=_str(name) if name is not None else None,
            utilization_gpu_pct=float(util.gpu) if util is not None else None,
            utilization_memory_pct=float(util.memory) if util is not None else None,
            memory_used_mib=mem.used / mib if mem is not None else None,
            memory_total_mib=mem.total / mib if mem is not None else None,
            temperature_c=call(n.nvmlDeviceGetTemperature, h, NVML_TEMPERATURE_GPU),
            power_w=power / 1000 if power is not None else None,
            power_limit_w=limit / 1000 if limit is not None else None,
            sm_clock_mhz=call(n.nvmlDeviceGetClockInfo, h, NVML_CLOCK_SM),
            memory_clock_mhz=call(n.nvmlDeviceGetClockInfo, h, NVML_CLOCK_MEM),
            max_sm_clock_mhz=call(n.nvmlDeviceGetMaxClockInfo, h, NVML_CLOCK_SM),
            throttle_reasons=[v for b, v in THROTTLE_BITS.items() if reasons & b] if reasons is not None else [],
            ecc_sbe_volatile=call(
                n.nvmlDeviceGetTotalEccErrors, h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC
            ),
            ecc_dbe_volatile=call(
                n.nvmlDeviceGetTotalEccErrors, h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
            ),
            remapped_rows_pending=bool(rows[2]) if rows is not None else None,
            remapped_rows_failure=bool(rows[3]) if rows is not None else None,
            pcie_replay_count=call(n.nvmlDeviceGetPcieReplayCounter, h),
            pcie_link_gen=call(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_link_width=call(n.nvmlDeviceGetCurrPcieLinkWidth, h),
            energy_j=energy / 1000 if energy is not None else None,
        )


# -- replay ------------------------------------------------------------------------------


class ReplaySource:
    """Replay recorded node output from ``root/<node>/``.

    * ``*.xml``: ``nvidia-smi -q -x`` captures, one per tick in sorted name order, cycling;
      each collect yields one NodeSample per node with ts = ``clock()``.
    * ``kern.log``: followed like ``tail -f`` from its start (lines appended later are read
      on the next ``events()``); XIDs are mapped to a GPU index and UUID through the node's
      latest parsed capture.

    Node folders (and capture files) are rescanned each call, so ones created after start are
    picked up. ``nodes`` limits which folders are read. A capture that fails to parse is
    logged and skipped for that tick.
    """

    name = "replay"

    def __init__(self, root: Path, nodes: list[str] | None, clock: Clock, collector_id: str | None = None) -> None:
        self.root = Path(root)
        self.nodes = nodes
        self.clock = clock
        self.collector_id = collector_id or default_collector_id()
        self._cursor: dict[str, int] = {}
        self._followers: dict[str, FileFollower] = {}
        self.inventory: dict[str, list[GpuSample]] = {}

    def _node_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            raise FileNotFoundError(f"replay folder {self.root} does not exist")
        dirs = sorted(p for p in self.root.iterdir() if p.is_dir())
        if self.nodes is not None:
            wanted = set(self.nodes)
            dirs = [d for d in dirs if d.name in wanted]
        return dirs

    async def collect(self) -> list[NodeSample]:
        return self.collect_sync()

    def collect_sync(self) -> list[NodeSample]:
        ts = self.clock()
        out = []
        for d in self._node_dirs():
            files = sorted(d.glob("*.xml"))
            if not files:
                continue
            i = self._cursor.get(d.name, 0)
            self._cursor[d.name] = i + 1
            f = files[i % len(files)]
            try:
                rep = parse_nvidia_smi_xml(f.read_text(errors="replace"))
            except (ValueError, OSError) as exc:
                log.warning("replay: skipping %s: %s", f, exc)
                continue
            self.inventory[d.name] = rep.gpus
            out.append(
                NodeSample(
                    node=d.name,
                    ts=ts,
                    collector_id=self.collector_id,
                    source="nvidia-smi-xml",
                    gpus=rep.gpus,
                    driver_version=rep.driver_version,
                    cuda_version=rep.cuda_version,
                )
            )
        return out

    async def events(self) -> list[GpuEvent]:
        return self.events_sync()

    def events_sync(self) -> list[GpuEvent]:
        now = self.clock()
        out = []
        for d in self._node_dirs():
            fol = self._followers.get(d.name)
            if fol is None:
                fol = self._followers[d.name] = FileFollower(d / "kern.log")
            lines = fol.read_new_lines()
            if not lines:
                continue
            inv = self.inventory.get(d.name)
            if inv is None:
                inv = self._first_inventory(d)
            for line in lines:
                ev = parse_kernel_log_line(line, d.name, now, source="replay")
                if ev is not None:
                    out.append(resolve_gpu(ev, inv))
        return out

    def _first_inventory(self, d: Path) -> list[GpuSample]:
        for f in sorted(d.glob("*.xml")):
            try:
                gpus = parse_nvidia_smi_xml(f.read_text(errors="replace")).gpus
            except (ValueError, OSError):
                continue
            self.inventory[d.name] = gpus
            return gpus
        return []

    async def close(self) -> None:
        return None
