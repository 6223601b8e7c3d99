"""The remediator's units on their own (issue 18: service.py along its seams): the Slurm
actuator, the reconcile verdict, drain adoption and the resolution note, the health-check
drain selection, the records and the metric collector."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import gpuwarden.remediator.health_drains as health_drains
from gpuwarden.remediator import Alerter, RemediatorSettings
from gpuwarden.remediator.actuation import SlurmActuator
from gpuwarden.remediator.health_drains import HealthDrain, HealthDrains
from gpuwarden.remediator.intents import reconciled
from gpuwarden.remediator.metrics import RemediatorCollector
from gpuwarden.remediator.policy import Decision, History, PolicyConfig, adopt_drain
from gpuwarden.remediator.records import failure_remediation, recent_entry, resume_remediation
from gpuwarden.shared.lease import NoLease
from gpuwarden.shared.models import Action, NodeState, Remediation
from gpuwarden.shared.models import RemediationDecision as D
from gpuwarden.shared.slurm import drain_argv
from gpuwarden.sim.slurm import FakeSlurm

NOW = 1_800_000_000.0
OURS = "gpuwarden: xid-79 gpu=3 failure=abcdef12"


def node(name: str, reason: str | None = None, user: str | None = None, ts: float | None = None) -> NodeState:
    return NodeState(
        node=name, ts=NOW, state="IDLE", flags=["DRAIN"] if reason else [], reason=reason, reason_user=user,
        reason_ts=ts,
    )  # fmt: skip


def actuator(fake: FakeSlurm, retries: int = 2) -> SlurmActuator:
    s = RemediatorSettings(remediator_command_retries=retries, remediator_retry_backoff_s=0)
    return SlurmActuator(fake, s)


async def test_drain_writes_once_and_re_reads_before_each_retry() -> None:
    fake = FakeSlurm(nodes=[node("n1")])
    res = await actuator(fake).drain("n1", OURS)
    assert (res.status, res.error) == ("ok", "")
    assert fake.calls == [("n1", "DRAIN", OURS)]
    assert res.argv == drain_argv("n1", "DRAIN", OURS) and res.exit_code == 0

    fake = FakeSlurm(nodes=[node("n1")])
    fake.fail_with = 1
    res = await actuator(fake, retries=2).drain("n1", OURS)
    assert res.status == "failed" and res.error.startswith("scontrol exit 1")
    assert len(fake.calls) == 3 and res.exit_code == 1  # 1 + 2 retries, no more


async def test_drain_leaves_a_foreign_reason_alone() -> None:
    fake = FakeSlurm(nodes=[node("n1", "admin: PSU", "alice")])
    res = await actuator(fake).drain("n1", OURS)
    assert res.status == "foreign" and "by alice" in res.error and "'admin: PSU'" in res.error
    assert fake.calls == [] and res.argv == [] and res.exit_code is None


async def test_resume_only_while_the_reason_is_still_ours() -> None:
    fake = FakeSlurm(nodes=[node("n1", OURS)])
    res = await actuator(fake).resume("n1", OURS)
    assert res.ok and fake.calls == [("n1", "RESUME", None)]

    fake = FakeSlurm(nodes=[node("n1", "admin: PSU")])
    res = await actuator(fake).resume("n1", OURS)
    assert res.status == "foreign" and fake.calls == []

    fake = FakeSlurm(nodes=[node("n1")])
    res = await actuator(fake).resume("n1", OURS)
    assert (res.status, res.error) == ("gone", "n1 is no longer out") and fake.calls == []


def intent(reason: str = OURS) -> Remediation:
    return Remediation(
        remediation_id="i1", ts=NOW - 10, decided_at=NOW - 10, node="n1", action=Action.DRAIN,
        argv=drain_argv("n1", "DRAIN", reason), dry_run=False, decision=D.INTENT, reason="x",
        failure_ids=["abcdef1234"],
    )  # fmt: skip


def test_reconciled_from_the_node_as_slurm_shows_it() -> None:
    assert reconciled(intent(), node("n1", OURS))[0] == D.EXECUTED
    decision, why = reconciled(intent(), node("n1", "admin: PSU"))
    assert decision == D.REFUSED and why.startswith("[rule=foreign-reason] reconciled: n1 has reason 'admin: PSU'")
    assert reconciled(intent(), node("n1"))[0] == D.FAILED
    assert reconciled(intent(), None)[0] == D.FAILED


def test_adopt_drain_and_the_resolution_behind_it() -> None:
    rec = adopt_drain(node("n1", OURS, ts=NOW - 50))
    assert (rec.node, rec.reason, rec.drained_at) == ("n1", OURS, NOW - 50)
    assert {k: (n.failure_id, n.pattern) for k, n in rec.failures.items()} == {"abcdef12": ("abcdef12", "xid-79")}

    h = History()
    h.adopt_intent("n1", OURS, NOW - 50, ["abcdef1234", "abcdef1299"], NOW - 60)
    h.adopt_intent("n1", OURS, NOW - 50, ["abcdef1234"], NOW - 60)
    assert h.drains == [("n1", NOW - 60)] and h.handled == {"abcdef1234", "abcdef1299"}
    h.note_drained("n2", OURS, NOW, "f2", "ecc-dbe")
    assert h.note_resolved("n3", "f9", NOW, 600) == "failure resolved; gpuwarden holds no drain for it"
    assert h.note_resolved("n2", "f2", NOW, 600) == "failure resolved; n2 resumes after the 600s hold-down"
    assert h.drained["n2"].failures["f2"].resolved_at == NOW and h.drained["n2"].all_resolved()


def test_health_drain_due_only_after_a_later_pass_once_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_drains, "HEALTH_SETTLE_S", -1.0)
    reason = "gpuwarden prolog: CRITICAL: ecc"
    nodes = {"n1": node("n1", reason, ts=NOW - 100), "n2": node("n2", "admin: PSU", ts=NOW - 100)}
    h, hd = History(), HealthDrains()
    h.note_health("n1", NOW - 10, True)
    h.note_health("n2", NOW - 10, True)
    assert list(hd.due(nodes, h)) == []  # no result seen on the bus yet: not settled
    hd.note_result("n1")
    hd.note_result("n2")
    [due] = hd.due(nodes, h)
    assert due == HealthDrain("n1", reason, NOW - 100)
    assert due.why(NOW - 10).startswith("[rule=health-check-passed] drained by the health check")
    h.note_health("n1", NOW - 5, False)  # a later failed check: no pass after it
    assert list(hd.due(nodes, h)) == []
    h.note_health("n1", NOW - 1, True)
    [due] = hd.due(nodes, h)
    hd.done(due)
    assert list(hd.due(nodes, h)) == []
    monkeypatch.setattr(health_drains, "HEALTH_SETTLE_S", 3600.0)
    h2 = History()
    h2.note_health("n1", NOW - 1, True)
    assert list(HealthDrains().due(nodes, h2)) == []


def test_records() -> None:
    from factories import make_failure

    f = make_failure(failure_id="f1", node="n1", first_seen=NOW - 5, last_seen=NOW - 1)
    d = Decision(D.SKIPPED, "[rule=x] why", Action.NONE, rule="x")
    rem = failure_remediation(f, d, D.SKIPPED, d.reason, dry_run=True)
    assert (rem.node, rem.ts, rem.action, rem.failure_ids, rem.argv, rem.dry_run) == ("n1", NOW - 1, Action.NONE,
                                                                                      ["f1"], [], True)  # fmt: skip
    assert recent_entry(rem, "x", "f1", f.pattern) == {
        "at": rem.decided_at, "node": "n1", "decision": "skipped", "action": "none", "rule": "x", "failure": "f1",
        "pattern": f.pattern, "reason": "[rule=x] why", "argv": [],
    }  # fmt: skip
    res = resume_remediation("r1", "n1", NOW, D.EXECUTED, "[rule=r] ok", ["f1"], dry_run=False, argv=["a"],
                             exit_code=0, output=None)  # fmt: skip
    assert res.reason == "resume: [rule=r] ok" and res.action == Action.RESUME and res.ts == NOW


def test_collector_names_and_values() -> None:
    class State:
        history = History(breaker_reason="too many", drained={"n1": adopt_drain(node("n1", OURS))})
        cfg = PolicyConfig(enforce=True)
        lease = NoLease()
        alerter = Alerter()
        decisions = {"executed": 2}

    reg = CollectorRegistry()
    reg.register(RemediatorCollector(State()))
    text = generate_latest(reg).decode()
    for line in (
        "gpuwarden_remediator_breaker_open 1.0",
        "gpuwarden_remediator_enforce 1.0",
        "gpuwarden_remediator_lease_held 1.0",
        "gpuwarden_remediator_drained_nodes 1.0",
        "gpuwarden_remediator_alerts_active 0.0",
        'gpuwarden_remediator_decisions_total{decision="executed"} 2.0',
        'gpuwarden_remediator_decisions_total{decision="failed"} 0.0',
        "gpuwarden_remediator_alerts_delivered_total 0.0",
        "gpuwarden_remediator_alerts_failed_total 0.0",
    ):
        assert line in text.splitlines(), line
