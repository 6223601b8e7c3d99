"""The choice of test servers (tests/servers.py): containers or local, for every combination of
the environment, a Docker engine and java; the Docker probe against fake engines; and what goes
into the containers (tests/server_containers.py), all without Docker."""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import server_containers
from prerequisites import give_up
from servers import (
    ServerChoiceError,
    choose_kafka,
    choose_server,
    docker_available,
    kafka_version,
    servers_mode,
)

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "deploy" / "kafka.sh"

MODES = [None, "", "auto", "containers", "local"]  # None: unset


def env_of(mode: str | None, **more: str) -> dict[str, str]:
    env = {"PATH": "/usr/bin", **more}
    if mode is not None:
        env["GPUWARDEN_TEST_SERVERS"] = mode
    return env


# -- the mode ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "mode"), [(None, "auto"), ("", "auto"), ("auto", "auto"), ("containers", "containers"), ("local", "local")]
)
def test_mode_of_the_environment(raw: str | None, mode: str) -> None:
    assert servers_mode(env_of(raw)) == mode


@pytest.mark.parametrize("raw", ["container", "Containers", "docker", " local", "yes", "1"])
def test_an_unknown_mode_is_a_value_error_naming_the_choices(raw: str) -> None:
    with pytest.raises(ValueError, match="expected one of auto, containers, local") as exc:
        servers_mode(env_of(raw))
    assert f"GPUWARDEN_TEST_SERVERS={raw!r}" in str(exc.value)


# -- Kafka ------------------------------------------------------------------------------

#: (mode, docker, java) -> the choice without an external Kafka and without REQUIRE_KAFKA;
#: "error" = ServerChoiceError (containers asked for, no engine)
KAFKA: dict[tuple[str | None, bool, bool], str] = {
    (None, True, True): "container",
    (None, True, False): "container",
    (None, False, True): "jars",
    (None, False, False): "tansu",
    ("", True, True): "container",
    ("", True, False): "container",
    ("", False, True): "jars",
    ("", False, False): "tansu",
    ("auto", True, True): "container",
    ("auto", True, False): "container",
    ("auto", False, True): "jars",
    ("auto", False, False): "tansu",
    ("containers", True, True): "container",
    ("containers", True, False): "container",
    ("containers", False, True): "error",
    ("containers", False, False): "error",
    ("local", True, True): "jars",
    ("local", True, False): "tansu",
    ("local", False, True): "jars",
    ("local", False, False): "tansu",
}


def test_the_kafka_table_covers_every_combination() -> None:
    assert len(KAFKA) == len(MODES) * 2 * 2


@pytest.mark.parametrize(("mode", "docker", "java"), sorted(KAFKA, key=repr))
def test_choose_kafka(mode: str | None, docker: bool, java: bool) -> None:
    want = KAFKA[(mode, docker, java)]
    if want == "error":
        with pytest.raises(ServerChoiceError):
            choose_kafka(env_of(mode), docker=docker, java=java)
    else:
        assert choose_kafka(env_of(mode), docker=docker, java=java) == want


@pytest.mark.parametrize(("mode", "docker", "java"), sorted(KAFKA, key=repr))
def test_require_kafka_turns_only_the_tansu_fallback_into_an_error(mode: str | None, docker: bool, java: bool) -> None:
    want = KAFKA[(mode, docker, java)]
    env = env_of(mode, GPUWARDEN_TEST_REQUIRE_KAFKA="1")
    if want in ("tansu", "error"):
        with pytest.raises(ServerChoiceError) as exc:
            choose_kafka(env, docker=docker, java=java)
        if want == "tansu":
            assert str(exc.value).startswith("GPUWARDEN_TEST_REQUIRE_KAFKA=1 but Apache Kafka cannot start")
            assert "no java for deploy/kafka.sh" in str(exc.value)
    else:
        assert choose_kafka(env, docker=docker, java=java) == want
    # any other value than "1" is not the requirement (as before)
    if want != "error":
        assert choose_kafka(env_of(mode, GPUWARDEN_TEST_REQUIRE_KAFKA="0"), docker=docker, java=java) == want


@pytest.mark.parametrize(("mode", "docker", "java"), sorted(KAFKA, key=repr))
@pytest.mark.parametrize("require", [None, "1"])
def test_an_external_kafka_comes_first_whatever_else(
    mode: str | None, docker: bool, java: bool, require: str | None
) -> None:
    more = {"GPUWARDEN_BOOTSTRAP_SERVERS": "kafka-1:9092"}
    if require:
        more["GPUWARDEN_TEST_REQUIRE_KAFKA"] = require
    assert choose_kafka(env_of(mode, **more), docker=docker, java=java) == "external"


def test_an_empty_bootstrap_is_no_external_kafka() -> None:
    assert choose_kafka(env_of(None, GPUWARDEN_BOOTSTRAP_SERVERS=""), docker=False, java=True) == "jars"


def test_a_bad_mode_is_an_error_even_with_an_external_kafka() -> None:
    with pytest.raises(ValueError, match="GPUWARDEN_TEST_SERVERS='contianers'"):
        choose_kafka(env_of("contianers", GPUWARDEN_BOOTSTRAP_SERVERS="k:9092"), docker=True, java=True)


def test_containers_without_docker_says_what_to_do() -> None:
    with pytest.raises(ServerChoiceError) as exc:
        choose_kafka(env_of("containers"), docker=False, java=True)
    msg = str(exc.value)
    assert msg.startswith("GPUWARDEN_TEST_SERVERS=containers but no Docker engine answers, so Apache Kafka")
    assert "DOCKER_HOST" in msg and "/var/run/docker.sock" in msg
    assert "GPUWARDEN_TEST_SERVERS=auto or local" in msg


def test_require_kafka_message_names_what_is_missing() -> None:
    with pytest.raises(ServerChoiceError, match=r"no java for deploy/kafka.sh and no Docker engine$"):
        choose_kafka(env_of("auto", GPUWARDEN_TEST_REQUIRE_KAFKA="1"), docker=False, java=False)
    with pytest.raises(ServerChoiceError, match=r"no java for deploy/kafka.sh \(GPUWARDEN_TEST_SERVERS=local\)$"):
        choose_kafka(env_of("local", GPUWARDEN_TEST_REQUIRE_KAFKA="1"), docker=True, java=False)


# -- the other servers ------------------------------------------------------------------

#: (mode, docker, installed locally) -> the choice
SERVER: dict[tuple[str | None, bool, bool], str] = {
    (None, True, True): "container",
    (None, True, False): "container",
    (None, False, True): "local",
    (None, False, False): "missing",
    ("", True, True): "container",
    ("", True, False): "container",
    ("", False, True): "local",
    ("", False, False): "missing",
    ("auto", True, True): "container",
    ("auto", True, False): "container",
    ("auto", False, True): "local",
    ("auto", False, False): "missing",
    ("containers", True, True): "container",
    ("containers", True, False): "container",
    ("containers", False, True): "error",
    ("containers", False, False): "error",
    ("local", True, True): "local",
    ("local", True, False): "missing",
    ("local", False, True): "local",
    ("local", False, False): "missing",
}


def test_the_server_table_covers_every_combination() -> None:
    assert len(SERVER) == len(MODES) * 2 * 2


@pytest.mark.parametrize(("mode", "docker", "local"), sorted(SERVER, key=repr))
def test_choose_server(mode: str | None, docker: bool, local: bool) -> None:
    want = SERVER[(mode, docker, local)]
    if want == "error":
        with pytest.raises(ServerChoiceError, match="so Prometheus cannot start in a container"):
            choose_server("Prometheus", env_of(mode), docker=docker, local=local)
    else:
        assert choose_server("Prometheus", env_of(mode), docker=docker, local=local) == want


def test_choose_server_rejects_a_bad_mode() -> None:
    with pytest.raises(ValueError, match="GPUWARDEN_TEST_SERVERS='podman'"):
        choose_server("Alertmanager", env_of("podman"), docker=True, local=True)


def test_the_kafka_requirement_does_not_touch_the_other_servers() -> None:
    env = env_of("auto", GPUWARDEN_TEST_REQUIRE_KAFKA="1", GPUWARDEN_BOOTSTRAP_SERVERS="k:9092")
    assert choose_server("Alertmanager", env, docker=False, local=False) == "missing"
    assert choose_server("Alertmanager", env, docker=True, local=False) == "container"


# -- the Docker probe -------------------------------------------------------------------


class _FakeEngine(http.server.BaseHTTPRequestHandler):
    """The two calls of the docker SDK's probe: ``/version`` (API version) and ``/vX/_ping``."""

    ping_status = 200

    def do_GET(self) -> None:
        if self.path == "/version":
            self._send(200, "application/json", json.dumps({"ApiVersion": "1.45", "Version": "27.0.0"}))
        elif re.fullmatch(r"/v1\.45/_ping", self.path):
            self._send(self.ping_status, "text/plain", "OK" if self.ping_status == 200 else "down")
        else:
            self._send(404, "application/json", json.dumps({"message": f"no {self.path}"}))

    def _send(self, status: int, ctype: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    status = getattr(request, "param", 200)
    handler = type("Engine", (_FakeEngine,), {"ping_status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_docker_available_when_the_engine_answers_the_ping(fake_engine: str) -> None:
    assert docker_available({"DOCKER_HOST": fake_engine}, timeout_s=2) is True


@pytest.mark.parametrize("fake_engine", [500], indirect=True)
def test_docker_unavailable_when_the_ping_fails(fake_engine: str) -> None:
    assert docker_available({"DOCKER_HOST": fake_engine}, timeout_s=2) is False


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "host",
    [
        "unix:///nonexistent/gpuwarden-test/docker.sock",  # no socket
        "tcp://127.0.0.1:{closed}",  # nothing listens
        "bogus://what",  # not a Docker URL
        "tcp://",  # no host
    ],
)
def test_docker_unavailable_never_raises(host: str, tmp_path: Path) -> None:
    env = {"DOCKER_HOST": host.format(closed=closed_port()), "HOME": str(tmp_path)}
    start = time.monotonic()
    assert docker_available(env, timeout_s=1) is False
    assert time.monotonic() - start < 5


def test_docker_probe_gives_up_on_an_engine_that_never_answers() -> None:
    with socket.socket() as s:  # accepts connections (backlog) but never replies
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        start = time.monotonic()
        assert docker_available({"DOCKER_HOST": f"tcp://127.0.0.1:{s.getsockname()[1]}"}, timeout_s=0.5) is False
        assert time.monotonic() - start < 4  # the timeout holds (one read for /version)


def test_docker_unavailable_without_tls_files(tmp_path: Path, fake_engine: str) -> None:
    env = {"DOCKER_HOST": fake_engine, "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(tmp_path / "none")}
    assert docker_available(env, timeout_s=1) is False


# -- the Kafka version ------------------------------------------------------------------


def test_kafka_version_is_the_default_of_deploy_kafka_sh() -> None:
    text = KAFKA_SH.read_text()
    [default] = re.findall(r"^KAFKA_VERSION=\$\{KAFKA_VERSION:-([^}]*)\}$", text, re.MULTILINE)
    assert kafka_version({}, KAFKA_SH) == default
    assert re.fullmatch(r"\d+\.\d+\.\d+", default)
    assert default in (ROOT / "README.md").read_text()  # "Tested against real Apache Kafka X.Y.Z"


def test_kafka_version_follows_kafka_version_like_the_script() -> None:
    assert kafka_version({"KAFKA_VERSION": "3.8.1"}, KAFKA_SH) == "3.8.1"
    assert kafka_version({"KAFKA_VERSION": ""}, KAFKA_SH) == kafka_version({}, KAFKA_SH)


@pytest.mark.parametrize("bad", ["latest", "3.9", "3.9.1; rm -rf /", "v3.9.1"])
def test_a_bad_kafka_version_is_a_value_error(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"KAFKA_VERSION={bad!r}: expected X.Y.Z")):
        kafka_version({"KAFKA_VERSION": bad}, KAFKA_SH)


def test_a_script_without_a_default_is_a_value_error(tmp_path: Path) -> None:
    script = tmp_path / "kafka.sh"
    script.write_text("#!/bin/sh\nKAFKA_VERSION=${KAFKA_VERSION}\n")
    with pytest.raises(ValueError, match=re.escape("no 'KAFKA_VERSION=${KAFKA_VERSION:-X.Y.Z}' line")):
        kafka_version({}, script)


# -- what goes into the containers ------------------------------------------------------


def kafka_sh_properties() -> dict[str, str]:
    """The server.properties deploy/kafka.sh writes, as key -> value (ports left symbolic)."""
    text = KAFKA_SH.read_text()
    body = text[text.index('server.properties" <<PROPS') :].split("\n", 1)[1].split("\nPROPS", 1)[0]
    return dict(line.split("=", 1) for line in body.splitlines() if line and not line.startswith("#"))


def test_the_kafka_container_has_the_broker_settings_of_deploy_kafka_sh() -> None:
    env = server_containers.kafka_env("MkU3OEVBNTcwNTJENDM2Qk")
    props = kafka_sh_properties()
    same = ["process.roles", "node.id", "num.partitions", "offsets.topic.replication.factor",
            "offsets.topic.num.partitions", "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr", "group.initial.rebalance.delay.ms", "auto.create.topics.enable",
            "log.retention.hours", "controller.listener.names"]  # fmt: skip
    for key in same:
        assert env["KAFKA_" + key.upper().replace(".", "_")] == props[key], key
    assert env["CLUSTER_ID"] == "MkU3OEVBNTcwNTJENDM2Qk"
    listeners = dict(x.split("://") for x in env["KAFKA_LISTENERS"].split(","))
    assert listeners["PLAINTEXT"] == f"0.0.0.0:{server_containers.KAFKA_PORT}"
    assert set(listeners) == {"PLAINTEXT", "BROKER", "CONTROLLER"}
    protocols = dict(x.split(":") for x in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols == {"PLAINTEXT": "PLAINTEXT", "BROKER": "PLAINTEXT", "CONTROLLER": "PLAINTEXT"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"1@localhost:{listeners['CONTROLLER'].split(':')[1]}"


def test_kafka_cluster_ids_are_kraft_ids() -> None:
    ids = {server_containers._cluster_id() for _ in range(20)}
    assert len(ids) == 20
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{22}", i) for i in ids)


def test_the_kafka_start_script_advertises_the_published_address() -> None:
    script = server_containers.kafka_start_script("127.0.0.1", 49153)
    assert script.startswith("#!/bin/sh\n")
    assert 'export KAFKA_ADVERTISED_LISTENERS="PLAINTEXT://127.0.0.1:49153,BROKER://$(hostname -i' in script
    assert script.rstrip().endswith("exec /etc/kafka/docker/run")


def test_the_otel_collector_config_forwards_metrics_and_logs_unbatched() -> None:
    cfg = yaml.safe_load(server_containers.otel_collector_config("host.docker.internal:4000"))
    assert cfg["receivers"]["otlp"]["protocols"] == {
        "grpc": {"endpoint": "0.0.0.0:4317"}, "http": {"endpoint": "0.0.0.0:4318"}}  # fmt: skip
    assert cfg["exporters"]["otlp"] == {
        "endpoint": "host.docker.internal:4000",
        "tls": {"insecure": True},
        "sending_queue": {"enabled": False},
    }
    assert cfg["service"]["pipelines"] == {
        "metrics": {"receivers": ["otlp"], "exporters": ["otlp"]},
        "logs": {"receivers": ["otlp"], "exporters": ["otlp"]},
    }
    assert "processors" not in cfg


def test_the_prometheus_config_scrapes_the_target_every_second() -> None:
    cfg = yaml.safe_load(server_containers.prometheus_config("host.docker.internal:9100", "job-a"))
    assert cfg == {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "job-a", "static_configs": [{"targets": ["host.docker.internal:9100"]}]}],
    }


@pytest.mark.parametrize(
    ("image", "binary"),
    [
        (server_containers.PROMETHEUS_IMAGE, "prometheus"),
        (server_containers.ALERTMANAGER_IMAGE, "prometheus-alertmanager"),
    ],
)
def test_the_prom_images_are_the_versions_of_the_local_packages(image: str, binary: str) -> None:
    import shutil
    import subprocess

    name, tag = image.split(":")
    assert name == f"prom/{binary.removeprefix('prometheus-')}" and re.fullmatch(r"v\d+\.\d+\.\d+", tag)
    path = shutil.which(binary)
    if path is None:
        # .ci/run installs the Debian package (deploy/debian-packages.txt): there a missing one fails
        give_up(f"{binary} not installed (Debian package {binary}): nothing to compare {image} with")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    [version] = re.findall(r"version (\d+\.\d+\.\d+)", out.stdout + out.stderr)[:1]
    assert tag == f"v{version}", f"{image} but the Debian package is {version}: keep both modes on one server"


def test_the_collector_and_kafka_images() -> None:
    name, tag = server_containers.OTEL_COLLECTOR_IMAGE.split(":")
    assert name == "otel/opentelemetry-collector-contrib"
    assert re.fullmatch(r"0\.\d+\.\d+", tag) and int(tag.split(".")[1]) < 144  # `otlp` renamed in 0.144
    version = kafka_version({}, KAFKA_SH)
    assert server_containers.KAFKA_IMAGE.format(version=version) == f"apache/kafka:{version}"


def test_the_server_modules_import_no_testcontainers_until_a_container_starts() -> None:
    import subprocess
    import sys

    code = "import sys, servers, server_containers; print('testcontainers' in sys.modules, 'docker' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT / "tests", capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.split() == ["False", "False"]
