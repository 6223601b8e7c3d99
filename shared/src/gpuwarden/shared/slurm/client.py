"""The narrow Slurm interface of gpuwarden and its implementation on the Slurm 22.05 CLI.

:class:`SlurmClient` is all the slurm-watcher and the remediator use. :class:`CliSlurm`
runs ``squeue``/``sinfo``/``scontrol`` through a :class:`CommandRunner` (argv lists, a
timeout per call, retries), so tests give it a fake runner that returns recorded output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from ..models import JobState, NodeState
from .names import validate_node_name
from .parse import (
    TERMINAL_JOB_STATES,
    SinfoJsonParser,
    SqueueJsonParser,
    parse_sacct_json,
    parse_scontrol_job_gpus,
    parse_scontrol_nodes,
)

__all__ = [
    "ENDED_STATES_ARG",
    "MAX_REASON_LEN",
    "CliSlurm",
    "CommandResult",
    "CommandRunner",
    "SlurmAccounting",
    "SlurmClient",
    "SlurmEndedJobs",
    "SlurmError",
    "SubprocessRunner",
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


@dataclass(frozen=True)
class CommandResult:
    """One finished command: argv, exit code (124 = timed out), stdout, stderr, duration (s)."""

    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def output(self, limit: int = 2000) -> str:
        """stdout + stderr, stripped, truncated to ``limit`` characters."""
        text = "\n".join(p for p in (self.stdout.strip(), self.stderr.strip()) if p)
        return text if len(text) <= limit else text[: limit - 3] + "..."


class CommandRunner(Protocol):
    """Runs one command. Never raises for a non-zero exit; a timeout gives exit code 124."""

    async def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult: ...


class SubprocessRunner:
    """:class:`CommandRunner` on ``asyncio.create_subprocess_exec`` (no shell); kills the
    process on timeout. A missing program gives exit code 127."""

    async def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        args = [str(a) for a in argv]
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            return CommandResult(args, 127, "", str(exc), time.monotonic() - t0)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()
            return CommandResult(args, 124, "", f"timed out after {timeout_s:g}s", time.monotonic() - t0)
        rc = proc.returncode if proc.returncode is not None else -1
        return CommandResult(
            args, rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0
        )


class SlurmError(RuntimeError):
    """A Slurm command failed (after retries); ``result`` is its last :class:`CommandResult`."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class SlurmClient(Protocol):
    """What gpuwarden needs from Slurm: four calls.

    Implementations: :class:`CliSlurm` (real Slurm 22.05 commands),
    ``SimulatedSlurm`` (scenario state machine), ``FakeSlurm`` (tests).
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
    whose ``gres_detail`` cannot be matched to nodes); ``nodes()``: ``sinfo --json``;
    ``node()``: ``scontrol show node <name>``; ``update_node()``: ``scontrol update``.

    Args:
        runner: runs argv lists (default :class:`SubprocessRunner`).
        timeout_s: per command, s.
        retries: extra attempts of a read after a failure; writes (``update_node``) run once.
        backoff_s: sleep before retry ``k`` is ``backoff_s * k``, s.
        now: clock for the observation time ``ts`` of returned states (epoch s).
        bin_prefix: prepended to command names (e.g. ``/usr/bin/``).
    """

    def __init__(
        self,
        runner: CommandRunner | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        now: Callable[[], float] = time.time,
        bin_prefix: str = "",
    ) -> None:
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.now = now
        self.bin = bin_prefix
        self._squeue = SqueueJsonParser()  # reuses unchanged job records between polls
        self._sinfo = SinfoJsonParser()

    async def _run(self, argv: list[str], *, read: bool) -> CommandResult:
        res: CommandResult | None = None
        # a write is never retried here: after a timeout or "Unable to contact" it may have
        # landed, and someone may have changed the node since; the caller re-reads the node
        # and re-applies its rules before another attempt (see the remediator)
        for attempt in range(self.retries + 1 if read else 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * attempt)
            res = await self.runner.run(argv, self.timeout_s)
            if res.ok:
                return res
            transient = res.exit_code == 124 or bool(_TRANSIENT.search(res.stderr))
            log.warning(
                "%s: exit %s (attempt %d/%d): %s",
                " ".join(argv[:3]),
                res.exit_code,
                attempt + 1,
                self.retries + 1,
                res.stderr.strip()[:200],
            )
            if not (transient or (read and res.exit_code != 127)):
                break
        assert res is not None
        return res

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
