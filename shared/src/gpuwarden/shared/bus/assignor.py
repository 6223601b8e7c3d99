"""Partition assignment that keeps one key's partitions, of several topics and of several
consumer groups, on one worker.

Kafka assigns each consumer group on its own, and aiokafka's default (round robin) deals a
group's partitions out over its members topic after topic. A service that reads node-keyed
topics in two groups (the detector's sample lane and event lane) or two node-keyed topics in one
group (the correlator's lane ``all``) then handles gpu-node-007's samples on one worker and its
XIDs on another, and a rule that joins the two (an XID that explains a silence, a fold of
``gpu-missing`` into ``gpu-fallen-off-bus``) never sees both.

:class:`AffinityAssignor` lays out each topic's partitions in contiguous ranges over the
group's *workers*, sorted by a worker id that every member sends as the user data of its
subscription (:meth:`AffinityAssignor.metadata`). The layout depends only on the sorted worker
ids and the partition count, never on Kafka's random member ids, so:

* within one group, topics with the same partition count go to the workers partition number by
  partition number (what Kafka's range assignor does);
* across groups whose members are the same workers (every worker runs every lane, each lane a
  consumer in its own group), partition *p* of every topic with the same count goes to the same
  worker in each group.

A key's partition number is the same in every topic with the same count (one partitioner,
murmur2 of the key), so a node's records of every node-keyed topic of equal count meet on one
worker (:data:`gpuwarden.shared.topics.COPARTITION_GROUPS` keeps those counts equal). While two
groups rebalance (a worker joins or leaves), one may run on the new layout a moment before the
other; they agree again when both have settled.

A consumer offers this assignor alone. aiokafka 0.14 sends one JoinGroup per prefix of the
assignor list (aio-libs/aiokafka#1168, not merged): with round robin offered second as a
fallback, each join was two JoinGroups with different metadata, the second starting another
rebalance, and two workers under load kept their group rebalancing for minutes. The cost: a
worker of a version before this assignor (round robin only) and one of this version cannot share
a group (Kafka refuses the join with INCONSISTENT_GROUP_PROTOCOL), so an upgrade from such a
version stops every worker of the service before starting the new ones.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

__all__ = ["AffinityAssignor", "layout"]

log = logging.getLogger(__name__)


def layout(partitions: Sequence[int], members: Iterable[tuple[str, str]]) -> dict[str, list[int]]:
    """Partitions of one topic by member. Pure.

    Args:
        partitions: the topic's partition numbers.
        members: ``(worker id, member id)`` of each member subscribed to the topic.

    Returns:
        ``{member id: [partition, ...]}`` for every member (an empty list for one that gets none).
        The sorted partitions are cut into one contiguous range per distinct worker id, in
        worker id order; the first ``len(partitions) % workers`` workers get one more. A worker
        with several members in the group (not how gpuwarden runs) deals its range out over
        them in member id order.
    """
    parts = sorted(partitions)
    by_worker: dict[str, list[str]] = defaultdict(list)
    for worker, member in members:
        by_worker[worker].append(member)
    out: dict[str, list[int]] = {m: [] for ms in by_worker.values() for m in ms}
    workers = sorted(by_worker)
    if not workers:
        return out
    each, extra = divmod(len(parts), len(workers))
    start = 0
    for i, worker in enumerate(workers):
        n = each + (1 if i < extra else 0)
        own = parts[start : start + n]
        start += n
        ms = sorted(by_worker[worker])
        for j, p in enumerate(own):
            out[ms[j % len(ms)]].append(p)
    return out


class AffinityAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """aiokafka partition assignor ``gpuwarden-affinity`` (see the module): one instance per
    consumer, built with the worker id shared by every consumer of one service instance.

    Raises:
        ValueError: an empty ``worker_id``.
    """

    name = "gpuwarden-affinity"
    version = 0

    def __init__(self, worker_id: str) -> None:
        if not worker_id:
            raise ValueError("an affinity assignor needs a worker id")
        self.worker_id = worker_id

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        """The join request's subscription, with this worker's id as its user data."""
        return ConsumerProtocolMemberMetadata(self.version, list(topics), self.worker_id.encode())

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """Run by the group's leader: every subscribed topic laid out by :func:`layout`. A member
        whose user data is empty or not UTF-8 counts as a worker of its own (its member id)."""
        subscribers: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for member_id, meta in members.items():
            try:
                worker = bytes(meta.user_data or b"").decode() or member_id
            except UnicodeDecodeError:
                worker = member_id
            for topic in meta.subscription:
                subscribers[topic].append((worker, member_id))
        chosen: dict[str, dict[str, list[int]]] = {m: {} for m in members}
        for topic, subs in subscribers.items():
            parts = cluster.partitions_for_topic(topic)
            if not parts:
                log.warning("no partition metadata for topic %s: none of it assigned this round", topic)
                continue
            for member_id, own in layout(sorted(parts), subs).items():
                if own:
                    chosen[member_id][topic] = own
        return {m: ConsumerProtocolMemberAssignment(self.version, sorted(chosen[m].items()), b"") for m in members}

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Nothing to keep: the layout is a function of the members' metadata."""
