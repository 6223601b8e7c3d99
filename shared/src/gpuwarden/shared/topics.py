"""Topic registry: every gpuwarden topic with its key, value model, partitions and configs.

Topics are created explicitly (never by broker auto-create) with :func:`create_topics`.
Names carry a configurable prefix (default ``gpuwarden.``), see ``GPUWARDEN_TOPIC_PREFIX``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from pydantic import BaseModel

from . import models as m

__all__ = ["TOPICS", "TopicSpec", "create_topics", "topic"]


@dataclass(frozen=True)
class TopicSpec:
    """One topic: short name (without prefix), message key, value model, partitions, configs."""

    name: str
    key: str
    model: type[BaseModel] | None
    partitions: int
    description: str
    configs: dict[str, str] = field(default_factory=dict)

    def full(self, prefix: str) -> str:
        """The topic's name on the broker: ``prefix + name``."""
        return f"{prefix}{self.name}"


_WEEK_MS = str(7 * 24 * 3600 * 1000)
_DAY_MS = str(24 * 3600 * 1000)

TOPICS: dict[str, TopicSpec] = {
    t.name: t
    for t in [
        TopicSpec(
            "gpu.samples", "node", m.NodeSample, 6, "one NodeSample per node per tick", {"retention.ms": _DAY_MS}
        ),
        TopicSpec(
            "gpu.events", "node", m.GpuEvent, 6, "XID/SXID/NVLink/ECC events, never sampled", {"retention.ms": _WEEK_MS}
        ),
        TopicSpec("slurm.jobs", "job id", m.JobState, 6, "job state changes and snapshots", {"retention.ms": _WEEK_MS}),
        TopicSpec(
            "slurm.nodes", "node", m.NodeState, 6, "node state changes and snapshots", {"retention.ms": _WEEK_MS}
        ),
        TopicSpec(
            "allocations", "node", None, 6, "internal: slurm.jobs repartitioned by node", {"retention.ms": _WEEK_MS}
        ),
        TopicSpec(
            "gpu.attributed", "node", m.AttributedSample, 6, "NodeSample + job per GPU", {"retention.ms": _DAY_MS}
        ),
        TopicSpec(
            "gpu.events.attributed",
            "node",
            m.AttributedEvent,
            6,
            "GpuEvent + job of its GPU",
            {"retention.ms": _WEEK_MS},
        ),
        TopicSpec(
            "job.windows",
            "job id",
            m.JobWindow,
            6,
            "per-window summary per (node, gpu) of a job",
            {"retention.ms": _DAY_MS},
        ),
        TopicSpec("failures", "node", m.Failure, 6, "named failures: the public contract", {"retention.ms": _WEEK_MS}),
        TopicSpec(
            "remediations", "node", m.Remediation, 3, "audit trail of remediation decisions", {"retention.ms": _WEEK_MS}
        ),
        TopicSpec(
            "health", "node", m.HealthCheckResult, 3, "prolog/epilog health check results", {"retention.ms": _WEEK_MS}
        ),
        TopicSpec(
            "deadletter",
            "source topic",
            m.DeadLetter,
            1,
            "messages no service could process",
            {"retention.ms": _WEEK_MS},
        ),
    ]
}


def topic(name: str, prefix: str = "gpuwarden.") -> str:
    """Full topic name for a registered short name.

    Raises:
        KeyError: ``name`` is not a registered topic.
    """
    return TOPICS[name].full(prefix)


async def create_topics(
    bootstrap_servers: str,
    prefix: str = "gpuwarden.",
    partitions: int | None = None,
    replication_factor: int = 1,
    with_configs: bool = True,
) -> dict[str, str]:
    """Create every registered topic that does not exist yet.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the broker.
        prefix: topic name prefix.
        partitions: override the registry's partition count (tests, small brokers).
        replication_factor: replicas per partition.
        with_configs: send per-topic configs (Tansu ignores most of them).

    Returns:
        ``{full topic name: "created" | "exists"}``.

    Raises:
        aiokafka.errors.KafkaError: the broker is unreachable or refused a topic.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=15000)
    await admin.start()
    result: dict[str, str] = {}
    try:
        existing = set(await admin.list_topics())
        new = []
        for spec in TOPICS.values():
            full = spec.full(prefix)
            if full in existing:
                result[full] = "exists"
                continue
            new.append(
                NewTopic(
                    name=full,
                    num_partitions=partitions or spec.partitions,
                    replication_factor=replication_factor,
                    topic_configs=dict(spec.configs) if with_configs else {},
                )
            )
            result[full] = "created"
        if new:
            try:
                resp = await admin.create_topics(new)
            except TopicAlreadyExistsError:
                resp = None
            errors = getattr(resp, "topic_errors", None) or getattr(resp, "topic_error_codes", None) or []
            for err in errors:
                name, code = err[0], err[1]
                if code == 36:  # TOPIC_ALREADY_EXISTS: another process raced us
                    result[name] = "exists"
                elif code:
                    raise RuntimeError(f"broker refused topic {name}: error code {code} {err[2:]}")
    finally:
        await admin.close()
    return result
