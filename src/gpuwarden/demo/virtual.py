"""When a simulated run is over, in virtual time: every source has published its last tick and
every consumer of the pipeline has committed everything there is to read.

``gpuwarden simulate`` used to stop ``duration / speed`` wall seconds after the start, so a
simulated collector that fell behind (64 nodes at ``--speed 50``) was stopped half-way and the
run lost the data, and the verdicts, of the rest of the scenario. A run now ends on
:meth:`Drain.done` instead: the collector's ``/healthz`` says ``finished`` (its paced source
published the scenario's last tick; ``--speed`` only caps how fast it goes) and every consumer
group of the pipeline has a committed offset at the end offset of every partition of every
topic it reads (lag 0: nothing in flight). Detection works in event time, so the same scenario
gives the same failures at any speed.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from gpuwarden.shared.bus import kafka_admin, kafka_consumer

__all__ = ["PIPELINE_GROUPS", "Drain", "lag_of", "reader_at_end", "source_finished"]

#: Consumer group (the services' defaults: ``gpuwarden-<service>``, the correlator's group,
#: the detector's event lane) -> the short names of the topics it reads, for everything between
#: the simulated sources and the ``failures`` / ``remediations`` a run reports.
PIPELINE_GROUPS: dict[str, tuple[str, ...]] = {
    "gpuwarden-correlator": ("gpu.samples", "gpu.events"),
    "gpuwarden-detector": ("gpu.attributed", "job.windows"),
    "gpuwarden-detector-events": ("gpu.events", "gpu.events.attributed", "slurm.jobs", "slurm.nodes", "health"),
    "gpuwarden-remediator": ("failures",),
}


def source_finished(port: int, timeout_s: float = 1.0) -> bool:
    """True when the service on ``127.0.0.1:port`` answers ``/healthz`` with ``"finished": true``
    (the collector, once its paced source published its last tick); False otherwise, also when
    it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout_s) as r:
            body = json.loads(r.read())
    except (OSError, ValueError):
        return False
    return bool(isinstance(body, dict) and body.get("finished") is True)


def lag_of(ends: Mapping[TopicPartition, int], committed: Mapping[TopicPartition, int | None]) -> int:
    """Messages between the committed offsets and the end offsets (a partition without a commit
    counts from 0, so a group that has not read a non-empty partition yet is not drained)."""
    return sum(max(0, end - (committed.get(tp) or 0)) for tp, end in ends.items())


@dataclass
class Drain:
    """Lag of the pipeline's consumer groups on one broker, for topics under ``prefix``.

    ``groups``: consumer group -> short topic names (default :data:`PIPELINE_GROUPS`).
    :meth:`start` / :meth:`stop` open and close one admin client and one offsets consumer.
    """

    bootstrap: str
    prefix: str
    groups: Mapping[str, Iterable[str]] = field(default_factory=lambda: dict(PIPELINE_GROUPS))
    last: dict[str, int] = field(default_factory=dict)
    _admin: AIOKafkaAdminClient | None = None
    _ends: AIOKafkaConsumer | None = None
    _parts: dict[str, list[TopicPartition]] = field(default_factory=dict)

    async def start(self) -> None:
        """Raises aiokafka.errors.KafkaError when the broker does not answer."""
        self._admin = kafka_admin(self.bootstrap)
        self._ends = kafka_consumer(self.bootstrap, group_id=None)
        await self._admin.start()
        await self._ends.start()

    async def stop(self) -> None:
        if self._ends is not None:
            await self._ends.stop()
            self._ends = None
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    async def _partitions(self, short: str) -> list[TopicPartition]:
        assert self._ends is not None
        tps = self._parts.get(short)
        if tps:
            return tps
        topic = f"{self.prefix}{short}"
        ps = self._ends.partitions_for_topic(topic)
        if not ps:
            await self._ends._client.force_metadata_update()
            ps = self._ends.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(ps)]
        if tps:
            self._parts[short] = tps
        return tps

    async def lags(self) -> dict[str, int]:
        """Consumer group -> messages not yet committed, over the topics it reads (also kept in
        :attr:`last`)."""
        assert self._admin is not None and self._ends is not None, "Drain not started"
        out: dict[str, int] = {}
        for group, shorts in self.groups.items():
            tps = [tp for s in shorts for tp in await self._partitions(s)]
            ends = await self._ends.end_offsets(tps) if tps else {}
            offs = await self._admin.list_consumer_group_offsets(group, partitions=tps) if tps else {}
            committed = {tp: (o.offset if o is not None and o.offset >= 0 else None) for tp, o in offs.items()}
            out[group] = lag_of(ends, committed)
        self.last = out
        return out

    async def done(self) -> bool:
        """True when every group has lag 0."""
        return all(v == 0 for v in (await self.lags()).values())


async def reader_at_end(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> bool:
    """True when ``consumer`` (assigned or subscribed to the full ``topics``) has fetched every
    partition of them up to its end offset."""
    tps = [tp for tp in consumer.assignment() if tp.topic in set(topics)]
    if not tps:
        return False
    ends = await consumer.end_offsets(tps)
    for tp in tps:
        if await consumer.position(tp) < ends[tp]:
            return False
    return True
