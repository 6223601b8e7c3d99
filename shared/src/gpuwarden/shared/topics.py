"""Topic registry: every gpuwarden topic with its key, value model, partitions and configs.

Topics are created explicitly (never by broker auto-create) with :func:`create_topics`.
Names carry a configurable prefix (default ``gpuwarden.``), see ``GPUWARDEN_TOPIC_PREFIX``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.protocol.metadata import MetadataRequest
from pydantic import BaseModel

from . import models as m

log = logging.getLogger(__name__)

__all__ = [
    "COPARTITIONED",
    "COPARTITION_GROUPS",
    "MAX_RETENTION_MS",
    "TOPICS",
    "TopicSpec",
    "TopicsMissing",
    "check_topic_overrides",
    "check_topics",
    "copartition_group",
    "create_topics",
    "low_min_insync",
    "partitions_setting",
    "prefix_hint",
    "replication_plan",
    "topic",
    "topic_layout",
]


@dataclass(frozen=True)
class TopicSpec:
    """One topic: short name (without prefix), message key, value model, partitions, configs,
    and the services (``services/<name>``) that write it (``producers``) and read it
    (``consumers``); docs/architecture.md's topics table is generated from them."""

    name: str
    key: str
    model: type[BaseModel] | None
    partitions: int
    description: str
    configs: dict[str, str] = field(default_factory=dict)
    producers: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    #: The service that dead-letters a record of this topic outside its contract (schema or
    #: :mod:`gpuwarden.shared.contract`): the first that reads it. Other readers drop such a
    #: record and count it, so it is dead-lettered once. ``None``: every reader dead-letters (a
    #: topic with one reader, or written only by gpuwarden's own validated outputs); ``"none"``:
    #: nobody (every worker reads the topic whole, so each logs and counts a bad record instead).
    edge: str | None = None

    def full(self, prefix: str) -> str:
        """The topic's name on the broker: ``prefix + name``."""
        return f"{prefix}{self.name}"


_WEEK_MS = str(7 * 24 * 3600 * 1000)
_DAY_MS = str(24 * 3600 * 1000)

TOPICS: dict[str, TopicSpec] = {
    t.name: t
    for t in [
        TopicSpec(
            "gpu.samples",
            "node",
            m.NodeSample,
            6,
            "one NodeSample per node per tick",
            {"retention.ms": _DAY_MS},
            producers=("collector",),
            consumers=("correlator",),
            edge="correlator",
        ),
        TopicSpec(
            "gpu.events",
            "node",
            m.GpuEvent,
            6,
            "XID/SXID/NVLink/ECC events, never sampled",
            {"retention.ms": _WEEK_MS},
            producers=("collector",),
            consumers=("correlator", "detector"),
            edge="correlator",
        ),
        TopicSpec(
            "slurm.jobs",
            "job id",
            m.JobState,
            6,
            "job state changes and snapshots",
            {"retention.ms": _WEEK_MS},
            producers=("slurm-watcher",),
            consumers=("correlator", "detector", "console"),
            edge="detector",
        ),
        TopicSpec(
            "slurm.nodes",
            "node",
            m.NodeState,
            6,
            "node state changes and snapshots",
            {"retention.ms": _WEEK_MS},
            producers=("slurm-watcher",),
            consumers=("detector", "otlp-bridge", "remediator", "console"),
            edge="detector",
        ),
        TopicSpec(
            "slurm.watermarks",
            "cluster",
            m.SlurmWatermark,
            1,
            "how far Slurm's view on slurm.jobs is complete (event time + offsets), every poll",
            {"retention.ms": _DAY_MS},
            producers=("slurm-watcher",),
            consumers=("correlator",),
            edge="none",
        ),
        TopicSpec(
            "correlator.windows",
            "node",
            None,
            6,
            "internal: the correlator's per-node open windows (its changelog, compacted)",
            {"cleanup.policy": "compact", "segment.ms": str(3600 * 1000)},
            producers=("correlator",),
            consumers=("correlator",),
        ),
        TopicSpec(
            "gpu.attributed",
            "node",
            m.AttributedSample,
            6,
            "NodeSample + job per GPU",
            {"retention.ms": _DAY_MS},
            producers=("correlator",),
            consumers=("detector", "otlp-bridge"),
        ),
        TopicSpec(
            "gpu.events.attributed",
            "node",
            m.AttributedEvent,
            6,
            "GpuEvent + job of its GPU",
            {"retention.ms": _WEEK_MS},
            producers=("correlator",),
            consumers=("detector", "otlp-bridge"),
        ),
        TopicSpec(
            "job.windows",
            "job id",
            m.JobWindow,
            6,
            "per-window summary per (node, gpu) of a job",
            {"retention.ms": _DAY_MS},
            producers=("correlator",),
            consumers=("detector", "console"),
        ),
        TopicSpec(
            "failures",
            "node",
            m.Failure,
            6,
            "named failures: the public contract",
            {"retention.ms": _WEEK_MS},
            producers=("detector",),
            consumers=("otlp-bridge", "remediator", "console"),
        ),
        TopicSpec(
            "job.reports",
            "job id",
            m.JobReport,
            3,
            "job verdicts: where a job's GPU-hours went, why, what it cost",
            {"retention.ms": str(30 * 24 * 3600 * 1000)},
            producers=("detector",),
            consumers=("console",),
        ),
        TopicSpec(
            "remediations",
            "node",
            m.Remediation,
            3,
            "audit trail of remediation decisions",
            {"retention.ms": _WEEK_MS},
            producers=("remediator",),
            consumers=("otlp-bridge", "remediator", "console"),
        ),
        TopicSpec(
            "health",
            "node",
            m.HealthCheckResult,
            6,
            "prolog/epilog health check results",
            {"retention.ms": _WEEK_MS},
            producers=("health-check",),
            consumers=("detector", "remediator"),
            edge="detector",
        ),
        TopicSpec(
            "deadletter",
            "source topic",
            m.DeadLetter,
            1,
            "messages no service could process",
            {"retention.ms": _WEEK_MS},
            producers=("correlator", "detector", "otlp-bridge", "remediator"),
            consumers=(),
        ),
    ]
}


def topic(name: str, prefix: str = "gpuwarden.") -> str:
    """Full topic name for a registered short name.

    Raises:
        KeyError: ``name`` is not a registered topic.
    """
    return TOPICS[name].full(prefix)


def replication_plan(
    brokers: int, replication_factor: int | None = None, min_insync: int | None = None
) -> tuple[int, int]:
    """``(replication factor, min.insync.replicas)`` for a cluster of ``brokers`` brokers. Pure.

    Default: 3 replicas and ``min.insync.replicas=2`` when the cluster has >= 3 brokers (a
    write with ``acks=all`` then survives one broker down and is on 2 brokers when
    confirmed), otherwise one replica per broker and ``min.insync.replicas=1``.

    Raises:
        ValueError: more replicas than brokers, ``min_insync`` above the replication factor,
            or values below 1.
    """
    if brokers < 1:
        raise ValueError("the cluster reports no brokers")
    rf = replication_factor if replication_factor is not None else (3 if brokers >= 3 else brokers)
    if rf < 1:
        raise ValueError(f"replication factor must be >= 1, got {rf}")
    if rf > brokers:
        raise ValueError(f"replication factor {rf} needs at least {rf} brokers; the cluster has {brokers}")
    isr = min_insync if min_insync is not None else (2 if rf >= 3 else 1)
    if not 1 <= isr <= rf:
        raise ValueError(f"min.insync.replicas must be 1..{rf} (the replication factor), got {isr}")
    return rf, isr


#: Topics that keep one partition count, by the key they share: a key's partition number is
#: then the same in each (one partitioner), and a worker gets a key's records of all of them
#: (:class:`~gpuwarden.shared.bus.assignor.AffinityAssignor`, also across a service's consumer
#: groups). ``node``: the correlator finds a node's changelog partition and events by its
#: samples' partition (it will not start when ``gpu.samples`` and ``correlator.windows``
#: differ), and the detector's two lanes read a node's samples, events, node state and health
#: checks on one worker. ``job``: a job's windows and its Slurm states meet on one detector
#: worker (its verdict needs both).
COPARTITION_GROUPS: dict[str, tuple[str, ...]] = {
    "node": (
        "gpu.samples",
        "gpu.events",
        "correlator.windows",
        "gpu.attributed",
        "gpu.events.attributed",
        "slurm.nodes",
        "health",
    ),
    "job": ("slurm.jobs", "job.windows"),
}
#: The node-keyed group of :data:`COPARTITION_GROUPS`.
COPARTITIONED: tuple[str, ...] = COPARTITION_GROUPS["node"]


def copartition_group(name: str) -> tuple[str, ...]:
    """The :data:`COPARTITION_GROUPS` entry holding short topic name ``name`` (empty when none)."""
    return next((g for g in COPARTITION_GROUPS.values() if name in g), ())


#: Largest ``retention.ms`` Kafka takes (a Java long), ms.
MAX_RETENTION_MS = 2**63 - 1


def check_topic_overrides(
    partitions: Mapping[str, int] | None = None, retention_hours: Mapping[str, float] | None = None
) -> None:
    """Check per-topic partitions and retention (``GPUWARDEN_TOPIC_PARTITIONS``,
    ``GPUWARDEN_TOPIC_RETENTION_HOURS``): keys are registered short names (``gpu.samples``);
    partitions an integer 1-10,000, one count for the :data:`COPARTITIONED` topics it names;
    retention a finite number of hours that is at least 1 ms and at most Kafka's largest,
    only on a topic that is not compacted.

    Raises:
        ValueError: naming every bad key or value (an unknown name with the closest known one).
    """
    import difflib

    bad: list[str] = []
    for what, mapping in (("partitions", partitions or {}), ("retention", retention_hours or {})):
        for name, value in mapping.items():
            spec = TOPICS.get(name)
            if spec is None:
                near = difflib.get_close_matches(name.removeprefix("gpuwarden."), list(TOPICS), n=1)
                bad.append(f"{what} of unknown topic {name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
            elif isinstance(value, bool) or not isinstance(value, int | float):
                bad.append(f"{what} of {name} must be a number, got {value!r}")
            elif what == "partitions" and (not isinstance(value, int) or not 1 <= value <= 10_000):
                bad.append(f"partitions of {name} must be a whole number 1-10000, got {value!r}")
            elif what == "retention" and not (
                math.isfinite(value) and 1 <= round(value * 3_600_000) <= MAX_RETENTION_MS
            ):
                bad.append(f"retention of {name} must be a finite number of hours, 1 ms to 2^63-1 ms, got {value!r}")
            elif what == "retention" and spec.configs.get("cleanup.policy") == "compact":
                bad.append(f"{name} is compacted (its latest record per key is kept): it has no retention to set")
    for members in COPARTITION_GROUPS.values():
        group = {n: c for n, c in (partitions or {}).items() if n in members}
        if len(set(group.values())) > 1:
            bad.append(
                f"{', '.join(members)} must have one partition count (a key's records of all of them are read "
                f"by one worker, by partition number), got {group}: name one of them"
            )
    if bad:
        raise ValueError("; ".join(bad))


def topic_layout(
    spec: TopicSpec,
    partitions: int | None = None,
    partitions_by_topic: Mapping[str, int] | None = None,
    retention_hours: Mapping[str, float] | None = None,
) -> tuple[int, dict[str, str]]:
    """Partitions and configs a topic is created with. Partitions: ``partitions`` (one count for
    every topic: ``topics create --partitions``, tests, small brokers), else the per-topic
    setting (for a topic of :data:`COPARTITION_GROUPS`, the count any of its group is given), else the
    registry's. Configs: the registry's, with ``retention.ms`` from ``retention_hours`` where it
    names the topic."""
    n = partitions or partitions_setting(spec.name, partitions_by_topic) or spec.partitions
    configs = dict(spec.configs)
    hours = (retention_hours or {}).get(spec.name)
    if hours is not None:
        configs["retention.ms"] = str(round(hours * 3_600_000))
    return n, configs


def partitions_setting(name: str, partitions_by_topic: Mapping[str, int] | None) -> int | None:
    """The per-topic partition count that applies to ``name`` (its group's, for a co-partitioned topic)."""
    by = partitions_by_topic or {}
    return next((by[n] for n in copartition_group(name) or (name,) if n in by), None)


async def create_topics(
    bootstrap_servers: str,
    prefix: str = "gpuwarden.",
    partitions: int | None = None,
    replication_factor: int | None = None,
    with_configs: bool = True,
    *,
    min_insync_replicas: int | None = None,
    client_kwargs: dict[str, Any] | None = None,
    partitions_by_topic: Mapping[str, int] | None = None,
    retention_hours: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """Create every registered topic that does not exist yet; check the ones that do.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the broker.
        prefix: topic name prefix.
        partitions: override the registry's partition count (tests, small brokers).
        replication_factor: replicas per partition; None: see :func:`replication_plan`
            (3 on a cluster of >= 3 brokers).
        with_configs: send per-topic configs (Tansu ignores most of them).
        min_insync_replicas: ``min.insync.replicas`` of the new topics (None: 2 with >= 3 replicas).
        client_kwargs: security settings of the admin client (``BusSettings.kafka_kwargs()``).
        partitions_by_topic: partitions per short topic name (``GPUWARDEN_TOPIC_PARTITIONS``);
            ``partitions`` wins over it; see :func:`topic_layout`.
        retention_hours: retention per short topic name (``GPUWARDEN_TOPIC_RETENTION_HOURS``), h.

    Returns:
        ``{full topic name: "created" | "exists" | "exists (N replicas, fewer than R)" |
        "exists (N partitions, not the M asked: ...)"}``. An existing topic is never altered.

    Raises:
        ValueError: a replication factor the cluster cannot hold, or a bad per-topic setting.
        aiokafka.errors.KafkaError: the broker is unreachable or refused a topic.
    """
    from .bus.clients import kafka_admin

    check_topic_overrides(partitions_by_topic, retention_hours)
    admin = kafka_admin({**(client_kwargs or {}), "bootstrap_servers": bootstrap_servers}, request_timeout_ms=15000)
    await admin.start()
    result: dict[str, str] = {}
    try:
        cluster = await admin.describe_cluster()
        rf, isr = replication_plan(len(cluster.get("brokers", [])) or 1, replication_factor, min_insync_replicas)
        existing = set(await admin.list_topics())
        mine = [spec.full(prefix) for spec in TOPICS.values() if spec.full(prefix) in existing]
        have: dict[str, tuple[int, int]] = {}  # full name -> (fewest replicas, partitions)
        if mine:
            for t in await admin.describe_topics(mine):
                parts = t.get("partitions") or []
                have[t["topic"]] = (min((len(p.get("replicas") or []) for p in parts), default=0), len(parts))
        new = []
        for spec in TOPICS.values():
            full = spec.full(prefix)
            count, layout = topic_layout(spec, partitions, partitions_by_topic, retention_hours)
            if full in existing:
                n, parts_now = have.get(full, (rf, count))
                notes = [] if n >= rf else [f"{n} replicas, fewer than {rf}"]
                if partitions_setting(spec.name, partitions_by_topic) is not None and parts_now != count:
                    notes.append(
                        f"{parts_now} partitions, not the {count} asked: an existing topic is not altered; "
                        "more partitions move keys between them"
                    )
                result[full] = f"exists ({'; '.join(notes)})" if notes else "exists"
                continue
            configs = layout if with_configs else {}
            if with_configs and rf > 1:
                configs["min.insync.replicas"] = str(isr)
            new.append(
                NewTopic(
                    name=full,
                    num_partitions=count,
                    replication_factor=rf,
                    topic_configs=configs,
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
            nodes = [b["node_id"] for b in cluster.get("brokers", [])]
            await _wait_known(admin, [t.name for t in new], nodes)
    finally:
        await admin.close()
    return result


async def _wait_known(admin: AIOKafkaAdminClient, names: list[str], nodes: list[int], timeout_s: float = 30.0) -> None:
    """Wait (up to ``timeout_s``) until every broker in ``nodes`` answers metadata for each new
    topic with a leader for every partition: a client that starts right after
    :func:`create_topics` then never gets "unknown topic" from a broker that lags behind."""
    end = time.monotonic() + timeout_s
    for node in nodes:
        while True:
            resp = (await admin._send_request_to_node(node, MetadataRequest(names))).to_object()
            known = {t["topic"] for t in resp["topics"] if t["error_code"] == 0 and t["partitions"]
                     and all(p["error_code"] == 0 and p["leader"] >= 0 for p in t["partitions"])}  # fmt: skip
            if known >= set(names) or time.monotonic() > end:
                break
            await asyncio.sleep(0.1)


class TopicsMissing(ValueError):
    """None of gpuwarden's topics exists with the configured prefix (a wrong
    ``GPUWARDEN_TOPIC_PREFIX``, or ``gpuwarden topics create`` never ran): nothing could work."""


def prefix_hint(existing: set[str], prefix: str) -> str:
    """``" (this cluster has them with prefix 'x.')"`` when the registered topics (half of them
    at least) exist under another prefix (the closest to ``prefix`` when several do), else ``""``."""
    found = sorted({name[: -len(spec.name)] for spec in TOPICS.values() for name in existing
                    if name.endswith(spec.name) and name != spec.full(prefix)})  # fmt: skip
    import difflib

    counts = {p: sum(1 for spec in TOPICS.values() if spec.full(p) in existing) for p in found}
    full = [p for p, n in counts.items() if n >= len(TOPICS) // 2]
    near = difflib.get_close_matches(prefix, full, n=1, cutoff=0.5) or sorted(full)[:1]
    return f" (this cluster has them with prefix {near[0]!r})" if near else ""


def low_min_insync(responses: list[dict[str, Any]], isr: int) -> list[str]:
    """One sentence per topic whose ``min.insync.replicas`` is below ``isr``, from aiokafka's
    ``DescribeConfigsResponse.to_object()`` dicts (``resources`` -> ``config_entries``)."""
    out = []
    for r in responses:
        for res in r.get("resources", []):
            for c in res.get("config_entries", []):
                if c.get("config_names") == "min.insync.replicas" and int(c.get("config_value") or 1) < isr:
                    out.append(
                        f"{res.get('resource_name')}: min.insync.replicas={c.get('config_value')}, "
                        f"below {isr}: an acks=all write would be confirmed by fewer brokers"
                    )
    return out


async def check_topics(
    bootstrap_servers: str,
    prefix: str = "gpuwarden.",
    *,
    client_kwargs: dict[str, Any] | None = None,
    timeout_ms: int = 10000,
    none_is_fatal: bool = False,
) -> list[str]:
    """What is wrong with this prefix's topics on the cluster, checked at a service's start.

    For each registered topic: missing (create them with ``gpuwarden topics create``), fewer
    replicas than :func:`replication_plan` gives for the cluster's broker count, or a
    ``min.insync.replicas`` below the plan's (an ``acks=all`` write would then be confirmed by
    one broker). A broker that does not answer the config query (the embedded Tansu) skips
    that part of the check.

    Returns:
        One sentence per problem; empty when the topics are as planned.

    Raises:
        aiokafka.errors.KafkaError: the cluster is unreachable.
        TopicsMissing: with ``none_is_fatal``, when not one registered topic exists on the
            prefix for 15 s (a broker may learn of topics created a moment ago late; the message
            names the prefix, and the one the cluster has them under).
    """
    from .bus.clients import kafka_admin

    admin = kafka_admin(
        {**(client_kwargs or {}), "bootstrap_servers": bootstrap_servers}, request_timeout_ms=timeout_ms
    )
    await admin.start()
    problems: list[str] = []
    try:
        cluster = await admin.describe_cluster()
        brokers = len(cluster.get("brokers", [])) or 1
        rf, isr = replication_plan(brokers)
        existing = set(await admin.list_topics())
        names = [spec.full(prefix) for spec in TOPICS.values()]
        missing = [n for n in names if n not in existing]
        end = time.monotonic() + 15.0
        while none_is_fatal and len(missing) == len(names) and time.monotonic() < end:
            # topics created a moment ago may not have reached the broker that answered yet
            await asyncio.sleep(1.0)
            existing = set(await admin.list_topics())
            missing = [n for n in names if n not in existing]
        if none_is_fatal and len(missing) == len(names):
            # absent, or only hidden from a principal without DESCRIBE? the broker says which
            [desc] = await admin.describe_topics([names[0]])
            if desc.get("error_code") == 29:  # TOPIC_AUTHORIZATION_FAILED
                from aiokafka.errors import TopicAuthorizationFailedError

                raise TopicAuthorizationFailedError(f"this principal may not DESCRIBE the topics of {prefix!r}")
            raise TopicsMissing(
                f"none of gpuwarden's {len(names)} topics exists with prefix {prefix!r} on {bootstrap_servers}"
                f"{prefix_hint(existing, prefix)}: check GPUWARDEN_TOPIC_PREFIX, or create them with "
                "`gpuwarden topics create` (or the lines of `gpuwarden topics plan`)"
            )
        if missing:
            problems.append(
                f"{len(missing)} topics missing ({', '.join(missing[:4])}...): run `gpuwarden topics create`"
            )
        present = [n for n in names if n in existing]
        if not present:
            return problems
        counts: dict[str, int] = {}
        for t in await admin.describe_topics(present):
            parts = t.get("partitions") or []
            counts[t["topic"]] = len(parts)
            n = min((len(p.get("replicas") or []) for p in parts), default=0)
            if n < rf:
                problems.append(f"{t['topic']}: {n} replicas, fewer than {rf} on a {brokers}-broker cluster")
        for key, members in COPARTITION_GROUPS.items():
            group = {n: counts[prefix + n] for n in members if prefix + n in counts}
            if len(set(group.values())) > 1:
                problems.append(
                    f"{', '.join(members)} have different partition counts {group}: a {key}'s records of them "
                    "no longer meet on one worker (the correlator will not start when gpu.samples and "
                    "correlator.windows differ; the detector's lanes read one node on two workers). gpuwarden "
                    "never alters a topic: raise the smaller ones with kafka-topics.sh --alter --partitions N "
                    "(their keys move to other partitions once), or create new ones with one count "
                    "(GPUWARDEN_TOPIC_PARTITIONS)"
                )
        if rf > 1:
            try:
                from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

                resp = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in present])
                problems += low_min_insync([r.to_object() for r in resp], isr)
            except Exception as exc:  # an optional part of the check (Tansu does not answer it)
                log.debug("min.insync.replicas not checked: %s: %s", type(exc).__name__, exc)
    finally:
        await admin.close()
    return problems
