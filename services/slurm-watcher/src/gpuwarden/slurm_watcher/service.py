"""The slurm-watcher service: poll Slurm, publish changes to ``slurm.jobs`` / ``slurm.nodes`` and
the view's progress to ``slurm.watermarks``."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge

from gpuwarden.shared.bus import Producer
from gpuwarden.shared.lease import KafkaLease, Lease, NoLease
from gpuwarden.shared.models import DeadLetter, JobState, NodeState, SlurmWatermark
from gpuwarden.shared.service import Service
from gpuwarden.shared.slurm import (
    TERMINAL_JOB_STATES,
    SlurmAccounting,
    SlurmClient,
    SlurmEndedJobs,
    SlurmError,
    build_client,
)

from .diff import carry_gpus, diff_jobs, diff_nodes, resolve_ends
from .jobcomp import JobcompReader, merge_end
from .settings import SlurmWatcherSettings

__all__ = ["SlurmWatcher", "SlurmWatcherSettings", "kafka_lease", "make_client"]

log = logging.getLogger(__name__)


def make_client(s: SlurmWatcherSettings) -> tuple[SlurmClient, Callable[[], float]]:
    """The configured Slurm client and its observation clock (see ``build_client``)."""
    return build_client(
        s.slurm_watcher_backend,
        scenario=s.slurm_watcher_scenario,
        state_file=s.slurm_watcher_state_file,
        timeout_s=s.slurm_watcher_command_timeout_s,
        retries=s.slurm_watcher_command_retries,
        rest_url=s.slurm_watcher_rest_url,
        rest_token=s.slurm_watcher_rest_token,
        rest_user=s.slurm_watcher_rest_user,
        rest_version=s.slurm_watcher_rest_version,
    )


def kafka_lease(
    bootstrap: str,
    prefix: str,
    cluster: str,
    session_timeout_ms: int = 10_000,
    client_kwargs: dict[str, Any] | None = None,
    create: bool = True,
) -> KafkaLease:
    """The single-publisher lease of one cluster: every watcher of ``cluster`` joins the group
    ``{prefix}slurm-watcher.{cluster}`` on the one-partition topic
    ``{prefix}slurm-watcher.lease.{cluster}`` (see :mod:`gpuwarden.shared.lease`).

    Args:
        bootstrap: Kafka bootstrap servers.
        prefix: topic prefix (``GPUWARDEN_TOPIC_PREFIX``).
        cluster: cluster name (``[A-Za-z0-9._-]{1,100}``); one lease per cluster.
        session_timeout_ms: how long a dead holder keeps the lease, ms.
        client_kwargs: extra aiokafka client arguments (security settings).
        create: create the lease topic when missing (``GPUWARDEN_CREATE_TOPICS``).

    Raises:
        ValueError: bad cluster name.
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", cluster):
        raise ValueError(f"invalid cluster name {cluster!r}")
    return KafkaLease(
        bootstrap,
        f"{prefix}slurm-watcher.lease.{cluster}",
        f"{prefix}slurm-watcher.{cluster}",
        session_timeout_ms,
        client_kwargs,
        name="slurm-watcher",
        create=create,
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
        accounting: where end states are confirmed (default: the client when it has
            ``accounting()``, e.g. :class:`CliSlurm`; ``None`` = no confirmation).
        ended: where ends missed while no watcher held the lease are found (default: the
            client when it has ``ended_since()``, e.g. :class:`CliSlurm`; ``None`` = none).
        lease: the single-publisher lease (default: from settings).

    Robustness: a failed ``jobs()`` keeps the last good job table (nothing is published as
    ended); a job that leaves squeue is published ended only once sacct confirms it, or after
    ``gone_grace_polls`` polls as ``ENDED`` with ``confirmed=False``. After a failed poll the
    period doubles up to ``max_backoff_s``. The watcher's own status (``ok``, ``degraded``:
    one of jobs/nodes/accounting failing, ``unreachable``: jobs and nodes failing) is in
    ``/healthz`` and the gauge ``gpuwarden_slurm_watcher_status`` (1 ok, 0.5 degraded, 0 unreachable).

    Takeover: whenever this instance acquires the lease (first poll included), the jobs that
    ended since ``max(own last poll, now - takeover_lookback_s)`` according to accounting and
    are no longer in squeue are published once (sacct's state and times, ``confirmed=True``,
    no GPU indices: accounting has none); a failing sacct is retried on the next polls.

    jobcomp/kafka (``slurm_watcher_jobcomp_topic``, optional): a job's end read from slurmctld's
    ``jobcomp/kafka`` topic is published at once, over the poller's view of the job (its GPU
    indices: the record has none), and the poller then knows the job ended (no second record);
    see :mod:`gpuwarden.slurm_watcher.jobcomp`.

    Watermark: after every poll whose ``jobs()`` read succeeded (also when nothing changed: a
    heartbeat), once each ``slurm.jobs`` record of the poll (takeover recovery included) is
    delivered, one :class:`~gpuwarden.shared.models.SlurmWatermark` goes to
    ``slurm.watermarks`` (key: ``slurm_watcher_cluster``): ``ts`` = the poll's observation time
    (taken before the query), ``jobs_offsets`` = per ``slurm.jobs`` partition this instance has
    written to since it started, the offset after its last delivered record there (from the
    producer's delivery metadata; a producer without ``send``, such as
    :class:`~gpuwarden.shared.bus.MemoryPublisher`, gives none, so the offsets stay empty). None
    after a failed job read, without the lease, or while a job record is undelivered (it is sent
    again on the next poll). Gauge ``gpuwarden_slurm_watermark_seconds`` (the last ``ts``),
    counter ``gpuwarden_slurm_watermarks_total``.
    """

    name = "slurm-watcher"

    def __init__(
        self,
        settings: SlurmWatcherSettings,
        client: SlurmClient | None = None,
        producer: Producer | None = None,
        now: Callable[[], float] | None = None,
        accounting: SlurmAccounting | None = None,
        lease: Lease | None = None,
        ended: SlurmEndedJobs | None = None,
    ) -> None:
        super().__init__(settings, producer)
        self.settings: SlurmWatcherSettings = settings
        if client is None:
            client, default_now = make_client(settings)
            now = now or default_now
        self.client = client
        self.accounting: SlurmAccounting | None = accounting or (
            client if callable(getattr(client, "accounting", None)) else None  # type: ignore[assignment]
        )
        self.ended: SlurmEndedJobs | None = ended or (
            client if callable(getattr(client, "ended_since", None)) else None  # type: ignore[assignment]
        )
        self._recover_since: float | None = None
        self.recovered = 0
        """Ends published by takeover recovery (since start)."""
        self.now = now or time.time
        self._misses: dict[str, int] = {}
        self.lease: Lease = lease or self._default_lease(settings, producer is None)
        self._held_before = False
        self.failed_polls = 0
        self.status = "starting"
        self._status_gauge = Gauge(
            "gpuwarden_slurm_watcher_status",
            "1 = Slurm polled fine, 0.5 = degraded (a read failing), 0 = unreachable",
            registry=self.metrics.registry,
        )
        self._jobs: dict[str, JobState] = {}
        self._nodes: dict[str, NodeState] = {}
        self._last_snapshot: float | None = None
        self.polls = 0
        #: slurm.jobs partition -> offset after the last record this watcher had delivered there
        self.jobs_offsets: dict[int, int] = {}
        #: (record, delivery future) of the slurm.jobs records sent this poll
        self._job_sends: list[tuple[JobState, asyncio.Future[Any]]] = []
        #: job id -> a slurm.jobs record the broker did not confirm (sent again next poll)
        self._unsent: dict[str, JobState] = {}
        self.watermarks = 0
        """Watermarks published (since start)."""
        self.watermark_ts: float | None = None
        """``ts`` of the last watermark published (the poll's observation time), epoch s."""
        self._wm_gauge = Gauge(
            "gpuwarden_slurm_watermark_seconds",
            "Event time up to which the published Slurm view is complete (ts of the last slurm.watermarks), epoch s",
            registry=self.metrics.registry,
        )
        self._wm_count = Counter(
            "gpuwarden_slurm_watermarks",
            "Watermarks published on slurm.watermarks, count",
            registry=self.metrics.registry,
        )
        self.last_poll_ts: float | None = None
        self.last_error: str | None = None
        self.jobcomp: JobcompReader | None = None
        self.jobcomp_published = 0
        #: job id -> the end a jobcomp/kafka record gave, while squeue still lists the job
        #: (COMPLETING): the poller keeps the end, never goes back to an active state
        self._jobcomp_ended: dict[str, JobState] = {}
        """Job ends published from jobcomp/kafka records (since start)."""
        if settings.slurm_watcher_jobcomp_topic:
            self.jobcomp = JobcompReader(
                settings, settings.slurm_watcher_jobcomp_topic, self._on_jobcomp, self._jobcomp_bad, self.now
            )

    @staticmethod
    def _default_lease(s: SlurmWatcherSettings, real_bus: bool) -> Lease:
        """The lease of the settings; with an injected producer (tests) none unless passed."""
        kind = s.slurm_watcher_lease
        if kind == "auto":
            kind = "none" if s.slurm_watcher_backend == "simulated" else "kafka"
        if kind == "kafka" and real_bus:
            return kafka_lease(
                s.bootstrap_servers,
                s.topic_prefix,
                s.slurm_watcher_cluster,
                s.slurm_watcher_lease_session_ms,
                client_kwargs=s.kafka_kwargs(),
                create=s.create_topics,
            )
        return NoLease()

    async def on_start(self) -> None:
        await self.lease.start()
        self.spawn(self._loop(), "poll")
        if self.jobcomp is not None:
            self.spawn(self.jobcomp.run(), "jobcomp")

    async def _on_jobcomp(self, record: JobState) -> None:
        """One jobcomp/kafka record: its end, if the poller has not seen it, goes out now (lease
        holder only) and becomes the poller's last view of the job."""
        if not self.lease.held():
            return
        job = merge_end(record, self._jobs)
        if job is None:
            return
        self._jobs[job.job_id] = self._jobcomp_ended[job.job_id] = job
        self._misses.pop(job.job_id, None)
        await self.publish("slurm.jobs", job.job_id, job)
        self.jobcomp_published += 1

    def _with_jobcomp_ends(self, current: list[JobState]) -> list[JobState]:
        """squeue's jobs with the ends jobcomp/kafka gave in their place; forgets the ends of
        jobs squeue no longer lists."""
        if not self._jobcomp_ended:
            return current
        listed = {j.job_id for j in current}
        for jid in [k for k in self._jobcomp_ended if k not in listed]:
            del self._jobcomp_ended[jid]
        return [self._jobcomp_ended.get(j.job_id, j) for j in current]

    async def _jobcomp_bad(self, dl: DeadLetter) -> None:
        self.metrics.dead_lettered.labels("jobcomp").inc()
        await self.publish("deadletter", dl.source_topic, dl)

    async def on_stop(self) -> None:
        await self.lease.stop()
        close = getattr(self.client, "close", None)  # RestSlurm: its HTTP session
        if close is not None:
            await close()

    async def _loop(self) -> None:
        period = self.settings.slurm_watcher_poll_s
        while True:
            t0 = time.monotonic()
            if not self.lease.held():
                self.status = "standby"  # another watcher of this cluster publishes
                self._held_before = False
                await asyncio.sleep(min(period, 1.0))
                continue
            await self.poll_once()
            wait = self.next_period(period)
            await asyncio.sleep(max(0.0, wait - (time.monotonic() - t0)))

    def next_period(self, period: float) -> float:
        """The poll period after this poll: ``period``, doubled per consecutive failed poll, at
        most ``max_backoff_s`` (s)."""
        if self.failed_polls <= 0:
            return period
        return float(min(self.settings.slurm_watcher_max_backoff_s, period * 2 ** min(self.failed_polls, 30)))

    async def poll_once(self, force_snapshot: bool = False) -> int:
        """Poll once and publish; returns the number of messages published (0 without the lease).
        The first poll after the lease is (re)acquired is a full snapshot from an empty table."""
        if not self.lease.held():
            self.status = "standby"
            self._held_before = False
            return 0
        now = self.now()
        if not self._held_before:
            self._held_before = True
            lookback = self.settings.slurm_watcher_takeover_lookback_s
            if self.ended is not None and lookback > 0:
                self._recover_since = max(self.last_poll_ts or 0.0, now - lookback)
            if self.polls:  # taking over: rebuild from scratch, publish everything
                self._jobs, self._nodes, self._misses, self._unsent = {}, {}, {}, {}
                force_snapshot = True
        mono = time.monotonic()
        snapshot = (
            force_snapshot
            or self._last_snapshot is None
            or (mono - self._last_snapshot >= self.settings.slurm_watcher_snapshot_s)
        )
        jobs_r, nodes_r = await asyncio.gather(self.client.jobs(), self.client.nodes(), return_exceptions=True)
        sent = 0
        ok = True
        failures = 0
        if isinstance(jobs_r, BaseException):
            ok = self._failed("jobs", jobs_r)
            failures += 2
        else:
            changed, seen = diff_jobs(self._jobs, self._with_jobcomp_ends(carry_gpus(self._jobs, jobs_r)), now)
            acct: dict[str, Any] | None = {}
            ends = [j.job_id for j in changed if j.state in TERMINAL_JOB_STATES]
            if self.accounting is not None and ends:
                try:
                    acct = {a.job_id: a for a in await self.accounting.accounting(ends)}
                except (SlurmError, ValueError, OSError) as exc:
                    self._failed("accounting", exc)
                    acct = None
                    failures += 1
            if self.accounting is not None:
                changed, seen = resolve_ends(
                    changed, seen, self._jobs, acct, self._misses, self.settings.slurm_watcher_gone_grace_polls, now
                )
            self._jobs = seen
            out = (
                changed
                if not snapshot
                else [
                    *(j.model_copy(update={"snapshot": True}) for j in self._jobs.values()),
                    *(j for j in changed if j.job_id not in self._jobs),
                ]
            )
            if self._unsent:  # not delivered last time, and not superseded by a newer record now
                newer = {j.job_id for j in out}
                retry = [j for jid, j in self._unsent.items() if jid not in newer]
                self._unsent = {}
                for j in retry:
                    await self._publish_job(j)
                sent += len(retry)
            for j in out:
                await self._publish_job(j)
            sent += len(out)
            if self._recover_since is not None:
                in_squeue = {j.job_id for j in jobs_r} | {j.job_id for j in out}
                n_recovered = await self._recover_ends(self._recover_since, in_squeue, now)
                if n_recovered is None:
                    failures += 1
                else:
                    sent += n_recovered
        if isinstance(nodes_r, BaseException):
            ok = self._failed("nodes", nodes_r)
            failures += 2
        else:
            changed_n, self._nodes = diff_nodes(self._nodes, nodes_r)
            out_n = (
                changed_n if not snapshot else [n.model_copy(update={"snapshot": True}) for n in self._nodes.values()]
            )
            for n in out_n:
                await self.publish("slurm.nodes", n.node, n)
            sent += len(out_n)
        if not isinstance(jobs_r, BaseException):
            await self._publish_watermark(now)
        if snapshot and ok:
            self._last_snapshot = mono
        self.polls += 1
        self.last_poll_ts = now
        self.failed_polls = self.failed_polls + 1 if failures else 0
        self.status = "ok" if not failures else ("unreachable" if failures >= 4 else "degraded")
        self._status_gauge.set({"ok": 1.0, "degraded": 0.5}.get(self.status, 0.0))
        return sent

    async def _publish_job(self, job: JobState) -> None:
        """Publish one ``slurm.jobs`` record; its delivery is awaited before the poll's watermark."""
        send = getattr(self.producer, "send", None)
        if send is None:  # a publisher without delivery metadata (tests): no offsets to report
            await self.publish("slurm.jobs", job.job_id, job)
            return
        self._job_sends.append((job, await send("slurm.jobs", job.job_id, job)))

    async def _publish_watermark(self, now: float) -> None:
        """After a poll whose job read succeeded (also when nothing changed): once every
        ``slurm.jobs`` record of it is delivered, say on ``slurm.watermarks`` that the view is
        complete up to ``now`` (the poll's observation time) at :attr:`jobs_offsets`.

        A job record the broker did not confirm (the producer logs and counts it) means no
        watermark this poll; it is sent again on the next poll that reads the jobs, unless
        that poll publishes a newer record of the same job.
        """
        sends, self._job_sends = self._job_sends, []
        results = await asyncio.gather(*(f for _, f in sends), return_exceptions=True)
        undelivered = 0
        for (job, _), md in zip(sends, results, strict=True):
            if isinstance(md, BaseException):
                if isinstance(md, asyncio.CancelledError):
                    raise md
                self._unsent[job.job_id] = job
                undelivered += 1
                continue
            p, o = int(md.partition), int(md.offset) + 1
            if o > self.jobs_offsets.get(p, 0):
                self.jobs_offsets[p] = o
        if undelivered:
            log.warning(
                "%d slurm.jobs record(s) not delivered: no watermark this poll, sent again next poll", undelivered
            )
            return
        wm = SlurmWatermark(
            cluster=self.settings.slurm_watcher_cluster,
            ts=now,
            jobs_offsets=dict(self.jobs_offsets),
            polls=self.polls + 1,
        )
        await self.publish("slurm.watermarks", wm.cluster, wm)
        self.watermark_ts = now
        self._wm_gauge.set(now)
        self.watermarks += 1
        self._wm_count.inc()

    async def _recover_ends(self, since: float, in_squeue: set[str], now: float) -> int | None:
        """Publish the ends accounting has since ``since`` of jobs not in ``in_squeue`` (missed
        while no watcher held the lease). Returns how many, or ``None`` if accounting failed
        (then it is tried again on the next poll)."""
        assert self.ended is not None
        try:
            records = await self.ended.ended_since(since)
        except (SlurmError, ValueError, OSError) as exc:
            self._failed("accounting (takeover recovery)", exc)
            return None
        self._recover_since = None
        out = [
            r.model_copy(update={"ts": now, "snapshot": False, "confirmed": True})
            for r in records
            if r.job_id not in in_squeue
        ]
        for r in out:
            await self._publish_job(r)
        self.recovered += len(out)
        if out:
            log.info("takeover: published %d job ends since %.0f from accounting", len(out), since)
        return len(out)

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
            slurm_status=self.status,
            lease_held=self.lease.held(),
            failed_polls=self.failed_polls,
            last_poll_ts=self.last_poll_ts,
            last_error=self.last_error,
            jobs=len(self._jobs),
            nodes=len(self._nodes),
            watermark_ts=self.watermark_ts,
            watermarks=self.watermarks,
        )
        if self.jobcomp is not None:
            h.update(jobcomp_topic=self.jobcomp.topic, jobcomp_records=self.jobcomp.records,
                     jobcomp_bad=self.jobcomp.bad, jobcomp_published=self.jobcomp_published)  # fmt: skip
        return h
