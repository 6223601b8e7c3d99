"""The ``xid`` check: XIDs and SXIDs in the kernel log inside the GPUs' windows."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from gpuwarden.shared.models import EventKind
from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line
from gpuwarden.shared.nvidia.nvml import nvml_str
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id
from gpuwarden.shared.nvidia.xids import xid_codes, xid_table

from ..io import ToolMissing, ToolTimeout
from .base import CheckResult, Context, Inputs, Status, _handles, _result

__all__ = ["APPLICATION_XIDS", "REPAIR_XIDS", "check_xid"]

APPLICATION_XIDS = xid_codes("application")
"""XIDs usually caused by the job's own code (illegal address, MMU fault from user code, reset
channel, preemptive cleanup): WARNING, not a bad node. The ``health`` column of the XID table
(:mod:`gpuwarden.shared.nvidia.xids`)."""

REPAIR_XIDS = xid_codes("repair")
"""Memory repair / correctable-error notices (63 row remapping recorded, 92 high single-bit ECC
rate): WARNING; whether a remap is pending or failed is the ``ecc`` check's verdict. The
``health`` column of the XID table."""

_RECOVERY_RE = re.compile(r"to 0x[0-9a-fA-F]+ \(([^)]*)\)")


def _xid_status(code: int | None, message: str) -> Status | None:
    """Status of one XID by the ``health`` column of the XID table: ``recovery-action`` (XID 154,
    R565+ "GPU recovery action changed from ... to 0xN (ACTION)") by the action it ends on (None:
    recovered, OK; otherwise CRITICAL, the driver asks for a reset/drain/reboot), ``application``
    and ``repair`` WARNING, ``node`` and codes missing from the table CRITICAL."""
    entry = xid_table().get(code) if code is not None else None
    health = entry.health if entry is not None else "node"
    if health == "recovery-action":
        m = _RECOVERY_RE.search(message)
        if m and m.group(1).strip().lower() == "none":
            return None
        return Status.CRITICAL
    if health in ("application", "repair"):
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
