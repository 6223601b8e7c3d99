"""The slurm-watcher service: poll Slurm, publish changes to ``slurm.jobs`` / ``slurm.nodes``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gpuwarden.shared.bus import Producer
from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.service import Service
from gpuwarden.shared.settings import ServiceSettings
from gpuwarden.shared.slurm import DEFAULT_SIM_STATE_FILE, SlurmClient, SlurmError, build_client

from .diff import diff_jobs, diff_nodes

__all__ = ["SlurmWatcher", "SlurmWatcherSettings", "make_client"]

log = logging.getLogger(__name__)


class SlurmWatcherSettings(ServiceSettings):
    """Settings of the slurm-watcher (``GPUWARDEN_SLURM_WATCHER_*`` plus the common ones)."""

    slurm_watcher_backend: Literal["cli", "simulated"] = Field(
        "cli", description="cli = squeue/sinfo/scontrol of Slurm 22.05; simulated = scenario state machine"
    )
    slurm_watcher_poll_s: float = Field(2.0, gt=0, description="Poll period, s")
    slurm_watcher_snapshot_s: float = Field(60.0, gt=0, description="Full snapshot period (wall clock), s")
    slurm_watcher_scenario: Path | None = Field(None, description="Scenario YAML (backend=simulated)")
    slurm_watcher_state_file: Path = Field(
        DEFAULT_SIM_STATE_FILE, description="Drain state file shared with the remediator (backend=simulated)"
    )
    slurm_watcher_command_timeout_s: float = Field(10.0, gt=0, description="Timeout of one Slurm command, s")
    slurm_watcher_command_retries: int = Field(2, ge=0, description="Retries of a failed Slurm read")


def make_client(s: SlurmWatcherSettings) -> tuple[SlurmClient, Callable[[], float]]:
    """The configured Slurm client and its observation clock (see ``build_client``)."""
    return build_client(
        s.slurm_watcher_backend,
        scenario=s.slurm_watcher_scenario,
        state_file=s.slurm_watcher_state_file,
        timeout_s=s.slurm_watcher_command_timeout_s,
        retries=s.slurm_watcher_command_retries,
    )


class SlurmWatcher(Service):
    """Polls a :class:`SlurmClient` every ``poll_s``; publishes ``JobState`` (key: job id) and
    ``NodeState`` (key: node) when they change, and all of them with ``snapshot=True``
    on the first poll and every ``snapshot_s``. A failing Slurm read is logged and
    counted (``gpuwarden_errors{kind="slurm"}``); the loop keeps going.

    Args:
        settings: service settings.
        client: Slurm client (default: from settings); tests pass a fake.
        producer: bus producer (default: Kafka from settings).
        now: clock of observations, epoch s (default: the client's).
    """

    name = "slurm-watcher"

    def __init__(
        self,
        settings: SlurmWatcherSettings,
        client: SlurmClient | None = None,
        producer: Producer | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(settings, producer)
        self.settings: SlurmWatcherSettings = settings
        if client is None:
            client, default_now = make_client(settings)
            now = now or default_now
        self.client = client
        self.now = now or time.time
        self._jobs: dict[str, JobState] = {}
        self._nodes: dict[str, NodeState] = {}
        self._last_snapshot: float | None = None
        self.polls = 0
        self.last_poll_ts: float | None = None
        self.last_error: str | None = None

    async def on_start(self) -> None:
        self.spawn(self._loop(), "poll")

    async def _loop(self) -> None:
        period = self.settings.slurm_watcher_poll_s
        while True:
            t0 = time.monotonic()
            await self.poll_once()
            await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))

    async def poll_once(self, force_snapshot: bool = False) -> int:
        """Poll once and publish; returns the number of messages published."""
        mono = time.monotonic()
        snapshot = (
            force_snapshot
            or self._last_snapshot is None
            or (mono - self._last_snapshot >= self.settings.slurm_watcher_snapshot_s)
        )
        now = self.now()
        jobs_r, nodes_r = await asyncio.gather(self.client.jobs(), self.client.nodes(), return_exceptions=True)
        sent = 0
        ok = True
        if isinstance(jobs_r, BaseException):
            ok = self._failed("jobs", jobs_r)
        else:
            changed, self._jobs = diff_jobs(self._jobs, jobs_r, now)
            out = (
                changed
                if not snapshot
                else [
                    *(j.model_copy(update={"snapshot": True}) for j in self._jobs.values()),
                    *(j for j in changed if j.job_id not in self._jobs),
                ]
            )
            for j in out:
                await self.publish("slurm.jobs", j.job_id, j)
            sent += len(out)
        if isinstance(nodes_r, BaseException):
            ok = self._failed("nodes", nodes_r)
        else:
            changed_n, self._nodes = diff_nodes(self._nodes, nodes_r)
            out_n = (
                changed_n if not snapshot else [n.model_copy(update={"snapshot": True}) for n in self._nodes.values()]
            )
            for n in out_n:
                await self.publish("slurm.nodes", n.node, n)
            sent += len(out_n)
        if snapshot and ok:
            self._last_snapshot = mono
        self.polls += 1
        self.last_poll_ts = now
        return sent

    def _failed(self, what: str, exc: BaseException) -> bool:
        if not isinstance(exc, SlurmError | ValueError | OSError):
            raise exc
        self.metrics.errors.labels("slurm").inc()
        self.last_error = f"{what}: {exc}"
        log.warning("slurm %s poll failed: %s", what, exc)
        return False

    def health(self) -> dict[str, Any]:
        h = super().health()
        h.update(
            polls=self.polls,
            last_poll_ts=self.last_poll_ts,
            last_error=self.last_error,
            jobs=len(self._jobs),
            nodes=len(self._nodes),
        )
        return h
