"""Simulated Slurm: the scheduler's state machine for a scenario, behind
:class:`~gpuwarden.shared.slurm.client.SlurmClient`; and :class:`FakeSlurm`, in memory, for tests.

Jobs follow the scenario in event time (:class:`ScenarioClock`); drain/resume state lives
in a small JSON file (``fcntl`` lock) so the separate slurm-watcher and remediator
processes of a simulation see the same cluster. :func:`simulated_backend` is the ``simulated``
Slurm backend of :func:`gpuwarden.shared.slurm.factory.build_client` (entry point
``gpuwarden.slurm_backends: simulated``), used by the slurm-watcher and the remediator.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.scenario import Scenario, ScenarioClock, load_scenario
from gpuwarden.shared.slurm.client import CommandResult, check_reason, drain_argv, ended_after
from gpuwarden.shared.slurm.factory import DEFAULT_SIM_STATE_FILE
from gpuwarden.shared.slurm.names import validate_node_name

__all__ = ["JOB_RETENTION_S", "FakeSlurm", "SimulatedSlurm", "simulated_backend"]

JOB_RETENTION_S = 300.0  # like Slurm's MinJobAge: finished jobs stay listed this long (scenario s)


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


class _StateFile:
    """``{"nodes": {name: {"state": "DRAIN", "reason", "user", "ts"}}}`` under an exclusive lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def locked(self, exclusive: bool) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                data: dict[str, Any] = {"nodes": {}}
                if self.path.exists():
                    text = self.path.read_text()
                    if text.strip():
                        data = json.loads(text)
                before = json.dumps(data, sort_keys=True)
                yield data
                if exclusive and json.dumps(data, sort_keys=True) != before:
                    tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
                    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                    os.replace(tmp, self.path)
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)


class SimulatedSlurm:
    """:class:`~gpuwarden.shared.slurm.client.SlurmClient` for a scenario.

    * A job is ``RUNNING`` from its ``start_s`` until its ``end_s`` (scenario seconds), then
      ``COMPLETED`` (exit code 0) for :data:`JOB_RETENTION_S`, then no longer listed; jobs
      not started yet are not listed (not submitted). GPU indices: ``scenario.allocations()``.
    * A node is ``ALLOCATED`` when all its GPUs run jobs, ``MIXED`` when some do, else
      ``IDLE``; a drained node has flags ``["DRAIN"]`` and the reason, user and event time.
    * ``update_node`` behaves like ``scontrol update``: unknown node -> exit 1 ``Invalid node
      name specified``; DRAIN without reason -> ``ValueError`` (as
      :class:`~gpuwarden.shared.slurm.client.CliSlurm`).

    Args:
        scenario: the scenario.
        clock: its event-time clock.
        state_path: JSON file shared by every process of the run (created on first drain).
    """

    def __init__(self, scenario: Scenario, clock: ScenarioClock, state_path: Path | str) -> None:
        self.scenario = scenario
        self.clock = clock
        self.state = _StateFile(Path(state_path))
        self._alloc = scenario.allocations()
        self._names = scenario.cluster.node_names()
        self._known = set(self._names)

    def _t(self) -> float:
        return self.clock.scenario_s()

    def _jobs_at(self, t: float) -> list[JobState]:
        ts = self.clock.event_ts(t)
        out: list[JobState] = []
        for j in self.scenario.jobs:
            if t < j.start_s:
                continue
            if j.end_s is not None and t >= j.end_s + JOB_RETENTION_S:
                continue
            done = j.end_s is not None and t >= j.end_s
            jid = str(j.id)
            out.append(
                JobState(
                    job_id=jid,
                    ts=ts,
                    state="COMPLETED" if done else "RUNNING",
                    name=j.name or j.profile,
                    user=j.user,
                    account=j.account or j.user,
                    partition=j.partition or self.scenario.cluster.partition,
                    nodes=j.node_list(),
                    gpus={n: list(g) for n, g in self._alloc[jid].items()},
                    start_ts=self.clock.event_ts(j.start_s),
                    end_ts=self.clock.event_ts(j.end_s) if j.end_s is not None else None,
                    exit_code=0 if done else None,
                )
            )
        return out

    async def jobs(self) -> list[JobState]:
        return self._jobs_at(self._t())

    def _used_at(self, t: float, only: str | None = None) -> dict[str, set[int]]:
        """GPU indices held by running jobs at scenario time ``t``, per node (of ``only``, if given):
        the jobs :meth:`_jobs_at` lists as RUNNING, read from the scenario without building them."""
        names = self._names if only is None else [only]
        used: dict[str, set[int]] = {n: set() for n in names}
        for j in self.scenario.jobs:
            if t < j.start_s or (j.end_s is not None and t >= j.end_s):
                continue
            for n, g in self._alloc[str(j.id)].items():
                if n in used:
                    used[n].update(g)
        return used

    def _nodes_at(self, t: float, drains: dict[str, Any], only: str | None = None) -> list[NodeState]:
        ts = self.clock.event_ts(t)
        used = self._used_at(t, only)
        total = self.scenario.cluster.gpus_per_node
        out = []
        for n, held in used.items():
            u = len(held)
            base = "ALLOCATED" if u >= total else "MIXED" if u else "IDLE"
            d = drains.get(n)
            out.append(
                NodeState(
                    node=n,
                    ts=ts,
                    state=base,
                    flags=["DRAIN"] if d else [],
                    reason=d["reason"] if d else None,
                    reason_user=d["user"] if d else None,
                    reason_ts=d["ts"] if d else None,
                    gres=f"gpu:{total}",
                    gres_used=f"gpu:{u}",
                    partitions=[self.scenario.cluster.partition],
                )
            )
        return out

    async def nodes(self) -> list[NodeState]:
        with self.state.locked(False) as data:
            drains = dict(data.get("nodes", {}))
        return self._nodes_at(self._t(), drains)

    async def node(self, name: str) -> NodeState | None:
        """One node's state, built alone (``scontrol show node N`` reads one node, not the cluster)."""
        validate_node_name(name)
        if name not in self._known:
            return None
        with self.state.locked(False) as data:
            drains = dict(data.get("nodes", {}))
        return self._nodes_at(self._t(), drains, only=name)[0]

    async def update_node(self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None) -> CommandResult:
        argv = drain_argv(name, state, reason)
        t0 = time.monotonic()
        if name not in self._known:
            return CommandResult(argv, 1, "", "slurm_update error: Invalid node name specified", time.monotonic() - t0)
        with self.state.locked(True) as data:
            nodes = data.setdefault("nodes", {})
            if state == "DRAIN":
                nodes[name] = {
                    "state": "DRAIN",
                    "reason": check_reason(reason),
                    "user": _user(),
                    "ts": self.clock.event_ts(self._t()),
                }
            else:
                nodes.pop(name, None)
        return CommandResult(argv, 0, "", "", time.monotonic() - t0)


class FakeSlurm:
    """In-memory :class:`~gpuwarden.shared.slurm.client.SlurmClient` for tests: set ``jobs_list`` /
    ``nodes_map`` directly; ``calls`` records every ``update_node`` (name, state, reason); ``fail_with`` makes the
    next updates return that exit code; ``raise_on_read`` makes reads raise it. Accounting
    (``accounting()``, ``ended_since()``) answers from ``accounting_map``, or raises
    ``accounting_error``; calls are recorded in ``accounting_calls`` / ``ended_since_calls``."""

    def __init__(self, nodes: list[NodeState] | None = None, jobs: list[JobState] | None = None) -> None:
        self.nodes_map: dict[str, NodeState] = {n.node: n for n in nodes or []}
        self.jobs_list: list[JobState] = list(jobs or [])
        self.calls: list[tuple[str, str, str | None]] = []
        self.fail_with: int | None = None
        self.raise_on_read: Exception | None = None
        self.now = time.time
        self.accounting_map: dict[str, JobState] = {}
        self.accounting_error: Exception | None = None
        self.accounting_calls: list[list[str]] = []
        self.ended_since_calls: list[float] = []

    async def accounting(self, job_ids: list[str] | tuple[str, ...]) -> list[JobState]:
        """Records of ``accounting_map`` for these ids (``SlurmAccounting``); raises
        ``accounting_error`` if set."""
        self.accounting_calls.append(list(job_ids))
        if self.accounting_error:
            raise self.accounting_error
        return [self.accounting_map[j] for j in job_ids if j in self.accounting_map]

    async def ended_since(self, since: float) -> list[JobState]:
        """Records of ``accounting_map`` that ended at or after ``since`` (``SlurmEndedJobs``);
        raises ``accounting_error`` if set."""
        self.ended_since_calls.append(since)
        if self.accounting_error:
            raise self.accounting_error
        return ended_after(list(self.accounting_map.values()), since)

    async def jobs(self) -> list[JobState]:
        if self.raise_on_read:
            raise self.raise_on_read
        return list(self.jobs_list)

    async def nodes(self) -> list[NodeState]:
        if self.raise_on_read:
            raise self.raise_on_read
        return list(self.nodes_map.values())

    async def node(self, name: str) -> NodeState | None:
        validate_node_name(name)
        if self.raise_on_read:
            raise self.raise_on_read
        return self.nodes_map.get(name)

    async def update_node(self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None) -> CommandResult:
        argv = drain_argv(name, state, reason)
        self.calls.append((name, state, reason))
        if self.fail_with is not None:
            return CommandResult(argv, self.fail_with, "", "slurm_update error: simulated failure", 0.0)
        cur = self.nodes_map.get(name)
        if cur is None:
            return CommandResult(argv, 1, "", "slurm_update error: Invalid node name specified", 0.0)
        if state == "DRAIN":
            upd = {
                "flags": [*[f for f in cur.flags if f != "DRAIN"], "DRAIN"],
                "reason": reason,
                "reason_user": "root",
                "reason_ts": self.now(),
            }
        else:
            upd = {
                "flags": [f for f in cur.flags if f != "DRAIN"],
                "reason": None,
                "reason_user": None,
                "reason_ts": None,
            }
        self.nodes_map[name] = cur.model_copy(update=upd)
        return CommandResult(argv, 0, "", "", 0.0)


def simulated_backend(
    scenario: Path | str, state_file: Path | str | None
) -> tuple[SimulatedSlurm, Callable[[], float]]:
    """The ``simulated`` Slurm backend: :class:`SimulatedSlurm` of the scenario YAML at
    ``scenario`` on ``ScenarioClock.from_env()`` (``GPUWARDEN_SIM_START``,
    ``GPUWARDEN_SIM_SPEED``), drain state in ``state_file`` (default
    :data:`~gpuwarden.shared.slurm.factory.DEFAULT_SIM_STATE_FILE`), and the clock of its
    observations (event time of now, epoch s).

    Raises:
        FileNotFoundError: the scenario file does not exist.
        ValueError: the scenario is invalid.
    """
    clock = ScenarioClock.from_env()
    sim = SimulatedSlurm(load_scenario(scenario), clock, Path(state_file or DEFAULT_SIM_STATE_FILE))
    return sim, lambda: clock.event_ts(clock.scenario_s(time.time()))
