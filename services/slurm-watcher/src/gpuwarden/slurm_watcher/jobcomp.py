"""The optional ``jobcomp/kafka`` job source of slurm-watcher (``GPUWARDEN_SLURM_WATCHER_JOBCOMP_TOPIC``).

Sites that run ``JobCompType=jobcomp/kafka`` (Slurm 23.02+) have slurmctld write one JSON
record per finished job to a Kafka topic. The watcher reads that topic (no consumer group:
every watcher instance reads it whole, from its end at start; only the lease holder publishes)
and publishes a job's end on ``slurm.jobs`` as soon as the record arrives, instead of at the
next poll, so the correlator and the detector stop attributing a node's GPUs to a job that is
over up to ``poll_s`` earlier.

What the record lacks is filled from the poller (:func:`merge_end`): the GPU indices (the
record has none) and the nodes, name and user when the record leaves them out. The poller
stays the source of truth: a record of a job the poller already saw end, or already saw in
the same state, publishes nothing; a start record (Slurm 25.05+ ``enable_job_start``) is
counted and left to the poller (it has no GPU indices to attribute samples by); a record
lost while no watcher ran is found by the takeover recovery (sacct), as any other end. A
record that is not a jobcomp record goes to ``deadletter`` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from gpuwarden.shared.bus import dead_letter_of, kafka_client, kafka_consumer
from gpuwarden.shared.models import DeadLetter, JobState
from gpuwarden.shared.slurm import TERMINAL_JOB_STATES
from gpuwarden.shared.slurm.jobcomp import fill_gpus, parse_jobcomp_record

from .settings import SlurmWatcherSettings

__all__ = ["JobcompReader", "merge_end"]

log = logging.getLogger(__name__)


def merge_end(record: JobState, polled: Mapping[str, JobState]) -> JobState | None:
    """The ``slurm.jobs`` record to publish for one jobcomp record, or None when it adds nothing.

    ``polled``: the poller's last state per job id. Only an end the poller has not seen is
    published: the record's state, end time, exit code and ``confirmed``, over the poller's
    view of the job (nodes, GPU indices, name, user, partition, start and submit times where
    the record has none). A start record, or an end the poller already has, gives None. Pure.
    """
    if record.state not in TERMINAL_JOB_STATES:
        return None
    known = polled.get(record.job_id)
    if known is not None and known.state in TERMINAL_JOB_STATES:
        return None
    job = fill_gpus(record, polled)
    if known is None:
        return job
    return known.model_copy(
        update={
            "ts": record.ts,
            "state": record.state,
            "end_ts": record.end_ts if record.end_ts is not None else known.end_ts,
            "exit_code": record.exit_code if record.exit_code is not None else known.exit_code,
            "start_ts": known.start_ts or record.start_ts,
            "submit_ts": known.submit_ts or record.submit_ts,
            "nodes": known.nodes or record.nodes,
            "gpus": job.gpus or known.gpus,
            "user": known.user or record.user,
            "name": known.name or record.name,
            "partition": known.partition or record.partition,
            "confirmed": True,
            "snapshot": False,
        }
    )


class JobcompReader:
    """Reads ``topic`` (every partition, from its end) and hands each record to ``on_job`` as a
    :class:`JobState` (``ts`` = ``now()``); an unreadable record to ``on_bad`` as its
    :class:`~gpuwarden.shared.models.DeadLetter`. Waits for the topic to exist (slurmctld creates
    it on its first record when the broker allows it). Counts: ``records``, ``bad``.
    """

    def __init__(
        self,
        settings: SlurmWatcherSettings,
        topic: str,
        on_job: Callable[[JobState], Awaitable[None]],
        on_bad: Callable[[DeadLetter], Awaitable[None]],
        now: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.topic, self.on_job, self.on_bad, self.now = settings, topic, on_job, on_bad, now
        self.records = 0
        self.bad = 0
        self.ready = asyncio.Event()
        """Set once the topic's partitions are assigned and positioned at their end."""

    async def run(self) -> None:
        """Read until cancelled. Raises what the Kafka client raises on start (no broker)."""
        c: AIOKafkaConsumer = kafka_consumer(
            self.settings,
            client_id=f"{self.settings.client_id}-slurm-watcher-jobcomp",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            fetch_max_wait_ms=200,
        )
        await c.start()
        try:
            tps = await self._partitions()
            c.assign(tps)
            await c.seek_to_end(*tps)
            for tp in tps:  # resolve the end now: records written after this point are read
                await c.position(tp)
            self.ready.set()
            log.info("slurm-watcher: reading jobcomp/kafka records from %s (%d partitions)", self.topic, len(tps))
            while True:
                for recs in (await c.getmany(timeout_ms=500, max_records=500)).values():
                    for rec in recs:
                        await self._one(rec)
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await c.stop()

    async def _partitions(self) -> list[TopicPartition]:
        warned = False
        wait_s = 0.5  # a topic created a moment ago may reach the metadata late: look again soon, then every 5 s
        while True:
            client = kafka_client(self.settings)
            try:
                await client.bootstrap()
                parts = (await client.fetch_all_metadata()).partitions_for_topic(self.topic) or set()
            finally:
                await client.close()
            if parts:
                return [TopicPartition(self.topic, p) for p in sorted(parts)]
            if not warned:
                log.warning("slurm-watcher: jobcomp topic %r does not exist yet; waiting for slurmctld's first "
                            "record (job ends come from the poller meanwhile)", self.topic[:200])  # fmt: skip
                warned = True
            await asyncio.sleep(wait_s)
            wait_s = min(5.0, wait_s * 2)

    async def _one(self, rec: ConsumerRecord) -> None:
        self.records += 1
        try:
            job = parse_jobcomp_record(rec.value or b"", self.now())
        except ValueError as exc:
            log.warning("slurm-watcher: dead-lettering %s[%s]@%s: %s", self.topic[:200], rec.partition, rec.offset,
                        str(exc)[:300], extra={"rate_limited": True})  # fmt: skip
            dl = dead_letter_of(
                "slurm-watcher", self.topic, rec.partition, rec.offset, rec.key, rec.value, str(exc), time.time()
            )
            await self.on_bad(dl)
            self.bad += 1  # counted once handed over (published), as ``records`` counts what was read
            return
        await self.on_job(job)
