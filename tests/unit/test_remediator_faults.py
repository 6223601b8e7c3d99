"""The remediator under faults (issue 13, point 4): no blind retry over a foreign drain, the
breaker counts Slurm's nodes (not bus messages), intent before the command and reconciliation
of an intent without outcome after a crash."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from factories import make_failure, node_states
from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.remediator.intents import intended_reason, open_intents
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.command import CommandTimeout
from gpuwarden.shared.models import Failure, NodeState, Remediation
from gpuwarden.shared.models import RemediationDecision as D
from gpuwarden.shared.slurm import CliSlurm, CommandResult, drain_argv
from gpuwarden.sim.slurm import FakeSlurm

NOW = 2_000_000.0


class MemProducer(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class AdminDrainsDuringOutage(FakeSlurm):
    """The first ``scontrol update`` fails like an unreachable slurmctld; meanwhile an admin
    drains the node with a reason of their own."""

    def __init__(self, nodes: list[NodeState], landed: bool = False) -> None:
        super().__init__(nodes=nodes)
        self.landed = landed
        self.failed_once = False

    async def update_node(self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None) -> CommandResult:
        if not self.failed_once and state == "DRAIN":
            self.failed_once = True
            self.calls.append((name, state, reason))
            if self.landed:  # the drain landed, then the admin replaced the reason
                await super().update_node(name, state, reason)
                self.calls.pop()
            cur = self.nodes_map[name]
            self.nodes_map[name] = cur.model_copy(
                update={"flags": ["DRAIN"], "reason": "admin: bad PSU", "reason_user": "alice", "reason_ts": NOW}
            )
            argv = drain_argv(name, state, reason)
            return CommandResult(argv, 1, "", "slurm_update error: Unable to contact slurm controller", 0.1)
        return await super().update_node(name, state, reason)


def failure(node: str = "gpu-node-002", fid: str = "f1") -> Failure:
    return make_failure(failure_id=fid, node=node, first_seen=NOW - 5, last_seen=NOW - 1, gpu_hours_lost=0.1)


def make(fake: FakeSlurm, **kw: object) -> tuple[Remediator, MemProducer]:
    fake.now = lambda: NOW
    prod = MemProducer()
    s = RemediatorSettings(remediator_enforce=True, remediator_retry_backoff_s=0, **kw)  # type: ignore[arg-type]
    return Remediator(s, client=fake, producer=prod, now=lambda: NOW), prod  # type: ignore[arg-type]


async def test_foreign_drain_between_failed_and_retried_scontrol_is_never_overwritten() -> None:
    for landed in (False, True):
        fake = AdminDrainsDuringOutage(node_states(20, NOW), landed=landed)
        r, prod = make(fake)
        await r.seed()
        rem = await r.handle_failure(failure())
        assert rem.decision == D.REFUSED and "foreign-reason" in rem.reason and "admin: bad PSU" in rem.reason
        assert len(fake.calls) == 1, fake.calls  # one attempt, no retry over the admin's drain
        assert fake.nodes_map["gpu-node-002"].reason == "admin: bad PSU"
        assert "gpu-node-002" not in r.history.drained  # not gpuwarden's: never resumed
        # the failure resolves; nothing is resumed
        fake.nodes_map["gpu-node-002"] = fake.nodes_map["gpu-node-002"]
        assert await r.resume_due() == []
        assert fake.nodes_map["gpu-node-002"].reason == "admin: bad PSU"
        decisions = [v.decision for v in prod.of("remediations")]
        assert decisions == [D.INTENT, D.REFUSED]


async def test_drain_that_landed_despite_an_error_counts_as_executed_without_a_second_write() -> None:
    class LandsThenTimesOut(FakeSlurm):
        async def update_node(self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None) -> CommandResult:
            res = await super().update_node(name, state, reason)
            return CommandResult(res.argv, 124, "", "timed out after 10s", 10.0)

    fake = LandsThenTimesOut(nodes=node_states(20, NOW))
    r, _ = make(fake)
    rem = await r.handle_failure(failure())
    assert rem.decision == D.EXECUTED and len(fake.calls) == 1
    assert "gpu-node-002" in r.history.drained


async def test_forged_node_records_do_not_raise_the_breaker_denominator() -> None:
    fake = FakeSlurm(nodes=node_states(20, NOW))
    r, _ = make(fake, remediator_max_drain_fraction=0.1, remediator_max_drains_per_window=100)
    await r.seed()
    for i in range(100):  # forged slurm.nodes records from the bus
        forged = NodeState(node=f"forged-{i:03d}", ts=NOW, state="IDLE")
        await r._on_message("slurm.nodes", forged, None)  # type: ignore[arg-type]
    names = [f"gpu-node-{i:03d}" for i in range(1, 8)]
    decided = [(await r.handle_failure(failure(n, f"f{n}"))).decision for n in names]
    # 10 % of Slurm's 20 nodes = 2 drains; then the breaker (never 5 of 20)
    assert decided.count(D.EXECUTED) == 2, decided
    assert sum(1 for n in fake.nodes_map.values() if n.drained) == 2
    assert r.history.breaker_reason is not None


async def test_crash_between_intent_and_outcome_is_reconciled_from_slurm() -> None:
    fake = FakeSlurm(nodes=node_states(20, NOW))
    r, prod = make(fake)
    f = failure()
    # the intent is published, the command runs, and the process dies before the outcome
    r.client = fake
    await r.handle_failure(f)
    intent, outcome = prod.of("remediations")
    assert intent.decision == D.INTENT and outcome.intent_id == intent.remediation_id
    log = [intent]  # what the topic holds when the process died after the command
    assert open_intents([intent, outcome]) == [] and open_intents(log) == [intent]
    assert intended_reason(intent) == fake.nodes_map["gpu-node-002"].reason

    # a fresh remediator finds the open intent: the drain landed -> executed, adopted
    r2, _prod2 = make(fake)
    await r2.seed()
    r2.intents = {i.remediation_id: i for i in open_intents(log)}
    (rec,) = await r2.reconcile()
    assert rec.decision == D.EXECUTED and rec.intent_id == intent.remediation_id
    assert "gpu-node-002" in r2.history.drained and f.failure_id in r2.history.handled
    assert len(fake.calls) == 1 and not r2.intents

    # the command never ran -> failed, and the failure is decided again (one drain)
    fake2 = FakeSlurm(nodes=node_states(20, NOW))
    r3, _ = make(fake2)
    await r3.seed()
    r3.intents = {intent.remediation_id: intent}
    (rec3,) = await r3.reconcile()
    assert rec3.decision == D.FAILED and f.failure_id not in r3.history.handled
    assert (await r3.handle_failure(f)).decision == D.EXECUTED and len(fake2.calls) == 1

    # someone else drained it meanwhile -> refused, never gpuwarden's
    fake3 = FakeSlurm(nodes=node_states(20, NOW, {"gpu-node-002": "admin: RMA"}))
    r4, _ = make(fake3)
    await r4.seed()
    r4.intents = {intent.remediation_id: intent}
    (rec4,) = await r4.reconcile()
    assert rec4.decision == D.REFUSED and "gpu-node-002" not in r4.history.drained


async def test_intent_survives_in_the_ledger(tmp_path: object) -> None:
    from pathlib import Path

    led = Path(str(tmp_path)) / "ledger.json"
    fake = FakeSlurm(nodes=node_states(20, NOW))
    r, _prod = make(fake, remediator_ledger_file=led)
    intent = Remediation(
        remediation_id="i1", ts=NOW, decided_at=NOW, node="gpu-node-002", action="drain",
        argv=drain_argv("gpu-node-002", "DRAIN", "gpuwarden: x gpu=1 failure=f1"), dry_run=False,
        decision=D.INTENT, reason="intent", failure_ids=["f1"],
    )  # fmt: skip
    r.intents["i1"] = intent
    r._save()
    r2, _ = make(fake, remediator_ledger_file=led)
    await r2.seed()
    assert list(r2.intents) == ["i1"]
    (rec,) = await r2.reconcile()
    assert rec.decision == D.FAILED and not r2.intents


class ScontrolScript:
    """A command runner (the :mod:`gpuwarden.shared.command` contract) for a real ``CliSlurm``:
    ``sinfo`` and ``scontrol show node`` answer recorded 22.05 output (gpu-node-004 idle) until
    ``unreachable``; every ``scontrol update`` times out. Records every argv."""

    LOCAL = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "local-22.05"

    def __init__(self, unreachable_after_write: bool) -> None:
        self.calls: list[list[str]] = []
        self.unreachable = False
        self.unreachable_after_write = unreachable_after_write
        self.sinfo = (self.LOCAL / "sinfo.json").read_text()
        self.show = (self.LOCAL / "scontrol-show-node-all-with-drained.txt").read_text()

    async def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(list(argv))
        if argv[:2] == ["scontrol", "update"]:
            self.unreachable = self.unreachable_after_write
            raise CommandTimeout(f"scontrol ran past {timeout_s:g}s")
        if self.unreachable:
            return CommandResult(list(argv), 1, "", "slurm_load_node error: Unable to contact slurm controller", 0.0)
        out = self.sinfo if argv[0] == "sinfo" else self.show
        return CommandResult(list(argv), 0, out, "", 0.0)

    def count(self, *prefix: str) -> int:
        return sum(1 for a in self.calls if tuple(a[: len(prefix)]) == prefix)


async def test_a_failing_drain_is_retried_at_one_layer_only() -> None:
    """``remediator_command_retries=2``: at most 3 ``scontrol update`` (the remediator's layer),
    each node read at most 3 times (the client's layer), never 3 x 3."""
    s = RemediatorSettings(remediator_enforce=True, remediator_retry_backoff_s=0, remediator_command_retries=2)
    f = failure("gpu-node-004", "f-one-layer")

    # the writes time out, the reads work: 3 writes, one re-read before each, one at the end
    runner = ScontrolScript(unreachable_after_write=False)
    cli = CliSlurm(runner, timeout_s=1, retries=2, backoff_s=0)
    r = Remediator(s, client=cli, producer=MemProducer(), now=lambda: NOW)  # type: ignore[arg-type]
    rem = await r.handle_failure(f)
    assert rem.decision == D.FAILED and "[rule=command]" in rem.reason and "exit 124" in rem.reason
    assert runner.count("scontrol", "update") == 3
    assert runner.count("scontrol", "show", "node") == 1 + 3 + 1  # decision, before each write, the end

    # Slurm goes away after the first write: its re-read is retried by the client (3 calls),
    # then the drain ends (no blind write); the remediator does not retry that read again
    runner = ScontrolScript(unreachable_after_write=True)
    cli = CliSlurm(runner, timeout_s=1, retries=2, backoff_s=0)
    r = Remediator(s, client=cli, producer=MemProducer(), now=lambda: NOW)  # type: ignore[arg-type]
    rem = await r.handle_failure(f)
    assert rem.decision == D.FAILED and "no blind write" in rem.reason
    assert runner.count("scontrol", "update") == 1
    assert runner.count("scontrol", "show", "node") == 1 + 1 + 3
