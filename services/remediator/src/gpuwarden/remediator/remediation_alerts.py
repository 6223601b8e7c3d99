"""The alerts the remediator's decisions raise, with their names and texts.

``GpuwardenNodeDrained`` (a drain, or a dry run's would-be drain: the same name and labels,
``dry_run="true"``), ``GpuwardenFailure`` (alert-only rules), ``GpuwardenRemediationRefused``,
``GpuwardenRemediationFailed`` (a drain or resume command failed after retries) and
``GpuwardenCircuitBreakerOpen``. Delivery, de-duplication and resolution are the
:class:`~gpuwarden.remediator.alerts.Alerter`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuwarden.shared.models import Failure

from .alerts import Alerter
from .policy import id8

__all__ = ["RemediationAlerts"]


class RemediationAlerts:
    """Fires the remediator's alerts on ``alerter``.

    Args:
        alerter: the delivery (assignable: :attr:`alerter`).
        dry_run: the remediator only records (label ``dry_run`` of alerts about failures).
        generator_url: the ``generatorURL`` of an alert about a failure id (None: none).
    """

    def __init__(self, alerter: Alerter, dry_run: bool, generator_url: Callable[[str], str | None]) -> None:
        self.alerter = alerter
        self.dry_run = dry_run
        self.generator_url = generator_url

    async def failure(
        self, name: str, f: Failure, summary: str, severity: str | None = None, description: str | None = None
    ) -> bool:
        """Fire alert ``name`` about ``f``: its GPU, job, episode start, failure id, dry-run flag,
        runbook and generatorURL; severity defaults to the failure's, description to its
        verdict. Returns True if sent (not already firing)."""
        return await self.alerter.fire(
            name,
            f.node,
            f.pattern,
            severity or f.severity.value,
            summary,
            description or f.verdict,
            gpu=f.gpu_index,
            job_id=f.job_id,
            dry_run=self.dry_run,
            starts_at=f.first_seen,
            failure_id=f.failure_id,
            generator_url=self.generator_url(f.failure_id),
        )

    async def refused(self, f: Failure, reason: str) -> None:
        """``GpuwardenRemediationRefused``: ``<node>: <reason>``."""
        await self.failure("GpuwardenRemediationRefused", f, f"{f.node}: {reason}")

    async def drain_failed(self, f: Failure, error: str) -> None:
        """``GpuwardenRemediationFailed`` (critical): the drain of ``f``'s node failed."""
        await self.failure("GpuwardenRemediationFailed", f, f"drain of {f.node} failed: {error}", "critical")

    async def drained(self, f: Failure, executed: bool) -> None:
        """``GpuwardenNodeDrained``: drained (``executed``) or would drain (dry run)."""
        gpu = "" if f.gpu_index is None else f" GPU {f.gpu_index}"
        what = "drained" if executed else "would drain (dry-run, not drained)"
        summary = f"gpuwarden {what} {f.node}: {f.pattern}{gpu} (failure {id8(f.failure_id)})"
        await self.failure("GpuwardenNodeDrained", f, summary)

    async def alert_only(self, f: Failure) -> None:
        """``GpuwardenFailure``: a failure an alert-only rule matched."""
        await self.failure("GpuwardenFailure", f, f"{f.pattern} on {f.node} (alert only, not drained)")

    async def breaker_open(self, reason: str) -> None:
        """``GpuwardenCircuitBreakerOpen`` (critical): drains stopped until a person resets."""
        await self.alerter.fire(
            "GpuwardenCircuitBreakerOpen",
            "-",
            "breaker",
            "critical",
            f"remediator stopped draining: {reason}",
            "Stays open until a person runs `gpuwarden remediator reset-breaker`.",
        )

    async def resume_failed(self, node: str, error: str) -> None:
        """``GpuwardenRemediationFailed`` (warning): the resume of ``node`` failed."""
        summary = f"resume of {node} failed: {error}"
        await self.alerter.fire("GpuwardenRemediationFailed", node, "resume", "warning", summary)
