"""The one command-runner contract of gpuwarden (Slurm commands, health-check tools).

A runner runs **one argv list** (never a shell string: a ``str`` is refused) with a timeout in
seconds, stdin closed, the command in a session (process group) of its own, and:

* returns a :class:`CommandResult` for **every exit status**: a non-zero exit is an answer
  (``scontrol`` refusing a drain, ``dcgmi diag`` finding a fault), never raised;
* raises :class:`CommandNotFound` when ``argv[0]`` is not an executable on ``PATH`` (or at
  the path given), before anything is forked;
* raises :class:`CommandTimeout` when ``timeout_s`` passes: the whole process group has
  been killed (children such as ``nvvs`` included) before it is raised.

:class:`SubprocessRunner` (blocking, for threads: the health checks) and
:class:`AsyncSubprocessRunner` (asyncio: the Slurm client) implement it; tests pass fakes of
:class:`CommandRunner` / :class:`AsyncCommandRunner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "AsyncCommandRunner",
    "AsyncSubprocessRunner",
    "CommandNotFound",
    "CommandResult",
    "CommandRunner",
    "CommandTimeout",
    "SubprocessRunner",
    "check_argv",
]


class CommandNotFound(Exception):
    """``argv[0]`` is not installed or not executable (nothing was started)."""


class CommandTimeout(Exception):
    """The command ran past its timeout and was killed with its process group, or it was not
    started because the runner was closed (:meth:`SubprocessRunner.kill_all`)."""


@dataclass(frozen=True)
class CommandResult:
    """One finished command: argv, exit code, stdout, stderr (text, undecodable bytes
    replaced) and duration (s)."""

    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        """True for exit code 0."""
        return self.exit_code == 0

    def output(self, limit: int = 2000) -> str:
        """stdout + stderr, stripped, truncated to ``limit`` characters."""
        text = "\n".join(p for p in (self.stdout.strip(), self.stderr.strip()) if p)
        return text if len(text) <= limit else text[: limit - 3] + "..."


class CommandRunner(Protocol):
    """Blocking runner (see the module for the contract)."""

    def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult: ...


class AsyncCommandRunner(Protocol):
    """asyncio runner (see the module for the contract)."""

    async def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult: ...


def check_argv(argv: Sequence[str], timeout_s: float) -> list[str]:
    """``argv`` as a list of str, validated with the timeout (s).

    Raises:
        ValueError: ``argv`` is a string (a shell command line), or empty; ``timeout_s`` <= 0.
    """
    if isinstance(argv, str | bytes):
        raise ValueError(f"a command is an argv list, never a shell string: {argv!r}")
    args = [str(a) for a in argv]
    if not args or not args[0]:
        raise ValueError("empty argv: no command to run")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 s, got {timeout_s!r}")
    return args


def _kill_group(pid: int, kill_one: Callable[[], None]) -> None:
    """SIGKILL the process group ``pid`` leads (or, failing that, the process itself)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            kill_one()


class SubprocessRunner:
    """:class:`CommandRunner` on :class:`subprocess.Popen`: no shell, stdin closed, each command
    in its own process group, the whole group killed when ``timeout_s`` passes.
    :meth:`kill_all` kills what is still running (a health-check run past its budget, SIGTERM
    from the wrapper's guard) and refuses new commands after that, so an abandoned check cannot
    start the next tool. (No ``preexec_fn``: forking with a callback while other threads run
    can deadlock the child.) Thread-safe."""

    def __init__(self) -> None:
        self._live: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        """Run ``argv`` (see the module's contract).

        Raises:
            ValueError: see :func:`check_argv`.
            CommandNotFound: ``argv[0]`` is not an executable.
            CommandTimeout: it ran past ``timeout_s`` (killed), or :meth:`kill_all` was called.
        """
        args = check_argv(argv, timeout_s)
        if shutil.which(args[0]) is None:  # absent tools are common (ibstat on a RoCE node): no fork
            raise CommandNotFound(args[0])
        t0 = time.monotonic()
        with self._lock:
            if self._closed:
                raise CommandTimeout(f"{args[0]} not started: the run is over")
            try:
                p = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    errors="replace",
                    start_new_session=True,
                )
            except (FileNotFoundError, PermissionError) as exc:
                raise CommandNotFound(args[0]) from exc
            self._live.add(p)
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            _kill_group(p.pid, p.kill)
            p.communicate()
            raise CommandTimeout(f"{args[0]} ran past {timeout_s:g}s") from exc
        finally:
            with self._lock:
                self._live.discard(p)
        return CommandResult(args, p.returncode, out, err, time.monotonic() - t0)

    def kill_all(self) -> int:
        """Kill every command still running (and its process group) and start no more; returns
        how many were running."""
        with self._lock:
            self._closed = True
            live = list(self._live)
        for p in live:
            _kill_group(p.pid, p.kill)
        return len(live)


class AsyncSubprocessRunner:
    """:class:`AsyncCommandRunner` on :func:`asyncio.create_subprocess_exec`: no shell, stdin
    closed, each command in its own process group, the whole group killed when ``timeout_s``
    passes or the awaiting task is cancelled."""

    async def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        """Run ``argv`` (see the module's contract).

        Raises:
            ValueError: see :func:`check_argv`.
            CommandNotFound: ``argv[0]`` is not an executable.
            CommandTimeout: it ran past ``timeout_s`` (killed).
        """
        args = check_argv(argv, timeout_s)
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise CommandNotFound(args[0]) from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            _kill_group(proc.pid, proc.kill)
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise CommandTimeout(f"{args[0]} ran past {timeout_s:g}s") from exc
        rc = proc.returncode if proc.returncode is not None else -1
        return CommandResult(
            args, rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0
        )
