"""The correlator's lanes: an events worker in its own consumer group (XIDs never wait behind
a sample backlog) next to a samples worker; and the producer settings."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from unittest.mock import patch

import pytest

from faust_loops import close_faust_thread_loops  # noqa: F401 (fixture)
from gpuwarden.correlator.app import LANES, create_app
from gpuwarden.correlator.settings import CorrelatorSettings
from gpuwarden.shared.allocations import fan_out
from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import EventKind, GpuEvent, JobState

NODE = "gpu-node-001"

pytestmark = pytest.mark.usefixtures("close_faust_thread_loops")


def settings(**kw: Any) -> CorrelatorSettings:
    return CorrelatorSettings(bootstrap_servers="h1:9092", topic_prefix="x.", consumer_group="g", **kw)


@pytest.fixture
def sent() -> Iterator[list[tuple[str, bytes | None, bytes]]]:
    out: list[tuple[str, bytes | None, bytes]] = []

    async def fake_send(self: Any, topic: str, key: bytes | None, value: bytes, *_: Any, **__: Any) -> Any:
        out.append((topic, key, value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    with patch("faust.transport.drivers.aiokafka.Producer.send", fake_send):
        yield out


def test_lanes_split_the_inputs_and_the_events_lane_has_its_own_group() -> None:
    assert set(LANES["samples"]) | set(LANES["events"]) == set(LANES["all"])
    events = create_app(settings(correlator_lane="events"), partitions=2)
    assert events.conf.id == "g-events"
    assert sorted(events.agents) == ["correlate-allocations", "correlate-gpu.events"]
    assert events.windows_table is None and events.windows_store is None
    # its own allocations table (changelog under its own app id), fed from the allocations topic
    assert events.allocations_table.changelog_topic.get_topic_name() == "g-events-x.node-allocations-changelog"
    samples = create_app(settings(correlator_lane="samples"), partitions=2)
    assert samples.conf.id == "g"
    assert sorted(samples.agents) == ["correlate-allocations", "correlate-gpu.samples", "correlate-slurm.jobs"]
    assert samples.windows_store is not None
    assert sorted(create_app(settings(), partitions=2).agents) == sorted(f"correlate-{t}" for t in LANES["all"])


def test_producer_batches_are_configurable() -> None:
    app = create_app(settings(correlator_producer_linger_s=0.05, correlator_producer_batch_bytes=65536), partitions=1)
    assert (app.conf.producer_linger, app.conf.producer_max_batch_size) == (0.05, 65536)
    with pytest.raises(ValueError):
        settings(correlator_producer_batch_bytes=2_000_000)  # over the broker's message.max.bytes


async def test_events_lane_attributes_an_xid(sent: list[tuple[str, bytes | None, bytes]]) -> None:
    app = create_app(settings(correlator_lane="events"), partitions=2)
    app.finalize()
    app.flow_control.resume()
    job = JobState(job_id="1001", ts=10, state="RUNNING", nodes=[NODE], gpus={NODE: [0, 1]}, start_ts=5)
    [alloc] = fan_out(job)
    async with app.agents["correlate-allocations"].test_context() as agent:
        await agent.put(alloc.model_dump_json().encode(), key=NODE.encode())
    ev = GpuEvent(event_id="e", node=NODE, ts=12, kind=EventKind.XID, code=79, gpu_index=1, raw="x", source="simulated")
    async with app.agents["correlate-gpu.events"].test_context() as agent:
        await agent.put(ev.to_json(), key=NODE.encode())
    [(topic, key, value)] = sent
    aev = decode("gpu.events.attributed", value)
    assert (topic, key) == ("x.gpu.events.attributed", NODE.encode())
    assert aev.job is not None and aev.job.job_id == "1001"


async def test_window_snapshots_reach_the_producer_in_order_before_its_flush_returns() -> None:
    """The changelog records of the windows table are appended by the producer flush faust
    awaits before it commits offsets (not left in faust's buffer), oldest first, also when two
    flushes overlap."""
    from gpuwarden.correlator.app import BatchedTableStore

    class Producer:
        def __init__(self) -> None:
            self.got: list[tuple[str, bytes, bytes, int]] = []

        async def send(self, topic: str, key: bytes, value: bytes, partition: int, *_: Any) -> Any:
            # the first record waits (e.g. on metadata): a later flush must not overtake it
            await asyncio.sleep(0.02 if not self.got and b"1.0" in value else 0)
            self.got.append((topic, key, value, partition))

    app = create_app(settings(), partitions=2)
    store = app.windows_store
    assert isinstance(store, BatchedTableStore)
    p = Producer()
    app.windows_table.data["n1"] = {"v": 2, "wm": 1.0, "w": {}}
    store.dirty = {"n1": 1}
    store.flush()
    first = asyncio.create_task(store.send_unsent(p))
    await asyncio.sleep(0)  # the first send is under way
    app.windows_table.data["n1"] = {"v": 2, "wm": 2.0, "w": {}}
    store.dirty = {"n1": 1}
    store.flush()
    sent = [await store.send_unsent(p), await first]
    name = app.windows_table.changelog_topic.get_topic_name()
    assert sent == [1, 1] and [(t, v, part) for t, _k, v, part in p.got] == [
        (name, b'{"v":2,"wm":1.0,"w":{}}', 1),
        (name, b'{"v":2,"wm":2.0,"w":{}}', 1),
    ]


def test_bench_cpu_figures() -> None:
    import os

    from gpuwarden.sim.bench.correlator import RunResult, cpu_seconds

    mine = cpu_seconds(os.getpid())
    assert mine is not None and mine > 0
    assert cpu_seconds(2**22 + 12345) is None  # no such process (above the default pid_max)
    assert RunResult(rate=1.0, cpu_s=11.0, per_worker=[]).cpu_per_1000(200_000) == pytest.approx(0.055)


async def test_a_window_snapshot_not_delivered_fails_the_commit_and_is_sent_again() -> None:
    """Offsets are committed only after the producer flush: a snapshot whose delivery failed
    (or whose hand-over raised) must make that flush fail and go out again with the next one,
    never be dropped while the commit goes ahead."""
    from gpuwarden.correlator.app import BatchedTableStore, ChangelogNotWritten

    class Producer:
        def __init__(self) -> None:
            self.got: list[bytes] = []
            self.fail_delivery: set[bytes] = set()
            self.refuse: set[bytes] = set()

        async def send(self, topic: str, key: bytes, value: bytes, partition: int, *_: Any) -> Any:
            if value in self.refuse:
                raise RuntimeError("buffer full")
            self.got.append(value)
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            if value in self.fail_delivery:
                fut.set_exception(RuntimeError("NotEnoughReplicas"))
            else:
                fut.set_result(None)
            return fut

    app = create_app(settings(), partitions=2)
    store = app.windows_store
    assert isinstance(store, BatchedTableStore)
    p = Producer()
    for n in ("n1", "n2", "n3"):
        app.windows_table.data[n] = {"v": 2, "wm": 1.0, "w": {}, "n": n}
    store.dirty = {"n1": 0, "n2": 1, "n3": 0}
    store.flush()
    v1, v2, v3 = (r[2] for r in store.unsent)
    p.fail_delivery = {v2}
    assert await store.send_unsent(p) == 3
    with pytest.raises(ChangelogNotWritten, match="1 window snapshot"):
        await store.check_delivered()
    assert [r[2] for r in store.unsent] == [v2]  # back in line, the others were delivered
    p.fail_delivery = set()
    assert await store.send_unsent(p) == 1
    await store.check_delivered()  # delivered now: the commit may go ahead
    assert p.got == [v1, v2, v3, v2] and store.unsent == []
    # a hand-over that raises keeps that record and the ones after it, in order
    store.dirty = {"n1": 0, "n2": 1, "n3": 0}
    store.flush()
    p.refuse = {v2}
    with pytest.raises(RuntimeError, match="buffer full"):
        await store.send_unsent(p)
    assert [r[2] for r in store.unsent] == [v2, v3]
