"""The correlator's faust app: configuration and agents under faust's ``test_context()``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from unittest.mock import AsyncMock, patch

import orjson
import pytest
from faust.types import TP
from typer.testing import CliRunner

import gpuwarden.correlator as correlator
from faust_loops import close_faust_thread_loops  # noqa: F401 (fixture)
from gpuwarden.correlator.app import broker_urls, create_app
from gpuwarden.correlator.cli import app as cli_app
from gpuwarden.correlator.settings import CorrelatorSettings
from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample, JobState, NodeSample

NODE = "gpu-node-001"

pytestmark = pytest.mark.usefixtures("close_faust_thread_loops")


def settings(**kw: Any) -> CorrelatorSettings:
    return CorrelatorSettings(bootstrap_servers="h1:9092,h2:9093", topic_prefix="x.", **kw)


def test_public_names() -> None:
    missing = [name for name in correlator.__all__ if not hasattr(correlator, name)]
    assert correlator.__all__ and missing == []


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_CORRELATOR_RETENTION_S", "120")
    monkeypatch.setenv("GPUWARDEN_CORRELATOR_PARTITIONS", "2")
    monkeypatch.setenv("GPUWARDEN_CONSUMER_GROUP", "my-group")
    monkeypatch.setenv("GPUWARDEN_CORRELATOR_WINDOW_S", "30")
    monkeypatch.setenv("GPUWARDEN_CORRELATOR_WINDOW_GRACE_S", "2.5")
    s = CorrelatorSettings()
    assert (s.correlator_retention_s, s.correlator_partitions, s.app_id) == (120.0, 2, "my-group")
    assert (s.correlator_window_s, s.correlator_window_grace_s) == (30.0, 2.5)
    monkeypatch.delenv("GPUWARDEN_CONSUMER_GROUP")
    assert CorrelatorSettings().app_id == "gpuwarden-correlator"


def test_broker_urls() -> None:
    assert broker_urls("h1:9092, h2:9093") == "kafka://h1:9092;kafka://h2:9093"


def test_create_app_configuration(tmp_path: Any) -> None:
    app = create_app(settings(), partitions=2, datadir=tmp_path)
    c = app.conf
    assert c.id == "gpuwarden-correlator"
    assert [str(u) for u in c.broker] == ["kafka://h1:9092", "kafka://h2:9093"]
    assert str(c.store) == "memory:" or str(c.store).startswith("memory")
    assert c.web_enabled is False
    assert c.topic_partitions == 2
    assert c.topic_disable_leader is True
    assert c.consumer_auto_offset_reset == "earliest"
    assert c.stream_wait_empty is False
    assert c.stream_recovery_delay == 0.0
    assert c.processing_guarantee.value == "at_least_once"  # no transactions, so no idempotent producer
    assert set(app.agents) == {
        "correlate-slurm.jobs",
        "correlate-allocations",
        "correlate-gpu.samples",
        "correlate-gpu.events",
    }
    topics = {t for a in app.agents.values() for t in a.channel.topics}  # type: ignore[attr-defined]
    # gpu.attributed is produced, not consumed back: samples are windowed where they are joined.
    assert topics == {"x.slurm.jobs", "x.allocations", "x.gpu.samples", "x.gpu.events"}
    assert app.windows_table.changelog_topic.get_topic_name() == "gpuwarden-correlator-x.node-windows-changelog"
    assert app.windows_table.partitions == 2
    assert (app.core.window_s, app.core.window_grace_s) == (10.0, 5.0)
    table = app.allocations_table
    assert table.changelog_topic.get_topic_name() == "gpuwarden-correlator-x.node-allocations-changelog"
    assert table.partitions == 2
    assert not list(tmp_path.iterdir()) or (tmp_path / "v1").exists()


def test_create_app_builds_independent_apps() -> None:
    a, b = create_app(settings(), partitions=2), create_app(settings(consumer_group="other"), partitions=3)
    assert a is not b and b.conf.id == "other" and b.allocations_table.partitions == 3


@pytest.fixture
def sent() -> Iterator[list[tuple[str, bytes | None, bytes]]]:
    """Capture what the agents publish (they send through the app's producer, not Topic.send)."""
    out: list[tuple[str, bytes | None, bytes]] = []

    async def fake_send(self: Any, topic: str, key: bytes | None, value: bytes, *_: Any, **__: Any) -> Any:
        out.append((topic, key, value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    with patch("faust.transport.drivers.aiokafka.Producer.send", fake_send):
        yield out


async def test_agents_join_samples_and_events_with_the_table(sent: list[tuple[str, bytes | None, bytes]]) -> None:
    app = create_app(settings(), partitions=2)
    app.finalize()
    app.flow_control.resume()
    job = JobState(job_id="1001", ts=10, state="RUNNING", nodes=[NODE], gpus={NODE: [0, 1]}, start_ts=5)
    async with app.agents["correlate-slurm.jobs"].test_context() as agent:
        await agent.put(job.to_json(), key=b"1001")
        await agent.put(b"garbage", key=b"1002")
    [alloc] = [s for s in sent if s[0] == "x.allocations"]
    assert alloc[1] == NODE.encode()
    async with app.agents["correlate-allocations"].test_context() as agent:
        await agent.put(alloc[2], key=NODE.encode())
    assert set(app.allocations_table.get(NODE)) == {"1001"}
    # the allocations table is changelogged in batches too, with a delivery check: not through
    # faust's own buffer, whose flush gives up after 0.1 s
    allocations_changelog = app.allocations_table.changelog_topic.get_topic_name()
    assert list(app.allocations_store.dirty) == [NODE]
    assert not [x for x in sent if x[0] == allocations_changelog]
    app.sensors.on_commit_initiated(app.consumer)
    assert [(k, orjson.loads(v)) for _p, k, v in app.allocations_store.unsent] == [
        (orjson.dumps(NODE), app.allocations_table.get(NODE))
    ]

    s = NodeSample(node=NODE, ts=11, collector_id="c", source="simulated", gpus=[GpuSample(index=i) for i in range(4)])
    async with app.agents["correlate-gpu.samples"].test_context() as agent:
        await agent.put(s.to_json(), key=NODE.encode())
    ev = GpuEvent(event_id="e", node=NODE, ts=12, kind=EventKind.XID, code=79, gpu_index=1, raw="x", source="simulated")
    async with app.agents["correlate-gpu.events"].test_context() as agent:
        await agent.put(ev.to_json(), key=NODE.encode())
        await agent.put(b"{}", key=NODE.encode())

    by_topic: dict[str, list[Any]] = {}
    for name, _key, value in sent:
        by_topic.setdefault(name, []).append(
            decode(name.removeprefix("x."), value) if name != "x.allocations" else value
        )
    [att] = by_topic["x.gpu.attributed"]
    assert [(j.gpu_index, j.job_id) for j in att.jobs] == [(0, "1001"), (1, "1001")]
    [aev] = by_topic["x.gpu.events.attributed"]
    assert aev.job.job_id == "1001"
    assert [d.source_topic for d in by_topic["x.deadletter"]] == ["x.slurm.jobs", "x.gpu.events"]
    assert app.first_output_at is not None

    # The sample agent also windows what it attributes: the window closes once a later
    # sample pushes the node's watermark past its end + grace.
    assert not [s for s in sent if s[0] == "x.job.windows"]
    later = NodeSample(node=NODE, ts=30, collector_id="c", source="simulated", gpus=[GpuSample(index=0)])
    async with app.agents["correlate-gpu.samples"].test_context() as agent:
        await agent.put(later.to_json(), key=NODE.encode(), partition=1)
    assert len([s for s in sent if s[0] == "x.gpu.attributed"]) == 2
    windows = [(k, decode("job.windows", v)) for name, k, v in sent if name == "x.job.windows"]
    assert [(k, w.job_id, w.gpu_index, w.window_start, w.samples) for k, w in windows] == [
        (b"1001", "1001", 0, 10.0, 1),
        (b"1001", "1001", 1, 10.0, 1),
    ]
    assert set(app.windows_table.get(NODE)["w"]) == {"1001|0|30.0"}
    # The windows table is changelogged in batches, when a commit starts: not on every sample.
    assert app.windows_store.dirty == {NODE: 1}
    assert not [s for s in sent if "node-windows-changelog" in s[0]]
    # A commit starting snapshots them: one record per dirty node, its partition, its state as
    # JSON; the producer flush that faust awaits before committing the offsets sends them.
    state = orjson.dumps(app.windows_table.get(NODE))
    app.sensors.on_commit_initiated(app.consumer)
    key = orjson.dumps(NODE)  # the table's own key serialisation (JSON), as faust's send_changelog wrote it
    assert app.windows_store.unsent == [(1, key, state)]
    assert app.windows_store.dirty == {}
    app.sensors.on_commit_initiated(app.consumer)  # nothing changed since: nothing more
    assert len(app.windows_store.unsent) == 1
    with patch.object(app.producer.buffer, "flush", AsyncMock()):  # (the allocations table's queue: not started)
        await app.producer.flush()
    changelog = app.windows_table.changelog_topic.get_topic_name()
    assert [s for s in sent if s[0] == changelog] == [(changelog, key, state)]
    assert app.windows_store.unsent == []
    # Dirty nodes of a revoked partition are forgotten (their next owner reprocesses them).
    app.windows_store.dirty = {NODE: 1, "other": 0, "third": 2}
    app.windows_store.drop({1})
    assert app.windows_store.dirty == {"other": 0, "third": 2}
    # ... as faust's partitions-revoked signal delivers them (other topics' partitions do not count).
    await app.on_partitions_revoked.send({TP("x.gpu.samples", 0), TP("x.gpu.events", 2)})
    assert app.windows_store.dirty == {"third": 2}


def test_cli_help() -> None:
    result = CliRunner().invoke(cli_app, ["--help"])
    assert result.exit_code == 0
    assert "correlator" in result.output.lower()
