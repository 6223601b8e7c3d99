"""Checks of a GPU's links: PCIe width/generation, NVLink state, NVSwitch fabric registration."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from gpuwarden.shared.nvidia.nvml import NVLINK_PROBE_LINKS

from ..parsers import NvlinkGpu, NvlinkLink
from .base import CheckResult, Context, Inputs, Status, _handles, _nvml_err, _result
from .nvml import _IDLE, _clock_reasons

__all__ = ["check_fabric", "check_nvlink", "check_pcie", "evaluate_nvlink"]


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
        for lk in range(NVLINK_PROBE_LINKS):
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
