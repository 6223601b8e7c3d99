"""Which real servers the test fixtures start: containers (testcontainers) or local ones.

The fixtures of ``tests/conftest.py`` and ``tests/integration`` start real servers: Apache Kafka,
Alertmanager, Prometheus and an OTLP collector. Each exists two ways: as a container (a Docker
engine and testcontainers) or local (Kafka from the Maven jars of ``deploy/kafka.sh``, the Debian
packages, the pinned ``rotel`` wheel). This module decides which, from the environment:

``GPUWARDEN_TEST_SERVERS``
    ``auto`` (the default; unset or empty is ``auto``): containers when a Docker engine answers,
    else the local servers. ``containers``: always containers; no engine is an error
    (:class:`ServerChoiceError`). ``local``: never Docker.
``GPUWARDEN_BOOTSTRAP_SERVERS``
    an external Kafka: used as is, before any mode (nothing is started).
``GPUWARDEN_TEST_REQUIRE_KAFKA=1``
    (set by CI) no Tansu fallback: when neither a Kafka container nor the jars can run, an error.

The choices are pure functions of their arguments (``env``, ``docker``, ``java``, ``local``);
:func:`docker_available` is the one probe. Slurm and Chromium are always local (no maintained
image fits: a Slurm cluster needs the host's cgroups and munge, the console tests drive the
host's Chromium over CDP).
"""

from __future__ import annotations

import gc
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, get_args

Mode = Literal["auto", "containers", "local"]
KafkaChoice = Literal["external", "container", "jars", "tansu"]
ServerChoice = Literal["container", "local", "missing"]

MODES: tuple[Mode, ...] = get_args(Mode)
MODE_VAR = "GPUWARDEN_TEST_SERVERS"
BOOTSTRAP_VAR = "GPUWARDEN_BOOTSTRAP_SERVERS"
REQUIRE_KAFKA_VAR = "GPUWARDEN_TEST_REQUIRE_KAFKA"


class ServerChoiceError(RuntimeError):
    """The environment asks for a server this machine cannot start (e.g. containers, no Docker)."""


def servers_mode(env: Mapping[str, str]) -> Mode:
    """The ``GPUWARDEN_TEST_SERVERS`` mode of ``env``: ``auto`` when unset or empty.

    Raises:
        ValueError: any other value than ``auto``, ``containers``, ``local`` (exact, lower case).
    """
    raw = env.get(MODE_VAR, "")
    if raw == "":
        return "auto"
    for mode in MODES:
        if raw == mode:
            return mode
    raise ValueError(f"{MODE_VAR}={raw!r}: expected one of {', '.join(MODES)} (unset means auto)")


def _use_containers(env: Mapping[str, str], docker: bool, server: str) -> bool:
    mode = servers_mode(env)
    if mode == "containers" and not docker:
        raise ServerChoiceError(
            f"{MODE_VAR}=containers but no Docker engine answers, so {server} cannot start in a "
            "container (DOCKER_HOST, or the default socket /var/run/docker.sock); start Docker, "
            f"or set {MODE_VAR}=auto or local to use the local servers"
        )
    return mode != "local" and docker


def choose_kafka(env: Mapping[str, str], docker: bool, java: bool) -> KafkaChoice:
    """Where the session's Kafka comes from.

    Args:
        env: the environment (``GPUWARDEN_BOOTSTRAP_SERVERS``, ``GPUWARDEN_TEST_SERVERS``,
            ``GPUWARDEN_TEST_REQUIRE_KAFKA``).
        docker: a Docker engine answers (:func:`docker_available`).
        java: ``deploy/kafka.sh`` can run (java on the PATH).

    Returns:
        ``external`` when ``GPUWARDEN_BOOTSTRAP_SERVERS`` is set (whatever the mode); else
        ``container`` (apache/kafka via testcontainers) when containers are chosen; else ``jars``
        (``deploy/kafka.sh``) with java; else ``tansu`` (the embedded broker).

    Raises:
        ValueError: a bad ``GPUWARDEN_TEST_SERVERS`` (checked even with an external Kafka).
        ServerChoiceError: ``containers`` without Docker; or ``GPUWARDEN_TEST_REQUIRE_KAFKA=1``
            and the only way left is Tansu.
    """
    servers_mode(env)  # a typo is an error even when an external Kafka makes the mode moot
    if env.get(BOOTSTRAP_VAR):
        return "external"
    if _use_containers(env, docker, "Apache Kafka"):
        return "container"
    if java:
        return "jars"
    if env.get(REQUIRE_KAFKA_VAR) == "1":
        raise ServerChoiceError(
            f"{REQUIRE_KAFKA_VAR}=1 but Apache Kafka cannot start: no java for deploy/kafka.sh"
            + (" and no Docker engine" if servers_mode(env) != "local" else f" ({MODE_VAR}=local)")
        )
    return "tansu"


def choose_server(server: str, env: Mapping[str, str], docker: bool, local: bool) -> ServerChoice:
    """How a fixture starts ``server`` (Alertmanager, Prometheus, the OTLP collector).

    Args:
        server: its name, for the error message.
        env: the environment (``GPUWARDEN_TEST_SERVERS``).
        docker: a Docker engine answers.
        local: its local form is installed (the Debian package's binary, the rotel wheel).

    Returns:
        ``container`` when containers are chosen; else ``local`` when installed; else ``missing``
        (the fixture fails, naming the package).

    Raises:
        ValueError: a bad ``GPUWARDEN_TEST_SERVERS``.
        ServerChoiceError: ``containers`` without Docker.
    """
    if _use_containers(env, docker, server):
        return "container"
    return "local" if local else "missing"


def docker_available(env: Mapping[str, str] | None = None, timeout_s: float = 2.0) -> bool:
    """True when a Docker engine answers a ping within ``timeout_s`` seconds; never raises.

    The engine is the one the docker SDK and testcontainers find: ``DOCKER_HOST`` (with
    ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``), else the current Docker CLI context, else the
    default socket ``/var/run/docker.sock``. ``env`` defaults to ``os.environ`` (the SDK also
    reads ``os.environ`` when ``env`` is empty).
    """
    # docker 7.x leaves the socket of a refused unix connect unclosed (UnixHTTPConnection.connect):
    # collected here, its ResourceWarning silenced, rather than surfacing in a later test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return _ping(env if env is not None else os.environ, timeout_s)
        finally:
            gc.collect()


def _ping(env: Mapping[str, str], timeout_s: float) -> bool:
    try:
        import docker

        client = docker.from_env(environment=dict(env), timeout=timeout_s)
    except Exception:  # no SDK, a bad DOCKER_HOST, nothing listening (version probe): no engine
        return False
    try:
        return client.ping() is True
    except Exception:
        return False
    finally:
        client.close()


_KAFKA_DEFAULT = re.compile(r"^KAFKA_VERSION=\$\{KAFKA_VERSION:-(\d+\.\d+\.\d+)\}$", re.MULTILINE)


def kafka_version(env: Mapping[str, str], script: Path) -> str:
    """The Apache Kafka version the tests run: ``KAFKA_VERSION`` from ``env`` if set, else the
    default of ``script`` (``deploy/kafka.sh``), so the container and the jars are the same Kafka.

    Raises:
        ValueError: ``KAFKA_VERSION`` is not ``X.Y.Z``, or ``script`` has no
            ``KAFKA_VERSION=${KAFKA_VERSION:-X.Y.Z}`` line.
        OSError: ``script`` cannot be read.
    """
    wanted = env.get("KAFKA_VERSION")
    if wanted:
        if not re.fullmatch(r"\d+\.\d+\.\d+", wanted):
            raise ValueError(f"KAFKA_VERSION={wanted!r}: expected X.Y.Z (an apache/kafka image tag)")
        return wanted
    m = _KAFKA_DEFAULT.search(script.read_text())
    if m is None:
        raise ValueError(f"{script}: no 'KAFKA_VERSION=${{KAFKA_VERSION:-X.Y.Z}}' line to take the default from")
    return m.group(1)
