"""The test servers as containers (testcontainers), for when :mod:`servers` chooses them.

Each server runs from the image of the version its local form has here, so both modes test the
same server: Apache Kafka of ``deploy/kafka.sh`` (``apache/kafka:X.Y.Z``), Debian 12's
Prometheus 2.42.0 and Alertmanager 0.25.0 (``prom/*``), and the OpenTelemetry Collector
(contrib) for the OTLP collector (the local form is the pinned ``rotel`` wheel). Every container
publishes its ports on random host ports, is waited for (HTTP ``/-/ready`` or its start-up log
line) and is removed on exit.

Servers that call back into the test (Alertmanager's webhooks, Prometheus' scrapes, the
collector's export) reach the host as :data:`HOST_FROM_CONTAINER` (``host-gateway``, Docker
20.10+): the test's receivers then listen on all interfaces (:data:`BIND_FOR_CONTAINERS`), and
the engine must run on this machine (a remote ``DOCKER_HOST`` serves Kafka only).

Pure helpers (``*_config``, :func:`kafka_env`, :func:`kafka_start_script`) build what goes into
a container and are unit-tested without Docker; the context managers need an engine.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # testcontainers is imported only when a container is started
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import WaitStrategy

PROMETHEUS_IMAGE = "prom/prometheus:v2.42.0"  # Debian 12's prometheus 2.42.0
ALERTMANAGER_IMAGE = "prom/alertmanager:v0.25.0"  # Debian 12's prometheus-alertmanager 0.25.0
OTEL_COLLECTOR_IMAGE = "otel/opentelemetry-collector-contrib:0.128.0"  # `otlp` exporter name (< 0.144)
KAFKA_IMAGE = "apache/kafka:{version}"  # the version of deploy/kafka.sh (servers.kafka_version)

#: how a container reaches a server of the test on this host, and where those servers listen then
HOST_FROM_CONTAINER = "host.docker.internal"
BIND_FOR_CONTAINERS = "0.0.0.0"  # the docker bridge is not loopback (test-only servers)
_EXTRA_HOSTS = {HOST_FROM_CONTAINER: "host-gateway"}

STARTUP_TIMEOUT_S = 120  # a first run pulls the image

KAFKA_PORT = 9092  # the client listener, published
_KAFKA_BROKER_PORT = 9093  # inter-broker, inside the container
_KAFKA_CONTROLLER_PORT = 9094
_KAFKA_START_SCRIPT = "/gpuwarden-kafka-start.sh"


@dataclass(frozen=True)
class Running:
    """A started container: the host its published ports are on, container port -> host port."""

    host: str
    ports: Mapping[int, int]

    def url(self, port: int) -> str:
        """``http://HOST:PORT`` of container port ``port`` as published."""
        return f"http://{self.host}:{self.ports[port]}"


def _host(container: DockerContainer) -> str:
    host = container.get_container_host_ip()
    return "127.0.0.1" if host == "localhost" else host  # one address family, as the local servers


@contextmanager
def run_container(
    image: str,
    *,
    ports: Sequence[int],
    command: Sequence[str],
    wait: WaitStrategy,
    files: Mapping[str, bytes] | None = None,
    reach_host: bool = False,
) -> Iterator[Running]:
    """Start ``image`` with ``command``, ``files`` (path in the container -> content) copied in
    before it starts, ``ports`` published; yield once ``wait`` is satisfied; remove it on exit.

    ``reach_host`` maps :data:`HOST_FROM_CONTAINER` to the host. Raises what testcontainers
    raises: ``TimeoutError`` (with the container's log) when not ready within the wait's timeout,
    ``docker.errors.DockerException`` when the engine refuses (an image that cannot be pulled).
    """
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image).with_exposed_ports(*ports).with_command(list(command))
    for path, content in (files or {}).items():
        container.with_copy_into_container(content, path)
    if reach_host:
        container.with_kwargs(extra_hosts=_EXTRA_HOSTS)
    container.waiting_for(wait.with_startup_timeout(STARTUP_TIMEOUT_S))
    with container:
        yield Running(_host(container), {p: container.get_exposed_port(p) for p in ports})


def _http_ready(port: int) -> WaitStrategy:
    from testcontainers.core.wait_strategies import HttpWaitStrategy

    return HttpWaitStrategy(port, "/-/ready").for_status_code(200)


@contextmanager
def alertmanager(config: str) -> Iterator[str]:
    """Alertmanager (:data:`ALERTMANAGER_IMAGE`) with ``config`` (its YAML), clustering off;
    yields its base URL ``http://HOST:PORT`` once ``/-/ready`` answers 200."""
    with run_container(
        ALERTMANAGER_IMAGE,
        ports=[9093],
        command=["--config.file=/etc/alertmanager/gpuwarden.yml", "--storage.path=/alertmanager",
                 "--cluster.listen-address="],
        files={"/etc/alertmanager/gpuwarden.yml": config.encode()},
        wait=_http_ready(9093),
        reach_host=True,
    ) as am:  # fmt: skip
        yield am.url(9093)


def prometheus_config(target: str, job: str) -> str:
    """A Prometheus config scraping ``target`` (``HOST:PORT``) every second as job ``job``."""
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: {job}\n    static_configs: [{{targets: ['{target}']}}]\n"
    )


@contextmanager
def prometheus(config: str) -> Iterator[int]:
    """Prometheus (:data:`PROMETHEUS_IMAGE`) with ``config``; yields its HTTP port on 127.0.0.1
    (a local engine) once ``/-/ready`` answers 200 (the TSDB is open)."""
    with run_container(
        PROMETHEUS_IMAGE,
        ports=[9090],
        command=["--config.file=/etc/prometheus/gpuwarden.yml", "--storage.tsdb.path=/prometheus"],
        files={"/etc/prometheus/gpuwarden.yml": config.encode()},
        wait=_http_ready(9090),
        reach_host=True,
    ) as prom:
        yield prom.ports[9090]


def otel_collector_config(export_to: str) -> str:
    """An OpenTelemetry Collector config: OTLP in on gRPC (4317) and HTTP (4318), metrics and
    logs out over OTLP/gRPC (plaintext) to ``export_to`` (``HOST:PORT``), no processor and no
    sending queue (each request forwarded as it comes, as rotel with ``--disable-batching``)."""
    return f"""\
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: "0.0.0.0:4317"}}
      http: {{endpoint: "0.0.0.0:4318"}}
exporters:
  otlp:
    endpoint: "{export_to}"
    tls: {{insecure: true}}
    sending_queue: {{enabled: false}}
service:
  pipelines:
    metrics: {{receivers: [otlp], exporters: [otlp]}}
    logs: {{receivers: [otlp], exporters: [otlp]}}
"""


@contextmanager
def otel_collector(export_port: int) -> Iterator[dict[str, int]]:
    """The OpenTelemetry Collector (:data:`OTEL_COLLECTOR_IMAGE`) exporting to this host's
    ``export_port``; yields ``{"grpc": PORT, "http": PORT}`` (published on 127.0.0.1, a local
    engine) once it logs that it is ready."""
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    with run_container(
        OTEL_COLLECTOR_IMAGE,
        ports=[4317, 4318],
        command=["--config=/etc/otelcol-contrib/gpuwarden.yaml"],
        files={"/etc/otelcol-contrib/gpuwarden.yaml": otel_collector_config(
            f"{HOST_FROM_CONTAINER}:{export_port}").encode()},
        wait=LogMessageWaitStrategy("Everything is ready"),
        reach_host=True,
    ) as col:  # fmt: skip
        yield {"grpc": col.ports[4317], "http": col.ports[4318]}


def kafka_env(cluster_id: str) -> dict[str, str]:
    """The apache/kafka image's environment: one KRaft node (broker and controller), with the
    broker settings of ``deploy/kafka.sh`` (no topic auto-creation, 4 offsets partitions, no
    initial rebalance delay, replication 1). The advertised listener is set at start
    (:func:`kafka_start_script`), once the published port is known."""
    return {
        "CLUSTER_ID": cluster_id,
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": (
            f"PLAINTEXT://0.0.0.0:{KAFKA_PORT},BROKER://0.0.0.0:{_KAFKA_BROKER_PORT},"
            f"CONTROLLER://0.0.0.0:{_KAFKA_CONTROLLER_PORT}"
        ),
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@localhost:{_KAFKA_CONTROLLER_PORT}",
        "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",  # inside the container
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "4",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_LOG_RETENTION_HOURS": "1",
    }


def kafka_start_script(host: str, port: int) -> str:
    """The script the Kafka container runs once its port is published: advertise ``host:port``
    to clients (the inter-broker listener on the container's own address), then the image's
    own start-up (``/etc/kafka/docker/run``)."""
    return (
        "#!/bin/sh\n"
        f'export KAFKA_ADVERTISED_LISTENERS="PLAINTEXT://{host}:{port},'
        f'BROKER://$(hostname -i | cut -d" " -f1):{_KAFKA_BROKER_PORT}"\n'
        "exec /etc/kafka/docker/run\n"
    )


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")  # KRaft's 22-char id


@contextmanager
def kafka(version: str) -> Iterator[str]:
    """Apache Kafka ``version`` (``apache/kafka:VERSION``, KRaft, one node); yields its
    bootstrap address ``HOST:PORT`` once the broker logs ``Kafka Server started``.

    testcontainers' own ``KafkaContainer`` (4.x) drives Confluent's image only (its start script
    is ``/etc/confluent/docker/*``, KRaft needs tag >= 7.0.0), so this is the same technique on
    the Apache image: the container waits for a start script, written once the published port
    is known, that sets the advertised listener.
    """
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    container = (
        DockerContainer(KAFKA_IMAGE.format(version=version))
        .with_exposed_ports(KAFKA_PORT)
        .with_command(["sh", "-c", f"while [ ! -f {_KAFKA_START_SCRIPT} ]; do sleep 0.1; done; "
                                   f"exec sh {_KAFKA_START_SCRIPT}"])
    )  # fmt: skip
    for key, value in kafka_env(_cluster_id()).items():
        container.with_env(key, value)
    with container:
        host, port = _host(container), container.get_exposed_port(KAFKA_PORT)
        container.copy_into_container(kafka_start_script(host, port).encode(), _KAFKA_START_SCRIPT, 0o755)
        ready = LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(STARTUP_TIMEOUT_S)
        ready.wait_until_ready(container)
        yield f"{host}:{port}"
