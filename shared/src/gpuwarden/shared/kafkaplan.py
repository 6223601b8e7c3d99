"""The Kafka plan a shared cluster's owner reviews before gpuwarden gets a principal.

:func:`plan_topics` lists every topic gpuwarden uses on a prefix, the internal ones included
(the correlator's changelog, the two single-publisher leases), with partitions, replication
factor, ``min.insync.replicas``, retention and the bytes per day it expects for a fleet size;
:func:`plan_acls` lists the ACLs each service principal needs, from the topic registry
(:data:`~gpuwarden.shared.topics.TOPICS`: who writes and reads each topic) and the consumer
groups and leases the services use; :func:`kafka_topics_argv` and :func:`kafka_acls_argv` give
the ``kafka-topics.sh`` / ``kafka-acls.sh`` commands (argv lists). ``gpuwarden topics plan``
prints them. Pure: nothing here talks to a broker.

Bytes per day are per replica and uncompressed (multiply by the replication factor for disk,
divide by the producer's compression ratio): message size x message rate. The sizes are
measured by the caller (``gpuwarden topics plan`` encodes simulated samples of the fleet's GPU
count when the simulation layer is installed) or default to the figures in :data:`SIZES`
(encoded 8-GPU H100 samples of the simulator, bytes; :func:`builtin_sizes` for a collector that
reads NVLinks on every Nth tick only); the rates come from the fleet size and
the collector interval for the sample topics, and from a stated assumption for the rare ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .topics import TOPICS, check_topic_overrides, copartition_group, partitions_setting, replication_plan, topic_layout

__all__ = [
    "SIZES",
    "Acl",
    "TopicPlan",
    "builtin_sizes",
    "human_bytes",
    "kafka_acls_argv",
    "kafka_topics_argv",
    "partitions_for",
    "plan_acls",
    "plan_topics",
]

#: Encoded message sizes, bytes, when the caller measures none: what ``gpuwarden topics plan``
#: measured on the simulator's 8-GPU H100 node with the NVML collector's default, 18 NVLinks'
#: state and counters on every tick.
SIZES: dict[str, float] = {
    "gpu.samples": 24_800.0,
    "gpu.attributed": 25_700.0,
    "job.windows": 750.0,
    "correlator.windows": 4_700.0,
    "gpu.events": 700.0,
    "gpu.events.attributed": 900.0,
    "slurm.jobs": 600.0,
    "slurm.nodes": 400.0,
    "slurm.watermarks": 300.0,
    "failures": 2_500.0,
    "job.reports": 6_000.0,
    "remediations": 800.0,
    "health": 900.0,
    "deadletter": 2_000.0,
    "lease": 0.0,
}
#: Bytes of those messages that are NVLink state and counters (18 links x 8 GPUs), measured with
#: :data:`SIZES`: a sample without them is 9.8 KB (see :func:`builtin_sizes`).
NVLINK_BYTES: dict[str, float] = {"gpu.samples": 15_000.0, "gpu.attributed": 15_000.0}


def builtin_sizes(nvlink_every: int = 1) -> dict[str, float]:
    """:data:`SIZES` for a collector that reads NVLinks on every ``nvlink_every``-th tick only
    (``GPUWARDEN_COLLECTOR_NVLINK_EVERY``; nvlinks absent on the other ticks): the sample topics'
    mean size, bytes.

    Raises:
        ValueError: ``nvlink_every`` < 1.
    """
    if nvlink_every < 1:
        raise ValueError(f"nvlink_every must be >= 1, got {nvlink_every}")
    return {k: v - NVLINK_BYTES.get(k, 0.0) * (nvlink_every - 1) / nvlink_every for k, v in SIZES.items()}


#: Assumed rates of the rare topics, per node per day (stated in the plan's ``basis``): events
#: and failures of a healthy fleet with a bad GPU now and then; a job per node every 2 hours.
RARE_PER_NODE_DAY: dict[str, float] = {
    "gpu.events": 2.0,
    "gpu.events.attributed": 2.0,
    "failures": 1.0,
    "remediations": 0.1,
    "health": 24.0,
    "deadletter": 0.1,
    "slurm.jobs": 36.0,
    "job.reports": 12.0,
}
DAY_S = 86_400.0


@dataclass(frozen=True)
class TopicPlan:
    """One topic of the plan: full ``name``, ``partitions``, ``replication_factor``,
    ``min_insync``, the topic ``configs`` (retention, cleanup), the expected ``messages_per_day``
    and ``bytes_per_day`` (per replica, uncompressed), ``stored_bytes`` (what it holds at steady
    state on one replica: a day's bytes x retention days; a compacted topic its latest record
    per key), ``basis`` (how they were estimated),
    ``created_by`` (``gpuwarden topics create``, or the service that creates it on first use)."""

    name: str
    short: str
    partitions: int
    replication_factor: int
    min_insync: int
    configs: dict[str, str]
    messages_per_day: float
    bytes_per_day: float
    stored_bytes: float
    basis: str
    created_by: str = "gpuwarden topics create"

    @property
    def retention_days(self) -> float | None:
        """Retention in days (None: compacted or the broker's default)."""
        ms = self.configs.get("retention.ms")
        return int(ms) / 86_400_000 if ms else None


@dataclass(frozen=True, order=True)
class Acl:
    """One ACL entry: ``principal`` may ``operation`` on ``resource_type`` (``topic``,
    ``group``, ``cluster``) ``name`` (``pattern``: ``literal`` or ``prefixed``)."""

    principal: str
    resource_type: str
    name: str
    operation: str
    pattern: str = "literal"
    why: str = field(default="", compare=False)


def _lease_topics(prefix: str, cluster: str) -> dict[str, tuple[str, str]]:
    """Lease topic name -> (service, consumer group) of the two single-publisher leases."""
    return {
        f"{prefix}slurm-watcher.lease.{cluster}": ("slurm-watcher", f"{prefix}slurm-watcher.{cluster}"),
        f"{prefix}remediator.lease.{cluster}": ("remediator", "gpuwarden-remediator-lease"),
    }


def plan_topics(
    nodes: int,
    *,
    gpus_per_node: int = 8,
    interval_s: float = 1.0,
    prefix: str = "gpuwarden.",
    brokers: int = 3,
    cluster: str = "default",
    partitions: int | None = None,
    sizes: Mapping[str, float] | None = None,
    commit_interval_s: float = 5.0,
    window_s: float = 10.0,
    size_basis: str = "default sizes (SIZES)",
    partitions_by_topic: Mapping[str, int] | None = None,
    retention_hours: Mapping[str, float] | None = None,
) -> list[TopicPlan]:
    """Every topic of ``prefix`` for a fleet of ``nodes`` GPU nodes with ``gpus_per_node`` GPUs
    sampled every ``interval_s`` s, on a cluster of ``brokers`` brokers.

    ``sizes``: encoded bytes per message by short topic name, which ``size_basis`` says how
    were found (missing ones from :data:`SIZES`, "built-in" in the basis; the sample topics'
    sizes are for ``gpus_per_node`` GPUs); ``commit_interval_s``: the
    correlator's checkpoint period (one changelog record per node each); ``window_s``: the job
    window (one job.windows record per GPU each, for GPUs in jobs: all are assumed busy);
    ``partitions_by_topic`` / ``retention_hours``: the site's per-topic settings
    (``GPUWARDEN_TOPIC_PARTITIONS`` / ``GPUWARDEN_TOPIC_RETENTION_HOURS``), which win over the plan's
    own partition count and the registry's retention.

    Raises:
        ValueError: ``nodes`` < 1, ``interval_s`` <= 0, replicas the cluster cannot hold, or a bad
            per-topic setting (:func:`~gpuwarden.shared.topics.check_topic_overrides`).
    """
    if nodes < 1 or not 0 < interval_s < math.inf or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be >= 1 and interval_s a finite number > 0")
    check_topic_overrides(partitions_by_topic, retention_hours)
    rf, isr = replication_plan(brokers)
    given = dict(sizes or {})
    size = {**SIZES, **given}
    per_s = nodes / interval_s
    rate: dict[str, tuple[float, str]] = {
        "gpu.samples": (per_s * DAY_S, f"{nodes} nodes / {interval_s:g} s"),
        "gpu.attributed": (per_s * DAY_S, "one per gpu.samples record"),
        "job.windows": (nodes * gpus_per_node * DAY_S / window_s, f"one per GPU per {window_s:g} s window"),
        "correlator.windows": (nodes * DAY_S / commit_interval_s, f"one per node per {commit_interval_s:g} s commit"),
        "slurm.nodes": (nodes * 24.0, "a snapshot per node per hour"),
        "slurm.watermarks": (DAY_S / 10.0, "one per 10 s poll"),
    }

    def _per_day(name: str) -> float:
        n = rate[name][0] if name in rate else RARE_PER_NODE_DAY.get(name, 0.0) * nodes
        return n * size[name]

    # one count for each co-partitioned group: the largest any of its topics needs (a key's
    # records of all of them are read by one worker, by partition number)
    auto = {name: max(TOPICS[name].partitions, partitions_for(_per_day(name) / DAY_S)) for name in TOPICS}
    out: list[TopicPlan] = []
    for spec in TOPICS.values():
        if spec.name in rate:
            n, basis = rate[spec.name]
        else:
            n = RARE_PER_NODE_DAY.get(spec.name, 0.0) * nodes
            basis = f"assumed {RARE_PER_NODE_DAY.get(spec.name, 0.0):g} per node per day"
        count, configs = topic_layout(spec, partitions, partitions_by_topic, retention_hours)
        if rf > 1:
            configs["min.insync.replicas"] = str(isr)
        per_day = _per_day(spec.name)
        if configs.get("cleanup.policy") == "compact":
            stored = nodes * size[spec.name]  # the latest snapshot per node
        else:
            stored = per_day * int(configs.get("retention.ms", str(7 * 86_400_000))) / 86_400_000
        need = max(auto[n] for n in copartition_group(spec.name) or (spec.name,))
        if not partitions and partitions_setting(spec.name, partitions_by_topic) is None:
            count = need  # nothing set: the plan's own count
        if count < need:
            basis += f"; {count} partitions as set, the plan alone gives {need} (1 MB/s per partition)"
        out.append(
            TopicPlan(
                name=spec.full(prefix),
                short=spec.name,
                # at least the registry's, more when one partition would carry over 1 MB/s
                partitions=count,
                replication_factor=rf,
                min_insync=isr if rf > 1 else 1,
                configs=configs,
                messages_per_day=n,
                bytes_per_day=per_day,
                stored_bytes=stored,
                basis=f"{basis}; {size[spec.name]:,.0f} B each ({size_basis if spec.name in given else 'built-in'})",
            )
        )
    for name, (service, _group) in _lease_topics(prefix, cluster).items():
        out.append(
            TopicPlan(
                name=name,
                short="lease",
                partitions=1,
                replication_factor=rf,
                min_insync=isr if rf > 1 else 1,
                configs={
                    "retention.ms": str(24 * 3600 * 1000),
                    **({"min.insync.replicas": str(isr)} if rf > 1 else {}),
                },
                messages_per_day=0.0,
                bytes_per_day=0.0,
                stored_bytes=0.0,
                basis="no records: the lease is a consumer group's membership of its one partition",
                created_by=f"{service} at first start (the replicas above), or this plan",
            )
        )
    return out


#: Consumer groups per service: (group or prefix, pattern type). Defaults of GPUWARDEN_CONSUMER_GROUP.
GROUPS: dict[str, list[tuple[str, str]]] = {
    "correlator": [("gpuwarden-correlator", "prefixed")],  # and -events for the events lane
    "detector": [("gpuwarden-detector", "prefixed")],  # and -events
    "otlp-bridge": [("gpuwarden-otlp-bridge", "prefixed")],
    "remediator": [("gpuwarden-remediator", "prefixed")],  # and -lease
}


def plan_acls(
    prefix: str = "gpuwarden.",
    *,
    principal: Mapping[str, str] | None = None,
    principal_prefix: str = "User:gpuwarden-",
    cluster: str = "default",
    services: Sequence[str] | None = None,
) -> list[Acl]:
    """The ACLs of every service principal (``principal``: service -> ``User:...``, default
    ``principal_prefix`` + the service name), least privilege:

    * WRITE on the topics it produces and READ on those it consumes (each implies DESCRIBE),
      from the registry; the dead-letter topic for every service that dead-letters;
    * DESCRIBE and DESCRIBE_CONFIGS on every topic of the prefix (the start-up topic check
      reads them all; no data);
    * READ on its consumer groups (prefixed ``gpuwarden-<service>``: the lanes' ``-events`` and
      the lease's ``-lease`` groups included), and for slurm-watcher its lease group;
    * for the two leases: READ/DESCRIBE on the lease topic (CREATE on it only if the plan's
      ``kafka-topics.sh`` lines are not run first);
    * nothing on the cluster: the idempotent producer needs WRITE on a topic (Kafka >= 2.8,
      KIP-679), not IDEMPOTENT_WRITE.

    The console and ``gpuwarden report`` read without a group; the collector and health-check
    only write.
    """
    every = {s for t in TOPICS.values() for s in (*t.producers, *t.consumers)}
    names = list(services) if services is not None else sorted(every)
    who = {s: (principal or {}).get(s, f"{principal_prefix}{s}") for s in names}
    out: set[Acl] = set()
    for s in names:
        p = who[s]
        out.add(Acl(p, "topic", prefix, "Describe", "prefixed", "start-up topic check"))
        out.add(Acl(p, "topic", prefix, "DescribeConfigs", "prefixed", "start-up topic check (min.insync.replicas)"))
        for spec in TOPICS.values():
            if s in spec.producers:
                out.add(Acl(p, "topic", spec.full(prefix), "Write", why=f"produces {spec.name}"))
            if s in spec.consumers:
                out.add(Acl(p, "topic", spec.full(prefix), "Read", why=f"consumes {spec.name}"))
        for group, pattern in GROUPS.get(s, []):
            out.add(Acl(p, "group", group, "Read", pattern, "its consumer groups (offset commits)"))
    for topic, (service, group) in _lease_topics(prefix, cluster).items():
        if service in who:
            p = who[service]
            out.add(Acl(p, "topic", topic, "Read", why="single-publisher lease"))
            out.add(Acl(p, "group", group, "Read", why="single-publisher lease membership"))
    if "detector" in who:  # the state adoption reads failures back at start
        out.add(Acl(who["detector"], "topic", f"{prefix}failures", "Read", why="adopts its open failures at start"))
    return sorted(out)


def kafka_topics_argv(plans: Sequence[TopicPlan], bootstrap: str, command: str = "kafka-topics.sh") -> list[list[str]]:
    """One ``kafka-topics.sh --create --if-not-exists`` argv per topic of ``plans``."""
    out = []
    for t in plans:
        argv = [command, "--bootstrap-server", bootstrap, "--create", "--if-not-exists", "--topic", t.name,
                "--partitions", str(t.partitions), "--replication-factor", str(t.replication_factor)]  # fmt: skip
        for k, v in sorted(t.configs.items()):
            argv += ["--config", f"{k}={v}"]
        out.append(argv)
    return out


def kafka_acls_argv(acls: Sequence[Acl], bootstrap: str, command: str = "kafka-acls.sh") -> list[list[str]]:
    """One ``kafka-acls.sh --add`` argv per (principal, resource, pattern), its operations together."""
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for a in acls:
        grouped.setdefault((a.principal, a.resource_type, a.name, a.pattern), []).append(a.operation)
    out = []
    for (p, rtype, name, pattern), ops in grouped.items():
        argv = [command, "--bootstrap-server", bootstrap, "--add", "--allow-principal", p]
        for op in sorted(set(ops)):
            argv += ["--operation", op]
        argv += [f"--{rtype}", name, "--resource-pattern-type", pattern]
        out.append(argv)
    return out


def human_bytes(n: float) -> str:
    """``n`` bytes as B/KB/MB/GB/TB (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def partitions_for(bytes_per_s: float, mb_per_partition_s: float = 1.0) -> int:
    """Partitions a topic of ``bytes_per_s`` wants at ``mb_per_partition_s`` MB/s per partition."""
    return max(1, math.ceil(bytes_per_s / (mb_per_partition_s * 1e6)))
