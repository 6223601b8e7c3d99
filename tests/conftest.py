"""Shared test fixtures.

``kafka_bootstrap`` (session): an external ``GPUWARDEN_BOOTSTRAP_SERVERS`` if set; else, as
``GPUWARDEN_TEST_SERVERS`` (``auto`` by default, ``containers``, ``local``; see
``tests/servers.py``) chooses, Apache Kafka in a container (testcontainers, a Docker engine) or
from the jars of ``deploy/kafka.sh`` (java present); else the embedded Tansu broker.
``GPUWARDEN_TEST_REQUIRE_KAFKA=1`` (set by CI) makes the Tansu fallback an error, so the
integration tests provably run against Apache Kafka in CI. ``docker_engine`` (session): whether
a Docker engine answers (not probed under ``GPUWARDEN_TEST_SERVERS=local``).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.shared.topics import create_topics
from gpuwarden.sim.brokers import ApacheKafka, TansuBroker
from servers import choose_kafka, docker_available, kafka_version, servers_mode

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def docker_engine() -> bool:
    """A Docker engine answers a ping (2 s at most); False without probing in ``local`` mode."""
    return servers_mode(os.environ) != "local" and docker_available()


@pytest.fixture(scope="session")
def kafka_bootstrap(docker_engine: bool) -> Iterator[str]:
    script = ROOT / "deploy" / "kafka.sh"
    choice = choose_kafka(os.environ, docker=docker_engine, java=ApacheKafka.available(script))
    if choice == "external":
        yield os.environ["GPUWARDEN_BOOTSTRAP_SERVERS"]
    elif choice == "container":
        import server_containers

        with server_containers.kafka(kafka_version(os.environ, script)) as addr:
            yield addr
    elif choice == "jars":
        k = ApacheKafka(script)
        addr = k.start()
        try:
            yield addr
        finally:
            k.stop()
    else:
        b = TansuBroker()
        addr = b.start()
        try:
            yield addr
        finally:
            b.stop()


@pytest.fixture
def topic_prefix(kafka_bootstrap: str) -> str:
    """A fresh topic prefix per test, with every registered topic created (2 partitions)."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    asyncio.run(create_topics(kafka_bootstrap, prefix, partitions=2))
    asyncio.run(_wait_for_leaders(kafka_bootstrap, prefix))
    return prefix


async def _wait_for_leaders(bootstrap: str, prefix: str, timeout_s: float = 30.0) -> None:
    """Wait until every partition of the new topics has a leader: a produce right after
    CreateTopics otherwise meets NotLeaderForPartition and retries (reordering a batch)."""
    import time

    from aiokafka import AIOKafkaClient

    from gpuwarden.shared.topics import TOPICS

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        end = time.monotonic() + timeout_s
        wanted = [spec.full(prefix) for spec in TOPICS.values()]
        while True:
            md = await client.fetch_all_metadata()
            ready = all(
                (parts := md.partitions_for_topic(name))
                and all(md.leader_for_partition(tp) not in (None, -1) for tp in _tps(name, parts))
                for name in wanted
            )
            if ready or time.monotonic() > end:
                return
            await asyncio.sleep(0.2)
    finally:
        await client.close()


def _tps(topic: str, partitions: set[int]) -> list[object]:
    from aiokafka.structs import TopicPartition

    return [TopicPartition(topic, p) for p in partitions]


@pytest.fixture
def bus_env(kafka_bootstrap: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing a service at the test broker and prefix."""
    env = {"GPUWARDEN_BOOTSTRAP_SERVERS": kafka_bootstrap, "GPUWARDEN_TOPIC_PREFIX": topic_prefix}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``prerequisites.needs(path)``: the path must exist (else the test fails, naming it)."""
    from prerequisites import need_path

    for mark in item.iter_markers("needs_path"):
        need_path(Path(mark.args[0]))
