"""The affinity assignor (issue 23: a node's samples and events on the same worker): every
partition assigned once, balanced over workers, and the same partition numbers to one worker in
every group and every topic of the same count, whatever Kafka's member ids are."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.detector.lanes import EVENT_LANE, SAMPLE_LANE
from gpuwarden.shared.bus.assignor import AffinityAssignor, layout
from gpuwarden.shared.topics import COPARTITION_GROUPS, TOPICS


class _Cluster:
    """The one ClusterMetadata call an assignor makes."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return set(range(n)) if n else None


def _group(workers: list[str], topics: list[str], cluster: _Cluster) -> dict[str, dict[str, list[int]]]:
    """One group's assignment: ``{worker: {topic: partitions}}`` (one member per worker, random
    member ids as Kafka gives them)."""
    members = {f"m-{uuid.uuid4().hex}": w for w in workers}
    metas = {m: AffinityAssignor(w).metadata(topics) for m, w in members.items()}
    out = AffinityAssignor(workers[0]).assign(cluster, metas)  # type: ignore[arg-type]
    return {members[m]: {t: list(ps) for t, ps in a.assignment} for m, a in out.items()}


@given(
    n=st.integers(1, 48),
    workers=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=9, unique=True),
)
@settings(max_examples=200, deadline=None)
def test_layout_assigns_each_partition_once_balanced_by_worker(n: int, workers: list[str]) -> None:
    got = layout(range(n), [(w, f"member-{i}") for i, w in enumerate(workers)])
    every = sorted(p for ps in got.values() for p in ps)
    assert every == list(range(n))
    sizes = [len(ps) for ps in got.values()]
    assert max(sizes) - min(sizes) <= 1
    for ps in got.values():  # contiguous ranges
        assert ps == list(range(ps[0], ps[0] + len(ps))) if ps else True


@given(
    n=st.integers(1, 48),
    workers=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=9, unique=True),
    seed=st.randoms(use_true_random=False),
)
@settings(max_examples=200, deadline=None)
def test_layout_depends_on_the_workers_not_on_member_ids_or_their_order(n: int, workers: list[str], seed) -> None:
    def by_worker(ids: list[str]) -> dict[str, list[int]]:
        pairs = list(zip(workers, ids, strict=True))
        seed.shuffle(pairs)
        member_of = {m: w for w, m in pairs}
        return {member_of[m]: ps for m, ps in layout(range(n), pairs).items()}

    assert by_worker([uuid.uuid4().hex for _ in workers]) == by_worker([uuid.uuid4().hex for _ in workers])


def test_several_members_of_one_worker_share_its_range() -> None:
    got = layout(range(6), [("a", "m2"), ("a", "m1"), ("b", "m3")])
    assert got == {"m1": [0, 2], "m2": [1], "m3": [3, 4, 5]}


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5, 6, 7])
def test_the_detectors_two_lanes_put_a_nodes_topics_on_one_worker(workers: int) -> None:
    """The detector's sample lane and event lane are two groups with the same workers: every
    node-keyed topic of both (gpu.attributed, gpu.events, gpu.events.attributed, slurm.nodes,
    health) gives each worker the same partition numbers, and the job-keyed ones (job.windows,
    slurm.jobs) too, at the registry's default counts."""
    cluster = _Cluster({t: s.partitions for t, s in TOPICS.items()})
    names = [f"gpu-host-{i:02d}:4242:{uuid.uuid4().hex[:8]}" for i in range(workers)]
    samples = _group(names, list(SAMPLE_LANE), cluster)
    events = _group(names, list(EVENT_LANE), cluster)
    for w in names:
        mine = {**samples.get(w, {}), **events.get(w, {})}
        for key, group in COPARTITION_GROUPS.items():
            read = [t for t in group if t in SAMPLE_LANE + EVENT_LANE]
            assert len({tuple(mine.get(t, [])) for t in read}) == 1, (key, w, mine)
    for t in SAMPLE_LANE:
        assert sorted(p for w in names for p in samples[w].get(t, [])) == list(range(TOPICS[t].partitions))
    for t in EVENT_LANE:
        assert sorted(p for w in names for p in events[w].get(t, [])) == list(range(TOPICS[t].partitions))


def test_a_member_without_a_worker_id_is_a_worker_of_its_own() -> None:
    cluster = _Cluster({"t": 4})
    metas = {
        "m-a": AffinityAssignor("a").metadata(["t"]),
        "m-old": ConsumerProtocolMemberMetadata(0, ["t"], b""),
        "m-bad": ConsumerProtocolMemberMetadata(0, ["t"], b"\xff\xfe"),
    }
    out = AffinityAssignor("a").assign(cluster, metas)  # type: ignore[arg-type]
    got = sorted(p for a in out.values() for _, ps in a.assignment for p in ps)
    assert got == [0, 1, 2, 3]
    assert {m: len([p for _, ps in a.assignment for p in ps]) for m, a in out.items()} == {
        "m-a": 2,
        "m-bad": 1,
        "m-old": 1,
    }


def test_a_topic_without_metadata_is_left_out_not_fatal() -> None:
    metas = {"m": AffinityAssignor("a").metadata(["known", "unknown"])}
    out = AffinityAssignor("a").assign(_Cluster({"known": 2}), metas)  # type: ignore[arg-type]
    assert [(t, list(ps)) for t, ps in out["m"].assignment] == [("known", [0, 1])]


def test_an_empty_worker_id_is_refused() -> None:
    with pytest.raises(ValueError, match="worker id"):
        AffinityAssignor("")


def test_every_consumer_of_a_service_carries_its_worker_id() -> None:
    from gpuwarden.detector import DetectorService, DetectorSettings

    svc = DetectorService(DetectorSettings(bootstrap_servers="127.0.0.1:1"))
    a = svc.consume(list(SAMPLE_LANE), svc.handle)
    b = svc.consume(list(EVENT_LANE), svc.handle, group="g-events")
    assert a.worker_id == b.worker_id == svc.worker_id
    assert DetectorService(DetectorSettings(bootstrap_servers="127.0.0.1:1")).worker_id != svc.worker_id
