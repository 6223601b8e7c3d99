"""gpuwarden remediator: policy-checked Slurm drains for failures, every decision audited."""

from .policy import REASON_PREFIX, Decision, History, PolicyConfig, decide, drain_reason, is_ours
from .service import Remediator, RemediatorSettings, make_client, resume_node

__all__ = [
    "REASON_PREFIX",
    "Decision",
    "History",
    "PolicyConfig",
    "Remediator",
    "RemediatorSettings",
    "decide",
    "drain_reason",
    "is_ours",
    "make_client",
    "resume_node",
]
