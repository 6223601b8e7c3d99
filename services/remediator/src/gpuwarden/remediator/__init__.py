"""gpuwarden remediator: policy-checked Slurm drains/resumes and alerts, every decision audited."""

from .alerts import Alert, Alerter, AlertmanagerSink, JsonWebhookSink, MemoryAlertSink, SlackSink
from .lease import KafkaLease, Lease, LeaseBoard, MemoryLease, NoLease
from .policy import REASON_PREFIX, Decision, History, PolicyConfig, decide, decide_resume, drain_reason, is_ours
from .policy_file import DEFAULT_POLICY, PolicyError, PolicyFile, PolicyRule, load_policy
from .service import Ledger, Remediator, RemediatorSettings, make_client, resume_node

__all__ = [
    "DEFAULT_POLICY",
    "REASON_PREFIX",
    "Alert",
    "Alerter",
    "AlertmanagerSink",
    "Decision",
    "History",
    "JsonWebhookSink",
    "KafkaLease",
    "Lease",
    "LeaseBoard",
    "Ledger",
    "MemoryAlertSink",
    "MemoryLease",
    "NoLease",
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
