"""The job report from the breakdown's seconds: GPU-hours and USD, findings, verdict and advice.

:func:`assemble` rounds the per-category seconds to GPU-hours (1e-6) and USD (cents) by largest
remainder so they add up, attributes them to the failures that caused them, and writes the
verdict, the summary line, what the data cannot tell and the recommendations.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gpuwarden.shared.models import (
    BreakdownItem,
    Failure,
    JobReport,
    JobState,
    ReportFinding,
    ReportGpu,
    WasteCategory,
    stable_id,
)

from .model import ORDER, is_loss, onset, side_of

__all__ = ["assemble"]

_JOB_SIDE = {
    WasteCategory.IDLE,
    WasteCategory.PARTIALLY_IDLE,
    WasteCategory.CHECKPOINT_STALL,
    WasteCategory.INPUT_WAIT,
    WasteCategory.HUNG,
}


def _apportion(values: list[float], total_units: int) -> list[int]:
    """Integers (largest remainder) proportional to ``values`` that add up to ``total_units``."""
    s = sum(values)
    if s <= 0:
        return [0] * len(values)
    raw = [v * total_units / s for v in values]
    ints = [math.floor(x) for x in raw]
    rest = total_units - sum(ints)
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - ints[i], reverse=True)[: max(0, rest)]:
        ints[i] += 1
    return ints


# -- words -----------------------------------------------------------------------------------
_WHAT = {
    "gpu-fallen-off-bus": "fell off the bus (XID 79)",
    "gpu-missing": "disappeared from the node",
    "uncorrectable-ecc": "had an uncorrectable ECC error",
    "uncontained-memory-error": "had an uncontained memory error",
    "contained-memory-error": "had a contained memory error",
    "gsp-firmware-error": "hung in its GSP firmware",
    "nvswitch-fatal": "lost its NVSwitch fabric",
    "nvlink-link-down": "lost an NVLink",
    "driver-fault": "hit a driver fault",
    "health-check-failed": "failed a health check",
    "xid-application-fault": "saw the job's code crash on it (application XID)",
}
_DO = {
    "idle-allocation": "Release GPUs the job does not use: request only what the code runs on, end interactive "
    "sessions when done.",
    "partial-idle-allocation": "Match --gres=gpu:N to the ranks the code starts (or check for a rank that died).",
    "input-starvation": "Feed the GPUs faster: more data-loader workers, pinned memory and prefetching, local or "
    "faster storage.",
    "checkpoint-stall": "Checkpoint less often, or asynchronously (write from a copy while training goes on).",
    "collective-hang": "Cancel and restart from the last checkpoint with NCCL_DEBUG=INFO and a shorter NCCL timeout.",
    "low-tensor-activity": "Use tensor cores: bf16/fp16 mixed precision or TF32 matmuls.",
    "gpu-memory-leak": "Find what keeps growing (tensors kept across steps, caches) before the job runs out of memory.",
    "straggler-gpu": "Have the slow GPU inspected (clocks, thermals, power) and resubmit excluding its node.",
    "straggler-node": "Have the slow node inspected (power, cooling, CPU, network) and resubmit excluding it.",
}


_UNEXPLAINED = {
    WasteCategory.IDLE: "every GPU sat idle while allocated",
    WasteCategory.PARTIALLY_IDLE: "some GPUs sat idle while the others worked",
    WasteCategory.LOST_TO_FAILURE: "work lost to a failure",
}


def _where_of(node: str, gpu: int | None) -> str:
    return f"GPU {gpu} on {node}" if gpu is not None else node


def _where(f: Failure) -> str:
    return _where_of(f.node, f.gpu_index)


def _phrase(f: Failure | ReportFinding) -> str:
    """A few words on what a finding saw, e.g. ``GPU 5 on gpu-node-003 fell off the bus (XID 79)``."""
    p, where = f.pattern, _where_of(f.node, f.gpu_index)
    ev = f.evidence[-1] if f.evidence else None
    fixed = {
        "idle-allocation": "every GPU sat idle while allocated",
        "partial-idle-allocation": f"{where} sat idle while the job's other GPUs worked",
        "input-starvation": "input-bound: the GPUs waited on the host for data",
        "checkpoint-stall": "checkpointing too often or too slowly: the GPUs stalled together",
        "collective-hang": "hung in a collective that never completes",
        "low-tensor-activity": "tensor cores mostly idle (slower precision?)",
        "gpu-memory-leak": f"GPU memory keeps growing on {where}",
    }
    if p in fixed:
        return fixed[p]
    if p in ("straggler-gpu", "straggler-node") and ev is not None:
        return f"{where} runs at {ev.value} x the job's median and the other GPUs wait for it"
    return f"{where} {_WHAT.get(p, p.replace('-', ' '))}"


def assemble(
    job: JobState,
    gpus: list[tuple[str, int]],
    t0: float,
    t1: float,
    final: bool,
    price: float,
    secs: dict[WasteCategory, float],
    attributed: dict[WasteCategory, dict[str, float]],
    per_gpu: list[ReportGpu],
    failures: list[Failure],
) -> JobReport:
    total_s = len(gpus) * (t1 - t0)
    micro = round(total_s / 3600.0 * 1e6)
    units = _apportion([secs[c] for c in ORDER], micro)
    hours = [u / 1e6 for u in units]
    cents_total = round(micro / 1e6 * price * 100)
    cents = _apportion(hours, cents_total)
    gpu_hours = micro / 1e6
    by_id = {f.failure_id: f for f in failures}
    breakdown = []
    for c, h, ct in zip(ORDER, hours, cents, strict=True):
        fids = sorted(attributed[c], key=lambda k: -attributed[c][k])
        sides = {side_of(by_id[k].category) for k in fids}
        side: Any = None
        if c in _JOB_SIDE:
            side = "job"
        elif c is WasteCategory.STRAGGLER_WAIT or (c is WasteCategory.LOST_TO_FAILURE and sides):
            side = sides.pop() if len(sides) == 1 else None
            side = side or ("cluster" if c is WasteCategory.STRAGGLER_WAIT else None)
        breakdown.append(
            BreakdownItem(
                category=c,
                gpu_hours=h,
                usd=ct / 100,
                share_pct=round(100.0 * h / gpu_hours, 2) if gpu_hours > 0 else 0.0,
                side=side,
                failure_ids=fids,
            )
        )
    fid_secs: dict[str, float] = {}
    for c in ORDER:
        for k, v in attributed[c].items():
            fid_secs[k] = fid_secs.get(k, 0.0) + v
    findings = [
        ReportFinding(
            failure_id=f.failure_id,
            pattern=f.pattern,
            rule_id=f.rule_id,
            category=f.category,
            severity=f.severity,
            side=side_of(f.category),
            node=f.node,
            gpu_index=f.gpu_index,
            state=f.state,
            onset_ts=max(0.0, onset(f)),
            first_seen=f.first_seen,
            last_seen=f.last_seen,
            verdict=f.verdict,
            evidence=list(f.evidence),
            cannot_determine=list(f.cannot_determine),
            recommended_action=f.recommended_action,
            gpu_hours=round(fid_secs.get(f.failure_id, 0.0) / 3600.0, 6),
            usd=round(fid_secs.get(f.failure_id, 0.0) / 3600.0 * price, 2),
        )
        for f in failures
    ]
    item = {b.category: b for b in breakdown}
    busy_h = item[WasteCategory.BUSY].gpu_hours
    unseen = item[WasteCategory.NO_TELEMETRY]
    waste_h = round(gpu_hours - busy_h - unseen.gpu_hours, 6)
    waste_usd = round(
        max(0.0, (cents_total - round(item[WasteCategory.BUSY].usd * 100) - round(unseen.usd * 100))) / 100, 2
    )
    sides = {side_of(f.category) for f in failures}
    side_all = "both" if len(sides) == 2 else (sides.pop() if sides else "none")
    utils = [g.utilization_gpu_pct_mean for g in per_gpu if g.utilization_gpu_pct_mean is not None]
    tensors = [g.tensor_activity_pct_mean for g in per_gpu if g.tensor_activity_pct_mean is not None]
    tensor = round(statistics.fmean(tensors), 2) if tensors else None
    busy_pct = round(100.0 * busy_h / gpu_hours, 2) if gpu_hours > 0 else 0.0
    verdict, summary = _verdict(job, len(gpus), gpu_hours, busy_pct, price, breakdown, findings, final)
    cannot = _cannot(failures, per_gpu, tensors, unseen, final, breakdown)
    recs: list[str] = []
    lost_nodes: set[str] = set()
    for f in sorted(findings, key=lambda x: -x.gpu_hours):
        r = _DO.get(f.pattern)
        if r is None and is_loss(by_id[f.failure_id]) and f.node not in lost_nodes:
            lost_nodes.add(f.node)
            r = (
                f"Resubmit from the last checkpoint excluding {f.node} (sbatch --exclude={f.node}): "
                f"{_where(by_id[f.failure_id])} needs a {f.recommended_action.value}."
            )
        if r and r not in recs:
            recs.append(r)
    for b in breakdown:
        if b.gpu_hours > 0 and not b.failure_ids and b.category in (WasteCategory.IDLE, WasteCategory.PARTIALLY_IDLE):
            r = _DO["idle-allocation" if b.category is WasteCategory.IDLE else "partial-idle-allocation"]
            if r not in recs:
                recs.append(r)
    if not recs and waste_h <= 0:
        recs.append("Nothing to do: the job kept its GPUs busy.")
    return JobReport(
        report_id=stable_id(job.job_id, t0, round(t1, 3), final),
        job_id=job.job_id,
        name=job.name,
        user=job.user,
        account=job.account,
        partition=job.partition,
        state=job.state,
        final=final,
        nodes=sorted({g[0] for g in gpus}),
        gpus={n: sorted(i for m, i in gpus if m == n) for n in sorted({g[0] for g in gpus})},
        gpu_count=len(gpus),
        start_ts=max(0.0, t0),
        end_ts=t1 if final else None,
        as_of=max(0.0, t1),
        duration_s=round(t1 - t0, 3),
        price_usd_per_gpu_hour=price,
        gpu_hours=gpu_hours,
        usd=cents_total / 100,
        busy_pct=busy_pct,
        waste_gpu_hours=max(0.0, waste_h),
        waste_usd=waste_usd,
        breakdown=breakdown,
        utilization_gpu_pct_mean=round(statistics.fmean(utils), 2) if utils else None,
        tensor_activity_pct_mean=tensor,
        tensor_activity_gpus=len(tensors),
        per_gpu=per_gpu,
        findings=findings,
        side=side_all,
        verdict=verdict,
        cannot_determine=cannot,
        recommendations=recs,
        summary=summary,
    )


def _money(usd: float) -> str:
    return f"${usd:,.2f}"


def _verdict(
    job: JobState,
    n_gpus: int,
    gpu_hours: float,
    busy_pct: float,
    price: float,
    breakdown: list[BreakdownItem],
    findings: list[ReportFinding],
    final: bool,
) -> tuple[str, str]:
    who = f"Job {job.job_id}" + (f" ({job.user})" if job.user else "")
    tense = "used" if final else "has used"
    head = (
        f"{who} {tense} {gpu_hours:.3f} GPU-hours on {n_gpus} GPUs ({_money(gpu_hours * price)}); "
        f"{busy_pct:.1f} % did work."
    )
    waste = [
        b for b in breakdown if b.category not in (WasteCategory.BUSY, WasteCategory.NO_TELEMETRY) and b.gpu_hours > 0
    ]
    by_id = {f.failure_id: f for f in findings}
    parts: dict[str, list[str]] = {"cluster": [], "job": []}
    explained: set[str] = set()
    for b in sorted(waste, key=lambda b: -b.gpu_hours):
        fs = [by_id[k] for k in b.failure_ids if k in by_id]
        cost = f"{b.gpu_hours:.3f} GPU-h, {_money(b.usd)}"
        if fs:
            f = fs[0]
            explained.add(f.failure_id)
            text = _phrase(f)
            parts[f.side].append(f"{text} ({b.category.value}: {cost})")
        else:
            side = b.side or "job"
            parts[side].append(f"{_UNEXPLAINED.get(b.category, b.category.value)} ({b.category.value}: {cost})")
    for f in findings:  # findings without a cost share still say what they saw
        if f.failure_id not in explained and f.pattern not in ("gpu-missing",):
            parts[f.side].append(_phrase(f))
    words = [head]
    if parts["cluster"]:
        words.append("Cluster-side: " + "; ".join(parts["cluster"]) + ".")
    if parts["job"]:
        words.append("Job-side: " + "; ".join(parts["job"]) + ".")
    if not waste and not findings:
        words.append("No waste found.")
    top = max(waste, key=lambda b: b.gpu_hours, default=None)
    summary = f"gpuwarden: {busy_pct:.0f}% busy of {gpu_hours:.2f} GPU-h ({_money(gpu_hours * price)})"
    if top is not None:
        cause = next((by_id[k] for k in top.failure_ids if k in by_id), None)
        summary += f"; top waste {top.category.value} {top.gpu_hours:.2f} GPU-h ({_money(top.usd)})"
        if cause is not None:
            summary += f", {cause.side}-side: {cause.pattern} {cause.node}" + (
                f" GPU {cause.gpu_index}" if cause.gpu_index is not None else ""
            )
    return " ".join(words), summary[:250]


def _cannot(
    failures: list[Failure],
    per_gpu: list[ReportGpu],
    tensors: list[float],
    unseen: BreakdownItem,
    final: bool,
    breakdown: list[BreakdownItem],
) -> list[str]:
    out = ["what the job computed: GPU utilisation says a kernel ran, not how much useful work it did"]
    if not tensors:
        out.append(
            "tensor activity (the MFU proxy): no GPU of the job reported it (needs GPM on Hopper or later, "
            "or DCGM profiling fields)"
        )
    elif len(tensors) < len(per_gpu):
        out.append(f"tensor activity of {len(per_gpu) - len(tensors)} of {len(per_gpu)} GPUs: they did not report it")
    if unseen.gpu_hours > 0:
        out.append(f"what {unseen.gpu_hours:.3f} GPU-hours ({unseen.share_pct:.1f} %) without telemetry were used for")
    if any(b.category is WasteCategory.STRAGGLER_WAIT and b.gpu_hours > 0 for b in breakdown):
        out.append("the exact wait on the straggler: estimated from its SM clock (or power) against the job's median")
    if any(b.category is WasteCategory.LOST_TO_FAILURE and b.gpu_hours > 0 for b in breakdown):
        out.append("when the job last checkpointed, so how much work before the failure is lost too")
    if not final:
        out.append("how the job ends: it is still running; the figures cover its start to as_of")
    for f in failures:
        for line in f.cannot_determine:
            if line not in out:
                out.append(line)
    return out
