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
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, NodeSample, stable_id

from .parsers import (
    KernelLogParser,
    normalize_pci_bus_id,
    parse_kernel_log_line,
    parse_nvidia_smi_xml,
    split_kmsg_record,
)

__all__ = [
    "SOURCES",
    "THROTTLE_BITS",
    "EventDeduper",
    "FileFollower",
    "JournalctlFollower",
    "KmsgReader",
    "LineReader",
    "LineStream",
    "Nvml",
    "NvmlEventWatcher",
    "NvmlSource",
    "Paced",
    "PopenLines",
    "ReplaySource",
    "Source",
    "default_collector_id",
    "nvml_str",
    "open_kernel_log",
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
    """Read new records from ``/dev/kmsg`` (non-blocking), resuming by sequence number.

    Without a saved position it starts at the end of the ring buffer (a first start does not
    replay boot-time messages). With ``state_path`` it saves the last sequence number read
    (atomically, on every call that read something) and on restart reads the ring buffer from
    its start, skipping records up to that number, so nothing is lost or repeated across a
    restart; a gap (records overwritten while down) is logged with its size.
    ``boot_ts`` (epoch s of boot) lets the parser give records their event time
    (``boot_ts + usec``). Lines are returned as the raw records ``PRI,SEQ,USEC,FLAGS;TEXT``.

    Raises:
        PermissionError: the process may not read ``/dev/kmsg`` (needs CAP_SYSLOG or root
            when ``kernel.dmesg_restrict=1``).
    """

    def __init__(self, path: str = "/dev/kmsg", state_path: Path | None = None, boot_ts: float | None = None) -> None:
        self.path = path
        self.state_path = state_path
        self.boot_ts = boot_ts
        self._fd: int | None = None
        self.last_seq: int | None = None
        self.lost_records = 0
        if state_path is not None and state_path.exists():
            try:
                self.last_seq = int(state_path.read_text().strip())
            except ValueError:
                log.warning("kmsg state %s unreadable; starting at the end of the ring buffer", state_path)

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        if self.last_seq is None:
            os.lseek(fd, 0, os.SEEK_END)
        return fd

    def read_new_lines(self) -> list[str]:
        if self._fd is None:
            self._fd = self._open()
        recs = []
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
            recs.append(rec.decode("utf-8", errors="replace"))
        return self.accept(recs)

    def accept(self, records: list[str]) -> list[str]:
        """Pure part of :meth:`read_new_lines`: drop records at or below the last sequence
        number, count gaps, remember and save the new last sequence number. Returns the first
        line of each new record."""
        out = []
        for r in records:
            head = split_kmsg_record(r)
            if head is None:
                continue
            if self.last_seq is not None:
                if head.seq <= self.last_seq:
                    continue
                if head.seq > self.last_seq + 1:
                    gap = head.seq - self.last_seq - 1
                    self.lost_records += gap
                    log.warning("kmsg: %d records lost (overwritten) before seq %d", gap, head.seq)
            self.last_seq = head.seq
            out.append(r.split("\n", 1)[0])
        if out and self.state_path is not None:
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(str(self.last_seq))
            tmp.replace(self.state_path)
        return out

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class LineStream(Protocol):
    """A running line-producing process: ``read_available()`` returns the complete lines it
    printed since the last call without blocking; ``returncode`` is None while it runs."""

    @property
    def returncode(self) -> int | None: ...

    def read_available(self) -> list[str]: ...

    def close(self) -> None: ...


class PopenLines:
    """:class:`LineStream` over a real subprocess (stdout read by a daemon thread into a queue)."""

    def __init__(self, argv: list[str]) -> None:
        import queue
        import subprocess

        self._q: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._t = threading.Thread(target=self._pump, name="journalctl-reader", daemon=True)
        self._t.start()

    def _pump(self) -> None:
        assert self._p.stdout is not None
        for line in self._p.stdout:
            self._q.put(line.rstrip("\n"))

    @property
    def returncode(self) -> int | None:
        return self._p.poll()

    def read_available(self) -> list[str]:
        out: list[str] = []
        while not self._q.empty():
            out.append(self._q.get_nowait())
        return out

    def close(self) -> None:
        if self._p.poll() is None:
            self._p.terminate()
            try:
                self._p.wait(timeout=2)
            except Exception:
                self._p.kill()


class JournalctlFollower:
    """Kernel log through ``journalctl -k -f`` when ``/dev/kmsg`` cannot be read (a container
    without CAP_SYSLOG but with the journal mounted, for example).

    ``output="short-iso-precise"`` (default): lines ``2025-02-14T05:03:42.123456+00:00 host
    kernel: NVRM: ...`` go to the kmsg parser as they are (ISO event time). ``output="json"``:
    each record becomes ``<ISO of __REALTIME_TIMESTAMP> <MESSAGE>`` (MESSAGE given as a string
    or as a byte array), and its ``__CURSOR`` is saved in ``state_path`` (when given) so a
    restart resumes with ``--after-cursor`` without loss or repeats. Starts at the end of the
    journal (``-n 0``) without a saved cursor. The process is started through ``runner``
    (argv list, no shell; :class:`PopenLines` by default) and restarted, with a warning, when
    it exits.
    """

    def __init__(
        self,
        runner: Callable[[list[str]], LineStream] = PopenLines,
        output: str = "short-iso-precise",
        state_path: Path | None = None,
        journalctl: str = "journalctl",
    ) -> None:
        if output not in ("short-iso-precise", "json"):
            raise ValueError("output is 'short-iso-precise' or 'json'")
        self.runner = runner
        self.output = output
        self.state_path = state_path
        self.journalctl = journalctl
        self.cursor: str | None = None
        self.restarts = 0
        self._stream: LineStream | None = None
        if state_path is not None and state_path.exists():
            self.cursor = state_path.read_text().strip() or None

    def argv(self) -> list[str]:
        """The command line: ``journalctl -k -f -o FORMAT --no-pager`` and ``-n 0`` or
        ``--after-cursor CURSOR``."""
        argv = [self.journalctl, "-k", "-f", "-o", self.output, "--no-pager"]
        return argv + (["--after-cursor", self.cursor] if self.cursor else ["-n", "0"])

    def read_new_lines(self) -> list[str]:
        if self._stream is None:
            self._stream = self.runner(self.argv())
        stream = self._stream
        raw = stream.read_available()
        if stream.returncode is not None:  # exited: read what it left, restart next call
            raw += stream.read_available()
            log.warning("journalctl exited with %s; restarting it", stream.returncode)
            stream.close()
            self._stream = None
            self.restarts += 1
        return self.accept(raw)

    def accept(self, raw: list[str]) -> list[str]:
        """Pure part of :meth:`read_new_lines`: journalctl output lines -> kernel-log lines."""
        if self.output != "json":
            return [ln for ln in raw if ln and not ln.startswith("-- ")]  # "-- No entries --", "-- Boot ..."
        out: list[str] = []
        for ln in raw:
            try:
                rec = json.loads(ln)
                msg = rec.get("MESSAGE")
                if isinstance(msg, list):  # non-UTF-8 messages come as byte arrays
                    msg = bytes(msg).decode("utf-8", errors="replace")
                usec = int(rec["__REALTIME_TIMESTAMP"])
            except (ValueError, KeyError, TypeError, AttributeError):
                log.debug("journalctl: not a JSON record: %r", ln[:200])
                continue
            if isinstance(msg, str):
                iso = datetime.fromtimestamp(usec / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
                out.extend(f"{iso} {part}" for part in msg.splitlines() or [""])
            self.cursor = rec.get("__CURSOR") or self.cursor
        if out and self.state_path is not None and self.cursor:
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(self.cursor)
            tmp.replace(self.state_path)
        return out

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def open_kernel_log(
    path: str,
    state_path: Path | None = None,
    boot_ts: float | None = None,
    journal: Callable[[], LineReader | None] | None = None,
) -> LineReader | None:
    """The kernel-log reader for ``path``: :class:`KmsgReader` for a ``/dev/...`` device that
    can be opened, else (permission denied, missing device) the ``journal`` fallback
    (default: :class:`JournalctlFollower` when ``journalctl`` is on PATH, else None, logged);
    any other path is a file followed from its end (:class:`FileFollower`)."""
    if not path.startswith("/dev/"):
        return FileFollower(Path(path), from_end=True)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        return KmsgReader(path, state_path=state_path, boot_ts=boot_ts)
    except OSError as exc:
        if journal is None:
            import shutil

            def journal() -> LineReader | None:
                return JournalctlFollower() if shutil.which("journalctl") else None

        reader = journal()
        if reader is None:
            log.error("cannot read %s (%s) and journalctl is not available: no kernel-log XIDs", path, exc)
        else:
            log.warning("cannot read %s (%s); following the kernel log with journalctl -k instead", path, exc)
        return reader


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


class NvmlEventWatcher:
    """NVML event set in a daemon thread: XID critical errors and single/double-bit ECC events.

    ``start()`` registers every GPU (a GPU or event type NVML refuses is skipped and logged)
    and waits in ``nvmlEventSetWait_v2`` (1 s timeout) until ``stop()``. ``drain(inventory)``
    returns the events seen since the last call as :class:`GpuEvent` (source ``nvml-event``,
    ts = ``clock()`` when NVML delivered it, GPU resolved through ``inventory``).
    """

    XID = 8  # nvmlEventTypeXidCriticalError
    SBE = 1  # nvmlEventTypeSingleBitEccError
    DBE = 2  # nvmlEventTypeDoubleBitEccError

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

    # Optional calls: a module without one of these (older nvidia-ml-py) leaves the field absent.
    # nvmlDeviceGetSerial, nvmlDeviceGetVbiosVersion, nvmlDeviceGetTemperatureThreshold,
    # nvmlDeviceGetPowerManagementLimit, nvmlDeviceGetPerformanceState, nvmlDeviceGetRetiredPages,
    # nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetMaxPcieLinkGeneration,
    # nvmlDeviceGetMaxPcieLinkWidth, nvmlDeviceGetPcieThroughput, nvmlDeviceGetNvLinkState,
    # nvmlDeviceGetNvLinkErrorCounter, nvmlDeviceGetFanSpeed, nvmlDeviceGetComputeRunningProcesses,
    # nvmlDeviceGetMigMode, nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex.


# NVML constants (nvml.h); the same numbers in pynvml and the fake.
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_CLOCK_GRAPHICS = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_FEATURE_ENABLED = 1
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999
NVML_ERROR_TIMEOUT = 10
NVML_SUCCESS = 0
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRICS_GET_VERSION = 1
_NVLINK_COUNTERS = {
    "replay_errors": NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery_errors": NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit_errors": NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data_errors": NVML_NVLINK_ERROR_DL_CRC_DATA,
}
# Errors after which the whole NVML is unusable until re-initialised.
_NVML_DEAD = {NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH}

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


def nvml_str(v: Any) -> str:
    """An NVML string: ``str`` in nvidia-ml-py >= 11.5, ``bytes`` before."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class GpuLost(Exception):
    """NVML answered ``NVML_ERROR_GPU_IS_LOST`` for a device."""


class _NvmlDead(Exception):
    """NVML answered a driver-level error (uninitialised, driver not loaded, version mismatch)."""


class _Gpm:
    """Per-GPU GPM state: two samples (previous, current) and a reusable metrics request."""

    def __init__(self, prev: Any, cur: Any, request: Any) -> None:
        self.prev, self.cur, self.request = prev, cur, request
        self.have_prev = False


class NvmlSource:
    """One node's GPUs through NVML, and XID lines of its kernel log.

    ``collect()`` returns ``[NodeSample]`` with ts = ``clock()`` (epoch s). A field NVML
    cannot read (``NVMLError``, e.g. NOT_SUPPORTED) is None. A GPU that answers
    ``GPU_IS_LOST`` is left out of the sample and reported once as a ``gpu-lost`` event
    (again only after it came back). NVML calls run in a worker thread: a sick GPU can make
    them block for seconds.

    Static fields go out on change only: ``NodeSample.driver_version`` (read at each
    ``nvmlInit``) is set on the first sample after a start or an NVML re-initialisation, and
    again every ``static_every_s`` seconds of event time (default 300) so that a consumer
    started later learns it; None on the samples in between. ``GpuSample.vbios_version``
    follows the same rule per GPU (also re-sent when a lost GPU is back). Consumers keep the
    last value they saw per node / GPU.

    GPM metrics (``sm_occupancy_pct``, ``tensor_activity_pct``) are read where the binding has
    ``nvmlGpmSampleGet``/``nvmlGpmMetricsGet``/``c_nvmlGpmMetricsGet_t`` and
    ``nvmlGpmQueryDeviceSupport`` says the GPU supports them (Hopper and newer); they cover the
    interval between two ticks, so the first sample of a GPU has none. Absent otherwise.

    NVLink state and error counters (``GpuSample.nvlinks``: up to 18 links x 5 NVML calls per
    GPU, most of a tick's NVML calls on an NVLink GPU) are read on every ``nvlink_every``-th
    tick only (1, the default: every tick), starting with the first; on the other ticks
    ``nvlinks`` is None (not read this tick), so a consumer computes NVLink error rates between
    the samples that carry them (the detector does).

    Readings that do not change while the driver is loaded (name, serial, temperature
    thresholds, maximum clocks, maximum PCIe link) are read once per GPU and kept: again every
    ``static_every_s`` of event time, after an NVML re-initialisation and when a lost GPU is
    back; one that read None (not supported, or an error) is tried again on every tick.
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
        event_watcher: NvmlEventWatcher | None = None,
        dedupe: EventDeduper | None = None,
        static_every_s: float = 300.0,
        nvlink_every: int = 1,
    ) -> None:
        """Raises ValueError: ``nvlink_every`` < 1."""
        if nvlink_every < 1:
            raise ValueError(f"nvlink_every must be >= 1 (ticks), got {nvlink_every}")
        self.nvml = nvml
        self.static_every_s = static_every_s
        self.nvlink_every = nvlink_every
        self._ticks = 0  # collects so far (NVLink is read when this is a multiple of nvlink_every)
        self._read_nvlink = True
        self._static_sent_ts: float | None = None  # event time driver/VBIOS last went out
        self._vbios_sent: set[int] = set()  # GPUs whose VBIOS went out since the last (re)send
        self._gpm: dict[int, _Gpm | None] = {}  # None: this GPU has no GPM
        self._static: dict[int, dict[tuple[Any, ...], Any]] = {}  # GPU -> readings that do not change (class doc)
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
        self._nvml_lost = False
        self._nvlinks: dict[int, list[int]] = {}  # gpu -> links that answered on first probe
        self._klog = KernelLogParser(node, source=event_source)
        self.event_watcher = event_watcher
        self.dedupe = dedupe
        self.call_errors: dict[tuple[str, int | None], int] = {}
        """(NVML function, NVML return code) -> count of errors other than NOT_SUPPORTED."""

    async def collect(self) -> list[NodeSample]:
        return [await asyncio.to_thread(self.collect_sync)]

    def collect_sync(self) -> NodeSample:
        """Synchronous body of :meth:`collect` (also used by the simulator without threads)."""
        n = self.nvml
        ts = self.clock()
        try:
            if not self._inited:
                n.nvmlInit()
                self._inited = True
                self._static_sent_ts = None
                self._gpm.clear()  # GPM samples do not survive nvmlShutdown
                self._static.clear()
                try:
                    self._driver = nvml_str(n.nvmlSystemGetDriverVersion())
                except n.NVMLError:
                    self._driver = None
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as exc:
            return self._nvml_down(ts, exc)
        w = self.event_watcher
        if w is not None and not w.started:
            try:
                w.start()
            except (n.NVMLError, AttributeError) as exc:  # AttributeError: bindings without events
                log.warning("NVML events unavailable (%s); XIDs come from the kernel log only", exc)
                self.event_watcher = None
        send_static = self._static_sent_ts is None or ts - self._static_sent_ts >= self.static_every_s
        if send_static:
            self._static_sent_ts = ts
            self._vbios_sent.clear()
            self._static.clear()
        self._read_nvlink = self._ticks % self.nvlink_every == 0
        self._ticks += 1
        gpus = []
        for i in range(count):
            try:
                gpus.append(self._gpu(i))
                self._lost.discard(i)
            except GpuLost as exc:
                self._vbios_sent.discard(i)
                self._gpm.pop(i, None)
                self._static.pop(i, None)
                if i not in self._lost:
                    self._lost.add(i)
                    self._pending.append(self._lost_event(i, ts, str(exc)))
            except _NvmlDead as exc:
                return self._nvml_down(ts, exc.__cause__ or exc)
        if self._nvml_lost:
            self._nvml_lost = False
            log.info("NVML of %s is back", self.node)
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
            driver_version=self._driver if send_static else None,
        )

    def _nvml_down(self, ts: float, exc: BaseException) -> NodeSample:
        """The whole NVML failed (init, count, or a driver-level error): one ``gpu-lost`` event
        (gpu_index None) per outage, an empty sample, and a fresh ``nvmlInit`` next tick."""
        if not self._nvml_lost:
            self._nvml_lost = True
            raw = f"NVML: {type(exc).__name__}: {exc}"
            log.warning("NVML of %s failed (%s); retrying every tick", self.node, exc)
            self._pending.append(
                GpuEvent(
                    event_id=stable_id(self.node, ts, EventKind.GPU_LOST.value, "nvml", raw),
                    node=self.node,
                    ts=ts,
                    kind=EventKind.GPU_LOST,
                    message=f"NVML unusable on {self.node}: {exc}",
                    raw=raw,
                    source="nvml",
                )
            )
        if self._inited:
            self._inited = False
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        return NodeSample(
            node=self.node,
            ts=ts,
            collector_id=self.collector_id,
            source=self.sample_source,
            gpus=[],
            driver_version=self._driver,
        )

    async def events(self) -> list[GpuEvent]:
        out, self._pending = self._pending, []
        if self.event_watcher is not None:
            out.extend(self.event_watcher.drain(self.inventory))
        if self.kernel_log is not None:
            out.extend(self.parse_lines(self.kernel_log.read_new_lines()))
        if self.dedupe is not None:
            out = self.dedupe.filter(out, self.clock())
        return out

    def parse_lines(self, lines: list[str]) -> list[GpuEvent]:
        """Kernel-log lines -> XID/SXID events with the GPU resolved from the last inventory
        (through one :class:`~gpuwarden.collector.parsers.KernelLogParser`, so messages split
        over lines across calls are joined)."""
        out = []
        now = self.clock()
        self._klog.boot_ts = getattr(self.kernel_log, "boot_ts", None)
        for line in lines:
            for ev in self._klog.feed(line, now):
                out.append(resolve_gpu(ev, self.inventory))
        return out

    async def close(self) -> None:
        free = getattr(self.nvml, "nvmlGpmSampleFree", None)
        for g in self._gpm.values():
            if g is not None and free is not None and self._inited:
                for smp in (g.prev, g.cur):
                    try:
                        free(smp)
                    except self.nvml.NVMLError:
                        pass
        self._gpm.clear()
        if self._inited:
            self._inited = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", exc)
        if self.event_watcher is not None:
            self.event_watcher.stop()
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
        errs = self.call_errors

        def call(name: str, *args: Any) -> Any:
            fn = getattr(n, name, None)
            if fn is None:
                return None  # this nvidia-ml-py has no such call: field absent
            try:
                return fn(*args)
            except n.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost(str(exc) or "NVML_ERROR_GPU_IS_LOST") from exc
                if code in _NVML_DEAD:
                    raise _NvmlDead(str(exc)) from exc
                if code not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                    errs[(name, code)] = errs.get((name, code), 0) + 1
                return None

        h = call("nvmlDeviceGetHandleByIndex", i)
        if h is None:
            raise GpuLost("no handle")
        kept: dict[tuple[Any, ...], Any] = self._static.setdefault(i, {})

        def static(name: str, handle: Any, *args: Any) -> Any:
            """``call`` for a reading that does not change: kept once it is not None."""
            key = (name, *args)
            v = kept.get(key)
            if v is None:
                v = call(name, handle, *args)
                if v is not None:
                    kept[key] = v
            return v

        uuid = call("nvmlDeviceGetUUID", h)
        pci = call("nvmlDeviceGetPciInfo", h)
        pci_id = normalize_pci_bus_id(nvml_str(pci.busId)) if pci is not None else None
        uuid = nvml_str(uuid) if uuid is not None else None
        self._known_pci[i] = (pci_id, uuid)
        name = static("nvmlDeviceGetName", h)
        util = call("nvmlDeviceGetUtilizationRates", h)
        mem = call("nvmlDeviceGetMemoryInfo", h)
        power = call("nvmlDeviceGetPowerUsage", h)
        limit = call("nvmlDeviceGetEnforcedPowerLimit", h)
        mgmt = call("nvmlDeviceGetPowerManagementLimit", h)
        reasons = call("nvmlDeviceGetCurrentClocksEventReasons", h)
        rows = call("nvmlDeviceGetRemappedRows", h)
        energy = call("nvmlDeviceGetTotalEnergyConsumption", h)
        serial = static("nvmlDeviceGetSerial", h)
        vbios = None
        if i not in self._vbios_sent:
            vbios = call("nvmlDeviceGetVbiosVersion", h)
            self._vbios_sent.add(i)
        occupancy, tensor = self._gpm_metrics(i, h, call)
        pstate = call("nvmlDeviceGetPerformanceState", h)
        rp_sbe = call("nvmlDeviceGetRetiredPages", h, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        rp_dbe = call("nvmlDeviceGetRetiredPages", h, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        rp_pending = call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        tx = call("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_UTIL_TX_BYTES)
        rx = call("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_UTIL_RX_BYTES)
        fan = call("nvmlDeviceGetFanSpeed", h)
        procs = call("nvmlDeviceGetComputeRunningProcesses", h)
        mig = call("nvmlDeviceGetMigMode", h)
        mig_on = bool(mig[0] == NVML_FEATURE_ENABLED) if mig is not None else None
        mig_n: int | None = None
        if mig_on:
            mig_n = 0
            for k in range(call("nvmlDeviceGetMaxMigDeviceCount", h) or 0):
                if call("nvmlDeviceGetMigDeviceHandleByIndex", h, k) is not None:
                    mig_n += 1
        mib = 1024 * 1024
        reserved = getattr(mem, "reserved", None) if mem is not None else None
        return GpuSample(
            index=i,
            uuid=uuid,
            pci_bus_id=pci_id,
            name=nvml_str(name) if name is not None else None,
            serial=nvml_str(serial) if serial is not None else None,
            vbios_version=nvml_str(vbios) if vbios is not None else None,
            utilization_gpu_pct=float(util.gpu) if util is not None else None,
            utilization_memory_pct=float(util.memory) if util is not None else None,
            memory_used_mib=mem.used / mib if mem is not None else None,
            memory_total_mib=mem.total / mib if mem is not None else None,
            memory_free_mib=mem.free / mib if mem is not None else None,
            memory_reserved_mib=reserved / mib if reserved is not None else None,
            temperature_c=call("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU),
            temperature_slowdown_c=static("nvmlDeviceGetTemperatureThreshold", h, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            temperature_shutdown_c=static("nvmlDeviceGetTemperatureThreshold", h, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            power_w=power / 1000 if power is not None else None,
            power_limit_w=limit / 1000 if limit is not None else None,
            power_management_limit_w=mgmt / 1000 if mgmt is not None else None,
            sm_clock_mhz=call("nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM),
            graphics_clock_mhz=call("nvmlDeviceGetClockInfo", h, NVML_CLOCK_GRAPHICS),
            memory_clock_mhz=call("nvmlDeviceGetClockInfo", h, NVML_CLOCK_MEM),
            max_sm_clock_mhz=static("nvmlDeviceGetMaxClockInfo", h, NVML_CLOCK_SM),
            max_graphics_clock_mhz=static("nvmlDeviceGetMaxClockInfo", h, NVML_CLOCK_GRAPHICS),
            max_memory_clock_mhz=static("nvmlDeviceGetMaxClockInfo", h, NVML_CLOCK_MEM),
            throttle_reasons=[v for b, v in THROTTLE_BITS.items() if reasons & b] if reasons is not None else [],
            performance_state=pstate if pstate is not None and 0 <= pstate <= 15 else None,
            ecc_sbe_volatile=call(
                "nvmlDeviceGetTotalEccErrors", h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC
            ),
            ecc_dbe_volatile=call(
                "nvmlDeviceGetTotalEccErrors", h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
            ),
            ecc_sbe_aggregate=call(
                "nvmlDeviceGetTotalEccErrors", h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC
            ),
            ecc_dbe_aggregate=call(
                "nvmlDeviceGetTotalEccErrors", h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC
            ),
            retired_pages_sbe=len(rp_sbe) if rp_sbe is not None else None,
            retired_pages_dbe=len(rp_dbe) if rp_dbe is not None else None,
            retired_pages=len(rp_sbe) + len(rp_dbe) if rp_sbe is not None and rp_dbe is not None else None,
            retired_pages_pending=bool(rp_pending) if rp_pending is not None else None,
            remapped_rows_correctable=int(rows[0]) if rows is not None else None,
            remapped_rows_uncorrectable=int(rows[1]) if rows is not None else None,
            remapped_rows_pending=bool(rows[2]) if rows is not None else None,
            remapped_rows_failure=bool(rows[3]) if rows is not None else None,
            pcie_replay_count=call("nvmlDeviceGetPcieReplayCounter", h),
            pcie_link_gen=call("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_link_gen_max=static("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_link_width=call("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_link_width_max=static("nvmlDeviceGetMaxPcieLinkWidth", h),
            pcie_tx_kbps=float(tx) if tx is not None else None,
            pcie_rx_kbps=float(rx) if rx is not None else None,
            fan_speed_pct=float(fan) if fan is not None else None,
            nvlinks=self._nvlink(i, h, call) if self._read_nvlink else None,
            processes=[
                {"pid": int(p.pid)}
                | ({"used_memory_mib": p.usedGpuMemory / mib} if getattr(p, "usedGpuMemory", None) is not None else {})
                for p in procs
            ]
            if procs is not None
            else None,
            mig_mode=mig_on,
            mig_instances=mig_n,
            energy_j=energy / 1000 if energy is not None else None,
            sm_occupancy_pct=occupancy,
            tensor_activity_pct=tensor,
        )

    def _gpm_metrics(self, i: int, h: Any, call: Callable[..., Any]) -> tuple[float | None, float | None]:
        """(SM occupancy %, any-tensor activity %) over the interval since the previous tick,
        from NVML GPM; (None, None) without GPM support or on the GPU's first tick."""
        n = self.nvml
        if i not in self._gpm:
            request_type = getattr(n, "c_nvmlGpmMetricsGet_t", None)
            sup = call("nvmlGpmQueryDeviceSupport", h) if request_type is not None else None
            ok = sup is not None and bool(getattr(sup, "isSupportedDevice", 0))
            ok = ok and all(hasattr(n, f) for f in ("nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet"))
            a = call("nvmlGpmSampleAlloc") if ok else None
            b = call("nvmlGpmSampleAlloc") if a is not None else None
            self._gpm[i] = _Gpm(a, b, request_type()) if a is not None and b is not None else None  # type: ignore[misc]
        g = self._gpm[i]
        if g is None:
            return None, None
        if call("nvmlGpmSampleGet", h, g.cur) is None:
            g.have_prev = False
            return None, None
        out: tuple[float | None, float | None] = (None, None)
        if g.have_prev:
            r = g.request
            r.version = NVML_GPM_METRICS_GET_VERSION
            r.numMetrics = 2
            r.sample1, r.sample2 = g.prev, g.cur
            r.metrics[0].metricId = NVML_GPM_METRIC_SM_OCCUPANCY
            r.metrics[1].metricId = NVML_GPM_METRIC_ANY_TENSOR_UTIL
            if call("nvmlGpmMetricsGet", r) is not None:
                vals = [
                    min(100.0, max(0.0, float(m.value))) if m.nvmlReturn == NVML_SUCCESS else None
                    for m in (r.metrics[0], r.metrics[1])
                ]
                out = (vals[0], vals[1])
        g.prev, g.cur = g.cur, g.prev
        g.have_prev = True
        return out

    def _nvlink(self, i: int, h: Any, call: Callable[..., Any]) -> list[dict[str, Any]] | None:
        """Per-link state and error counters; links are probed once (first tick) and only the
        ones that answered are read afterwards, so a GPU without NVLink costs one probe."""
        links = self._nvlinks.get(i)
        if links is None:
            links = [k for k in range(NVML_NVLINK_MAX_LINKS) if call("nvmlDeviceGetNvLinkState", h, k) is not None]
            self._nvlinks[i] = links
        if not links:
            return None
        out = []
        for k in links:
            st = call("nvmlDeviceGetNvLinkState", h, k)
            d: dict[str, Any] = {"link": k}
            if st is not None:
                d["active"] = bool(st == NVML_FEATURE_ENABLED)
            for key, counter in _NVLINK_COUNTERS.items():
                v = call("nvmlDeviceGetNvLinkErrorCounter", h, k, counter)
                if v is not None:
                    d[key] = int(v)
            out.append(d)
        return out


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
