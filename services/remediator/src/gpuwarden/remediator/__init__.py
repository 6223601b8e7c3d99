"""gpuwarden remediator: policy-checked Slurm drains/resumes and alerts, every decision audited."""

from .actuation import make_client, resume_node
from .alerts import Alert, Alerter, AlertmanagerSink, JsonWebhookSink, MemoryAlertSink, SlackSink
from .ledger import Ledger
from .policy import REASON_PREFIX, Decision, History, PolicyConfig, decide, decide_resume, drain_reason, is_ours
from .policy_file import DEFAULT_POLICY, PolicyError, PolicyFile, PolicyRule, load_policy
from .service import Remediator
from .settings import RemediatorSettings

__all__ = [
    "DEFAULT_POLICY",
    "REASON_PREFIX",
    "Alert",
    "Alerter",
    "AlertmanagerSink",
    "Decision",
    "History",
    "JsonWebhookSink",
    "Ledger",
    "MemoryAlertSink",
    "PolicyConfig",
    "PolicyError",
    "PolicyFile",
    "PolicyRule",
    "Remediator",
    "RemediatorSettings",
    "SlackSink",
    "decide",
    "decide_resume",
    "drain_reason",
    "is_ours",
    "load_policy",
    "make_client",
    "resume_node",
]
