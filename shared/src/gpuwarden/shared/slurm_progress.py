"""Slurm watermarks for code that publishes ``JobState`` on ``slurm.jobs`` itself.

The correlator attributes a record only once a ``SlurmWatermark`` (``slurm.watermarks``) says
Slurm's view is complete up to the record's ``ts`` *and* it has read ``slurm.jobs`` up to the
offsets the watermark names (see :class:`~gpuwarden.shared.models.SlurmWatermark`). The
slurm-watcher publishes them after every poll; a simulation, a bench or ``gpuwarden analyze``
that writes its own JobStates (raw aiokafka or :class:`~gpuwarden.shared.bus.Producer`) does it
with these two pieces::

    offsets = JobsOffsets()
    for job in jobs:
        offsets.note(await producer.send_and_wait(f"{prefix}slurm.jobs", job.to_json(), key=job.job_id.encode()))
    await publish_watermark(producer.send_and_wait, "default", ts, offsets.offsets, f"{prefix}slurm.watermarks")

Only publish a watermark once every JobState it covers is *delivered* (``send_and_wait``, or
the ``send`` future resolved): its offsets must not run ahead of what a reader can read, and
``ts`` must not claim more than the jobs published so far say (every job holding a GPU at any
time before ``ts`` must be among them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from .models import SlurmWatermark

__all__ = ["JobsOffsets", "RecordMetadataLike", "publish_watermark"]


class RecordMetadataLike(Protocol):
    """What :meth:`JobsOffsets.note` reads of a delivery: aiokafka's ``RecordMetadata``."""

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


class JobsOffsets:
    """Accumulates, per ``slurm.jobs`` partition, the offset after the last record delivered there.

    ``offsets`` (``dict[int, int]``: partition -> offset of the last noted record + 1) is the
    ``jobs_offsets`` of the next watermark. It only grows: noting an older delivery keeps the
    larger offset. Partitions never noted are absent.
    """

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}

    def note(self, md: RecordMetadataLike) -> None:
        """Note one delivered ``slurm.jobs`` record (the ``RecordMetadata`` that
        ``AIOKafkaProducer.send_and_wait``, or a ``send`` future, resolves to).

        Raises:
            ValueError: a negative partition or offset (not a delivery).
        """
        p, o = int(md.partition), int(md.offset)
        if p < 0 or o < 0:
            raise ValueError(f"not a delivered record: partition {p}, offset {o}")
        if o + 1 > self.offsets.get(p, 0):
            self.offsets[p] = o + 1


async def publish_watermark(
    send: Callable[..., Awaitable[Any]],
    cluster: str,
    ts: float,
    jobs_offsets: Mapping[int, int],
    topic: str,
) -> SlurmWatermark:
    """Publish one :class:`~gpuwarden.shared.models.SlurmWatermark` on ``topic``, keyed by ``cluster``.

    Args:
        send: an aiokafka-style send, called as ``send(topic, value: bytes, key=bytes)``:
            ``AIOKafkaProducer.send_and_wait`` (waits for the delivery) or
            ``AIOKafkaProducer.send`` (queues; its delivery future is not awaited here).
        cluster: cluster name (``[A-Za-z0-9._-]{1,100}``; the slurm-watcher's default is ``default``).
        ts: event time up to which the published JobStates are complete, epoch s (>= 0).
        jobs_offsets: ``slurm.jobs`` partition -> offset after the last JobState of this view
            (:attr:`JobsOffsets.offsets`); empty when no JobState was published (the view is
            then "no job anywhere" up to ``ts``).
        topic: full topic name, with the prefix (``f"{prefix}slurm.watermarks"``).

    Returns:
        The watermark published.

    Raises:
        pydantic.ValidationError (a ``ValueError``): bad cluster name, negative ``ts``.
        aiokafka.errors.KafkaError: what ``send`` raises (not delivered).
    """
    wm = SlurmWatermark(cluster=cluster, ts=ts, jobs_offsets=dict(jobs_offsets))
    await send(topic, wm.to_json(), key=cluster.encode())
    return wm
