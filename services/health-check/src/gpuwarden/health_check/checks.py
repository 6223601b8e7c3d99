"""The health checks: each a small synchronous function over narrow inputs, returning one result.

A check gets an :class:`Inputs` (NVML through the collector's ``Nvml`` protocol, a
:class:`~gpuwarden.health_check.io.ToolRunner`, a :class:`~gpuwarden.health_check.io.KernelLog`,
a sysfs root, a clock) and a :class:`Context` (phase, the job's GPUs, thresholds), and returns a
:class:`CheckResult` whose :class:`Status` is a Nagios code. Decisions over already-read data
are pure ``evaluate_*`` functions, tested on recorded tool output. Checks register by name in
:data:`CHECKS` (which phases run them by default).

Status per check (the first reason printed is the worst):

==============  ==========================================================================
gpu-count       CRITICAL fewer GPUs than expected, none, or a job GPU index that is absent
nvml            CRITICAL a GPU that does not answer NVML (lost, unknown error, ...)
processes       CRITICAL compute processes left on a GPU, or used memory above the threshold
ecc             CRITICAL volatile uncorrectable ECC > 0, row remap pending/failed,
                retired pages pending
xid             CRITICAL any XID outside the application set {13, 31, 43, 45, 68, 69} or a
                fatal SXID since the window start; WARNING application XIDs only
pcie            CRITICAL link width below its maximum; WARNING generation below its maximum on
                a busy GPU (idle GPUs lower the generation to save power)
nvlink          CRITICAL an inactive link on a GPU that has NVLink
clocks          CRITICAL HW slowdown / HW thermal slowdown / HW power brake; WARNING SW thermal
infiniband      CRITICAL an InfiniBand port not ACTIVE/LinkUp, below the expected rate, or fewer
                IB ports than expected (Ethernet/RoCE ports are ignored); ports from sysfs, else
                ibstat, ibstatus, ibv_devinfo -v; WARNING a rate is required but not reported
dcgm            CRITICAL a Fail; WARNING a Warn or a Skip (skip is not pass); UNKNOWN a cut-off
                table, no dcgmi / host engine, every test skipped, or a job GPU that
                dcgmi discovery does not list (job GPUs map to DCGM ids by UUID)
==============  ==========================================================================
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from gpuwarden.collector.parsers import normalize_pci_bus_id, parse_kernel_log_line
from gpuwarden.collector.sources import Nvml
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
    "CheckResult",
    "CheckSpec",
    "Context",
    "Inputs",
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
    """What a run is about. ``gpus``: the job's NVML indices (None = every GPU);
    ``since_ts``: epoch s from which kernel-log XIDs count; ``expected_gpus``: GPUs the node
    must have (None = any number >= 1); ``ib_rate_gbps``: rate every IB port must reach (None =
    the fastest IB port's rate); ``ib_ports``: IB ports the node must have (None = any);
    ``max_used_mib``: used GPU memory (MiB) above which a GPU counts as not released;
    ``dcgm_level``: ``dcgmi diag -r`` level (0 = the dcgm check is not run by default)."""

    phase: Phase = "periodic"
    node: str = "localhost"
    job_id: str | None = None
    gpus: list[int] | None = None
    since_ts: float = 0.0
    expected_gpus: int | None = None
    ib_rate_gbps: float | None = None
    ib_ports: int | None = None
    max_used_mib: float = 1024.0
    dcgm_level: int = 0
    tool_timeout_s: float = 8.0


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

    def ready_nvml(self) -> Nvml:
        """``nvmlInit`` once for every check; raises RuntimeError when NVML is absent or failed."""
        with self._lock:
            if self.nvml is None:
                raise RuntimeError("NVML unavailable (no driver / nvidia-ml-py)")
            if self._init is None:
                try:
                    self.nvml.nvmlInit()
                    self._init = True
                except Exception as exc:
                    self._init = exc
            if isinstance(self._init, BaseException):
                raise RuntimeError(f"nvmlInit failed: {self._init}")
            return self.nvml

    def shutdown(self) -> None:
        with self._lock:
            if self._init is True and self.nvml is not None:
                try:
                    self.nvml.nvmlShutdown()
                except Exception:  # best effort at exit
                    pass
            self._init = None


def _text(v: object) -> str:
    """NVML strings: ``str`` in nvidia-ml-py >= 11.5, ``bytes`` before."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _nvml_err(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _gpu_indices(nv: Nvml, ctx: Context) -> list[int]:
    n = nv.nvmlDeviceGetCount()
    return list(ctx.gpus) if ctx.gpus is not None else list(range(n))


def _handles(inp: Inputs, ctx: Context) -> tuple[Nvml, list[tuple[int, Any]], list[str]]:
    """(nvml, [(index, handle)], [errors]) for the selected GPUs; a GPU whose handle fails is an error."""
    nv = inp.ready_nvml()
    out: list[tuple[int, Any]] = []
    errs: list[str] = []
    for i in _gpu_indices(nv, ctx):
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
    missing = [g for g in ctx.gpus or [] if g >= n]
    if missing:
        probs.append((Status.CRITICAL, f"job GPU(s) {missing} absent ({n} visible)", missing[0]))
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


def check_processes(inp: Inputs, ctx: Context) -> CheckResult:
    nv, hs, errs = _handles(inp, ctx)
    probs: list[tuple[Status, str, int | None]] = [(Status.CRITICAL, e, None) for e in errs]
    for i, h in hs:
        try:
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))  # type: ignore[attr-defined]
            used_mib = nv.nvmlDeviceGetMemoryInfo(h).used / (1024 * 1024)
        except nv.NVMLError as exc:
            probs.append((Status.CRITICAL, f"GPU {i}: {_nvml_err(exc)}", i))
            continue
        if procs:
            pids = ",".join(str(p.pid) for p in procs[:4])
            probs.append((Status.CRITICAL, f"GPU {i}: {len(procs)} leftover process(es) pid {pids}", i))
        elif used_mib > ctx.max_used_mib:
            probs.append((Status.CRITICAL, f"GPU {i}: {used_mib:.0f} MiB used with no process", i))
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


def check_clocks(inp: Inputs, ctx: Context) -> CheckResult:
    nv, hs, errs = _handles(inp, ctx)
    probs: list[tuple[Status, str, int | None]] = [(Status.CRITICAL, e, None) for e in errs]
    for i, h in hs:
        try:
            r = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        except nv.NVMLError as exc:
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
            idle = bool(nv.nvmlDeviceGetCurrentClocksEventReasons(h) & _IDLE)
        except nv.NVMLError as exc:
            probs.append((Status.UNKNOWN, f"GPU {i}: PCIe link unreadable ({_nvml_err(exc)})", i))
            continue
        if width < mwidth:
            probs.append((Status.CRITICAL, f"GPU {i}: PCIe x{width} of x{mwidth} (gen {gen}/{mgen})", i))
        elif gen < mgen and not idle:
            probs.append((Status.WARNING, f"GPU {i}: PCIe gen {gen} of {mgen} while busy", i))
    return _result("pcie", probs, f"{len(hs)} GPU(s) at full PCIe width")


def evaluate_nvlink(gpus: Sequence[NvlinkGpu], selected: Sequence[int] | None = None) -> CheckResult:
    """NVLink verdict over ``nvidia-smi nvlink --status`` data (or NVML converted to it):
    CRITICAL for any inactive link of a selected GPU that has links; OK otherwise (a node
    without NVLink is OK)."""
    sel = [g for g in gpus if selected is None or g.index in selected]
    probs: list[tuple[Status, str, int | None]] = []
    total = up = 0
    for g in sel:
        down = [lk.link for lk in g.links if not lk.active]
        total += len(g.links)
        up += len(g.links) - len(down)
        if down:
            probs.append((Status.CRITICAL, f"GPU {g.index}: NVLink {down} inactive", g.index))
    if total == 0:
        return CheckResult("nvlink", Status.OK, "no NVLink on the selected GPUs")
    return _result("nvlink", probs, f"{up}/{total} NVLinks up on {len(sel)} GPU(s)")


def check_nvlink(inp: Inputs, ctx: Context) -> CheckResult:
    nv, hs, errs = _handles(inp, ctx)
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
    res = evaluate_nvlink(gpus)
    if errs:
        return CheckResult("nvlink", Status.CRITICAL, "; ".join(errs[:3]))
    return res


# -- kernel log -------------------------------------------------------------------------

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})
"""XIDs usually caused by the job's own code (illegal address, MMU fault from user code, reset
channel, preemptive cleanup): WARNING, not a bad node."""


def check_xid(inp: Inputs, ctx: Context) -> CheckResult:
    if inp.kernel_log is None:
        return CheckResult("xid", Status.UNKNOWN, "no kernel log configured")
    now = inp.clock()
    lines = inp.kernel_log.read_lines()
    pci_to_index: dict[str, int] = {}
    if ctx.gpus is not None:
        try:
            nv, hs, _ = _handles(inp, Context(gpus=None))
            for i, h in hs:
                pci = nv.nvmlDeviceGetPciInfo(h).busId
                pci_to_index[normalize_pci_bus_id(pci.decode() if isinstance(pci, bytes) else str(pci))] = i
        except Exception:
            pci_to_index = {}  # cannot map: count every XID
    probs: list[tuple[Status, str, int | None]] = []
    seen = 0
    for ln in lines:
        ev = parse_kernel_log_line(ln, ctx.node, default_ts=now)
        if ev is None or ev.ts < ctx.since_ts:
            continue
        idx = pci_to_index.get(ev.pci_bus_id or "") if pci_to_index else None
        if ctx.gpus is not None and idx is not None and idx not in ctx.gpus:
            continue  # another job's GPU
        seen += 1
        where = f"GPU {idx}" if idx is not None else f"PCI {ev.pci_bus_id or '?'}"
        if ev.kind == EventKind.SXID:
            if ev.fatal:
                probs.append((Status.CRITICAL, f"fatal SXID {ev.code} on {where}", idx))
            continue
        st = Status.WARNING if ev.code in APPLICATION_XIDS else Status.CRITICAL
        probs.append((st, f"XID {ev.code} on {where}: {ev.message[:60]}", idx))
    return _result("xid", probs, f"no XID since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ctx.since_ts))}")


# -- InfiniBand -------------------------------------------------------------------------


def evaluate_infiniband(
    ports: Sequence[IbPort], rate_gbps: float | None = None, min_ports: int | None = None, source: str | None = None
) -> CheckResult:
    """InfiniBand verdict over parsed ports: only ``link_layer`` InfiniBand ports (or unknown
    layer) count; each must be ``ACTIVE`` and ``LinkUp`` at ``rate_gbps`` (default: the fastest
    IB port's rate) Gb/s; with ``min_ports`` the node needs that many IB ports. A port whose rate
    the source does not print (plain ``ibv_devinfo``) is a WARNING only when a rate is required.
    ``source`` (``sysfs``, ``ibstat`` ...) is named in the OK reason."""
    ib = [p for p in ports if (p.link_layer or "InfiniBand").lower() == "infiniband"]
    probs: list[tuple[Status, str, int | None]] = []
    if min_ports is not None and len(ib) < min_ports:
        probs.append((Status.CRITICAL, f"{len(ib)}/{min_ports} InfiniBand ports present", None))
    want = rate_gbps if rate_gbps is not None else max((p.rate_gbps or 0 for p in ib), default=0)
    for p in ib:
        name = f"{p.device}/{p.port}"
        if p.state != "ACTIVE" or (p.phys_state is not None and p.phys_state != "LinkUp"):
            probs.append((Status.CRITICAL, f"{name} {p.state}/{p.phys_state or '?'}", None))
        elif want and p.rate_gbps is None:
            probs.append((Status.WARNING, f"{name} rate not reported (expected {want:g} Gb/s)", None))
        elif want and (p.rate_gbps or 0) < want:
            probs.append((Status.CRITICAL, f"{name} at {p.rate_gbps:g} Gb/s, expected {want:g}", None))
    via = f" ({source})" if source else ""
    if not ib and not probs:
        return CheckResult("infiniband", Status.OK, f"no InfiniBand ports{via}")
    at = f" at {want:g} Gb/s" if want else ""
    return _result("infiniband", probs, f"{len(ib)} InfiniBand port(s) ACTIVE{at}{via}")


# (argv, parser) tried in order when sysfs has no RDMA devices (a container without /sys/class/infiniband)
_IB_TOOLS: tuple[tuple[list[str], Callable[[str], list[IbPort]]], ...] = (
    (["ibstat"], parse_ibstat),
    (["ibstatus"], parse_ibstatus),
    (["ibv_devinfo", "-v"], parse_ibv_devinfo),
)


def read_ib_ports(inp: Inputs, ctx: Context) -> tuple[list[IbPort], str | None]:
    """The node's RDMA ports and where they were read: sysfs first (no tool to run), then the
    first of ``ibstat``, ``ibstatus``, ``ibv_devinfo -v`` that is installed and parses. ``([], None)``
    when none reports a device. A tool that times out is skipped (the next one is tried)."""
    ports = read_sysfs_ib(inp.sysfs_root)
    if ports:
        return ports, "sysfs"
    for argv, parse in _IB_TOOLS:
        try:
            out = inp.runner.run(argv, ctx.tool_timeout_s)
        except (ToolMissing, ToolTimeout):
            continue
        if out.returncode != 0 or not out.stdout.strip():
            continue  # "No IB devices found" / no umad: not a verdict, try the next source
        try:
            return parse(out.stdout), argv[0]
        except ValueError:
            continue
    return [], None


def check_infiniband(inp: Inputs, ctx: Context) -> CheckResult:
    ports, source = read_ib_ports(inp, ctx)
    return evaluate_infiniband(ports, ctx.ib_rate_gbps, ctx.ib_ports, source)


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


def _dcgmi(inp: Inputs, argv: list[str], ctx: Context) -> ToolOutput | CheckResult:
    try:
        return inp.runner.run(argv, ctx.tool_timeout_s)
    except ToolMissing:
        return CheckResult("dcgm", Status.UNKNOWN, "dcgmi not installed")
    except ToolTimeout as exc:
        return CheckResult("dcgm", Status.UNKNOWN, f"{' '.join(argv[:3])}: {exc}")


def _last_line(out: ToolOutput) -> str:
    text = (out.stdout + out.stderr).strip().splitlines()
    return (text or [""])[-1][:100]


def check_dcgm(inp: Inputs, ctx: Context) -> CheckResult:
    """``dcgmi discovery -l`` maps the job's GPUs (NVML index -> UUID -> DCGM GPU id), then
    ``dcgmi diag -r LEVEL -i IDS`` runs on exactly those GPUs. Without a job GPU list the diag runs
    on DCGM's default all-GPU group. UNKNOWN when DCGM is absent, the host engine does not answer,
    or a job GPU is not visible to DCGM (a diag that cannot cover a GPU proves nothing about it)."""
    level = ctx.dcgm_level or 1
    argv = ["dcgmi", "diag", "-r", str(level)]
    if ctx.gpus is not None:
        disc_out = _dcgmi(inp, ["dcgmi", "discovery", "-l"], ctx)
        if isinstance(disc_out, CheckResult):
            return disc_out
        try:
            discovery = parse_dcgmi_discovery(disc_out.stdout)
        except ValueError:
            return CheckResult(
                "dcgm", Status.UNKNOWN, f"dcgmi discovery exited {disc_out.returncode}: {_last_line(disc_out)}"
            )
        ids: list[int]
        problems: list[str]
        try:
            nv = inp.ready_nvml()
            nvml_ids: list[tuple[int, str | None, str | None]] = []
            for i in ctx.gpus:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                nvml_ids.append((i, _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetPciInfo(h).busId)))
        except Exception as exc:  # NVML unusable: the NVML checks report it; DCGM ids = indices
            log.debug("dcgm: NVML ids unavailable (%s); using NVML indices as DCGM ids", exc)
            ids, problems = list(ctx.gpus), []
        else:
            ids, problems = map_dcgm_gpus(discovery, nvml_ids)
        if problems:
            return CheckResult("dcgm", Status.UNKNOWN, "; ".join(problems[:3]), ctx.gpus[0] if ctx.gpus else None)
        argv += ["-i", ",".join(str(g) for g in ids)]
    out = _dcgmi(inp, argv, ctx)
    if isinstance(out, CheckResult):
        return out
    try:
        return evaluate_dcgm(parse_dcgmi_diag(out.stdout))
    except ValueError:
        return CheckResult("dcgm", Status.UNKNOWN, f"dcgmi diag exited {out.returncode}: {_last_line(out)}")


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
        CheckSpec("processes", check_processes, _ALL),
        CheckSpec("ecc", check_ecc, _ALL),
        CheckSpec("xid", check_xid, _ALL),
        CheckSpec("pcie", check_pcie, _ALL),
        CheckSpec("nvlink", check_nvlink, _ALL),
        CheckSpec("clocks", check_clocks, _ALL),
        CheckSpec("infiniband", check_infiniband, _ALL),
        CheckSpec("dcgm", check_dcgm, frozenset()),  # only by name or with a dcgm level > 0
    )
}
