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
