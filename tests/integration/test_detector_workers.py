"""Several detector workers on a real broker (issue 23: a node's samples and events on the same
worker): each worker's sample lane and event lane, two consumer groups, hold the same partition
numbers of every node-keyed topic (and of the job-keyed ones) after a worker joins and after one
leaves; and an XID 79 and its node's samples reach the one worker that owns the node."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from gpuwarden.detector import DetectorService, DetectorSettings
from gpuwarden.detector.lanes import EVENT_LANE, SAMPLE_LANE
from gpuwarden.shared.bus import kafka_producer
from gpuwarden.shared.models import AttributedSample, EventKind, GpuEvent, GpuSample, NodeSample
from gpuwarden.shared.topics import COPARTITION_GROUPS, create_topics

pytestmark = pytest.mark.integration

PARTITIONS = 6


class _Recording(DetectorService):
    """The detector, noting which nodes' records each lane handed it."""

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        self.seen: set[tuple[str, str]] = set()

    async def handle(self, topic, value, _record=None) -> None:  # type: ignore[no-untyped-def]
        node = value.sample.node if isinstance(value, AttributedSample) else getattr(value, "node", None)
        if node is not None:
            self.seen.add((topic, node))
        await super().handle(topic, value, _record)


def _held(svc: DetectorService) -> dict[str, list[int]]:
    """Partitions of both lanes of one worker, by short topic name."""
    out: dict[str, list[int]] = {}
    for c in svc._consumers:
        out.update(c.assignment())
    return out


def _settled(workers: list[DetectorService]) -> bool:
    """Every partition of every lane topic held by exactly one worker."""
    for t in SAMPLE_LANE + EVENT_LANE:
        held = sorted(p for w in workers for p in _held(w).get(t, []))
        if held != list(range(PARTITIONS)):
            return False
    return True


async def _wait_settled(workers: list[DetectorService], timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not _settled(workers):
        if time.monotonic() > end:
            pytest.fail(f"the lanes did not settle in {timeout_s:.0f}s: {[_held(w) for w in workers]}")
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # a second rebalance round of one group would show here
    assert _settled(workers)


def _assert_affine(workers: list[DetectorService]) -> None:
    for w in workers:
        held = _held(w)
        for key, group in COPARTITION_GROUPS.items():
            read = [t for t in group if t in SAMPLE_LANE + EVENT_LANE]
            split = {tuple(held.get(t, [])) for t in read}
            assert len(split) == 1, f"{key}-keyed topics split on {w.worker_id}: {held}"


async def test_each_workers_two_lanes_hold_the_same_partitions(kafka_bootstrap: str, monkeypatch) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}."
    await create_topics(kafka_bootstrap, prefix, partitions=PARTITIONS)
    monkeypatch.setenv("GPUWARDEN_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("GPUWARDEN_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("GPUWARDEN_CONSUMER_GROUP", f"{prefix}detector")  # groups of this test alone
    workers: list[DetectorService] = []
    try:
        for _ in range(2):
            w = _Recording(DetectorSettings())
            await w.start()
            workers.append(w)
        await _wait_settled(workers)
        _assert_affine(workers)
        assert all(_held(w).get("gpu.attributed") for w in workers)  # both have work

        third = _Recording(DetectorSettings())  # one joins: both groups rebalance
        await third.start()
        workers.append(third)
        await _wait_settled(workers)
        _assert_affine(workers)
        assert sorted(len(_held(w)["gpu.attributed"]) for w in workers) == [2, 2, 2]

        await _traffic(kafka_bootstrap, prefix, workers)  # type: ignore[arg-type]

        gone = workers.pop(0)  # one leaves
        await gone.stop()
        await _wait_settled(workers)
        _assert_affine(workers)
    finally:
        for w in workers:
            await w.stop()


async def _traffic(bootstrap: str, prefix: str, workers: list[_Recording], nodes: int = 24) -> None:
    """A sample (gpu.attributed) and a raw XID 79 (gpu.events) of each node, keyed by node as the
    correlator and the collector key them: each node's two records reach one worker, the same."""
    p = kafka_producer(bootstrap)
    await p.start()
    names = [f"gpu-node-{i:03d}" for i in range(nodes)]
    t0 = time.time() - 300  # event time within the detector's edge check of the wall clock
    try:
        for i, node in enumerate(names):
            sample = NodeSample(node=node, ts=t0 + i, collector_id="c", source="nvml",
                                gpus=[GpuSample(index=0, uuid=f"GPU-{node}", utilization_gpu_pct=90.0)])  # fmt: skip
            event = GpuEvent(event_id=f"x-{node}", node=node, ts=t0 + i, kind=EventKind.XID, code=79, gpu_index=0,
                             raw=f"NVRM: Xid (PCI:0000:44:00): 79, {node}", source="test")  # fmt: skip
            await p.send(f"{prefix}gpu.attributed", AttributedSample(sample=sample).to_json(), key=node.encode())
            await p.send(f"{prefix}gpu.events", event.to_json(), key=node.encode())
        await p.flush()
    finally:
        await p.stop()
    end = time.monotonic() + 30
    while sum(len(w.seen) for w in workers) < 2 * nodes and time.monotonic() < end:
        await asyncio.sleep(0.2)
    for node in names:
        by = {t: [w.worker_id for w in workers if (t, node) in w.seen] for t in ("gpu.attributed", "gpu.events")}
        assert len(by["gpu.attributed"]) == 1 and by["gpu.attributed"] == by["gpu.events"], (node, by)
    assert sum(1 for w in workers if w.seen) > 1  # the nodes were spread, not all on one worker


async def test_a_worker_joins_each_group_in_one_round(kafka_bootstrap: str, monkeypatch) -> None:
    """One JoinGroup per join. aiokafka 0.14 sends a JoinGroup for each prefix of the assignor
    list (aio-libs/aiokafka#1168, unmerged): with a fallback assignor after gpuwarden-affinity,
    every join was two, the second with other metadata, which starts another rebalance; two
    correlator workers under load kept each other rebalancing for minutes (generation 131 after
    a minute, no window produced). A lone member's first generation is 1."""
    prefix = f"g{uuid.uuid4().hex[:8]}."
    await create_topics(kafka_bootstrap, prefix, partitions=PARTITIONS)
    monkeypatch.setenv("GPUWARDEN_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("GPUWARDEN_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("GPUWARDEN_CONSUMER_GROUP", f"{prefix}detector")
    w = DetectorService(DetectorSettings())
    await w.start()
    try:
        await _wait_settled([w])
        # aiokafka has no public accessor for the generation a member holds
        generations = [c._consumer._coordinator.generation for c in w._consumers]  # type: ignore[union-attr]
        assert generations == [1] * len(w._consumers), generations
    finally:
        await w.stop()
