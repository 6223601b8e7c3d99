"""Pure join logic: Slurm jobs -> per-node GPU allocations -> attribution (correlator, detector).

Everything here works on plain data (models and dicts), in *event time* only: a sample or
event is attributed by its own ``ts``, never by the wall clock, so a replay at any speed
gives the same result. No Kafka, no faust: the stream agents only move data through these
functions (see :mod:`gpuwarden.correlator.core`; the detector uses it to attribute late).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.shared.models import AttributedEvent, AttributedSample, GpuAttribution, GpuEvent, JobState, NodeSample

__all__ = [
    "ACTIVE_STATES",
    "PENDING_STATES",
    "Allocation",
    "NodeAllocations",
    "apply_allocation",
    "attribute_event",
    "attribute_sample",
    "attributions_at",
    "base_state",
    "dump_allocations",
    "expire",
    "fan_out",
    "load_allocations",
]

#: Job states in which the job holds its GPUs (allocation open-ended until a terminal state).
ACTIVE_STATES = frozenset(
    {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING", "STAGE_OUT"}
)
#: Job states without an allocation yet: nothing to fan out.
PENDING_STATES = frozenset({"PENDING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})


class Allocation(BaseModel):
    """One job's GPUs on one node (value of the internal ``allocations`` topic, keyed by node).

    ``end_ts`` is ``None`` while the job still holds the GPUs; ``ts`` is when the watcher
    observed the job state this record came from (used to ignore stale updates).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(min_length=1)
    job_id: str = Field(min_length=1)
    gpus: list[int] = Field(default_factory=list, description="GPU indices of the job on this node")
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    start_ts: float | None = Field(None, description="Job start, epoch s; None = unknown (covers any earlier ts)")
    end_ts: float | None = Field(None, description="Job end, epoch s; None = still running")
    state: str
    job_gpus: int = Field(0, ge=0, description="Total GPUs of the job across its nodes")
    ts: float = Field(ge=0, description="Event time of the JobState this record comes from")

    def covers(self, ts: float) -> bool:
        """True if the allocation held its GPUs at event time ``ts`` (start <= ts < end)."""
        start = -math.inf if self.start_ts is None else self.start_ts
        end = math.inf if self.end_ts is None else self.end_ts
        return start <= ts < end

    def attribution(self, gpu_index: int) -> GpuAttribution:
        return GpuAttribution(
            gpu_index=gpu_index,
            job_id=self.job_id,
            user=self.user,
            account=self.account,
            partition=self.partition,
            job_start_ts=self.start_ts,
            job_gpus=self.job_gpus,
        )


#: What the table holds per node: job id -> allocation.
NodeAllocations = Mapping[str, Allocation]


def base_state(state: str) -> str:
    """``"CANCELLED by 1000"`` -> ``"CANCELLED"``; upper-case first word."""
    parts = state.strip().split()
    return parts[0].upper() if parts else ""


def fan_out(job: JobState) -> list[Allocation]:
    """One :class:`Allocation` per node of ``job`` (empty for pending jobs).

    Active states give an open-ended allocation (``end_ts`` None: the JobState's ``end_ts``
    is the time limit while running). Any other state (COMPLETED, FAILED, CANCELLED,
    TIMEOUT, NODE_FAIL, PREEMPTED, REQUEUED, ...) closes the allocation at the job's
    ``end_ts``, or at the observation ``ts`` when Slurm gave none.
    """
    state = base_state(job.state)
    if state in PENDING_STATES:
        return []
    nodes = list(dict.fromkeys([*job.nodes, *job.gpus]))
    job_gpus = sum(len(set(g)) for g in job.gpus.values())
    end = None if state in ACTIVE_STATES else (job.end_ts if job.end_ts is not None else job.ts)
    return [
        Allocation(
            node=node,
            job_id=job.job_id,
            gpus=sorted(set(job.gpus.get(node, []))),
            user=job.user,
            account=job.account,
            partition=job.partition,
            start_ts=job.start_ts,
            end_ts=end,
            state=state,
            job_gpus=job_gpus,
            ts=job.ts,
        )
        for node in nodes
    ]


def apply_allocation(allocs: NodeAllocations, new: Allocation, *, keep_gpuless: bool = False) -> dict[str, Allocation]:
    """The node's allocations after ``new`` (a new dict; ``allocs`` is not changed).

    Stale records (older ``ts`` than the one held) are ignored, so redelivery and
    out-of-order snapshots converge. A closing record without GPU indices keeps the
    indices already known. A record without GPUs for an unknown job is not stored, unless
    ``keep_gpuless``: a reader that attributes node-wide events (the detector) keeps it as
    "this job holds the node, GPU indices unknown"; it never attributes a GPU.
    """
    out = dict(allocs)
    old = out.get(new.job_id)
    if old is not None and new.ts < old.ts:
        return out
    if not new.gpus:
        if old is None:
            if keep_gpuless:
                out[new.job_id] = new
            return out
        new = new.model_copy(
            update={"gpus": old.gpus, "start_ts": new.start_ts if new.start_ts is not None else old.start_ts}
        )
    out[new.job_id] = new
    return out


def expire(allocs: NodeAllocations, now_ts: float, retention_s: float) -> dict[str, Allocation]:
    """Drop allocations that ended more than ``retention_s`` before event time ``now_ts``."""
    return {j: a for j, a in allocs.items() if a.end_ts is None or a.end_ts + retention_s > now_ts}


def attributions_at(
    allocs: NodeAllocations, ts: float, gpu_indices: Iterable[int] | None = None
) -> list[GpuAttribution]:
    """Who held each GPU at event time ``ts``: one attribution per held GPU, sorted by index.

    ``gpu_indices`` restricts the result to those GPUs (e.g. the GPUs present in a sample).
    If two allocations overlap on a GPU (inconsistent Slurm data), the one that started
    last wins, ties broken by job id, so the result is deterministic.
    """
    wanted = None if gpu_indices is None else set(gpu_indices)
    best: dict[int, Allocation] = {}
    for a in allocs.values():
        if not a.covers(ts):
            continue
        for g in a.gpus:
            if wanted is not None and g not in wanted:
                continue
            cur = best.get(g)
            if cur is None or _rank(a) > _rank(cur):
                best[g] = a
    return [best[g].attribution(g) for g in sorted(best)]


def _rank(a: Allocation) -> tuple[float, str]:
    return (-math.inf if a.start_ts is None else a.start_ts, a.job_id)


def attribute_sample(sample: NodeSample, allocs: NodeAllocations) -> AttributedSample:
    """Join a sample with the node's allocations at ``sample.ts`` (only GPUs in the sample)."""
    return AttributedSample(sample=sample, jobs=attributions_at(allocs, sample.ts, [g.index for g in sample.gpus]))


def attribute_event(event: GpuEvent, allocs: NodeAllocations) -> AttributedEvent:
    """Join an event with the job holding its GPU at ``event.ts`` and all jobs on the node."""
    node_jobs = attributions_at(allocs, event.ts)
    job = None
    if event.gpu_index is not None:
        job = next((a for a in node_jobs if a.gpu_index == event.gpu_index), None)
    return AttributedEvent(event=event, job=job, node_jobs=node_jobs)


def load_allocations(raw: Mapping[str, Any] | None) -> dict[str, Allocation]:
    """Table value (JSON: job id -> allocation dict) -> allocations."""
    if not raw:
        return {}
    return {j: Allocation.model_validate(v) for j, v in raw.items()}


def dump_allocations(allocs: NodeAllocations) -> dict[str, Any]:
    """Allocations -> JSON-able table value."""
    return {j: a.model_dump(mode="json") for j, a in allocs.items()}
