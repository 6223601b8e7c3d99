"""The NVML source: one node's GPUs through NVML, plus XID lines of its kernel log.

:meth:`NvmlSource._gpu` reads a GPU's scalar fields from the field registry (``fields.csv``:
the ``nvml`` call, ``nvml_scale``, ``nvml_static``; :func:`nvml_reads`) and those of
:data:`NVML_IN_CODE` in code, next to the GPM and NVLink readers it calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gpuwarden.shared.fieldgen import gpu_sample_model
from gpuwarden.shared.fields import FIELDS, FieldSpec
from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, NodeSample, stable_id
from gpuwarden.shared.nvidia.kernel_log import KernelLogParser
from gpuwarden.shared.nvidia.nvml import (
    NVLINK_PROBE_LINKS,
    NVML_DEAD_ERRORS,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_FEATURE_ENABLED,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_SM_OCCUPANCY,
    NVML_GPM_METRICS_GET_VERSION,
    NVML_NVLINK_ERROR_DL_CRC_DATA,
    NVML_NVLINK_ERROR_DL_CRC_FLIT,
    NVML_NVLINK_ERROR_DL_RECOVERY,
    NVML_NVLINK_ERROR_DL_REPLAY,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    NVML_SUCCESS,
    THROTTLE_BITS,
    Nvml,
    nvml_str,
)
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id
from gpuwarden.shared.nvidia.values import gpu_sample

from .base import Clock, DroppedReadings, LineReader, default_collector_id, resolve_gpu
from .dedupe import EventDeduper
from .nvml_events import NvmlEventWatcher

__all__ = ["NVML_IN_CODE", "GpuLost", "NvmlRow", "NvmlSource", "nvml_reads"]

log = logging.getLogger(__name__)

_NVLINK_COUNTERS = {
    "replay_errors": NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery_errors": NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit_errors": NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data_errors": NVML_NVLINK_ERROR_DL_CRC_DATA,
}


#: Registry rows with an ``nvml`` call that :meth:`NvmlSource._gpu` reads in code, not from the
#: row: the handle, the identity it remembers, the VBIOS (sent once), the clock-event bitmask, the
#: performance state (32 is "unknown"), retired-page lists (counted), processes, MIG and GPM.
NVML_IN_CODE = frozenset(
    {
        "index", "uuid", "pci_bus_id", "vbios_version", "throttle_reasons", "performance_state",
        "retired_pages", "retired_pages_sbe", "retired_pages_dbe", "nvlinks", "processes",
        "mig_mode", "mig_instances", "sm_occupancy_pct", "tensor_activity_pct",
    }
)  # fmt: skip


class NvmlRow(NamedTuple):
    """One registry row the NVML source reads generically: its call's answer -> ``.attr`` or
    ``[item]`` -> ``convert`` (by the row's type and ``nvml_scale``)."""

    field: str
    call: str
    args: tuple[int, ...]  # pynvml's constants
    attr: str | None
    item: int | None
    static: bool
    convert: Callable[[Any], Any]


def _converter(type_: str, scale: float | None) -> Callable[[Any], Any]:
    if type_ == "str":
        return nvml_str
    if type_ == "bool":
        return bool
    if scale is None or scale == 1:
        return int if type_ == "int" else float
    div = 1 / scale
    if div.is_integer():  # mW / 1000, not mW * 0.001: the float a hand-written conversion gives
        return (lambda v: round(float(v) / div)) if type_ == "int" else (lambda v: float(v) / div)
    return (lambda v: round(float(v) * scale)) if type_ == "int" else (lambda v: float(v) * scale)


def nvml_reads(fields: Sequence[FieldSpec] = FIELDS) -> tuple[NvmlRow, ...]:
    """The scalar rows of ``fields`` with an ``nvml`` call that the NVML source reads generically
    (all but :data:`NVML_IN_CODE`), with their arguments as pynvml's constants."""
    return tuple(
        NvmlRow(f.field, r.call, r.constants(), r.attr, r.item, f.nvml_static, _converter(f.type, f.nvml_scale))
        for f in fields
        if f.type != "list" and f.field not in NVML_IN_CODE and (r := f.nvml_read) is not None
    )


def _by_call(rows: Sequence[NvmlRow]) -> tuple[tuple[str, tuple[int, ...], bool, tuple[NvmlRow, ...]], ...]:
    """``rows`` grouped by (call, arguments, static), in registry order: one call per group and tick."""
    groups: dict[tuple[str, tuple[int, ...], bool], list[NvmlRow]] = {}
    for r in rows:
        groups.setdefault((r.call, r.args, r.static), []).append(r)
    return tuple((c, a, st, tuple(rs)) for (c, a, st), rs in groups.items())


def _row_value(answer: Any, r: NvmlRow) -> Any:
    """Row ``r``'s model value from its call's (not None) ``answer``; None when the answer lacks
    it. A value that does not convert is passed on as it came: the model refuses and names it."""
    try:
        v = answer if r.attr is None and r.item is None else getattr(answer, r.attr) if r.attr else answer[r.item]
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    if v is None:
        return None
    try:
        return r.convert(v)
    except (TypeError, ValueError, OverflowError):
        return v


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
        fields: Sequence[FieldSpec] = FIELDS,
    ) -> None:
        """``fields``: the field registry whose ``nvml`` rows are read (another one in tests: its
        model, :func:`~gpuwarden.shared.fieldgen.gpu_sample_model`, builds the samples).

        Raises ValueError: ``nvlink_every`` < 1."""
        if nvlink_every < 1:
            raise ValueError(f"nvlink_every must be >= 1 (ticks), got {nvlink_every}")
        self.nvml = nvml
        self._calls = _by_call(nvml_reads(fields))
        self._model = gpu_sample_model(fields)
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
        self.problem: str | None = None
        """Why NVML is unusable (init/count failed: no driver, no library), None while it works;
        the service's /healthz says it."""
        self._nvlinks: dict[int, list[int]] = {}  # gpu -> links that answered on first probe
        self._klog = KernelLogParser(node, source=event_source)
        self.event_watcher = event_watcher
        self.dedupe = dedupe
        self.call_errors: dict[tuple[str, int | None], int] = {}
        """(NVML function, NVML return code) -> count of errors other than NOT_SUPPORTED."""
        #: readings dropped because the model cannot hold them (out of range, a sentinel)
        self.dropped = DroppedReadings()

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
            self.problem = None
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
        self.problem = f"NVML unusable: {type(exc).__name__}: {exc}"[:300]
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
        (through one :class:`~gpuwarden.shared.nvidia.kernel_log.KernelLogParser`, so messages split
        over lines across calls are joined). An XID whose bus no known GPU has goes to the one
        GPU NVML reports lost whose bus this process never read (:meth:`_lost_gpu_of`)."""
        out = []
        now = self.clock()
        self._klog.boot_ts = getattr(self.kernel_log, "boot_ts", None)
        for line in lines:
            for ev in self._klog.feed(line, now):
                ev = resolve_gpu(ev, self.inventory)
                if ev.gpu_index is None and ev.pci_bus_id and ev.kind is EventKind.XID:
                    ev = self._lost_gpu_of(ev)
                out.append(ev)
        return out

    def _lost_gpu_of(self, ev: GpuEvent) -> GpuEvent:
        """``ev`` with the index of the GPU it must be, by elimination: NVML numbers every GPU of
        the node (a GPU that fell off the bus still has its index, its handle calls fail with
        ``GPU_IS_LOST``), and each index has one bus. A collector started after the GPU was lost
        never read that GPU's bus; when exactly one lost index has no known bus and no known GPU
        has the XID's bus, that index is the XID's GPU (remembered). Otherwise ``ev`` unchanged:
        nothing is guessed (two GPUs lost, or the bus of an NVSwitch)."""
        bus = ev.pci_bus_id
        known = {pci for pci, _ in self._known_pci.values() if pci} | {g.pci_bus_id for g in self.inventory}
        unread = [i for i in sorted(self._lost) if self._known_pci.get(i, (None, None))[0] is None]
        if bus is None or bus in known or len(unread) != 1:
            return ev
        self._known_pci[unread[0]] = (bus, None)
        return ev.model_copy(update={"gpu_index": unread[0]})

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
                if code in NVML_DEAD_ERRORS:
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
        data: dict[str, Any] = {"index": i, "uuid": uuid, "pci_bus_id": pci_id}
        # the registry's rows (fields.csv nvml, nvml_scale, nvml_static): one call per (function,
        # arguments) and tick, however many rows read its answer
        for fn, args, is_static, rows in self._calls:
            answer = static(fn, h, *args) if is_static else call(fn, h, *args)
            for r in rows:
                data[r.field] = None if answer is None else _row_value(answer, r)
        # read in code (NVML_IN_CODE): sent once, bitmasks, lists, an "unknown" sentinel, MIG, GPM
        if i not in self._vbios_sent:
            vbios = call("nvmlDeviceGetVbiosVersion", h)
            self._vbios_sent.add(i)
            data["vbios_version"] = nvml_str(vbios) if vbios is not None else None
        occupancy, tensor = self._gpm_metrics(i, h, call)
        reasons = call("nvmlDeviceGetCurrentClocksEventReasons", h)
        pstate = call("nvmlDeviceGetPerformanceState", h)  # 32: NVML_PSTATE_UNKNOWN
        rp_sbe = call("nvmlDeviceGetRetiredPages", h, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        rp_dbe = call("nvmlDeviceGetRetiredPages", h, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
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
        data.update(
            throttle_reasons=[v for b, v in THROTTLE_BITS.items() if reasons & b] if reasons is not None else [],
            performance_state=pstate if pstate is not None and 0 <= pstate <= 15 else None,
            retired_pages_sbe=len(rp_sbe) if rp_sbe is not None else None,
            retired_pages_dbe=len(rp_dbe) if rp_dbe is not None else None,
            retired_pages=len(rp_sbe) + len(rp_dbe) if rp_sbe is not None and rp_dbe is not None else None,
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
            sm_occupancy_pct=occupancy,
            tensor_activity_pct=tensor,
        )
        # a reading the model cannot hold (a sentinel) is dropped and counted, not the node's sample
        return gpu_sample(data, f"{self.node}: NVML GPU {i}", self._model, on_drop=self.dropped)

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
            links = [k for k in range(NVLINK_PROBE_LINKS) if call("nvmlDeviceGetNvLinkState", h, k) is not None]
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
