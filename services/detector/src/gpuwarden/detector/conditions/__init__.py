"""Condition rules: unhealthy states with a healthy default (STYLE item 6).

An XID is an *event*; "GPU 3 is thermally throttled" is a *condition*. A condition rule
names a signal (one of the types below, parameters from the catalog YAML), how long it
must hold before a failure opens (``for_s``) and how long it must be healthy again
before the failure resolves (``resolve_after_s``). Everything runs in event time.

Signal types, by scope:

* ``gpu`` (each GPU of each ``gpu.attributed`` sample; the previous sample of the same
  GPU is given for counters): ``throttle``, ``flag``, ``counter-rate``, ``clock-low``,
  ``pcie-degraded``, ``nvlink-rate``, ``nvlink-down``, ``memory-without-job``.
* ``node``: ``gpu-count-drop`` (a GPU vanished from the node's samples), ``silent`` (no
  sample from a node that reported before while other nodes keep reporting).
* ``job`` (the ``job.windows`` of one job and window start, all its GPUs together):
  ``idle``, ``partial-idle``, ``straggler-gpu``, ``straggler-node``, ``low-duty``,
  ``hang``, ``memory-growth``, ``low-tensor``, ``pauses``.
* ``health``: a failed prolog/epilog check on the ``health`` topic.

This package is the registry: the :data:`Signal` union the catalog's ``signal:`` entries are
validated against, their :data:`SCOPES`, the rule models (:class:`RuleBase`,
:class:`ConditionRule`) and the dispatch of job-scope evaluation. Each family lives in its own
module: :mod:`.gpu` (GPU thresholds and health flags), :mod:`.node` (node health),
:mod:`.jobshape` (idle, partial-idle, low-duty, hang, low-tensor, pauses), :mod:`.fleet`
(stragglers against the job's peers), :mod:`.memory` (memory trends); :mod:`.base` holds what
they share and :mod:`.tracker` the open/resolve state machine.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gpuwarden.shared.models import Action, Category, JobWindow, Pattern, Severity

from .base import CostModel, FrozenModel, JobContext, Reading
from .fleet import Straggler, StragglerMetric, evaluate_stragglers
from .gpu import (
    JOB_DEPENDENT,
    ClockLow,
    CounterRate,
    Flag,
    MemoryWithoutJob,
    NvlinkDown,
    NvlinkRate,
    PcieDegraded,
    Throttle,
    evaluate_gpu,
    gpu_evaluator,
)
from .jobshape import (
    Hang,
    Idle,
    LowDuty,
    LowTensor,
    PartialIdle,
    Pauses,
    evaluate_hang,
    evaluate_idle,
    evaluate_low_duty,
    evaluate_low_tensor,
    evaluate_partial_idle,
    evaluate_pauses,
)
from .memory import MemoryGrowth, evaluate_memory_growth
from .node import GpuCountDrop, HealthFailed, Silent
from .tracker import Tracker

__all__ = [
    "JOB_DEPENDENT",
    "SCOPES",
    "TEMPLATE_FIELDS",
    "ClockLow",
    "ConditionRule",
    "CostModel",
    "CounterRate",
    "Explain",
    "Flag",
    "GpuCountDrop",
    "Hang",
    "HealthFailed",
    "Idle",
    "JobContext",
    "LowDuty",
    "LowTensor",
    "MemoryGrowth",
    "MemoryWithoutJob",
    "NvlinkDown",
    "NvlinkRate",
    "PartialIdle",
    "Pauses",
    "PcieDegraded",
    "Reading",
    "RuleBase",
    "Signal",
    "Silent",
    "Straggler",
    "StragglerMetric",
    "Throttle",
    "Tracker",
    "check_template",
    "evaluate_gpu",
    "evaluate_job",
    "gpu_evaluator",
]


Signal = Annotated[
    Throttle
    | Flag
    | CounterRate
    | ClockLow
    | PcieDegraded
    | NvlinkRate
    | NvlinkDown
    | MemoryWithoutJob
    | GpuCountDrop
    | Silent
    | Idle
    | PartialIdle
    | Straggler
    | LowDuty
    | Hang
    | MemoryGrowth
    | LowTensor
    | Pauses
    | HealthFailed,
    Field(discriminator="type"),
]
SCOPES = {
    "gpu": {
        "throttle",
        "flag",
        "counter-rate",
        "clock-low",
        "pcie-degraded",
        "nvlink-rate",
        "nvlink-down",
        "memory-without-job",
    },
    "node": {"gpu-count-drop", "silent", "health-failed"},
    "job": {
        "idle",
        "partial-idle",
        "straggler-gpu",
        "straggler-node",
        "low-duty",
        "hang",
        "memory-growth",
        "low-tensor",
        "pauses",
    },
}


TEMPLATE_FIELDS = {"node", "gpu", "job_text", "code", "message"}


def check_template(v: str) -> str:
    """Raise ValueError if a verdict template uses a field the renderer does not fill."""
    import string

    names = {f for _, f, _, _ in string.Formatter().parse(v) if f}
    unknown = names - TEMPLATE_FIELDS
    if unknown:
        raise ValueError(f"verdict uses unknown fields {sorted(unknown)}; allowed {sorted(TEMPLATE_FIELDS)}")
    return v


class Explain(FrozenModel):
    """A rule's ``explain:`` block: how its findings pass the pending-finding stage
    (:mod:`gpuwarden.detector.pending`).

    ``by``: rules (ids) whose finding explains this one: a candidate of this rule is held until the
    watermark passes its ``first_seen`` + ``window_s``; if a finding of one of ``by`` lies within
    ``window_s`` of it (before or after) in the ``scope`` (``gpu``: the same GPU; ``node``: any GPU of
    the node), the candidate joins that failure as evidence instead of opening one of its own.
    ``explains``: the reverse, written on the cause (rule ids whose findings this rule explains, with
    this block's window and scope). ``aggregate: node``: when at least ``share`` of a node's GPUs in
    the same job have this finding within the window, they are one node-level failure (the GPUs as
    evidence). ``aggregate: job``: the same per node, and when at least ``job_share`` of the job's
    nodes (two at least) have it so within the window, all of the job's GPUs with the finding are
    one job-level failure (the nodes and GPUs as evidence; ``node`` is the first node, the verdict
    names them all); below that, node-level failures as with ``aggregate: node``. Only for a rule
    whose action acts on no node (``alert``, ``none``). ``answers``: beginnings of the explaining
    failure's ``cannot_determine`` entries that this finding settles once folded into it (XID 94
    tells that the XID 48 it follows was contained), so the published failure no longer says it
    cannot tell what its evidence shows. ``startup_s``: the job's start-up explains this finding (a
    model loading, data staging): a candidate first seen less than ``startup_s`` after its job's
    start (Slurm's, else the job's first window) is held until the watermark passes start +
    ``startup_s``; one that resolved by then is dropped (nothing published), one still open goes
    on (with its ``first_seen``: the idle time counts from its onset). A block with only
    ``startup_s`` holds nothing first seen after the start-up.
    """

    by: list[str] = Field(default_factory=list, description="Rule ids whose finding explains this one")
    explains: list[str] = Field(default_factory=list, description="Rule ids whose findings this rule explains")
    window_s: float = Field(60.0, gt=0, le=3600, description="Explanation window, event time, s")
    scope: Literal["gpu", "node"] = "gpu"
    aggregate: Literal["node", "job"] | None = Field(
        None, description="Most GPUs of a node: one node-level finding; job: and most nodes of a job: one job-level"
    )
    share: float = Field(0.5, gt=0, le=1, description="aggregate: share of the node's GPUs in the job, at least")
    job_share: float = Field(
        0.5, gt=0, le=1, description="aggregate job: share of the job's nodes (two at least) with the finding"
    )
    answers: list[str] = Field(
        default_factory=list,
        description="Beginnings of the explaining failure's cannot_determine entries this finding settles when folded",
    )
    startup_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="The job's start-up explains it: a candidate first seen within this of its job's start is held "
        "until the watermark passes start + this, and dropped if it resolved by then, s",
    )


class RuleBase(FrozenModel):
    """What every catalog rule has: identity, the canonical pattern, severity, the
    recommended action, the cost scope, a verdict template and what the data cannot tell."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    pattern: Pattern
    category: Category
    severity: Severity
    action: Action
    cost: CostModel = CostModel()
    verdict: str
    cannot_determine: list[str] = Field(default_factory=list)
    source: str | None = None
    explain: Explain | None = Field(
        None,
        description="What explains this finding and what it explains (the detector's pending-finding stage)",
    )

    @field_validator("action")
    @classmethod
    def _action(cls, v: Action) -> Action:
        if v is Action.RESUME:
            raise ValueError("resume is the remediator's own action, not a recommendation")
        return v

    @field_validator("verdict")
    @classmethod
    def _verdict(cls, v: str) -> str:
        return check_template(v)

    @model_validator(mode="after")
    def _job_level_acts_on_no_node(self) -> RuleBase:
        by_job = self.explain is not None and self.explain.aggregate == "job"
        if by_job and self.action not in (Action.ALERT, Action.NONE):
            raise ValueError(
                f"explain.aggregate job needs action alert or none, not {self.action.value}: a job-level failure "
                "names its first node only, and an action there would hit one node for the whole job"
            )
        return self


class ConditionRule(RuleBase):
    """A condition: a signal that must hold ``for_s`` to open and clear ``resolve_after_s`` to resolve."""

    signal: Signal
    for_s: float = Field(30, ge=0, description="Unhealthy this long (event time) before the failure opens, s")
    resolve_after_s: float = Field(60, ge=0, description="Healthy this long before it resolves, s")

    @property
    def scope(self) -> str:
        return next(s for s, types in SCOPES.items() if self.signal.type in types)


def evaluate_job(
    sig: Signal, windows: list[JobWindow], history: list[list[JobWindow]], ctx: JobContext | None = None
) -> list[tuple[str, int | None, Reading]]:
    """Evaluate a job-scope signal on the windows of one job and window start.

    Args:
        windows: one JobWindow per GPU of the job for the same window.
        history: earlier window groups of the same job, oldest first (for trends).
        ctx: the job's start and its GPUs' working power (None: unknown).

    Returns:
        ``(node, gpu_index or None for the whole job/node, reading)`` per subject; the
        job as a whole is reported on its first node with ``gpu_index`` None.

    Raises:
        ValueError: ``sig`` is not a job-scope signal (and ``windows`` is not empty).
    """
    if not windows:
        return []
    ctx = ctx or JobContext()
    if isinstance(sig, Idle):
        return evaluate_idle(sig, windows, ctx)
    if isinstance(sig, PartialIdle):
        return evaluate_partial_idle(sig, windows, ctx)
    if isinstance(sig, Straggler):
        return evaluate_stragglers(sig, windows)
    if isinstance(sig, LowDuty):
        return evaluate_low_duty(sig, windows)
    if isinstance(sig, Hang):
        return evaluate_hang(sig, windows, history, ctx)
    if isinstance(sig, MemoryGrowth):
        return evaluate_memory_growth(sig, windows, history, ctx)
    if isinstance(sig, LowTensor):
        return evaluate_low_tensor(sig, windows, ctx)
    if isinstance(sig, Pauses):
        return evaluate_pauses(sig, windows, history, ctx)
    raise ValueError(f"{sig.type} is not a job-scope signal")
