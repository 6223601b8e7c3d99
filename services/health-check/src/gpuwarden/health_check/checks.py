"""The health checks: each a small synchronous function over narrow inputs, returning one result.

A check gets an :class:`Inputs` (NVML through the collector's ``Nvml`` protocol, a
:class:`~gpuwarden.health_check.io.ToolRunner`, a :class:`~gpuwarden.health_check.io.KernelLog`,
a sysfs root, a clock) and a :class:`Context` (phase, the job's GPUs, thresholds), and returns a
:class:`CheckResult` whose :class:`Status` is a Nagios code. Decisions over already-read data
are pure ``evaluate_*`` functions, tested on recorded tool output. Checks register by name in
:data:`CHECKS` (which phases run them by default).

Status per check (the first reason printed is the worst):

==============  ==========================================================================
gpu-count       CRITICAL fewer GPUs than expected, none (unless 0 expected), or a job GPU
                that NVML does not list (matched by minor number / UUID)
nvml            CRITICAL a GPU that does not answer NVML (lost, unknown error, ...)
processes       CRITICAL compute processes left on a GPU, or used memory above the threshold,
                after the epilog's grace (prolog/epilog only: a busy node is no fault)
ecc             CRITICAL volatile uncorrectable ECC > 0, row remap pending/failed,
                retired pages pending
xid             CRITICAL an XID outside the application {13, 31, 43, 45, 68, 69} and repair
                {63, 92} sets (XID 154 by its recovery action: "None" is OK) or a fatal SXID
                inside the GPU's window; WARNING application/repair XIDs only
pcie            CRITICAL link width below its maximum; WARNING generation below its maximum on
                a busy GPU (idle GPUs lower the generation to save power)
nvlink          CRITICAL an inactive link on a job GPU of a node with NVLink (or fewer active
                links than expected); a node where no GPU has an active link has none
fabric          CRITICAL a job GPU whose NVSwitch fabric registration is not completed or failed
                (HGX H100+: nvidia-fabricmanager down); GPUs without a fabric are OK
clocks          CRITICAL HW slowdown / HW thermal slowdown / HW power brake; WARNING SW thermal
infiniband      CRITICAL an InfiniBand port not ACTIVE/LinkUp (or fewer ACTIVE than required),
                below the expected rate (Ethernet/RoCE and ignored ports left out); ports from
                sysfs, else ibstat, ibstatus, ibv_devinfo -v; WARNING a required rate unknown
dcgm            CRITICAL a Fail; WARNING a Warn or a Skip (skip is not pass); UNKNOWN a cut-off
                table, no dcgmi / host engine, a diag past its time, every test skipped, or a
                job GPU that dcgmi discovery does not list (job GPUs map to DCGM ids by UUID)
==============  ==========================================================================
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from gpuwarden.collector.parsers import normalize_pci_bus_id, parse_kernel_log_line
from gpuwarden.collector.sources import Nvml, nvml_str
from gpuwarden.shared.models import EventKind

from .io import KernelLog, ToolMissing, ToolOutput, ToolRunner, ToolTimeout, read_sysfs_ib
from .parsers import (
    DcgmDiag,
    DcgmDiscovery,
    DcgmGpu,
    IbPort,
    NvlinkGpu,
    NvlinkLink,
    parse_dcgmi_diag,
    parse_dcgmi_discovery,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
)

__all__ = [
    "APPLICATION_XIDS",
    "CHECKS",
    "REPAIR_XIDS",
    "CheckResult",
    "CheckSpec",
    "Context",
    "Inputs",
    "JobGpus",
    "NvmlUnavailable",
    "Phase",
    "Status",
    "evaluate_clocks",
    "evaluate_dcgm",
    "evaluate_infiniband",
    "evaluate_nvlink",
    "map_dcgm_gpus",
    "read_ib_ports",
    "worst",
]

log = logging.getLogger(__name__)

Phase = Literal["prolog", "epilog", "periodic"]


class Status(IntEnum):
    """Nagios plugin exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


_SEVERITY = {Status.OK: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.CRITICAL: 3}


def worst(statuses: Sequence[Status]) -> Status:
    """The overall status: CRITICAL > UNKNOWN > WARNING > OK (OK for an empty list)."""
    return max(statuses, key=lambda s: _SEVERITY[s], default=Status.OK)


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``reason`` is one line; ``gpu_index`` the first GPU at fault (None if
    node-wide or fine); ``duration_s`` wall seconds the check took (set by the runner)."""

    check: str
    status: Status
    reason: str
    gpu_index: int | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class Context:
    """What a run is about.

    * ``gpus``: the job's GPUs as Slurm numbers them (``SLURM_JOB_GPUS``: the ``/dev/nvidiaN``
      minor numbers), resolved to NVML indices by minor number (NVML renumbers the GPUs after
      one falls off the bus); ``gpu_uuids``: job GPUs given as ``GPU-``/``MIG-`` UUIDs
      (``CUDA_VISIBLE_DEVICES``). Both None = every GPU; ``gpus=[]`` = a job without GPUs.
    * ``since_ts``: epoch s from which kernel-log XIDs count (node-level events; GPU events too
      unless the next two say otherwise); ``since_by_gpu``: per Slurm GPU id, the end of the
      last epilog that checked it, and ``since_gpu_ts`` the start for a GPU not in it (prolog).
    * ``expected_gpus``: GPUs the node must have (None = any number >= 1, 0 = no GPUs).
    * ``ib_rate_gbps``: rate every IB port must reach (None = the fastest IB port's);
      ``ib_ports``: ACTIVE IB ports the node must have (None = every IB port must be ACTIVE);
      ``ib_ignore``: ``device`` or ``device/port`` names left out (uncabled ports).
    * ``nvlinks``: active NVLinks each GPU must have (None = every link a GPU reports; a node
      where no GPU has an active link has no NVLink).
    * ``max_used_mib``: used GPU memory (MiB) above which a GPU counts as not released;
      ``process_grace_s``: how long ``processes`` waits for leftovers to exit (epilog: CUDA
      teardown after the job's kill).
    * ``dcgm_level``: ``dcgmi diag -r`` level (0 = not run by default).
    * ``tool_timeout_s``: per external tool (ibstat, dmesg ...), s; ``dcgm_timeout_s``: for
      ``dcgmi diag``, s."""

    phase: Phase = "periodic"
    node: str = "localhost"
    job_id: str | None = None
    gpus: list[int] | None = None
    gpu_uuids: list[str] | None = None
    since_ts: float = 0.0
    since_by_gpu: dict[int, float] = field(default_factory=dict)
    since_gpu_ts: float | None = None
    expected_gpus: int | None = None
    ib_rate_gbps: float | None = None
    ib_ports: int | None = None
    ib_ignore: frozenset[str] = frozenset()
    nvlinks: int | None = None
    max_used_mib: float = 1024.0
    process_grace_s: float = 0.0
    dcgm_level: int = 0
    tool_timeout_s: float = 3.0
    dcgm_timeout_s: float = 8.0

    @property
    def whole_node(self) -> bool:
        """True when the run covers every GPU (no job GPU list)."""
        return self.gpus is None and self.gpu_uuids is None


@dataclass(frozen=True)
class JobGpus:
    """The job's GPUs resolved against NVML: ``indices`` (NVML), ``slurm_ids`` (NVML index ->
    Slurm GPU id, i.e. minor number, for every GPU NVML lists) and ``missing`` (one line per job
    GPU NVML does not list)."""

    indices: list[int] | None
    slurm_ids: dict[int, int]
    missing: list[str]
    missing_ids: list[int | str]


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node: no driver / nvidia-ml-py, or ``nvmlInit`` failed."""


@dataclass
class Inputs:
    """The outside systems, passed in (fakes in tests). ``nvml`` may be None (no driver): the
    NVML checks then report CRITICAL ``NVML unavailable``."""

    nvml: Nvml | None
    runner: ToolRunner
    kernel_log: KernelLog | None
    sysfs_root: Path = Path("/")
    clock: Callable[[], float] = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _init: BaseException | bool | None = field(default=None, repr=False)
    _job_cache: dict[object, JobGpus] = field(default_factory=dict, repr=False)

    def ready_nvml(self) -> Nvml:
        """``nvmlInit`` once for every check; raises :class:`NvmlUnavailable` when NVML is absent or failed."""
        with self._lock:
            if self.nvml is None:
                raise NvmlUnavailable("NVML unavailable (no driver / nvidia-ml-py)")
            if self._init is None:
                try:
                    self.nvml.nvmlInit()
                    self._init = True
                except Exception as exc:
                    self._init = exc
            if isinstance(self._init, BaseException):
                raise NvmlUnavailable(f"nvmlInit failed: {self._init}")
            return self.nvml

    def job_gpus(self, ctx: Context) -> JobGpus:
        """The job's GPUs of ``ctx`` as NVML indices (resolved once per GPU list; thread-safe).

        Slurm GPU ids match NVML devices by minor number (``nvmlDeviceGetMinorNumber``; an NVML
        without it: the index), UUIDs by ``nvmlDeviceGetUUID``, a ``MIG-`` UUID by its parent GPU.
        Raises NvmlUnavailable when NVML is unusable (as :meth:`ready_nvml`)."""
        key = (tuple(ctx.gpus) if ctx.gpus is not None else None, tuple(ctx.gpu_uuids or ()))
        with self._lock:
            hit = self._job_cache.get(key)
        if hit is not None:
            return hit
        nv = self.ready_nvml()
        n = nv.nvmlDeviceGetCount()
        minor_of: dict[int, int] = {}
        uuid_of: dict[str, int] = {}
        get_minor = getattr(nv, "nvmlDeviceGetMinorNumber", None)
        unreadable: list[int] = []
        for i in range(n):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                minor_of[i] = int(get_minor(h)) if get_minor is not None else i
            except nv.NVMLError:
                unreadable.append(i)  # the nvml check reports it
                continue
            try:
                uuid_of[nvml_str(nv.nvmlDeviceGetUUID(h)).lower()] = i
            except nv.NVMLError:
                pass
        taken = set(minor_of.values())
        for i in unreadable:  # assume the usual order where that names no readable GPU
            if i not in taken:
                minor_of[i] = i
                taken.add(i)
        index_of_minor = {m: i for i, m in minor_of.items()}
        if ctx.whole_node:
            res = JobGpus(None, minor_of, [], [])
        else:
            found: set[int] = set()
            missing: list[str] = []
            missing_ids: list[int | str] = []
            for g in ctx.gpus or []:
                if g in index_of_minor:
                    found.add(index_of_minor[g])
                else:
                    missing.append(f"job GPU {g} (/dev/nvidia{g}) not visible to NVML")
                    missing_ids.append(g)
            for u in ctx.gpu_uuids or []:
                idx = uuid_of.get(u.lower())
                if idx is None and u.upper().startswith("MIG-"):
                    idx = _mig_parent_index(nv, u)
                if idx is None:
                    missing.append(f"job GPU {u} not visible to NVML")
                    missing_ids.append(u)
                else:
                    found.add(idx)
            res = JobGpus(sorted(found), minor_of, missing, missing_ids)
        with self._lock:
            self._job_cache[key] = res
        return res

    def shutdown(self) -> None:
        with self._lock:
            if self._init is True and self.nvml is not None:
                try:
                    self.nvml.nvmlShutdown()
                except Exception:  # best effort at exit
                    pass
            self._init = None


def _nvml_err(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _mig_parent_index(nv: Any, uuid: str) -> int | None:
    """NVML index of the GPU holding MIG device ``uuid`` (None when NVML cannot tell)."""
    try:
        mig = nv.nvmlDeviceGetHandleByUUID(uuid)
        return int(nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)))
    except Exception:  # no such calls (old NVML, fakes) or an unknown UUID
        return None


def _gpu_indices(inp: Inputs, nv: Nvml, ctx: Context) -> list[int]:
    jg = inp.job_gpus(ctx)
    return list(jg.indices) if jg.indices is not None else list(range(nv.nvmlDeviceGetCount()))


def _handles(inp: Inputs, ctx: Context) -> tuple[Nvml, list[tuple[int, Any]], list[str]]:
    """(nvml, [(index, handle)], [errors]) for the selected GPUs; a GPU whose handle fails is an error."""
    nv = inp.ready_nvml()
    out: list[tuple[int, Any]] = []
    errs: list[str] = []
    for i in _gpu_indices(inp, nv, ctx):
        try:
            out.append((i, nv.nvmlDeviceGetHandleByIndex(i)))
        except nv.NVMLError as exc:
            errs.append(f"GPU {i}: {_nvml_err(exc)}")
    return nv, out, errs


def _result(name: str, problems: list[tuple[Status, str, int | None]], ok: str) -> CheckResult:
    if not problems:
        return CheckResult(name, Status.OK, ok)
    st = worst([p[0] for p in problems])
    first = [p for p in problems if p[0] == st]
    reasons = [p[1] for p in first] + [p[1] for p in problems if p[0] != st]
    more = f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return CheckResult(name, st, "; ".join(reasons[:3]) + more, first[0][2])


# -- NVML checks ------------------------------------------------------------------------


def check_gpu_count(inp: Inputs, ctx: Context) -> CheckResult:
    nv = inp.ready_nvml()
    n = nv.nvmlDeviceGetCount()
    probs: list[tuple[Status, str, int | None]] = []
    if n == 0 and ctx.expected_gpus != 0:
        probs.append((Status.CRITICAL, "no GPU visible to NVML", None))
    elif ctx.expected_gpus is not None and n < ctx.expected_gpus:
        probs.append((Status.CRITICAL, f"{n}/{ctx.expected_gpus} GPUs visible", None))
    elif ctx.expected_gpus is not None and n > ctx.expected_gpus:
        probs.append((Status.WARNING, f"{n} GPUs visible, {ctx.expected_gpus} expected", None))
    jg = inp.job_gpus(ctx)
    if jg.missing:
        probs.append((Status.CRITICAL, f"job GPU(s) {jg.missing_ids} absent ({n} visible)", None))
    exp = f"/{ctx.expected_gpus}" if ctx.expected_gpus is not None else ""
    return _result("gpu-count", probs, f"{n}{exp} GPUs visible")


def check_nvml(inp: Inputs, ctx: Context) -> CheckResult:
    nv, hs, errs = _handles(inp, ctx)
    probs: list[tuple[Status, str, int | None]] = [(Status.CRITICAL, e, None) for e in errs]
    for i, h in hs:
        try:
            nv.nvmlDeviceGetUUID(h)
            nv.nvmlDeviceGetMemoryInfo(h)
            nv.nvmlDeviceGetTemperature(h, 0)
            nv.nvmlDeviceGetPowerUsage(h)
        except nv.NVMLError as exc:
            probs.append((Status.CRITICAL, f"GPU {i}: {_nvml_err(exc)}", i))
    return _result("nvml", probs, f"{len(hs)} GPU(s) answer NVML")


def _leftovers(nv: Any, hs: list[tuple[int, Any]], ctx: Context) -> list[tuple[Status, str, int | None]]:
    probs: list[tuple[Status, str, int | None]] = []
    for i, h in hs:
        try:
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
            used_mib = nv.nvmlDeviceGetMemoryInfo(h).used / (1024 * 1024)
        except nv.NVMLError as exc:
            probs.append((Status.CRITICAL, f"GPU {i}: {_nvml_err(exc)}", i))
            continue
        if procs:
            pids = ",".join(str(p.pid) for p in procs[:4])
            probs.append((Status.CRITICAL, f"GPU {i}: {len(procs)} leftover process(es) pid {pids}", i))
        elif used_mib > ctx.max_used_mib:
            probs.append((Status.CRITICAL, f"GPU {i}: {used_mib:.0f} MiB used with no process", i))
    return probs


def check_processes(inp: Inputs, ctx: Context) -> CheckResult:
    """Leftover compute processes or memory on the job's GPUs. With ``process_grace_s`` (epilog)
    a GPU that is not free yet is looked at again every 0.5 s until it is or the grace is over:
    the job's processes may still be exiting (CUDA context teardown after slurmstepd's kill)."""
    nv, hs, errs = _handles(inp, ctx)
    probs = _leftovers(nv, hs, ctx)
    deadline = time.monotonic() + ctx.process_grace_s
    while probs and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        busy = {p[2] for p in probs}
        probs = _leftovers(nv, [(i, h) for i, h in hs if i in busy], ctx)
    probs = [(Status.CRITICAL, e, None) for e in errs] + probs
    return _result("processes", probs, f"{len(hs)} GPU(s) free")


def check_ecc(inp: Inputs, ctx: Context) -> CheckResult:
    nv, hs, errs = _handles(inp, ctx)
    probs: list[tuple[Status, str, int | None]] = [(Status.CRITICAL, e, None) for e in errs]
    for i, h in hs:
        try:
            dbe = nv.nvmlDeviceGetTotalEccErrors(h, 1, 0)  # uncorrected, volatile
            if dbe > 0:
                probs.append((Status.CRITICAL, f"GPU {i}: {dbe} uncorrectable ECC error(s)", i))
        except nv.NVMLError:
            pass  # ECC off / not supported (consumer GPUs)
        try:
            _corr, _unc, pending, failed = nv.nvmlDeviceGetRemappedRows(h)
            if failed:
                probs.append((Status.CRITICAL, f"GPU {i}: row remapping failed", i))
            elif pending:
                probs.append((Status.CRITICAL, f"GPU {i}: row remap pending (reset the GPU)", i))
        except nv.NVMLError:
            pass  # pre-Ampere: page retirement instead
        pend = getattr(nv, "nvmlDeviceGetRetiredPagesPendingStatus", None)
        if pend is not None:
            try:
                if pend(h):
                    probs.append((Status.CRITICAL, f"GPU {i}: retired pages pending (reset the GPU)", i))
            except nv.NVMLError:
                pass  # Ampere+ remap rows instead
    return _result("ecc", probs, f"{len(hs)} GPU(s) without uncorrectable ECC or pending remap")


# clock event reason bits (nvml.h nvmlClocksEventReason*)
_HW_SLOWDOWN, _SW_THERMAL, _HW_THERMAL, _HW_BRAKE, _IDLE = 0x8, 0x20, 0x40, 0x80, 0x1


def evaluate_clocks(index: int, reasons: int) -> tuple[Status, str] | None:
    """Problem of one GPU's clock event reasons bitmask (NVML), None when fine."""
    hw = [
        n
        for b, n in ((_HW_SLOWDOWN, "HW slowdown"), (_HW_THERMAL, "HW thermal"), (_HW_BRAKE, "power brake"))
        if reasons & b
    ]
    if hw:
        return Status.CRITICAL, f"GPU {index}: clocks held by {' + '.join(hw)}"
    if reasons & _SW_THERMAL:
        return Status.WARNING, f"GPU {index}: clocks held by SW thermal slowdown"
    return None


def _clock_reasons(nv: Any, h: Any) -> int:
    """Clock event reasons bitmask: ``nvmlDeviceGetCurrentClocksEventReasons`` (drivers R535+),
    else the older ``nvmlDeviceGetCurrentClocksThrottleReasons`` (same bits). Raises NVMLError."""
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is not None:
        try:
            return int(fn(h))
        except nv.NVMLError as exc:
            old = getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            if old is None or "Function Not Found" not in str(exc):
                raise
            return int(old(h))
    return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def check_clocks(inp: Inputs, ctx: Context) -> CheckResult:
    nv, hs, errs = _handles(inp, ctx)
    probs: list[tuple[Status, str, int | None]] = [(Status.CRITICAL, e, None) for e in errs]
    for i, h in hs:
        try:
            r = _clock_reasons(nv, h)
        except (nv.NVMLError, AttributeError) as exc:
            probs.append((Status.UNKNOWN, f"GPU {i}: clock reasons unreadable ({_nvml_err(exc)})", i))
            continue
        p = evaluate_clocks(i, r)
        if p:
            probs.append((p[0], p[1], i))
    return _result("clocks", probs, f"{len(hs)} GPU(s) not clock-limited by HW")


def check_pcie(inp: Inputs, ctx: Context) -> CheckResult:
    nv, hs, errs = _handles(inp, ctx)
    probs: list[tuple[Status, str, int | None]] = [(Status.CRITICAL, e, None) for e in errs]
    max_gen_f = getattr(nv, "nvmlDeviceGetMaxPcieLinkGeneration", None)
    max_w_f = getattr(nv, "nvmlDeviceGetMaxPcieLinkWidth", None)
    if max_gen_f is None or max_w_f is None:
        return CheckResult("pcie", Status.UNKNOWN, "NVML has no max PCIe link calls")
    for i, h in hs:
        try:
            gen, width = nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)
            mgen, mwidth = max_gen_f(h), max_w_f(h)
        except nv.NVMLError as exc:
            probs.append((Status.UNKNOWN, f"GPU {i}: PCIe link unreadable ({_nvml_err(exc)})", i))
            continue
        if width < mwidth:
            probs.append((Status.CRITICAL, f"GPU {i}: PCIe x{width} of x{mwidth} (gen {gen}/{mgen})", i))
            continue
        if gen >= mgen:
            continue
        try:
            idle = bool(_clock_reasons(nv, h) & _IDLE)
        except (nv.NVMLError, AttributeError):
            idle = True  # cannot tell: a lower generation may be power saving, do not warn
        if not idle:
            probs.append((Status.WARNING, f"GPU {i}: PCIe gen {gen} of {mgen} while busy", i))
    return _result("pcie", probs, f"{len(hs)} GPU(s) at full PCIe width")


def evaluate_nvlink(
    gpus: Sequence[NvlinkGpu], selected: Sequence[int] | None = None, expected: int | None = None
) -> CheckResult:
    """NVLink verdict over ``nvidia-smi nvlink --status`` data (or NVML converted to it) of every
    GPU of the node; ``selected`` are the GPUs judged (None = all).

    ``expected`` None: when no GPU of the node has an active link, the node has no NVLink
    connected (PCIe cards without a bridge report every link inactive): OK. Otherwise every link
    a selected GPU reports must be active (CRITICAL names the inactive ones). ``expected`` N
    (set it for bridged PCIe pairs, whose unbridged links stay inactive): each selected GPU needs
    N active links."""
    sel = [g for g in gpus if selected is None or g.index in selected]
    if expected is None and not any(lk.active for g in gpus for lk in g.links):
        reporting = sum(1 for g in gpus if g.links)
        why = f" ({reporting} GPU(s) report only inactive links)" if reporting else ""
        return CheckResult("nvlink", Status.OK, f"no NVLink connected on this node{why}")
    probs: list[tuple[Status, str, int | None]] = []
    total = up = 0
    for g in sel:
        down = [lk.link for lk in g.links if not lk.active]
        n_up = len(g.links) - len(down)
        want = len(g.links) if expected is None else expected
        total += want
        up += min(n_up, want)
        if n_up < want:
            why = f"NVLink {down} inactive" if expected is None else f"{n_up}/{want} NVLinks active, {down} inactive"
            probs.append((Status.CRITICAL, f"GPU {g.index}: {why}", g.index))
    if total == 0:
        return CheckResult("nvlink", Status.OK, "no NVLink on the selected GPUs")
    return _result("nvlink", probs, f"{up}/{total} NVLinks up on {len(sel)} GPU(s)")


def check_nvlink(inp: Inputs, ctx: Context) -> CheckResult:
    """NVML link state 0..17 of every GPU (whether the node has NVLink at all is a node-wide
    question), judged on the job's GPUs."""
    nv, hs, errs = _handles(inp, Context(gpus=None))
    state = getattr(nv, "nvmlDeviceGetNvLinkState", None)
    if state is None:
        return CheckResult("nvlink", Status.UNKNOWN, "NVML has no nvmlDeviceGetNvLinkState")
    gpus = []
    for i, h in hs:
        links = []
        for lk in range(18):  # NVML_NVLINK_MAX_LINKS
            try:
                links.append(NvlinkLink(lk, bool(state(h, lk)), None))
            except nv.NVMLError:
                break  # no such link (NOT_SUPPORTED / INVALID_ARGUMENT): the GPU has lk links
        gpus.append(NvlinkGpu(i, "", None, links))
    job = inp.job_gpus(ctx).indices
    res = evaluate_nvlink(gpus, job, ctx.nvlinks)
    mine = [e for e in errs if job is None or any(e.startswith(f"GPU {i}:") for i in job)]
    if mine:  # another job's lost GPU is that job's business (its own nvml check reports it)
        return CheckResult("nvlink", Status.CRITICAL, "; ".join(mine[:3]))
    return res


_FABRIC_STATE = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}


def check_fabric(inp: Inputs, ctx: Context) -> CheckResult:
    """NVSwitch fabric registration of each job GPU (``nvmlDeviceGetGpuFabricInfo``, HGX/DGX
    H100 and later with nvidia-fabricmanager): CRITICAL while the state is not ``completed`` or
    registration ended with an error; such a GPU fails every CUDA call ("system not yet
    initialized"). GPUs without a fabric (PCIe, A100 HGX: state "not supported", or an NVML
    without the call) are OK."""
    nv, hs, errs = _handles(inp, ctx)
    probs: list[tuple[Status, str, int | None]] = [(Status.CRITICAL, e, None) for e in errs]
    fn = getattr(nv, "nvmlDeviceGetGpuFabricInfo", None)
    struct = getattr(nv, "c_nvmlGpuFabricInfo_t", None)
    if fn is None or struct is None:
        return _result("fabric", probs, "NVML has no GPU fabric call (driver < R530): not checked")
    fabric = 0
    for i, h in hs:
        info = struct()
        try:
            fn(h, ctypes.byref(info))
        except nv.NVMLError as exc:
            if "Not Supported" in str(exc) or "Function Not Found" in str(exc):
                continue
            probs.append((Status.UNKNOWN, f"GPU {i}: fabric state unreadable ({_nvml_err(exc)})", i))
            continue
        state = int(info.state)
        if state == 0:
            continue
        fabric += 1
        if state != 3:
            why = f"NVLink fabric {_FABRIC_STATE.get(state, state)} (is nvidia-fabricmanager running?)"
            probs.append((Status.CRITICAL, f"GPU {i}: {why}", i))
        elif int(info.status) != 0:
            probs.append(
                (Status.CRITICAL, f"GPU {i}: NVLink fabric registration failed (NVML status {int(info.status)})", i)
            )
    if not fabric and not probs:
        return CheckResult("fabric", Status.OK, f"{len(hs)} GPU(s) without an NVSwitch fabric")
    return _result("fabric", probs, f"{fabric} GPU(s) registered with the NVLink fabric")


# -- kernel log -------------------------------------------------------------------------

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})
"""XIDs usually caused by the job's own code (illegal address, MMU fault from user code, reset
channel, preemptive cleanup): WARNING, not a bad node."""

REPAIR_XIDS = frozenset({63, 92})
"""Memory repair / correctable-error notices (63 row remapping recorded, 92 high single-bit ECC
rate): WARNING; whether a remap is pending or failed is the ``ecc`` check's verdict."""

_RECOVERY_RE = re.compile(r"to 0x[0-9a-fA-F]+ \(([^)]*)\)")


def _xid_status(code: int | None, message: str) -> Status | None:
    """Status of one XID: XID 154 (R565+ "GPU recovery action changed from ... to 0xN (ACTION)")
    by the action it ends on (None: recovered, OK; otherwise CRITICAL, the driver asks for a
    reset/drain/reboot), the application and repair sets WARNING, any other XID CRITICAL."""
    if code == 154:
        m = _RECOVERY_RE.search(message)
        if m and m.group(1).strip().lower() == "none":
            return None
        return Status.CRITICAL
    if code in APPLICATION_XIDS or code in REPAIR_XIDS:
        return Status.WARNING
    return Status.CRITICAL


def check_xid(inp: Inputs, ctx: Context) -> CheckResult:
    """XIDs/SXIDs in the kernel log inside the window: a GPU's events count from its own window
    start (``since_by_gpu``: the last epilog that checked it; else ``since_ts``), node-level
    events (NVSwitch SXIDs, a PCI address that is no GPU NVML lists) from ``since_ts``. In a job,
    events of GPUs outside the job are left out."""
    if inp.kernel_log is None:
        return CheckResult("xid", Status.UNKNOWN, "no kernel log configured")
    now = inp.clock()
    try:
        lines = inp.kernel_log.read_lines()
    except (OSError, ToolMissing, ToolTimeout) as exc:  # a log we cannot read proves nothing
        return CheckResult("xid", Status.UNKNOWN, f"kernel log unreadable: {type(exc).__name__}: {exc}"[:160])
    pci_to_index: dict[str, int] = {}
    job: list[int] | None = None
    slurm_ids: dict[int, int] = {}
    if not ctx.whole_node or ctx.since_by_gpu or ctx.since_gpu_ts is not None:
        try:
            jg = inp.job_gpus(ctx)
            job, slurm_ids = jg.indices, jg.slurm_ids
            nv, hs, _ = _handles(inp, Context(gpus=None))
            for i, h in hs:
                pci_to_index[normalize_pci_bus_id(nvml_str(nv.nvmlDeviceGetPciInfo(h).busId))] = i
        except Exception:  # NVML unusable: cannot map, every XID counts from since_ts
            pci_to_index, job = {}, None
    probs: list[tuple[Status, str, int | None]] = []
    tz = datetime.now().astimezone().tzinfo or UTC  # syslog / dmesg -T stamps are the node's local time
    for ln in lines:
        ev = parse_kernel_log_line(ln, ctx.node, default_ts=now, tz=tz)
        if ev is None:
            continue
        idx = pci_to_index.get(ev.pci_bus_id or "") if pci_to_index else None
        if job is not None and idx is not None and idx not in job:
            continue  # another job's GPU
        start = ctx.since_ts
        if idx is not None and idx in slurm_ids:
            gpu_default = ctx.since_gpu_ts if ctx.since_gpu_ts is not None else ctx.since_ts
            start = ctx.since_by_gpu.get(slurm_ids[idx], gpu_default)
        if ev.ts < start:
            continue
        where = f"GPU {idx}" if idx is not None else f"PCI {ev.pci_bus_id or '?'}"
        if ev.kind == EventKind.SXID:
            if ev.fatal:
                probs.append((Status.CRITICAL, f"fatal SXID {ev.code} on {where}", idx))
            continue
        st = _xid_status(ev.code, ev.message)
        if st is None:
            continue
        undated = ev.ts == now and parse_kernel_log_line(ln, ctx.node, default_ts=now + 1.0, tz=tz).ts != now  # type: ignore[union-attr]
        if undated:  # no wall-clock stamp ([ 365.9] or none): it would count again on every run
            probs.append((Status.WARNING, f"XID {ev.code} on {where} (undated log line): {ev.message[:50]}", idx))
        else:
            probs.append((st, f"XID {ev.code} on {where}: {ev.message[:60]}", idx))
    return _result("xid", probs, f"no XID since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ctx.since_ts))}")


# -- InfiniBand -------------------------------------------------------------------------


def evaluate_infiniband(
    ports: Sequence[IbPort],
    rate_gbps: float | None = None,
    min_ports: int | None = None,
    source: str | None = None,
    ignore: frozenset[str] = frozenset(),
) -> CheckResult:
    """InfiniBand verdict over parsed ports. Only ``link_layer`` InfiniBand ports (or unknown
    layer) count, minus those named in ``ignore`` (``mlx5_3`` or ``mlx4_0/2``).

    ``min_ports`` None: every IB port must be ``ACTIVE``/``LinkUp``. ``min_ports`` N: the node
    needs N ACTIVE IB ports (CRITICAL below, naming the down ones); ports down beyond that are
    not required (the uncabled second port of a dual-port HCA) and only mentioned. Active ports
    must run at ``rate_gbps`` (default: the fastest IB port's rate) Gb/s; a port whose rate the
    source does not print (plain ``ibv_devinfo``) is a WARNING only when a rate is required.
    ``source`` (``sysfs``, ``ibstat`` ...) is named in the reason."""
    ib = [
        p
        for p in ports
        if (p.link_layer or "InfiniBand").lower() == "infiniband"
        and p.device not in ignore
        and f"{p.device}/{p.port}" not in ignore
    ]
    probs: list[tuple[Status, str, int | None]] = []
    up = [p for p in ib if p.state == "ACTIVE" and (p.phys_state is None or p.phys_state == "LinkUp")]
    down = [p for p in ib if p not in up]
    down_txt = [f"{p.device}/{p.port} {p.state}/{p.phys_state or '?'}" for p in down]
    if min_ports is None:
        probs += [(Status.CRITICAL, t, None) for t in down_txt]
    elif len(up) < min_ports:
        probs.append((Status.CRITICAL, f"{len(up)}/{min_ports} InfiniBand ports ACTIVE", None))
        probs += [(Status.CRITICAL, t, None) for t in down_txt]
    want = rate_gbps if rate_gbps is not None else max((p.rate_gbps or 0 for p in up), default=0)
    for p in up:
        name = f"{p.device}/{p.port}"
        if want and p.rate_gbps is None:
            probs.append((Status.WARNING, f"{name} rate not reported (expected {want:g} Gb/s)", None))
        elif want and (p.rate_gbps or 0) < want:
            probs.append((Status.CRITICAL, f"{name} at {p.rate_gbps:g} Gb/s, expected {want:g}", None))
    via = f" ({source})" if source else ""
    if not ib and not probs:
        return CheckResult("infiniband", Status.OK, f"no InfiniBand ports{via}")
    at = f" at {want:g} Gb/s" if want else ""
    spare = f"; not required: {', '.join(down_txt)}" if min_ports is not None and down and len(up) >= min_ports else ""
    return _result("infiniband", probs, f"{len(up)} InfiniBand port(s) ACTIVE{at}{via}{spare}")


# (argv, parser) tried in order when sysfs has no RDMA devices (a container without /sys/class/infiniband)
_IB_TOOLS: tuple[tuple[list[str], Callable[[str], list[IbPort]]], ...] = (
    (["ibstat"], parse_ibstat),
    (["ibstatus"], parse_ibstatus),
    (["ibv_devinfo", "-v"], parse_ibv_devinfo),
)


def read_ib_ports(inp: Inputs, ctx: Context) -> tuple[list[IbPort], str | None, list[str]]:
    """The node's RDMA ports, where they were read, and what went wrong on the way: sysfs first
    (no tool to run), then the first of ``ibstat``, ``ibstatus``, ``ibv_devinfo -v`` that is
    installed and parses. A tool that prints nothing ("No IB devices found" on stderr) counts as
    no devices; one that exits non-zero after printing part of its output (``ibpanic``, exit
    255) or whose output its parser marks incomplete, one that hangs past ``tool_timeout_s`` or
    prints what its parser cannot read is a problem, and the next source is tried."""
    ports = read_sysfs_ib(inp.sysfs_root)
    if ports:
        return ports, "sysfs", []
    problems: list[str] = []
    for argv, parse in _IB_TOOLS:
        try:
            out = inp.runner.run(argv, ctx.tool_timeout_s)
        except ToolMissing:
            continue
        except ToolTimeout as exc:
            problems.append(str(exc))
            continue
        if not out.stdout.strip():
            continue  # nothing printed (exit 0, or "No IB devices found" on stderr): no devices here
        if out.returncode != 0:  # died part-way (ibstat's ibpanic, exit 255): what it printed is partial
            problems.append(f"{argv[0]} exited {out.returncode} after partial output: {_last_line(out)}"[:120])
            continue
        try:
            return parse(out.stdout), argv[0], []
        except ValueError as exc:
            problems.append(f"{argv[0]} output unreadable ({exc})"[:100])
    return [], None, problems


def check_infiniband(inp: Inputs, ctx: Context) -> CheckResult:
    ports, source, problems = read_ib_ports(inp, ctx)
    if source is None and problems:  # cannot tell "no ports" from "could not read them"
        return CheckResult("infiniband", Status.UNKNOWN, "InfiniBand ports unreadable: " + "; ".join(problems))
    return evaluate_infiniband(ports, ctx.ib_rate_gbps, ctx.ib_ports, source, ctx.ib_ignore)


# -- DCGM -------------------------------------------------------------------------------


def evaluate_dcgm(diag: DcgmDiag) -> CheckResult:
    """DCGM verdict: any Fail CRITICAL; a cut-off table UNKNOWN; every test skipped UNKNOWN;
    any Warn or Skip WARNING (skip is not pass); else OK."""
    fails, warns, skips = diag.by_result("fail"), diag.by_result("warn"), diag.by_result("skip")
    passes = diag.by_result("pass")
    g0 = next((t.gpus[0] for t in fails if t.gpus), None)
    if fails:
        return CheckResult(
            "dcgm",
            Status.CRITICAL,
            "dcgmi diag fail: " + "; ".join(f"{t.name}: {t.detail}"[:80] for t in fails[:3]),
            g0,
        )
    if not diag.complete:
        return CheckResult("dcgm", Status.UNKNOWN, f"dcgmi diag output cut off after {len(diag.tests)} rows")
    if not passes:
        return CheckResult("dcgm", Status.UNKNOWN, f"dcgmi diag: no test passed ({len(skips)} skipped)")
    if warns or skips:
        names = [f"{t.name} {t.result}" for t in warns + skips]
        return CheckResult("dcgm", Status.WARNING, f"dcgmi diag: {', '.join(names[:4])}")
    return CheckResult("dcgm", Status.OK, f"dcgmi diag: {len(passes)} tests pass")


def map_dcgm_gpus(
    discovery: DcgmDiscovery, nvml_ids: Sequence[tuple[int, str | None, str | None]]
) -> tuple[list[int], list[str]]:
    """DCGM GPU ids of the job's GPUs: ``nvml_ids`` is ``[(nvml_index, uuid, pci_bus_id)]``; each is
    matched by UUID, then by PCI bus id (DCGM numbers GPUs itself; on a node with excluded or
    detached GPUs its ids differ from NVML indices). Returns ``(dcgm_ids, problems)``: one problem
    line per GPU that DCGM does not list (or lists as inactive)."""
    by_uuid = discovery.by_uuid()
    by_bus: dict[str, DcgmGpu] = {}
    for g in discovery.gpus:
        try:
            if g.pci_bus_id:
                by_bus[normalize_pci_bus_id(g.pci_bus_id)] = g
        except ValueError:
            pass
    ids: list[int] = []
    problems: list[str] = []
    for index, uuid, bus in nvml_ids:
        found = by_uuid.get(uuid.lower()) if uuid else None
        if found is None and bus:
            try:
                found = by_bus.get(normalize_pci_bus_id(bus))
            except ValueError:
                found = None
        if found is None:
            problems.append(f"GPU {index} ({uuid or bus or '?'}) not listed by dcgmi discovery")
        elif found.status is not None and found.status.lower() not in ("ok", "active"):
            problems.append(f"GPU {index} is {found.status} in DCGM")
        else:
            ids.append(found.gpu_id)
    return ids, problems


def _dcgmi(inp: Inputs, argv: list[str], timeout_s: float) -> ToolOutput | CheckResult:
    try:
        return inp.runner.run(argv, timeout_s)
    except ToolMissing:
        return CheckResult("dcgm", Status.UNKNOWN, "dcgmi not installed")
    except ToolTimeout as exc:
        return CheckResult("dcgm", Status.UNKNOWN, f"{' '.join(argv[:3])}: {exc}")


def _last_line(out: ToolOutput) -> str:
    text = (out.stdout + out.stderr).strip().splitlines()
    return (text or ["(no output)"])[-1][:100]


def check_dcgm(inp: Inputs, ctx: Context) -> CheckResult:
    """``dcgmi discovery -l`` maps the job's GPUs (NVML index -> UUID -> DCGM GPU id), then
    ``dcgmi diag -r LEVEL -i IDS`` runs on exactly those GPUs (killed after ``dcgm_timeout_s``).
    Without a job GPU list the diag runs on DCGM's default all-GPU group. UNKNOWN when DCGM is
    absent, the host engine does not answer, the diag runs past its time, or a job GPU is not
    visible to DCGM (a diag that cannot cover a GPU proves nothing about it)."""
    t0 = time.monotonic()
    level = ctx.dcgm_level or 1
    argv = ["dcgmi", "diag", "-r", str(level)]
    to_nvml: dict[int, int] = {}  # DCGM GPU id -> NVML index
    if not ctx.whole_node:
        disc_out = _dcgmi(inp, ["dcgmi", "discovery", "-l"], ctx.tool_timeout_s)
        if isinstance(disc_out, CheckResult):
            return disc_out
        try:
            discovery = parse_dcgmi_discovery(disc_out.stdout)
        except ValueError:
            why = _last_line(disc_out)
            return CheckResult("dcgm", Status.UNKNOWN, f"dcgmi discovery exited {disc_out.returncode}: {why}")
        if not discovery.complete:  # a cut-off list cannot tell a missing GPU from a lost row
            return CheckResult("dcgm", Status.UNKNOWN, discovery.error or "dcgmi discovery output cut off")
        ids: list[int]
        problems: list[str]
        try:
            nv = inp.ready_nvml()
            jg = inp.job_gpus(ctx)
            problems = list(jg.missing)
            nvml_ids: list[tuple[int, str | None, str | None]] = []
            for i in jg.indices or []:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                nvml_ids.append((i, nvml_str(nv.nvmlDeviceGetUUID(h)), nvml_str(nv.nvmlDeviceGetPciInfo(h).busId)))
        except Exception as exc:  # NVML unusable: the NVML checks report it; DCGM ids = Slurm ids
            log.debug("dcgm: NVML ids unavailable (%s); using the job's GPU ids as DCGM ids", exc)
            ids, problems = list(ctx.gpus or []), []
        else:
            ids, more = map_dcgm_gpus(discovery, nvml_ids)
            problems += more
            if not more:
                to_nvml = dict(zip(ids, (i for i, _u, _b in nvml_ids), strict=True))
        if problems:
            return CheckResult("dcgm", Status.UNKNOWN, "; ".join(problems[:3]))
        if not ids:
            return CheckResult("dcgm", Status.OK, "no GPUs in the job: dcgmi diag not run")
        argv += ["-i", ",".join(str(g) for g in ids)]
    out = _dcgmi(inp, argv, max(0.1, ctx.dcgm_timeout_s - (time.monotonic() - t0)))  # what discovery left
    if isinstance(out, CheckResult):
        return out
    try:
        res = evaluate_dcgm(parse_dcgmi_diag(out.stdout))
    except ValueError:
        return CheckResult("dcgm", Status.UNKNOWN, f"dcgmi diag exited {out.returncode}: {_last_line(out)}")
    if res.gpu_index is not None and res.gpu_index in to_nvml:  # DCGM's GPU id -> the NVML index
        res = CheckResult(res.check, res.status, res.reason, to_nvml[res.gpu_index])
    return res


# -- registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: ``fn(inputs, context) -> CheckResult`` and the phases running it by default."""

    name: str
    fn: Callable[[Inputs, Context], CheckResult]
    phases: frozenset[str]


_ALL = frozenset({"prolog", "epilog", "periodic"})
CHECKS: dict[str, CheckSpec] = {
    s.name: s
    for s in (
        CheckSpec("gpu-count", check_gpu_count, _ALL),
        CheckSpec("nvml", check_nvml, _ALL),
        CheckSpec("processes", check_processes, frozenset({"prolog", "epilog"})),  # a busy node is not a fault
        CheckSpec("ecc", check_ecc, _ALL),
        CheckSpec("xid", check_xid, _ALL),
        CheckSpec("pcie", check_pcie, _ALL),
        CheckSpec("nvlink", check_nvlink, _ALL),
        CheckSpec("fabric", check_fabric, _ALL),
        CheckSpec("clocks", check_clocks, _ALL),
        CheckSpec("infiniband", check_infiniband, _ALL),
        CheckSpec("dcgm", check_dcgm, frozenset()),  # only by name or with a dcgm level > 0
    )
}
