"""Shared test fixtures.

``kafka_bootstrap`` (session): an external ``GPUWARDEN_BOOTSTRAP_SERVERS`` if set, else a
real Apache Kafka started with ``deploy/kafka.sh`` (java present), else the embedded Tansu
broker. ``GPUWARDEN_TEST_REQUIRE_KAFKA=1`` (set by CI) makes the Tansu fallback an error,
so the integration tests provably run against Apache Kafka in CI.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.shared.brokers import ApacheKafka, TansuBroker
from gpuwarden.shared.topics import create_topics

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    external = os.environ.get("GPUWARDEN_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    script = ROOT / "deploy" / "kafka.sh"
    if ApacheKafka.available(script):
        k = ApacheKafka(script)
        addr = k.start()
        try:
            yield addr
        finally:
            k.stop()
        return
    if os.environ.get("GPUWARDEN_TEST_REQUIRE_KAFKA") == "1":
        raise RuntimeError("GPUWARDEN_TEST_REQUIRE_KAFKA=1 but Apache Kafka cannot start (java missing?)")
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
    return prefix


@pytest.fixture
def bus_env(kafka_bootstrap: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing a service at the test broker and prefix."""
    env = {"GPUWARDEN_BOOTSTRAP_SERVERS": kafka_bootstrap, "GPUWARDEN_TOPIC_PREFIX": topic_prefix}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env
