"""The narrow Slurm interface of gpuwarden and its implementation on the Slurm 22.05 CLI.

:class:`SlurmClient` is all the slurm-watcher and the remediator use. :class:`CliSlurm`
runs ``squeue``/``sinfo``/``scontrol`` through an
:class:`~gpuwarden.shared.command.AsyncCommandRunner` (argv lists, a timeout per call; reads
retried with :func:`~gpuwarden.shared.retry.retry_async`), so tests give it a fake runner that
returns recorded output.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal, Protocol

from ..command import AsyncCommandRunner, AsyncSubprocessRunner, CommandNotFound, CommandResult, CommandTimeout
from ..models import JobState, NodeState
from ..retry import retry_async
from .fields import TERMINAL_JOB_STATES
from .jsonparse import SinfoJsonParser, SqueueJsonParser, parse_sacct_json
from .names import validate_node_name
from .textparse import parse_scontrol_job_gpus, parse_scontrol_nodes

__all__ = [
    "ENDED_STATES_ARG",
    "MAX_REASON_LEN",
    "CliSlurm",
    "CommandResult",
    "SlurmAccounting",
    "SlurmClient",
    "SlurmEndedJobs",
    "SlurmError",
    "check_reason",
    "drain_argv",
    "ended_after",
    "sacct_ended_argv",
]

log = logging.getLogger(__name__)

MAX_REASON_LEN = 200
_TRANSIENT = re.compile(
    r"timed out|Unable to contact|Connection refused|Zero Bytes|try again|Resource temporarily", re.I
)


class SlurmError(RuntimeError):
    """A Slurm command failed (after retries); ``result`` is its last :class:`CommandResult`."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class SlurmClient(Protocol):
    """What gpuwarden needs from Slurm: four calls.

    Implementations: :class:`CliSlurm` (real Slurm 22.05 commands), :class:`~.rest.RestSlurm`
    (slurmrestd); in the simulation layer ``gpuwarden.sim.slurm.SimulatedSlurm`` (scenario state
    machine) and ``gpuwarden.sim.slurm.FakeSlurm`` (tests).
    """

    async def jobs(self) -> list[JobState]:
        """Jobs the scheduler reports now (pending, running, and recently finished ones it
        still lists), nodes expanded, GPU indices per node. Raises :class:`SlurmError`."""
        ...

    async def nodes(self) -> list[NodeState]:
        """Every node with state, flags, reason. Raises :class:`SlurmError`."""
        ...

    async def node(self, name: str) -> NodeState | None:
        """One node's current state; ``None`` if Slurm does not know it.
        Raises ``ValueError`` (bad name) or :class:`SlurmError`."""
        ...

    async def update_node(self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None) -> CommandResult:
        """Set a node to DRAIN (``reason`` required) or RESUME. Returns the command's result
        (non-zero exit code on refusal or timeout); raises ``ValueError`` for a bad name or
        a DRAIN without a valid reason."""
        ...


class SlurmAccounting(Protocol):
    """Slurm accounting (``sacct``): how jobs ended. Optional next to :class:`SlurmClient`;
    the slurm-watcher confirms end states with it when the client has it."""

    async def accounting(self, job_ids: Sequence[str]) -> list[JobState]:
        """Accounting records of these jobs (``confirmed=True`` for end states; ``gpus`` empty;
        unknown ids are absent). Raises :class:`SlurmError` (accounting unreachable) or
        ``ValueError`` (unexpected output)."""
        ...


class SlurmEndedJobs(Protocol):
    """Slurm accounting by time: which jobs ended in a window. The slurm-watcher asks it when it
    takes over the lease, for ends that happened while no watcher published."""

    async def ended_since(self, since: float) -> list[JobState]:
        """Accounting records (allocations, ``confirmed=True``, ``gpus`` empty) of the jobs that
        ended at or after ``since`` (epoch s) in a terminal state. Raises :class:`SlurmError`
        (accounting unreachable) or ``ValueError`` (unexpected output)."""
        ...


ENDED_STATES_ARG = "CD,F,CA,TO,NF,PR,OOM,BF,DL"
"""``sacct -s`` short names of the terminal job states (:data:`TERMINAL_JOB_STATES` less ``ENDED``)."""


def sacct_ended_argv(since: float, sacct: str = "sacct") -> list[str]:
    """argv of ``sacct --json -X -a -S <since> -E now -s <terminal states>``: every user's
    allocations that were in a terminal state at or after ``since`` (epoch s, given to sacct in
    the local time of this machine, as sacct reads it). Pure."""
    start = datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S")
    return [sacct, "--json", "-X", "-a", "-S", start, "-E", "now", "-s", ENDED_STATES_ARG]


def ended_after(records: list[JobState], since: float) -> list[JobState]:
    """The records in a terminal state whose end is unknown or at/after ``since``. Pure."""
    return [r for r in records if r.state in TERMINAL_JOB_STATES and (r.end_ts is None or r.end_ts >= since)]


_JOB_ID_RE = re.compile(r"\d+(?:_\d+)?(?:\+\d+)?")


def check_reason(reason: str | None) -> str:
    """A drain reason as Slurm accepts it: non-empty, one line, at most ``MAX_REASON_LEN``.

    Raises:
        ValueError: empty, multi-line, too long.
    """
    if reason is None or not reason.strip():
        raise ValueError("DRAIN needs a reason (Slurm refuses a drain without one)")
    if "\n" in reason or "\r" in reason:
        raise ValueError("a drain reason must be one line")
    if len(reason) > MAX_REASON_LEN:
        raise ValueError(f"drain reason longer than {MAX_REASON_LEN} characters")
    return reason


def drain_argv(
    name: str, state: Literal["DRAIN", "RESUME"], reason: str | None, scontrol: str = "scontrol"
) -> list[str]:
    """The ``scontrol update`` argv for a node state change (validated; never a shell string).

    Raises:
        ValueError: bad node name, unknown state, or DRAIN without a valid reason.
    """
    validate_node_name(name)
    if state == "DRAIN":
        return [scontrol, "update", f"nodename={name}", "state=DRAIN", f"reason={check_reason(reason)}"]
    if state == "RESUME":
        return [scontrol, "update", f"nodename={name}", "state=RESUME"]
    raise ValueError(f"unsupported node state {state!r}: DRAIN or RESUME")


class CliSlurm:
    """:class:`SlurmClient` on the Slurm 22.05 commands.

    ``jobs()``: ``squeue --json`` (+ ``scontrol show job -d <id>`` only for running GPU jobs
    whose ``gres_detail`` cannot be matched to nodes); ``nodes()``: ``sinfo --json`` (the
    ``nodes`` list of 22.05, or the ``sinfo`` list of node groups of 23.02 .. 25.11, where a group
    of several nodes gives state and reason per node but no per-node allocated CPUs / GPU
    indices); ``node()``: ``scontrol show node <name>``; ``update_node()``: ``scontrol update``.

    Args:
        runner: runs argv lists (default :class:`~gpuwarden.shared.command.AsyncSubprocessRunner`).
        timeout_s: per command, s.
        retries: extra attempts of a read after a failure (any failure but a missing program);
            writes (``update_node``) run once: the caller re-reads the node before retrying one.
        backoff_s: sleep before retry ``k`` is ``backoff_s * k``, s.
        now: clock for the observation time ``ts`` of returned states (epoch s).
        bin_prefix: prepended to command names (e.g. ``/usr/bin/``).
    """

    def __init__(
        self,
        runner: AsyncCommandRunner | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        now: Callable[[], float] = time.time,
        bin_prefix: str = "",
    ) -> None:
        self.runner: AsyncCommandRunner = runner or AsyncSubprocessRunner()
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.now = now
        self.bin = bin_prefix
        self._squeue = SqueueJsonParser()  # reuses unchanged job records between polls
        self._sinfo = SinfoJsonParser()

    async def _once(self, argv: list[str]) -> CommandResult:
        """One run; a timeout is exit code 124 and a missing program 127 (as ``timeout(1)`` and
        a shell report them), so the retry rule and :class:`SlurmError` see one kind of result."""
        t0 = time.monotonic()
        try:
            res = await self.runner.run(argv, self.timeout_s)
        except CommandTimeout as exc:
            res = CommandResult(list(argv), 124, "", f"timed out after {self.timeout_s:g}s", time.monotonic() - t0)
            log.debug("%s", exc)
        except (CommandNotFound, OSError) as exc:
            res = CommandResult(list(argv), 127, "", str(exc) or type(exc).__name__, time.monotonic() - t0)
        if not res.ok:
            log.warning("%s: exit %s: %s", " ".join(argv[:3]), res.exit_code, res.stderr.strip()[:200])
        return res

    async def _run(self, argv: list[str], *, read: bool) -> CommandResult:
        # a write is never retried here: after a timeout or "Unable to contact" it may have
        # landed, and someone may have changed the node since; the caller re-reads the node
        # and re-applies its rules before another attempt (see the remediator)
        def again(res: CommandResult) -> bool:
            transient = res.exit_code == 124 or bool(_TRANSIENT.search(res.stderr))
            return not res.ok and (transient or res.exit_code != 127)

        return await retry_async(
            lambda: self._once(argv),
            retries=self.retries if read else 0,
            first_delay_s=self.backoff_s,
            growth="linear",
            retry_if=again,
        )

    async def _read(self, argv: list[str]) -> CommandResult:
        res = await self._run(argv, read=True)
        if not res.ok:
            raise SlurmError(f"{' '.join(argv)} failed (exit {res.exit_code}): {res.output(300)}", res)
        return res

    async def jobs(self) -> list[JobState]:
        ts = self.now()
        res = await self._read([f"{self.bin}squeue", "--json"])
        jobs, need = self._squeue.parse(res.stdout, ts)
        if not need:
            return jobs
        detail: dict[str, dict[str, list[int]]] = {}
        for jid in need:
            try:
                r = await self._read([f"{self.bin}scontrol", "show", "job", "-d", jid])
            except SlurmError as exc:  # the job may have ended in between
                log.info("no GPU detail for job %s: %s", jid, exc)
                continue
            detail.update(parse_scontrol_job_gpus(r.stdout))
        return [j.model_copy(update={"gpus": detail[j.job_id]}) if j.job_id in detail else j for j in jobs]

    async def nodes(self) -> list[NodeState]:
        ts = self.now()
        res = await self._read([f"{self.bin}sinfo", "--json"])
        return self._sinfo.parse(res.stdout, ts)

    async def accounting(self, job_ids: Sequence[str]) -> list[JobState]:
        """``sacct --json -X -j ID,...`` (allocations only), parsed by ``parse_sacct_json``.

        Raises:
            ValueError: an id is not ``123``, ``123_4`` or ``123+1``.
            SlurmError: sacct failed (slurmdbd unreachable...).
        """
        if not job_ids:
            return []
        for j in job_ids:
            if not _JOB_ID_RE.fullmatch(j):
                raise ValueError(f"invalid job id {j!r}")
        ts = self.now()
        res = await self._read([f"{self.bin}sacct", "--json", "-X", "-j", ",".join(job_ids)])
        return parse_sacct_json(res.stdout, ts)

    async def ended_since(self, since: float) -> list[JobState]:
        """:class:`SlurmEndedJobs`: ``sacct --json -X -a -S <since> -E now -s CD,F,CA,...``
        (see :func:`sacct_ended_argv`), filtered by :func:`ended_after`.

        Raises:
            SlurmError: sacct failed (slurmdbd unreachable...).
            ValueError: unexpected output.
        """
        ts = self.now()
        res = await self._read(sacct_ended_argv(since, f"{self.bin}sacct"))
        return ended_after(parse_sacct_json(res.stdout, ts), since)

    async def node(self, name: str) -> NodeState | None:
        validate_node_name(name)
        ts = self.now()
        argv = [f"{self.bin}scontrol", "show", "node", name]
        res = await self._run(argv, read=True)
        if not res.ok:
            if "not found" in (res.stdout + res.stderr):
                return None
            raise SlurmError(f"{' '.join(argv)} failed (exit {res.exit_code}): {res.output(300)}", res)
        found = [n for n in parse_scontrol_nodes(res.stdout, ts) if n.node == name]
        return found[0] if found else None

    async def update_node(self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None) -> CommandResult:
        argv = drain_argv(name, state, reason, f"{self.bin}scontrol")
        return await self._run(argv, read=False)
