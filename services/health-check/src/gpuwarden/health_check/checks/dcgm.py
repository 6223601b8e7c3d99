"""The ``dcgm`` check: ``dcgmi diag`` on the job's GPUs (mapped through ``dcgmi discovery``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from gpuwarden.shared.nvidia.nvml import nvml_str
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id

from ..io import ToolMissing, ToolOutput, ToolTimeout
from ..parsers import DcgmDiag, DcgmDiscovery, DcgmGpu, parse_dcgmi_diag, parse_dcgmi_discovery
from .base import CheckResult, Context, Inputs, Status, _last_line

__all__ = ["check_dcgm", "evaluate_dcgm", "map_dcgm_gpus"]

log = logging.getLogger(__name__)


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
