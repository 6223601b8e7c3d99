"""The job report from the breakdown's seconds: GPU-hours and USD, findings, verdict and advice.

:func:`assemble` rounds the per-category seconds to GPU-hours (1e-6) and USD (cents) by largest
remainder so they add up, attributes them to the failures that caused them, and writes the
verdict, the summary line, what the data cannot tell and the recommendations.

The verdict names, for each waste category, the GPUs and the time ranges (ISO-8601 UTC and
seconds into the job) the breakdown's :class:`~.model.Stretch` es give; the advice on idle time
follows its cause (idle from the start: the allocation or the ranks; idle after working: a rank
that died or hung); every open critical or fatal failure gets a recommendation naming its action.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gpuwarden.shared.models import (
    Action,
    BreakdownItem,
    Failure,
    FailureState,
    JobReport,
    JobState,
    ReportFinding,
    ReportGpu,
    Severity,
    WasteCategory,
    stable_id,
)

from .model import ORDER, Stretch, is_loss, onset, side_of

__all__ = ["MAX_RANGES", "action_text", "assemble", "gpus_text", "iso", "time_range", "when_text"]

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
    "partial-idle-allocation": "Match --gres=gpu:N to the ranks the code starts.",
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
    WasteCategory.STRAGGLER_WAIT: "the GPUs waited on stragglers",
    WasteCategory.HUNG: "the job hung",
    WasteCategory.CHECKPOINT_STALL: "the GPUs stalled on checkpoints",
    WasteCategory.INPUT_WAIT: "the GPUs waited on input",
}


def _where_of(node: str, gpu: int | None) -> str:
    return f"GPU {gpu} on {node}" if gpu is not None else node


def _where(f: Failure) -> str:
    if f.gpu_index is None and f.pci_bus_id:
        return f"GPU at PCI {f.pci_bus_id} on {f.node}"
    return _where_of(f.node, f.gpu_index)


def _phrase(f: Failure | ReportFinding) -> str:
    """A few words on what a finding saw, e.g. ``GPU 5 on gpu-node-003 fell off the bus (XID 79)``."""
    p = f.pattern
    where = _where(f) if isinstance(f, Failure) else _where_of(f.node, f.gpu_index)
    ev = f.evidence[-1] if f.evidence else None
    fixed = {
        "idle-allocation": "every GPU sat idle while allocated",
        "partial-idle-allocation": (
            f"{where} sat idle while the job's other GPUs worked"
            if f.gpu_index is not None
            else f"GPUs of {f.node} sat idle while the job's other GPUs worked"
        ),
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


# -- times and GPU sets ------------------------------------------------------------------------
#: Below this an epoch time is seconds since boot (a kernel log without wall-clock time), not a date.
_WALL_CLOCK_MIN_TS = 1e9
#: Time ranges named per waste category in the verdict (the largest; the rest are counted).
MAX_RANGES = 4


def iso(ts: float) -> str:
    """Epoch s as ISO-8601 UTC (``2024-05-01T12:03:04Z``; milliseconds when the time has a
    fraction of a second); a time before 2001 (seconds since boot) as ``+123 s``."""
    if not math.isfinite(ts) or ts < _WALL_CLOCK_MIN_TS:
        return f"+{ts:.0f} s"
    ms = round(ts * 1000)
    text = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{ms % 1000:03d}Z" if ms % 1000 else "Z")


def time_range(a: float, b: float, t0: float) -> str:
    """``[a, b)`` (epoch s) in words: ISO-8601 UTC start and end (the end's date left out when it
    is the start's), seconds into the job (from ``t0``) and the length, e.g.
    ``2024-05-01T12:05:00Z..12:10:00Z (+300..+600 s into the job, 300 s)``."""
    start, end = iso(a), iso(b)
    if start[:11] == end[:11] and "T" in end:
        end = end[11:]
    return f"{start}..{end} (+{a - t0:.0f}..+{b - t0:.0f} s into the job, {b - a:.0f} s)"


def _indices(ix: Sequence[int]) -> str:
    """GPU indices as ranges: ``0-3, 5``."""
    out: list[str] = []
    xs = sorted(set(ix))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)


def gpus_text(gs: Sequence[tuple[str, int]], job_gpus: Sequence[tuple[str, int]]) -> str:
    """A set of the job's GPUs (node, index) in words: ``GPU 3 on n1``, ``GPUs 0-3 on n1``,
    ``all 8 GPUs on n1`` (``both GPUs on n1``), ``all 64 GPUs`` (every GPU of the job)."""
    chosen = sorted(set(gs))
    if len(chosen) > 1 and set(chosen) == set(job_gpus):
        return f"all {len(chosen)} GPUs"
    per_node: dict[str, list[int]] = {}
    for n, i in chosen:
        per_node.setdefault(n, []).append(i)
    node_size = {n: sum(1 for m, _ in job_gpus if m == n) for n in per_node}
    parts = []
    for n, ix in per_node.items():
        if len(ix) == 1:
            parts.append(f"GPU {ix[0]} on {n}")
        elif len(ix) == node_size[n]:
            parts.append(f"both GPUs on {n}" if len(ix) == 2 else f"all {len(ix)} GPUs on {n}")
        else:
            parts.append(f"GPUs {_indices(ix)} on {n}")
    return ", ".join(parts)


def _groups(stretches: Sequence[Stretch]) -> list[tuple[float, float, list[tuple[str, int]]]]:
    """Stretches with the same time range joined: (start, end, GPUs), chronological."""
    by: dict[tuple[float, float], list[tuple[str, int]]] = {}
    for st in stretches:
        by.setdefault((round(st.start, 3), round(st.end, 3)), []).append((st.node, st.gpu_index))
    return [(a, b, gs) for (a, b), gs in sorted(by.items())]


def when_text(stretches: Sequence[Stretch], t0: float, job_gpus: Sequence[tuple[str, int]]) -> str:
    """Which GPUs, and when: the :data:`MAX_RANGES` largest time ranges (GPU-seconds) of
    ``stretches``, chronological, e.g. ``GPU 3 on n1 2024-05-01T12:05:00Z..12:10:00Z (+300..+600 s
    into the job, 300 s)``; the rest counted (``and 3 more ranges on 2 GPUs``)."""
    groups = _groups(stretches)
    if not groups:
        return ""
    top = sorted(groups, key=lambda g: (-(g[1] - g[0]) * len(g[2]), g[0]))[:MAX_RANGES]
    shown = sorted(top)
    text = "; ".join(f"{gpus_text(gs, job_gpus)} {time_range(a, b, t0)}" for a, b, gs in shown)
    rest = [g for g in groups if g not in top]
    if rest:
        n_gpus = len({x for _, _, gs in rest for x in gs})
        text += f"; and {len(rest)} more range{'s' if len(rest) > 1 else ''} on {n_gpus} GPU{'s' if n_gpus > 1 else ''}"
    return text


# -- what to do ---------------------------------------------------------------------------------
_SEVERITY_RANK = {Severity.FATAL: 0, Severity.CRITICAL: 1, Severity.WARNING: 2, Severity.INFO: 3}


def action_text(f: Failure) -> str:
    """What the failure's recommended action means for ``f``'s node and GPU, e.g. ``action
    reset-gpu: reset GPU 3 on n1 once no process uses it (nvidia-smi -r -i 3 on n1); until then
    keep jobs off n1``."""
    a, node, where = f.recommended_action, f.node, _where(f)
    ident = str(f.gpu_index) if f.gpu_index is not None else (f.pci_bus_id or "<GPU>")
    words = {
        Action.DRAIN: f"drain {node} (scontrol update nodename={node} state=DRAIN) and have it inspected",
        Action.RESET_GPU: f"reset {where} once no process uses it (nvidia-smi -r -i {ident} on {node}); "
        f"until then keep jobs off {node}",
        Action.REBOOT: f"drain and reboot {node}",
        Action.RMA: f"take {where} out of service and file an RMA",
        Action.RESTART_JOB: "cancel the job and restart it from its last checkpoint",
        Action.ALERT: "look into it",
        Action.RESUME: f"return {node} to service",
        Action.NONE: "no action",
    }.get(a, a.value)
    return f"action {a.value}: {words}"


def _open_serious(f: Failure) -> bool:
    return f.state is FailureState.OPEN and f.severity in (Severity.CRITICAL, Severity.FATAL)


def _failure_recs(findings: list[ReportFinding], by_id: dict[str, Failure]) -> list[str]:
    """One recommendation per finding that has one: every open critical or fatal failure first,
    each naming its action (a loss: resubmit excluding its node, once per node), then the others
    by cost. Idle findings are left to :func:`_idle_recs` (their advice depends on the cause)."""
    out: list[str] = []
    excluded: set[str] = set()
    order = sorted(
        findings,
        key=lambda x: (not _open_serious(by_id[x.failure_id]), _SEVERITY_RANK.get(x.severity, 9), -x.gpu_hours),
    )
    for rf in order:
        f = by_id[rf.failure_id]
        serious = _open_serious(f)
        if rf.pattern in ("idle-allocation", "partial-idle-allocation") and not serious:
            continue
        r = _DO.get(rf.pattern)
        state = f"{f.severity.value}, {f.state.value}"
        if is_loss(f):
            what = f"{_phrase(f)} ({state}); {action_text(f)}."
            if f.node not in excluded:
                excluded.add(f.node)
                r = f"Resubmit from the last checkpoint excluding {f.node} (sbatch --exclude={f.node}): {what}"
            else:
                r = what[0].upper() + what[1:]
        elif serious and r:
            r = f"{r.rstrip('.')} ({_phrase(f)}: {state}; action {f.recommended_action.value})."
        elif serious:
            r = f"{_phrase(f)} ({state}); {action_text(f)}."
            r = r[0].upper() + r[1:]
        if r and r not in out:
            out.append(r)
    return out


#: Idle stretches shorter than this get no advice of their own (they are still named), s.
MIN_ADVICE_S = 60.0
#: Recommendations on GPUs idle while others work, at most (the rest are counted in the last).
MAX_IDLE_RECS = 3


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _idle_recs(stretches: Sequence[Stretch], t0: float, job_gpus: Sequence[tuple[str, int]]) -> list[str]:
    """Advice on idle time that fits its cause, naming the GPUs and when (the longest stretch of
    each kind; stretches under :data:`MIN_ADVICE_S` get none, except a job that never worked):

    * every GPU idle and the job never worked: release the allocation;
    * every GPU idle before the job's first work: set-up on paid GPU time;
    * every GPU idle after working: the ranks waited on something (a hung or lost rank, I/O);
    * a GPU idle from its start while others work and never working: ``--gres`` / ranks;
    * a GPU idle from its start that worked later: a rank that started late;
    * a GPU idle after it worked: a rank that died or hung (its logs), not ``--gres``.
    """
    out: list[str] = []
    idle = [st for st in stretches if st.category is WasteCategory.IDLE]
    part = [st for st in stretches if st.category is WasteCategory.PARTIALLY_IDLE]
    kinds: dict[str, list[tuple[float, float, bool]]] = {}
    for a, b, _gs in _groups(idle):
        same = [x for x in idle if round(x.start, 3) == a and round(x.end, 3) == b]
        before, after = any(x.worked_before for x in same), any(x.worked_after for x in same)
        kind = "never" if not before and not after else ("setup" if not before else "mid")
        if kind == "never" or b - a >= MIN_ADVICE_S:
            kinds.setdefault(kind, []).append((a, b, after))
    for kind in ("never", "setup", "mid"):
        runs = kinds.get(kind, [])
        if not runs:
            continue
        a, b, after = max(runs, key=lambda r: (r[1] - r[0], -r[0]))
        rng = time_range(a, b, t0)
        if kind == "never":
            out.append(
                f"Every GPU of the job sat idle {rng} and none worked: {_DO['idle-allocation'][0].lower()}"
                f"{_DO['idle-allocation'][1:]}"
            )
        elif kind == "setup":
            out.append(
                f"The job did no GPU work before {iso(b)}: every GPU sat idle {rng}; set-up (data staging, "
                "downloads, compilation) runs on paid GPU time: stage data before the job or in a CPU step."
            )
        else:
            total = sum(y - x for x, y, _ in runs)
            many = (
                f" ({_times(len(runs))} for {MIN_ADVICE_S:.0f} s or more, {total:.0f} s in all)"
                if len(runs) > 1
                else ""
            )
            then = "then resumed" if after else "and had not resumed by the end of the report"
            out.append(
                f"Every GPU of the job stopped working at {iso(a)} and sat idle {rng}, {then}{many}: the ranks "
                "waited on something (a rank that died or hung, I/O, an interactive session left open): check the "
                "job's logs around then; end sessions when done."
            )
    per_gpu: dict[tuple[str, int], list[Stretch]] = {}
    for st in part:
        per_gpu.setdefault((st.node, st.gpu_index), []).append(st)
    # per GPU its cause: idle from its start and never working, starting late, or stopping mid-run
    advice: dict[tuple[str, float, float], list[tuple[tuple[str, int], Stretch, int, float, bool]]] = {}
    for g, sts in per_gpu.items():
        first = min(sts, key=lambda x: x.start)
        if not first.worked_before and not first.worked_after:
            kind, pick, mids = "gres", first, [first]
        else:
            mids = [x for x in sts if x.worked_before and x.end - x.start >= MIN_ADVICE_S]
            late = not first.worked_before and first.end - first.start >= MIN_ADVICE_S
            if mids:
                kind, pick = "mid", max(mids, key=lambda x: (x.end - x.start, -x.start))
            elif late:
                kind, pick, mids = "late", first, [first]
            else:
                continue
        key = (kind, round(pick.start, 3), round(pick.end, 3))
        total = sum(x.end - x.start for x in mids)
        advice.setdefault(key, []).append((g, pick, len(mids), total, all(x.worked_after for x in mids)))
    order = sorted(advice.items(), key=lambda kv: (-(kv[0][2] - kv[0][1]) * len(kv[1]), kv[0][1]))
    for n, ((kind, a, b), rows) in enumerate(order):
        if n == MAX_IDLE_RECS:
            rest = {g for _, rs in order[n:] for g, *_ in rs}
            out.append(
                f"And {len(order) - n} more GPU idle pattern{'s' if len(order) - n > 1 else ''} on "
                f"{gpus_text(sorted(rest), job_gpus)}: see the partially-idle ranges in the verdict."
            )
            break
        gs = [r[0] for r in rows]
        who = gpus_text(gs, job_gpus)
        rng = time_range(a, b, t0)
        plural = len(gs) > 1
        if kind == "gres":
            out.append(
                f"{who} sat idle from the job's start, {rng}, while the others worked, and never worked: "
                "match --gres=gpu:N (or the ranks per node) to the ranks the code starts."
            )
        elif kind == "late":
            out.append(
                f"{who} started work only at {iso(b)}: idle {rng} while the others worked; "
                f"{'their ranks' if plural else 'its rank'} started late (set-up or data loading on that rank?)."
            )
        else:
            resumed = all(r[4] for r in rows)
            then = "then resumed" if resumed else "and had not resumed by the end of the report"
            times = max(r[2] for r in rows)
            more = f" ({_times(times)} for {MIN_ADVICE_S:.0f} s or more)" if times > 1 else ""
            out.append(
                f"{who} worked, then sat idle {rng} while the others worked, {then}{more}: a rank that died or "
                f"hung, not a --gres matter: check the job's logs (the rank{'s' if plural else ''} on {who}) "
                f"around {iso(a)} for an exit, an error or a hang."
            )
    return out


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
    stretches: Sequence[Stretch] = (),
) -> JobReport:
    """The :class:`JobReport` from the breakdown's seconds per category (and per failure), the
    per-GPU rows, the counted failures and the stretches (who and when per category)."""
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
    by_cat: dict[WasteCategory, list[Stretch]] = {}
    for st in stretches:
        by_cat.setdefault(st.category, []).append(st)
    when = {c: when_text(v, t0, gpus) for c, v in by_cat.items()}
    verdict, summary = _verdict(job, len(gpus), gpu_hours, busy_pct, price, breakdown, findings, final, when, by_id)
    cannot = _cannot(failures, per_gpu, tensors, unseen, final, breakdown, when.get(WasteCategory.NO_TELEMETRY, ""))
    recs = _failure_recs(findings, by_id) + _idle_recs(stretches, t0, gpus)
    recs = list(dict.fromkeys(recs))
    if not recs:
        if waste_h <= 0 and busy_h > 0:
            recs.append("Nothing to do: the job kept its GPUs busy.")
        elif not any(g.windows for g in per_gpu):
            recs.append(
                "Nothing to judge the GPU use by: no GPU telemetry covered the job (run the collector, "
                "or give analyze the nvidia-smi/DCGM samples of its GPUs)."
            )
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
    when: dict[WasteCategory, str] | None = None,
    failures: dict[str, Failure] | None = None,
) -> tuple[str, str]:
    when = when or {}
    failures = failures or {}
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

    def phrase(f: ReportFinding) -> str:
        return _phrase(failures.get(f.failure_id, f))

    parts: dict[str, list[str]] = {"cluster": [], "job": []}
    explained: set[str] = set()
    for b in sorted(waste, key=lambda b: -b.gpu_hours):
        fs = [by_id[k] for k in b.failure_ids if k in by_id]
        cost = f"{b.gpu_hours:.3f} GPU-h, {_money(b.usd)}"
        at = f": {when[b.category]}" if when.get(b.category) else ""
        if fs:
            f = fs[0]
            explained.update(x.failure_id for x in fs)
            what = phrase(f) if len(fs) == 1 else f"{_UNEXPLAINED.get(b.category, phrase(f))} ({len(fs)} findings)"
            parts[f.side].append(f"{what} ({b.category.value}: {cost}){at}")
        else:
            side = b.side or "job"
            parts[side].append(f"{_UNEXPLAINED.get(b.category, b.category.value)} ({b.category.value}: {cost}){at}")
    for f in findings:  # findings without a cost share still say what they saw
        if f.failure_id not in explained and f.pattern not in ("gpu-missing",):
            parts[f.side].append(f"{phrase(f)} ({f.severity.value}, {f.state.value}, from {iso(f.onset_ts)})")
    words = [head]
    if parts["cluster"]:
        words.append("Cluster-side: " + "; ".join(parts["cluster"]) + ".")
    if parts["job"]:
        words.append("Job-side: " + "; ".join(parts["job"]) + ".")
    if not waste and not findings:
        words.append("No waste found." if n_gpus and busy_pct > 0 else "No GPU telemetry: nothing to judge.")
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
    unseen_when: str = "",
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
        out.append(
            f"what {unseen.gpu_hours:.3f} GPU-hours ({unseen.share_pct:.1f} %) without telemetry were used for"
            + (f" ({unseen_when})" if unseen_when else "")
        )
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
