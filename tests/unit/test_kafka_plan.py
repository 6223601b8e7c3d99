"""``gpuwarden topics plan`` (issue 26, item 2): every topic with its sizing, and least-privilege
ACLs per service principal derived from the topic registry."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from gpuwarden.shared.cli import app
from gpuwarden.shared.kafkaplan import kafka_acls_argv, kafka_topics_argv, plan_acls, plan_topics
from gpuwarden.shared.topics import TOPICS


def test_every_topic_is_planned_with_the_leases_and_replicas_of_the_cluster() -> None:
    plans = {p.name: p for p in plan_topics(1000, brokers=3, cluster="c1")}
    assert {f"gpuwarden.{n}" for n in TOPICS} | {
        "gpuwarden.slurm-watcher.lease.c1",
        "gpuwarden.remediator.lease.c1",
    } == set(plans)
    assert {(p.replication_factor, p.min_insync) for p in plans.values()} == {(3, 2)}
    assert all(p.partitions >= TOPICS[p.short].partitions for p in plans.values() if p.short in TOPICS)
    one = plan_topics(10, brokers=1)
    assert {(p.replication_factor, p.min_insync) for p in one} == {(1, 1)}
    assert all("min.insync.replicas" not in p.configs for p in one)


def test_volume_scales_with_the_fleet_and_the_samples_dominate() -> None:
    small = {p.short: p for p in plan_topics(100, sizes={"gpu.samples": 10_000.0})}
    big = {p.short: p for p in plan_topics(1000, sizes={"gpu.samples": 10_000.0})}
    assert small["gpu.samples"].bytes_per_day == 100 * 86_400 * 10_000.0
    assert big["gpu.samples"].bytes_per_day == pytest.approx(10 * small["gpu.samples"].bytes_per_day)
    assert big["gpu.samples"].partitions == 10  # 10 MB/s at 1 MB/s per partition
    assert small["gpu.samples"].partitions == TOPICS["gpu.samples"].partitions
    # the compacted changelog holds one snapshot per node, not a day of them
    cl = big["correlator.windows"]
    assert cl.configs["cleanup.policy"] == "compact" and cl.stored_bytes < cl.bytes_per_day / 1000
    assert max(big.values(), key=lambda p: p.bytes_per_day).short in {"gpu.samples", "gpu.attributed"}
    with pytest.raises(ValueError):
        plan_topics(0)


def test_acls_are_least_privilege_and_follow_the_registry() -> None:
    acls = plan_acls("gw.", cluster="c1")
    by = {(a.principal, a.resource_type, a.name, a.operation) for a in acls}
    for spec in TOPICS.values():
        for s in spec.producers:
            assert (f"User:gpuwarden-{s}", "topic", f"gw.{spec.name}", "Write") in by, (s, spec.name)
        for s in spec.consumers:
            assert (f"User:gpuwarden-{s}", "topic", f"gw.{spec.name}", "Read") in by, (s, spec.name)
    writes = {(a.principal, a.name) for a in acls if a.operation == "Write"}
    allowed = {(f"User:gpuwarden-{s}", f"gw.{t.name}") for t in TOPICS.values() for s in t.producers}
    assert writes == allowed  # nobody writes what the registry does not say it writes
    assert not [a for a in acls if a.resource_type == "cluster" or a.operation in ("All", "Create", "Alter")]
    assert ("User:gpuwarden-collector", "topic", "gw.gpu.samples", "Read") not in by
    assert ("User:gpuwarden-slurm-watcher", "group", "gw.slurm-watcher.c1", "Read") in by  # its lease
    assert ("User:gpuwarden-remediator", "topic", "gw.remediator.lease.c1", "Read") in by


def test_commands_are_argv_lists_with_every_config() -> None:
    [t] = [c for c in kafka_topics_argv(plan_topics(10), "k:9092") if "gpuwarden.correlator.windows" in c]
    assert t[:3] == ["kafka-topics.sh", "--bootstrap-server", "k:9092"]
    assert "cleanup.policy=compact" in t and t[t.index("--partitions") + 1] == "6"
    acl = kafka_acls_argv(plan_acls(principal_prefix="User:svc-"), "k:9092")
    det = [c for c in acl if "User:svc-detector" in c and "gpuwarden.failures" in c]
    assert det and det[0].count("--operation") == 2 and {"Read", "Write"} <= set(det[0])  # adopt + produce


def test_the_command_prints_the_plan_and_json() -> None:
    r = CliRunner().invoke(app, ["topics", "plan", "--nodes", "1000"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "gpuwarden.gpu.samples" in r.output and "total:" in r.output and "kafka-acls.sh" in r.output
    r = CliRunner().invoke(app, ["topics", "plan", "--nodes", "10", "--json"])
    doc = orjson.loads(r.output)
    assert {t["short"] for t in doc["topics"]} >= set(TOPICS) and doc["kafka_acls"] and doc["gzip_ratio"] > 1


def test_the_shipped_services_compress_with_zstd() -> None:
    """Issue 26: compression on in what is shipped (env files, compose); the codec library is installed."""
    from pathlib import Path

    from aiokafka.codec import has_zstd

    from gpuwarden.shared.settings import BusSettings

    root = Path(__file__).resolve().parents[2]
    assert has_zstd() and BusSettings(producer_compression="ZSTD").producer_compression == "zstd"
    for env in ("collector", "correlator", "detector", "otlp-bridge", "remediator", "slurm-watcher"):
        assert "GPUWARDEN_PRODUCER_COMPRESSION=zstd" in (root / "deploy" / "systemd" / f"{env}.env").read_text()
    assert "GPUWARDEN_PRODUCER_COMPRESSION: zstd" in (root / "docker-compose.yml").read_text()


def test_the_compression_variable_is_a_known_bus_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwarden.shared.settings import BusSettings

    monkeypatch.setenv("GPUWARDEN_PRODUCER_COMPRESSION", "lz4")
    assert BusSettings().producer_compression == "lz4"
