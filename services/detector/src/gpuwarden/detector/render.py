"""Turning what a rule found into the public :class:`~gpuwarden.shared.models.Failure`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpuwarden.shared.models import (
    Action,
    Category,
    CostEstimate,
    Evidence,
    Failure,
    FailureState,
    GpuAttribution,
    Severity,
    stable_id,
)

__all__ = ["NO_JOB", "Finding", "RuleLike", "render"]

NO_JOB = "which job was affected: no Slurm allocation covered this GPU at the event time"


class RuleLike(Protocol):
    """What :func:`render` needs of a rule (event rules and condition rules both have it)."""

    @property
    def id(self) -> str: ...
    @property
    def pattern(self) -> str: ...
    @property
    def category(self) -> Category: ...
    @property
    def severity(self) -> Severity: ...
    @property
    def action(self) -> Action: ...
    @property
    def verdict(self) -> str: ...
    @property
    def cannot_determine(self) -> list[str]: ...


@dataclass
class Finding:
    """One episode of one rule on one node (and GPU), as far as it is known."""

    node: str
    gpu_index: int | None
    first_seen: float
    last_seen: float
    occurrences: int
    evidence: list[Evidence]
    job: GpuAttribution | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    code: int | None = None
    message: str = ""
    state: FailureState = FailureState.OPEN
    gpus: list[int] | None = None  # a node-level finding made of these GPUs (the pending stage's aggregate)


def render(rule: RuleLike, f: Finding, price_usd_per_gpu_hour: float, scope: str) -> Failure:
    """The Failure for ``f`` under ``rule``: verdict, what cannot be told, cost.

    Cost: ``scope == "job"`` counts every GPU of the affected job (a synchronous job stalls
    as a whole), ``"gpu"`` only the GPU itself; USD/h = GPUs x price; GPU-hours lost =
    GPUs x episode length.
    """
    if f.gpu_index is not None:
        gpu_text = str(f.gpu_index)
    elif f.gpus:
        gpu_text = ",".join(map(str, f.gpus))
    elif f.pci_bus_id:
        gpu_text = f"at PCI {f.pci_bus_id}"
    else:
        gpu_text = "(node-wide)"
    job = f.job
    job_text = f"job {job.job_id} ({job.user or 'unknown user'})" if job else "no Slurm job (idle GPU)"
    verdict = rule.verdict.format(node=f.node, gpu=gpu_text, job_text=job_text, code=f.code, message=f.message)
    cannot = list(rule.cannot_determine)
    if f.gpu_index is None and f.pci_bus_id:
        cannot.insert(0, "which GPU index the PCI bus id maps to (no sample from this node yet)")
    if job is None and f.gpu_index is not None:
        cannot.append(NO_JOB)
    gpus = job.job_gpus if scope == "job" and job is not None and job.job_gpus else len(f.gpus or [0])
    return Failure(
        failure_id=stable_id(rule.id, f.node, f.gpu_index, f.first_seen),
        pattern=rule.pattern,
        rule_id=rule.id,
        category=rule.category,
        severity=rule.severity,
        node=f.node,
        gpu_index=f.gpu_index,
        gpu_uuid=f.gpu_uuid,
        pci_bus_id=f.pci_bus_id,
        job_id=job.job_id if job else None,
        user=job.user if job else None,
        partition=job.partition if job else None,
        first_seen=f.first_seen,
        last_seen=f.last_seen,
        state=f.state,
        occurrences=f.occurrences,
        evidence=list(f.evidence),
        verdict=verdict,
        cannot_determine=cannot,
        recommended_action=rule.action,
        cost=CostEstimate(
            affected_gpus=gpus,
            usd_per_hour=round(gpus * price_usd_per_gpu_hour, 4),
            gpu_hours_lost=round(gpus * max(0.0, f.last_seen - f.first_seen) / 3600.0, 6),
        ),
    )
