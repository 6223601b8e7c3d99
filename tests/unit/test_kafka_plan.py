"""``gpuwarden topics plan`` (issue 26, item 2): every topic with its sizing, and least-privilege
ACLs per service principal derived from the topic registry."""

from __future__ import annotations

import re

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
    alone = {p.short: p for p in plan_topics(1000, sizes={"gpu.samples": 10_000.0, "gpu.attributed": 1.0})}
    assert small["gpu.samples"].bytes_per_day == 100 * 86_400 * 10_000.0
    assert big["gpu.samples"].bytes_per_day == pytest.approx(10 * small["gpu.samples"].bytes_per_day)
    assert alone["gpu.samples"].partitions == 10  # 10 MB/s at 1 MB/s per partition
    # gpu.attributed (the same samples with their jobs) is larger, and its group shares its count
    assert big["gpu.attributed"].bytes_per_day > big["gpu.samples"].bytes_per_day
    assert big["gpu.samples"].partitions == big["gpu.attributed"].partitions > 10
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
    assert "Kafka plan: 1,000 nodes x 8 GPUs every 1 s" in r.output and ", 3 brokers," in r.output
    one = CliRunner().invoke(app, ["topics", "plan", "--nodes", "1", "--gpus-per-node", "1", "--brokers", "1"],
                             env={"COLUMNS": "200"})  # fmt: skip
    assert "Kafka plan: 1 node x 1 GPU every 1 s" in one.output and ", 1 broker," in one.output, one.output
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


# -- partitions and retention are settings (issue 26, item 2) ------------------------------------
def test_per_topic_partitions_and_retention_win_over_the_plan_and_the_registry() -> None:
    plans = {
        p.short: p
        for p in plan_topics(
            1000,
            sizes={"gpu.samples": 10_000.0},
            partitions_by_topic={"gpu.samples": 48, "failures": 2},
            retention_hours={"gpu.samples": 12, "failures": 90 * 24},
        )
    }
    assert plans["gpu.samples"].partitions == 48  # the plan alone says 10
    assert plans["failures"].partitions == 2
    assert plans["gpu.samples"].configs["retention.ms"] == str(12 * 3_600_000)
    assert plans["gpu.samples"].retention_days == 0.5
    assert plans["gpu.samples"].stored_bytes == pytest.approx(plans["gpu.samples"].bytes_per_day / 2)
    assert plans["failures"].retention_days == 90
    # the others keep what they had
    assert plans["job.windows"].configs == TOPICS["job.windows"].configs | {"min.insync.replicas": "2"}


@pytest.mark.parametrize(
    ("partitions", "retention", "says"),
    [
        ({"gpu.sample": 3}, {}, "unknown topic 'gpu.sample' (did you mean 'gpu.samples'?)"),
        ({"gpuwarden.gpu.samples": 3}, {}, "(did you mean 'gpu.samples'?)"),
        ({"gpu.samples": 0}, {}, "partitions of gpu.samples must be a whole number 1-10000"),
        ({}, {"failures": -1}, "retention of failures must be a finite number of hours"),
        ({}, {"failures": 1e-9}, "1 ms to 2^63-1 ms"),
        ({}, {"failures": 1e300}, "1 ms to 2^63-1 ms"),
        ({}, {"correlator.windows": 24}, "correlator.windows is compacted"),
        ({"gpu.samples": 24, "gpu.events": 12}, {}, "must have one partition count"),
    ],
)
def test_bad_per_topic_settings_are_refused_naming_the_topic(
    partitions: dict[str, int], retention: dict[str, float], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from gpuwarden.shared.settings import TopicSettings, describe_settings_error
    from gpuwarden.shared.topics import check_topic_overrides

    with pytest.raises(ValueError, match=re.escape(says)):
        check_topic_overrides(partitions, retention)
    with pytest.raises(ValueError, match=re.escape(says)):
        plan_topics(10, partitions_by_topic=partitions, retention_hours=retention)
    monkeypatch.setenv("GPUWARDEN_TOPIC_PARTITIONS", orjson.dumps(partitions).decode())
    monkeypatch.setenv("GPUWARDEN_TOPIC_RETENTION_HOURS", orjson.dumps(retention).decode())
    with pytest.raises(ValidationError) as err:
        TopicSettings()
    assert says in describe_settings_error(err.value)
    result = CliRunner().invoke(app, ["topics", "plan", "--nodes", "10"])
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output


def test_the_settings_reach_the_printed_commands_and_a_non_json_value_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUWARDEN_TOPIC_PARTITIONS", '{"gpu.samples": 24}')
    monkeypatch.setenv("GPUWARDEN_TOPIC_RETENTION_HOURS", '{"gpu.samples": 12}')
    result = CliRunner().invoke(app, ["topics", "plan", "--nodes", "10", "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    [cmd] = [c for c in doc["kafka_topics"] if "gpuwarden.gpu.samples" in c]
    assert cmd[cmd.index("--partitions") + 1] == "24"
    assert "retention.ms=43200000" in cmd
    monkeypatch.setenv("GPUWARDEN_TOPIC_PARTITIONS", "gpu.samples=24")
    result = CliRunner().invoke(app, ["topics", "plan", "--nodes", "10"])
    assert result.exit_code == 2
    out = " ".join(result.output.split())
    assert "topic_partitions" in out and "takes JSON" in out and "Traceback" not in out


def test_a_low_min_insync_replicas_is_named_from_the_describe_configs_response() -> None:
    """check_topics' min.insync.replicas check read a key the response does not have
    (``configs``; aiokafka's is ``config_entries``) behind an import that always failed, so it
    never reported anything. The response shape is aiokafka 0.12's DescribeConfigsResponse_v2."""
    from gpuwarden.shared.topics import low_min_insync

    def entry(name: str, value: str) -> dict[str, object]:
        return {"config_names": name, "config_value": value, "read_only": False, "config_source": 5}

    resp = {
        "throttle_time_ms": 0,
        "resources": [
            {"error_code": 0, "resource_type": 2, "resource_name": "gw.failures",
             "config_entries": [entry("retention.ms", "604800000"), entry("min.insync.replicas", "1")]},
            {"error_code": 0, "resource_type": 2, "resource_name": "gw.gpu.samples",
             "config_entries": [entry("min.insync.replicas", "2")]},
        ],
    }  # fmt: skip
    assert low_min_insync([resp], 2) == [
        "gw.failures: min.insync.replicas=1, below 2: an acks=all write would be confirmed by fewer brokers"
    ]
    assert low_min_insync([resp], 1) == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"gpu.samples": true}', "GPUWARDEN_TOPIC_PARTITIONS['gpu.samples']=True: Input should be a valid integer"),
        ('{"gpu.samples": 2.5}', "GPUWARDEN_TOPIC_PARTITIONS['gpu.samples']=2.5: Input should be a valid integer"),
        ('{"gpu.samples": "3"}', "GPUWARDEN_TOPIC_PARTITIONS['gpu.samples']='3': Input should be a valid integer"),
        ('{"gpu.samples": null}', "GPUWARDEN_TOPIC_PARTITIONS['gpu.samples']: Input should be a valid integer"),
        ("[1, 2]", "GPUWARDEN_TOPIC_PARTITIONS: Input should be a valid dictionary"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_by_its_entry(
    value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from gpuwarden.shared.settings import TopicSettings, describe_settings_error

    monkeypatch.setenv("GPUWARDEN_TOPIC_PARTITIONS", value)
    with pytest.raises(ValidationError) as err:
        TopicSettings()
    assert says in describe_settings_error(err.value)


def test_retention_is_strict_about_booleans_and_infinity(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from gpuwarden.shared.settings import TopicSettings

    for value in ('{"failures": true}', '{"failures": Infinity}', '{"failures": "12"}'):
        monkeypatch.setenv("GPUWARDEN_TOPIC_RETENTION_HOURS", value)
        with pytest.raises(ValidationError):
            TopicSettings()
    monkeypatch.setenv("GPUWARDEN_TOPIC_RETENTION_HOURS", '{"failures": 12}')
    assert TopicSettings().topic_retention_hours == {"failures": 12.0}


def test_the_correlators_topics_keep_one_count_in_the_plan_and_the_layout() -> None:
    """gpu.samples, gpu.events and correlator.windows share one partition count: the correlator
    refuses to start otherwise. The plan's own raise for a large fleet applied to gpu.samples
    alone before (13 against the changelog's 6 at 1,000 nodes)."""
    from gpuwarden.shared.topics import COPARTITIONED, topic_layout

    big = {p.short: p for p in plan_topics(1000)}
    assert len({big[n].partitions for n in COPARTITIONED}) == 1 and big["gpu.samples"].partitions > 6
    one = {p.short: p for p in plan_topics(1000, partitions_by_topic={"gpu.samples": 24})}
    assert {one[n].partitions for n in COPARTITIONED} == {24}
    low = {p.short: p for p in plan_topics(1000, partitions_by_topic={"correlator.windows": 2})}
    assert {low[n].partitions for n in COPARTITIONED} == {2}
    assert "2 partitions as set, the plan alone gives" in low["gpu.samples"].basis
    by = {"gpu.events": 12}
    assert {topic_layout(TOPICS[n], None, by)[0] for n in COPARTITIONED} == {12}
    assert topic_layout(TOPICS["failures"], None, by)[0] == TOPICS["failures"].partitions
    assert {topic_layout(TOPICS[n], 1, by)[0] for n in TOPICS} == {1}  # --partitions wins


def test_topics_plan_with_a_prefix_reads_no_other_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad Kafka security setting does not stop a plan that names its prefix and talks to no
    broker; the topic layout settings belong to `topics plan`/`create` only, not to the services."""
    from gpuwarden.shared.settings import BusSettings

    monkeypatch.setenv("GPUWARDEN_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("GPUWARDEN_SSL_CAFILE", "/nonexistent/ca.pem")
    monkeypatch.setenv("GPUWARDEN_TOPIC_PARTITIONS", '{"gpu.samples": 24}')
    result = CliRunner().invoke(app, ["topics", "plan", "--nodes", "10", "--prefix", "x.", "--json"])
    assert result.exit_code == 0, result.output
    monkeypatch.delenv("GPUWARDEN_SECURITY_PROTOCOL")
    monkeypatch.delenv("GPUWARDEN_SSL_CAFILE")
    monkeypatch.setenv("GPUWARDEN_TOPIC_PARTITIONS", "not json")
    assert BusSettings().topic_prefix == "gpuwarden."  # a service never reads the layout settings


def test_the_sample_sizes_follow_the_collectors_nvlink_cadence() -> None:
    """The plan's sample sizes are the NVML collector's: NVLink counters on every tick by default
    (about 60 % of a sample's bytes), fewer with ``--nvlink-every N``; the built-in figures (a
    production install without the simulation layer) agree with a fresh measurement, so they
    cannot drift from what the collector sends."""
    from gpuwarden.shared.kafkaplan import SIZES, builtin_sizes
    from gpuwarden.sim.kafkasize import measure_sizes

    every, fifth = measure_sizes(nvlink_every=1), measure_sizes(nvlink_every=5)
    assert every["gpu.samples"] > 1.8 * fifth["gpu.samples"]
    assert builtin_sizes(1) == SIZES
    for n, measured in ((1, every), (5, fifth)):
        built = builtin_sizes(n)
        for topic in ("gpu.samples", "gpu.attributed", "job.windows", "correlator.windows"):
            assert built[topic] == pytest.approx(measured[topic], rel=0.03), (n, topic)
    with pytest.raises(ValueError, match="nvlink_every"):
        builtin_sizes(0)

    def samples_per_day(*args: str) -> float:
        res = CliRunner().invoke(app, ["topics", "plan", "--nodes", "100", "--json", *args])
        assert res.exit_code == 0, res.output
        doc = orjson.loads(res.stdout)
        (plan,) = [t for t in doc["topics"] if t["short"] == "gpu.samples"]
        assert "NVLinks every" in plan["basis"]
        return float(plan["bytes_per_day"])

    assert samples_per_day() == pytest.approx(100 * 86_400 * every["gpu.samples"])
    assert samples_per_day("--nvlink-every", "5") == pytest.approx(100 * 86_400 * fifth["gpu.samples"])
    bad = CliRunner().invoke(app, ["topics", "plan", "--nvlink-every", "0"])
    assert bad.exit_code == 2


def test_without_the_simulation_layer_the_plan_uses_the_built_in_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A production install has no simulation layer to measure with: the plan then uses the
    built-in figures, per GPU for another GPU count, at the cadence asked, and says so."""
    from gpuwarden.shared import plugins
    from gpuwarden.shared.kafkaplan import builtin_sizes

    def missing(group: str, name: str, what: str) -> object:
        raise plugins.PluginMissing(f"{what} needs the gpuwarden package")

    monkeypatch.setattr(plugins, "load_plugin", missing)
    res = CliRunner().invoke(app, ["topics", "plan", "--nodes", "10", "--gpus-per-node", "4", "--nvlink-every", "5",
                                   "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = orjson.loads(res.stdout)
    (plan,) = [t for t in doc["topics"] if t["short"] == "gpu.samples"]
    assert plan["bytes_per_day"] == pytest.approx(10 * 86_400 * builtin_sizes(5)["gpu.samples"] / 2)
    assert "built-in size of 8-GPU H100 samples x 4/8 GPUs, NVLinks every 5 ticks" in plan["basis"]
    assert doc["gzip_ratio"] is None


def test_a_new_users_odd_input_gets_a_plan_or_one_line() -> None:
    """What a new user tried: every GPU count the help allows gives a plan (the simulated node
    had no PCI bus id past GPU 31); a prefix or cluster Kafka would refuse, and an infinite
    interval, are usage errors; an empty prefix is allowed (topics without one); a prefix
    without a separator, and a fleet past the brokers' partition guidance, get a note; the
    lease topics' lines carry min.insync.replicas like every other; the JSON names its inputs
    and totals."""
    run = CliRunner().invoke
    for gpus in ("33", "64"):
        res = run(app, ["topics", "plan", "--nodes", "10", "--gpus-per-node", gpus, "--json"])
        assert res.exit_code == 0, res.output
    for args in (["--prefix", "a b"], ["--prefix", "t[/b]x."], ["--prefix", "x.\n"], ["--cluster", ""],
                 ["--cluster", "c\n"], ["--interval", "inf"]):  # fmt: skip
        res = run(app, ["topics", "plan", *args])
        assert res.exit_code == 2 and "Traceback" not in res.output, (args, res.output)
    # topics create checks its prefix the same way, before it talks to a broker
    res = run(app, ["topics", "create", "--bootstrap-servers", "127.0.0.1:1", "--prefix", "a b"])
    assert res.exit_code == 2 and "Kafka's topic characters" in res.output
    res = run(app, ["topics", "plan", "--prefix", "", "--json"])
    doc = orjson.loads(res.stdout)
    assert doc["topics"][0]["name"] == "gpu.samples" and doc["inputs"]["prefix"] == ""
    assert doc["totals"]["bytes_per_day"] == pytest.approx(sum(t["bytes_per_day"] for t in doc["topics"]))
    res = run(app, ["topics", "plan", "--prefix", "team-a", "--nodes", "100000"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "does not end in '.', '-' or '_'" in res.output and "partition replicas per broker" in res.output
    assert "team-agpu.samples" in res.output  # the table folds a long name, never cuts it
    leases = [c for c in orjson.loads(run(app, ["topics", "plan", "--json"]).stdout)["kafka_topics"]
              if ".lease." in c[c.index("--topic") + 1]]  # fmt: skip
    assert len(leases) == 2 and all("min.insync.replicas=2" in c for c in leases)


def test_bootstrap_servers_and_the_topic_prefix_are_checked_at_start() -> None:
    """A malformed GPUWARDEN_BOOTSTRAP_SERVERS or GPUWARDEN_TOPIC_PREFIX is a settings error
    naming the value, not an aiokafka traceback or a topic Kafka refuses later."""
    from pydantic import ValidationError

    from gpuwarden.shared.settings import BusSettings, check_bootstrap_servers

    assert check_bootstrap_servers(" kafka-1:9092 , [::1]:9093,localhost") == "kafka-1:9092,[::1]:9093,localhost"
    # every form aiokafka takes: bare IPv6 (default port), a zone id, a trailing comma
    for ok in ("::1", "2001:db8::1", "[fe80::1%eth0]:9092", "kafka:9092,"):
        assert check_bootstrap_servers(ok) == ok.rstrip(",")
        assert BusSettings(bootstrap_servers=ok).bootstrap_servers == ok.rstrip(",")
    for bad in ("notahost:xx", "127.0.0.1:", "127.0.0.1:99999", "h:0", "", " , ", "a b:1"):
        with pytest.raises(ValueError, match="not host:port"):
            check_bootstrap_servers(bad)
        with pytest.raises(ValidationError):
            BusSettings(bootstrap_servers=bad)
    for bad in ("a b.", "x;rm -rf /", "t[b]x.", "p" * 101):
        with pytest.raises(ValidationError):
            BusSettings(topic_prefix=bad)
    assert BusSettings(topic_prefix="").topic("gpu.samples") == "gpu.samples"


def test_the_remediators_cluster_is_a_topic_name_only_with_the_kafka_lease() -> None:
    """GPUWARDEN_REMEDIATOR_CLUSTER is an alert label, any text; with the Kafka lease it also
    names the lease topic, so it must then be Kafka's topic characters."""
    from pydantic import ValidationError

    from gpuwarden.remediator.settings import RemediatorSettings

    assert RemediatorSettings(remediator_cluster="Prod A").remediator_cluster == "Prod A"
    assert RemediatorSettings(remediator_cluster="prod-a", remediator_lease="kafka").remediator_lease == "kafka"
    with pytest.raises(ValidationError, match="names the lease topic"):
        RemediatorSettings(remediator_cluster="Prod A", remediator_lease="kafka")
