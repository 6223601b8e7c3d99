"""Services check their topics against the cluster at start (issue 13, point 2)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gpuwarden.shared.topics import TOPICS, check_topics, create_topics

pytestmark = pytest.mark.integration


def test_missing_topics_are_reported_and_created_ones_pass(kafka_bootstrap: str) -> None:
    prefix = f"gpuwarden.check{uuid.uuid4().hex[:8]}."
    missing = asyncio.run(check_topics(kafka_bootstrap, prefix))
    assert len(missing) == 1 and f"{len(TOPICS)} topics missing" in missing[0] and "topics create" in missing[0]
    asyncio.run(create_topics(kafka_bootstrap, prefix, partitions=1))
    assert asyncio.run(check_topics(kafka_bootstrap, prefix)) == []  # 1 broker: 1 replica is the plan


def test_a_wrong_prefix_stops_a_service_at_once_naming_the_right_one(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a mistyped GPUWARDEN_TOPIC_PREFIX ended after 40 s as "cannot reach Kafka"
    (UnknownTopicOrPartitionError) although Kafka answered."""
    import os
    import subprocess
    import sys
    import time

    from gpuwarden.sim.brokers import free_port

    right = f"gw{uuid.uuid4().hex[:6]}."
    asyncio.run(create_topics(kafka_bootstrap, right, partitions=1))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env = {**clean, "GPUWARDEN_BOOTSTRAP_SERVERS": kafka_bootstrap, "GPUWARDEN_TOPIC_PREFIX": right[:-2] + ".",
           "GPUWARDEN_HTTP_PORT": str(free_port())}  # fmt: skip
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "gpuwarden.detector"], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 2 and time.monotonic() - t0 < 30, out.stderr[-2000:]
    [line] = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert "none of gpuwarden's" in line and f"this cluster has them with prefix {right!r}" in line, line
