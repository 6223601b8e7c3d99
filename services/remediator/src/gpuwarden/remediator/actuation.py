"""Slurm actuation: drain and resume commands with retries, never a blind write.

:class:`SlurmActuator` runs one drain or resume the remediator has decided on: before every
``scontrol update`` attempt it reads the node again and re-applies the own-reason rule, and it
retries the write at this one layer (the reads are retried by the Slurm client itself; a
re-read that still fails ends the command). It decides nothing and records nothing: the
caller (:class:`~gpuwarden.remediator.service.Remediator`, under its lock) turns the
:class:`CommandOutcome` into a remediation. :func:`resume_node` is the manual resume of
``gpuwarden remediator resume``; :func:`make_client` builds the configured Slurm client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from gpuwarden.shared.retry import retry_async
from gpuwarden.shared.slurm import SlurmClient, SlurmError, build_client

from .policy import is_ours, is_out
from .settings import RemediatorSettings

__all__ = ["CommandOutcome", "SlurmActuator", "make_client", "resume_node"]

log = logging.getLogger(__name__)

#: ``ok``: done (by this call, or an earlier attempt that landed despite its error);
#: ``foreign``: the node is out with a reason that is not gpuwarden's (left alone);
#: ``gone``: (resume) the node is no longer out before the first attempt; ``failed``: not done.
Status = Literal["ok", "foreign", "gone", "failed"]


@dataclass(frozen=True)
class CommandOutcome:
    """What one drain or resume came to: ``status`` (see :data:`Status`), the last command's
    ``argv``, ``exit_code`` and ``output`` (empty/None when no command ran), and ``error`` (why
    it is not ``ok``; empty when it is)."""

    status: Status
    argv: list[str]
    exit_code: int | None
    output: str | None
    error: str

    @property
    def ok(self) -> bool:
        """True when the command's effect is in place."""
        return self.status == "ok"


def make_client(s: RemediatorSettings) -> tuple[SlurmClient, Callable[[], float]]:
    """The configured Slurm client and its clock, epoch s (see ``build_client``)."""
    return build_client(
        s.remediator_backend,
        scenario=s.remediator_scenario,
        state_file=s.remediator_state_file,
        timeout_s=s.remediator_command_timeout_s,
        retries=s.remediator_command_retries,
    )


@dataclass
class _Attempts:
    """What the attempts of one drain or resume saw: the last command's argv, exit code and
    output, and how many attempts ran (of ``tries``)."""

    argv: list[str] = field(default_factory=list)
    code: int | None = None
    out: str | None = None
    n: int = 0
    tries: int = 1


class SlurmActuator:
    """Runs drains and resumes on ``client`` with ``1 + remediator_command_retries`` writes at
    most, sleeping ``remediator_retry_backoff_s`` (doubling) between them; both settings are
    read from ``settings`` at each command.

    Args:
        client: the Slurm client (assignable: :attr:`client`).
        settings: the remediator's settings.
    """

    def __init__(self, client: SlurmClient, settings: RemediatorSettings) -> None:
        self.client = client
        self.settings = settings

    async def drain(self, name: str, reason: str) -> CommandOutcome:
        """Drain ``name`` with ``reason``: before every attempt the node is read again; a node
        already out with ``reason`` is ``ok``, out with another reason ``foreign`` (the error
        says whose), unknown or unreadable ``failed``. When the writes are used up the node is
        read once more: the last write may have landed after all (a timeout). Never raises for
        Slurm errors."""
        run = _Attempts()

        async def attempt() -> tuple[str, str]:
            run.n += 1
            try:
                cur = await self.client.node(name)
            except (SlurmError, OSError, ValueError) as exc:
                err = f"cannot re-read {name} before the attempt (no blind write): {exc}"
                log.warning("drain of %s: %s (try %d/%d)", name, err, run.n, run.tries)
                return "unreadable", err
            if cur is None:
                return "failed", f"{name} is no longer known to Slurm"
            if is_out(cur):
                if cur.reason == reason:
                    return "ok", ""
                who = f" by {cur.reason_user}" if cur.reason_user else ""
                return "foreign", f"{name} is now {cur.state}{who} with reason {cur.reason!r}"
            try:
                res = await self.client.update_node(name, "DRAIN", reason)
            except (SlurmError, OSError, ValueError) as exc:
                log.warning("drain of %s failed (try %d/%d): %s", name, run.n, run.tries, exc)
                return "retry", str(exc)
            run.argv, run.code, run.out = list(res.argv), res.exit_code, res.output() or None
            if res.ok:
                return "ok", ""
            err = f"scontrol exit {res.exit_code}: {res.output(300)}"
            log.warning("drain of %s failed (try %d/%d): %s", name, run.n, run.tries, err)
            return "retry", err

        status, err = await self._retry(attempt, run)
        if status != "retry":
            return CommandOutcome(_status(status), run.argv, run.code, run.out, err)
        # the writes are used up; the last may have landed after all (a timeout): the node decides
        try:
            cur = await self.client.node(name)
        except (SlurmError, OSError, ValueError):
            cur = None
        if cur is not None and is_out(cur) and cur.reason == reason:
            return CommandOutcome("ok", run.argv, run.code, run.out, "")
        if cur is not None and is_out(cur):
            why = f"{name} is now {cur.state} with reason {cur.reason!r}"
            return CommandOutcome("foreign", run.argv, run.code, run.out, why)
        return CommandOutcome("failed", run.argv, run.code, run.out, err)

    async def resume(self, name: str, expect_reason: str | None = None) -> CommandOutcome:
        """Resume ``name``. With ``expect_reason`` (gpuwarden's own), before every attempt the
        node is read again and resumed only while it is still out with that reason: a node
        resumed meanwhile is ``ok`` after an attempt (it landed) and ``gone`` before the first,
        another reason is ``foreign``, an unreadable node ``failed``. Never raises for Slurm
        errors."""
        run = _Attempts()

        async def attempt() -> tuple[str, str]:
            run.n += 1
            if expect_reason is not None:
                try:
                    cur = await self.client.node(name)
                except (SlurmError, OSError, ValueError) as exc:
                    return "unreadable", f"cannot re-read {name} before the attempt (no blind write): {exc}"
                if cur is None or not is_out(cur):  # an earlier attempt landed, or someone resumed it
                    return ("ok", "") if run.n > 1 else ("gone", f"{name} is no longer out")
                if cur.reason != expect_reason:
                    return "foreign", f"{name} now has reason {cur.reason!r}: not gpuwarden's, not resumed"
            try:
                res = await self.client.update_node(name, "RESUME", None)
            except (SlurmError, OSError, ValueError) as exc:
                return "retry", str(exc)
            run.argv, run.code, run.out = list(res.argv), res.exit_code, res.output() or None
            if res.ok:
                return "ok", ""
            return "retry", f"scontrol exit {res.exit_code}: {res.output(300)}"

        status, err = await self._retry(attempt, run)
        return CommandOutcome(_status(status), run.argv, run.code, run.out, err)

    async def _retry(self, attempt: Callable[[], Awaitable[tuple[str, str]]], run: _Attempts) -> tuple[str, str]:
        """Run ``attempt`` (returns ``(status, error)``) again while its status is ``retry``."""
        run.tries = 1 + self.settings.remediator_command_retries
        return await retry_async(
            attempt,
            retries=self.settings.remediator_command_retries,
            first_delay_s=self.settings.remediator_retry_backoff_s,
            retry_if=lambda r: r[0] == "retry",
        )


#: An attempt's status as the command's (``unreadable``: the re-read failed; ``retry``: the
#: writes were used up).
_DONE: dict[str, Status] = {
    "ok": "ok", "foreign": "foreign", "gone": "gone", "failed": "failed", "unreadable": "failed",
}  # fmt: skip


def _status(s: str) -> Status:
    return _DONE.get(s, "failed")


async def resume_node(client: SlurmClient, name: str, dry_run: bool = False) -> tuple[int, str]:
    """Resume ``name`` only if gpuwarden drained it (its reason starts with ``gpuwarden:``).

    Returns:
        ``(exit code, message)``: 0 resumed / would resume / nothing to do; 1 refused or the
        command failed; 2 unknown node or invalid name.
    """
    try:
        node = await client.node(name)
    except ValueError as exc:
        return 2, f"error: {exc}"
    if node is None:
        return 2, f"error: node {name} is not known to Slurm"
    if not node.drained and not node.state.startswith("DOWN"):
        return 0, f"{name} is {node.state}, not drained: nothing to do"
    if not is_ours(node.reason):
        who = node.reason_user or "someone else"
        return 1, (
            f"refused: {name} was drained/downed by {who} with reason {node.reason!r}, not by gpuwarden "
            f"(its reason does not start with 'gpuwarden:'). Resume it with scontrol yourself if intended."
        )
    if dry_run:
        return 0, f"dry-run: would resume {name} (reason {node.reason!r})"
    res = await client.update_node(name, "RESUME", None)
    if not res.ok:
        return 1, f"resume of {name} failed (exit {res.exit_code}): {res.output(300)}"
    return 0, f"resumed {name} (was drained by gpuwarden: {node.reason!r})"
