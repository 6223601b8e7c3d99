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


def test_per_topic_partitions_and_retention_are_created_and_an_existing_topic_is_named_not_altered(
    kafka_bootstrap: str,
) -> None:
    """Issue 26, item 2: partitions and retention are settings (GPUWARDEN_TOPIC_PARTITIONS /
    GPUWARDEN_TOPIC_RETENTION_HOURS, passed by `gpuwarden topics create`)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    prefix = f"gwparts{uuid.uuid4().hex[:6]}."
    res = asyncio.run(
        create_topics(
            kafka_bootstrap,
            prefix,
            partitions_by_topic={"gpu.samples": 3, "failures": 2},
            retention_hours={"gpu.samples": 12, "failures": 2160},
        )
    )
    assert set(res.values()) == {"created"}

    async def look() -> tuple[dict[str, int], dict[str, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            names = [f"{prefix}gpu.samples", f"{prefix}gpu.events", f"{prefix}failures"]
            parts = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
            resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
            retention = {}
            for resp in await admin.describe_configs(resources):
                for res in resp.to_object()["resources"]:
                    [value] = [c["config_value"] for c in res["config_entries"] if c["config_names"] == "retention.ms"]
                    retention[res["resource_name"]] = value
            return parts, retention
        finally:
            await admin.close()

    parts, retention = asyncio.run(look())
    # gpu.events follows gpu.samples (the correlator joins them by partition); the rest keep the registry's
    assert parts == {f"{prefix}gpu.samples": 3, f"{prefix}gpu.events": 3, f"{prefix}failures": 2}
    assert asyncio.run(check_topics(kafka_bootstrap, prefix)) == []
    assert retention[f"{prefix}gpu.samples"] == str(12 * 3_600_000)
    assert retention[f"{prefix}failures"] == str(2160 * 3_600_000)
    assert retention[f"{prefix}gpu.events"] == TOPICS["gpu.events"].configs["retention.ms"]
    again = asyncio.run(create_topics(kafka_bootstrap, prefix, partitions_by_topic={"gpu.samples": 6}))
    assert again[f"{prefix}gpu.samples"].startswith("exists (3 partitions, not the 6 asked")
    assert again[f"{prefix}gpu.events"].startswith("exists (3 partitions, not the 6 asked")
    assert again[f"{prefix}failures"] == "exists"
    assert asyncio.run(look())[0][f"{prefix}gpu.samples"] == 3  # never altered
