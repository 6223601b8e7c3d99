"""gpuwarden's Kafka clients against a real Apache Kafka secured as production runs it
(``securekafka``: SASL_SSL with SCRAM-SHA-512 and PLAIN, mTLS, StandardAuthorizer ACLs).

Every client takes its security from ``GPUWARDEN_*`` variables: the shared producer and
consumer, the admin (``gpuwarden topics create``), the remediator's Kafka lease and the faust
correlator. One broker serves the whole module."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from pydantic import BaseModel
from securekafka import DENIED_PREFIX, PASSWORDS, SecureKafka, start_secure_kafka

from factories import make_failure
from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.shared.bus import Consumer, DeliveryError, NotAuthorizedError, Producer
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.models import AttributedSample, GpuSample, JobState, NodeSample, NodeState, SlurmWatermark
from gpuwarden.shared.settings import BusSettings
from gpuwarden.sim.brokers import free_port
from gpuwarden.sim.slurm import FakeSlurm

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GPUWARDEN = Path(sys.executable).with_name("gpuwarden")


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    k = start_secure_kafka(tmp_path_factory.mktemp("secure-kafka"))
    try:
        yield k
    finally:
        k.stop()


def sasl_env(k: SecureKafka, user: str = "alice", mechanism: str = "SCRAM-SHA-512", **extra: str) -> dict[str, str]:
    return {
        "GPUWARDEN_BOOTSTRAP_SERVERS": k.sasl_ssl,
        "GPUWARDEN_SECURITY_PROTOCOL": "SASL_SSL",
        "GPUWARDEN_SASL_MECHANISM": mechanism,
        "GPUWARDEN_SASL_USERNAME": user,
        "GPUWARDEN_SASL_PASSWORD": PASSWORDS[user],
        "GPUWARDEN_SSL_CAFILE": str(k.pki.ca),
        **extra,
    }


def mtls_env(k: SecureKafka, user: str = "alice", **extra: str) -> dict[str, str]:
    cert, key = k.pki.certs[user]
    return {
        "GPUWARDEN_BOOTSTRAP_SERVERS": k.mtls,
        "GPUWARDEN_SECURITY_PROTOCOL": "SSL",
        "GPUWARDEN_SSL_CAFILE": str(k.pki.ca),
        "GPUWARDEN_SSL_CERTFILE": str(cert),
        "GPUWARDEN_SSL_KEYFILE": str(key),
        **extra,
    }


def _set_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in list(os.environ):
        if name.startswith("GPUWARDEN_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _topics_create(env: dict[str, str], prefix: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    return subprocess.run(
        [str(GPUWARDEN), "topics", "create", "--prefix", prefix, "--partitions", "1"],
        env={**clean, **env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _roundtrip(settings: BusSettings, n: int = 5) -> tuple[bool | None, list[str]]:
    """Publish ``n`` node states with the shared producer (confirmed), read them back with the
    shared consumer in a fresh group; returns (producer idempotent, node names read)."""
    metrics = ServiceMetrics(f"sec{uuid.uuid4().hex[:6]}")
    producer = Producer(settings, metrics)
    await producer.start()
    got: list[str] = []

    async def handler(short: str, value: BaseModel, rec: Any) -> None:
        assert isinstance(value, NodeState)
        got.append(value.node)

    consumer = Consumer(settings, "sec-test", ["slurm.nodes"], f"sec-{uuid.uuid4().hex[:8]}", handler, producer,
                        metrics)  # fmt: skip
    try:
        for i in range(n):
            await producer.publish("slurm.nodes", f"n{i}", NodeState(node=f"n{i}", ts=1.0, state="IDLE"))
        await producer.confirm()
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        end = time.monotonic() + 30
        while len(got) < n and time.monotonic() < end and not task.done():
            await asyncio.sleep(0.1)
        await consumer.stop_gracefully(task, 5)
    finally:
        await producer.stop()
    return producer.idempotent, got


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
async def test_sasl_ssl_admin_producer_consumer(
    secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch, mechanism: str
) -> None:
    prefix = f"sasl{mechanism[:4].lower()}."
    env = sasl_env(secure_kafka, mechanism=mechanism, GPUWARDEN_TOPIC_PREFIX=prefix)
    out = _topics_create(env, prefix)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{prefix}failures" in out.stdout and "created" in out.stdout
    _set_env(monkeypatch, env)
    s = BusSettings()
    assert s.security_protocol == "SASL_SSL" and s.sasl_mechanism == mechanism
    idem, got = await _roundtrip(s)
    assert got == [f"n{i}" for i in range(5)]
    assert idem is True  # acks=all + idempotent producer on real Kafka, over SASL_SSL


async def test_mtls_admin_producer_consumer(secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = "mtls."
    env = mtls_env(secure_kafka, GPUWARDEN_TOPIC_PREFIX=prefix)
    out = _topics_create(env, prefix)
    assert out.returncode == 0, out.stdout + out.stderr
    _set_env(monkeypatch, env)
    idem, got = await _roundtrip(BusSettings())
    assert got == [f"n{i}" for i in range(5)] and idem is True


async def test_refused_connections_are_errors_at_start(
    secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password, a missing client certificate and a CA that did not sign the broker
    each fail the start with an error, within seconds: never a plaintext fallback or a hang."""
    k = secure_kafka
    cases = {
        "wrong password": {**sasl_env(k), "GPUWARDEN_SASL_PASSWORD": "not-the-password"},
        "no client certificate": {
            "GPUWARDEN_BOOTSTRAP_SERVERS": k.mtls,
            "GPUWARDEN_SECURITY_PROTOCOL": "SSL",
            "GPUWARDEN_SSL_CAFILE": str(k.pki.ca),
        },
        "unknown CA": {**mtls_env(k), "GPUWARDEN_SSL_CAFILE": str(k.pki.other_ca)},
        "plaintext to a TLS listener": {"GPUWARDEN_BOOTSTRAP_SERVERS": k.sasl_ssl},
    }
    for name, env in cases.items():
        _set_env(monkeypatch, env)
        p = Producer(BusSettings(), delivery_timeout_s=10)
        t0 = time.monotonic()
        with pytest.raises((KafkaError, OSError)):
            await asyncio.wait_for(p.start(), 40)
            await p.publish("slurm.nodes", "n", NodeState(node="n", ts=1.0, state="IDLE"))
            await p.confirm()
        await p.stop()
        assert time.monotonic() - t0 < 40, name
    # the same through a service process: exit code 2 and one clear line, no traceback
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env = {**clean, **cases["wrong password"], "GPUWARDEN_HTTP_PORT": str(free_port())}
    out = subprocess.run([sys.executable, "-m", "gpuwarden.detector"], env=env, capture_output=True, text=True,
                         timeout=90)  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "error:" in out.stderr and "Traceback" not in out.stderr


async def test_acl_denied_write_on_failures_is_a_clear_error(
    secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mallory may read everything but not WRITE ``failures``: the producer's confirmation
    names the authorization error, and a consumer whose handler publishes a failure stops with
    :class:`NotAuthorizedError` (nothing committed) instead of retrying forever or dropping it."""
    admin = sasl_env(secure_kafka, user="admin", GPUWARDEN_TOPIC_PREFIX=DENIED_PREFIX)
    assert _topics_create(admin, DENIED_PREFIX).returncode == 0
    _set_env(monkeypatch, sasl_env(secure_kafka, user="mallory", GPUWARDEN_TOPIC_PREFIX=DENIED_PREFIX))
    s = BusSettings()
    metrics = ServiceMetrics("mallory")
    producer = Producer(s, metrics, delivery_timeout_s=15)
    await producer.start()
    try:
        await producer.publish("slurm.nodes", "n1", NodeState(node="n1", ts=1.0, state="IDLE"))
        await producer.confirm()  # allowed: WRITE on other topics
        t0 = time.monotonic()
        await producer.publish("failures", "n1", make_failure(node="n1"))
        with pytest.raises(DeliveryError, match="TopicAuthorizationFailed"):
            await producer.confirm()
        assert time.monotonic() - t0 < 15

        async def detect(short: str, value: BaseModel, rec: Any) -> None:
            await producer.publish("failures", "n1", make_failure(node="n1"))

        group = f"mallory-{uuid.uuid4().hex[:6]}"
        c = Consumer(s, "detector", ["slurm.nodes"], group, detect, producer, metrics)
        await c.start()
        try:
            with pytest.raises(NotAuthorizedError, match=r"detector: Kafka refuses.*TopicAuthorizationFailed"):
                await asyncio.wait_for(c.run(), 45)
        finally:
            await c.stop()
        offsets = await _committed(s, group, f"{DENIED_PREFIX}slurm.nodes")
        assert offsets in ({}, {0: None}), offsets  # the record was not handled: not committed
    finally:
        await producer.stop()


async def _committed(s: BusSettings, group: str, topic: str) -> dict[int, int | None]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**s.kafka_kwargs())
    await admin.start()
    try:
        got = await admin.list_consumer_group_offsets(group)
        return {tp.partition: (m.offset if m.offset >= 0 else None) for tp, m in got.items() if tp.topic == topic}
    finally:
        await admin.close()


async def test_remediator_kafka_lease_over_sasl_ssl(secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = "lease."
    env = sasl_env(secure_kafka, GPUWARDEN_TOPIC_PREFIX=prefix)
    assert _topics_create(env, prefix).returncode == 0
    _set_env(monkeypatch, env)
    fake = FakeSlurm(nodes=[NodeState(node="gpu-node-001", ts=1.0, state="IDLE")])
    r = Remediator(RemediatorSettings(remediator_lease="kafka", remediator_cluster="sec"), client=fake)
    await r.start()
    try:
        end = time.monotonic() + 40
        while not r.lease.held() and time.monotonic() < end:
            await asyncio.sleep(0.2)
        assert r.lease.held(), "the lease was not acquired over SASL_SSL"
        assert r.health()["status"] == "ok"
    finally:
        await r.stop()


async def test_correlator_over_mtls(secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    """The correlator worker starts, reads the Slurm view, consumes and produces over mTLS."""
    prefix = "corr."
    env = mtls_env(secure_kafka, GPUWARDEN_TOPIC_PREFIX=prefix)
    assert _topics_create(env, prefix).returncode == 0
    _set_env(monkeypatch, env)
    s = BusSettings()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.correlator"],
        env={**clean, **env, "GPUWARDEN_HTTP_PORT": str(port), "GPUWARDEN_CONSUMER_GROUP": "gpuwarden-correlator-sec"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    producer = Producer(s)
    await producer.start()
    metrics = ServiceMetrics("corrsec")
    got: list[AttributedSample] = []

    async def handler(short: str, value: BaseModel, rec: Any) -> None:
        assert isinstance(value, AttributedSample)
        got.append(value)

    reader = Consumer(s, "reader", ["gpu.attributed"], f"r-{uuid.uuid4().hex[:6]}", handler, producer, metrics)
    await reader.start()
    task = asyncio.create_task(reader.run())
    try:
        now = time.time()
        job = JobState(job_id="77", ts=now, state="RUNNING", user="alice", account="ml", partition="gpu",
                       nodes=["gpu-node-001"], gpus={"gpu-node-001": [0]}, start_ts=now - 60,
                       end_ts=now + 3600)  # fmt: skip
        md = await (await producer.send("slurm.jobs", "77", job))
        # the Slurm view is complete past the samples' times once the job is read
        wm = SlurmWatermark(cluster="sec", ts=now + 3600, jobs_offsets={md.partition: md.offset + 1})
        await producer.publish("slurm.watermarks", "sec", wm)
        end, tick = time.monotonic() + 90, 0
        while time.monotonic() < end and not any(a.jobs for a in got):
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-3000:] if proc.stdout else ""
            sample = NodeSample(node="gpu-node-001", ts=now + tick, collector_id="t", source="simulated",
                                gpus=[GpuSample(index=0, utilization_gpu_pct=90.0)])  # fmt: skip
            await producer.publish("gpu.samples", "gpu-node-001", sample)
            await producer.confirm()
            tick += 1
            await asyncio.sleep(0.5)
        assert any(a.jobs and a.jobs[0].job_id == "77" for a in got), f"{len(got)} samples, none attributed"
    finally:
        await reader.stop_gracefully(task, 5)
        await producer.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.stdout:
            proc.stdout.close()


async def test_console_and_report_read_over_sasl_ssl(
    secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console and ``gpuwarden report`` take the services' SASL/TLS settings (issue 27, point 3):
    before, both built their consumer from the bootstrap servers alone and spoke plaintext."""
    from gpuwarden.console.service import ConsoleService, ConsoleSettings
    from gpuwarden.detector.report_cli import read_topics

    prefix = "cons."
    env = sasl_env(secure_kafka, GPUWARDEN_TOPIC_PREFIX=prefix)
    assert _topics_create(env, prefix).returncode == 0
    _set_env(monkeypatch, env)
    s = BusSettings()
    producer = Producer(s, ServiceMetrics("sec-console"))
    await producer.start()
    ui = ConsoleService(ConsoleSettings(http_port=0, console_token="s3cret-console-token"))
    await ui.start()
    try:
        await producer.publish("failures", "gpu-node-002", make_failure(failure_id="sec-f1"))
        await producer.confirm()
        end = time.monotonic() + 30
        while "sec-f1" not in ui.state.failures and time.monotonic() < end:
            await asyncio.sleep(0.2)
        assert "sec-f1" in ui.state.failures, "the console read nothing over SASL_SSL"
        # the report command's reader: connects, reads job.reports (empty), knows nothing of job 7
        assert await read_topics(s.bootstrap_servers, prefix, "7", False, 3.26, 10.0, s.kafka_kwargs()) is None
    finally:
        await ui.stop()
        await producer.stop()


PLAN_PREFIX = "plan."


def _plan(k: SecureKafka) -> dict[str, Any]:
    import orjson

    clean = {n: v for n, v in os.environ.items() if not n.startswith("GPUWARDEN_")}
    out = subprocess.run(
        [str(GPUWARDEN), "topics", "plan", "--nodes", "4", "--brokers", "1", "--prefix", PLAN_PREFIX,
         "--cluster", "plan-c", "--bootstrap-server", k.internal, "--json"],
        env=clean, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    doc: dict[str, Any] = orjson.loads(out.stdout)
    return doc


async def _create_from_argv(k: SecureKafka, argvs: list[list[str]]) -> None:
    """The plan's ``kafka-topics.sh --create`` lines, read back and sent through the admin API
    (the jars of deploy/kafka.sh hold no kafka-tools)."""
    from aiokafka.admin import NewTopic

    from gpuwarden.shared.bus.clients import kafka_admin

    topics = []
    for a in argvs:
        assert a[0] == "kafka-topics.sh" and "--create" in a and "--if-not-exists" in a, a
        val = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--") and not a[i + 1].startswith("--")}
        configs = dict(a[i + 1].split("=", 1) for i in range(len(a) - 1) if a[i] == "--config")
        topics.append(
            NewTopic(val["--topic"], int(val["--partitions"]), int(val["--replication-factor"]), topic_configs=configs)
        )
    admin = kafka_admin(k.internal)
    await admin.start()
    try:
        await admin.create_topics(topics)
    finally:
        await admin.close()


def _acls_for(k: SecureKafka, argvs: list[list[str]], principal: str) -> None:
    """Run the plan's ``kafka-acls.sh`` lines of ``principal`` with Kafka's own AclCommand."""
    mine = [a for a in argvs if principal in a]
    assert mine, principal
    for a in mine:
        assert a[0] == "kafka-acls.sh", a
        cmd = k.node._java("kafka.admin.AclCommand", *a[1:], "--force")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]


async def test_the_plans_acls_are_exactly_enough(secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: ``gpuwarden topics plan``'s commands against the real broker with the
    StandardAuthorizer. The detector principal given exactly the printed ACLs starts with no
    topic problem, consumes, commits and dead-letters; the remediator's lease works with
    ``GPUWARDEN_CREATE_TOPICS=false`` on the lease topic the plan created; a principal with none
    of them gets one line naming the refusal."""
    from gpuwarden.detector.service import DetectorService, DetectorSettings
    from gpuwarden.remediator.lease_consumer import make_lease
    from gpuwarden.shared.bus.clients import kafka_admin, kafka_producer

    doc = _plan(secure_kafka)
    await _create_from_argv(secure_kafka, doc["kafka_topics"])
    for who in ("User:gpuwarden-detector", "User:gpuwarden-remediator"):
        _acls_for(secure_kafka, doc["kafka_acls"], who)
    env = sasl_env(secure_kafka, user="gpuwarden-detector", GPUWARDEN_TOPIC_PREFIX=PLAN_PREFIX,
                   GPUWARDEN_CREATE_TOPICS="false", GPUWARDEN_HTTP_PORT="0")  # fmt: skip
    _set_env(monkeypatch, env)
    svc = DetectorService(DetectorSettings())
    await svc.start()
    try:
        assert svc.topic_problems == [], svc.topic_problems  # it may describe every topic of the prefix
        feed = kafka_producer(sasl_env_settings(secure_kafka, "admin"))
        await feed.start()
        try:
            await feed.send_and_wait(f"{PLAN_PREFIX}slurm.nodes", b'{"not": "a node state"}', key=b"n1")
            good = NodeState(node="n1", ts=time.time(), state="IDLE").to_json()
            await feed.send_and_wait(f"{PLAN_PREFIX}slurm.nodes", good, key=b"n1")
        finally:
            await feed.stop()
        deadline = time.monotonic() + 60
        while _dead_lettered(svc) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert _dead_lettered(svc) >= 1  # WRITE on the dead-letter topic
        assert svc.health()["status"] == "ok", svc.health()
    finally:
        await svc.stop()
    admin = kafka_admin(sasl_env_settings(secure_kafka, "admin"))
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets("gpuwarden-detector-events")  # the event lane
    finally:
        await admin.close()
    assert any(tp.topic == f"{PLAN_PREFIX}slurm.nodes" and om.offset >= 2 for tp, om in offsets.items()), offsets

    # the remediator's lease: no CREATE granted and GPUWARDEN_CREATE_TOPICS=false, on the plan's topic
    _set_env(monkeypatch, sasl_env(secure_kafka, user="gpuwarden-remediator", GPUWARDEN_TOPIC_PREFIX=PLAN_PREFIX,
                                   GPUWARDEN_CREATE_TOPICS="false", GPUWARDEN_REMEDIATOR_CLUSTER="plan-c"))  # fmt: skip
    lease = make_lease(RemediatorSettings())
    await lease.start()
    try:
        deadline = time.monotonic() + 30
        while not lease.held() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert lease.held()
    finally:
        await lease.stop()

    # nothing granted: one line naming what Kafka refused, exit 2, no traceback
    clean = {n: v for n, v in os.environ.items() if not n.startswith("GPUWARDEN_")}
    bad = {**clean, **sasl_env(secure_kafka, user="gpuwarden-nobody", GPUWARDEN_TOPIC_PREFIX=PLAN_PREFIX,
                               GPUWARDEN_HTTP_PORT=str(free_port()))}  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "gpuwarden.detector"], env=bad, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(errors) == 1 and "Authorization" in errors[0], out.stderr[-3000:]
    print(f"\nno ACLs: {errors[0]}")


def _dead_lettered(svc: Any) -> float:
    from prometheus_client import generate_latest

    text = generate_latest(svc.metrics.registry).decode()
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("gpuwarden_") and "_dead_lettered_total{" in ln
    )


def sasl_env_settings(k: SecureKafka, user: str) -> BusSettings:
    """BusSettings of ``user`` over SASL_SSL (without touching the environment)."""
    env = sasl_env(k, user=user)
    return BusSettings(
        bootstrap_servers=env["GPUWARDEN_BOOTSTRAP_SERVERS"],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=user,
        sasl_password=PASSWORDS[user],
        ssl_cafile=Path(env["GPUWARDEN_SSL_CAFILE"]),
    )
