"""Checks over NVML readings: GPU count, NVML answers, leftover processes, ECC, clocks."""

from __future__ import annotations

import time
from typing import Any

from gpuwarden.shared.nvidia.nvml import (
    CLOCK_REASON_GPU_IDLE,
    CLOCK_REASON_HW_POWER_BRAKE,
    CLOCK_REASON_HW_SLOWDOWN,
    CLOCK_REASON_HW_THERMAL,
    CLOCK_REASON_SW_THERMAL,
)

from .base import CheckResult, Context, Inputs, Status, _handles, _nvml_err, _result

__all__ = ["check_clocks", "check_ecc", "check_gpu_count", "check_nvml", "check_processes", "evaluate_clocks"]


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
_HW_SLOWDOWN, _SW_THERMAL, _HW_THERMAL, _HW_BRAKE, _IDLE = (
    CLOCK_REASON_HW_SLOWDOWN,
    CLOCK_REASON_SW_THERMAL,
    CLOCK_REASON_HW_THERMAL,
    CLOCK_REASON_HW_POWER_BRAKE,
    CLOCK_REASON_GPU_IDLE,
)


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
