"""docker-compose.yml is valid against the Compose specification's JSON schema, and each
gpuwarden service's command exists in the CLI (no container engine runs on CI machines).

The schema is the ``compose_spec.json`` shipped inside the docker-compose 1.29.2 wheel on
PyPI (fetched once with ``pip download`` and cached), not a copy kept in this repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import orjson
import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuwarden" / "compose-spec"
SERVICES = {
    "collector",
    "slurm-watcher",
    "correlator",
    "correlator-events",
    "detector",
    "otlp-bridge",
    "remediator",
    "console",
}


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    wheel = CACHE / "docker_compose-1.29.2-py2.py3-none-any.whl"
    if not wheel.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "docker-compose==1.29.2", "-d", str(CACHE)],
            check=True,
            timeout=300,
        )
    with zipfile.ZipFile(wheel) as z:
        return orjson.loads(z.read("compose/config/compose_spec.json"))


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_file_is_valid_against_the_compose_spec(compose_schema: dict, compose: dict) -> None:
    jsonschema.Draft7Validator.check_schema(compose_schema)
    errors = sorted(jsonschema.Draft7Validator(compose_schema).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_compose_runs_kafka_kraft_and_all_six_services(compose: dict) -> None:
    services = compose["services"]
    assert set(services) >= SERVICES
    kafka_env = services["kafka"]["environment"]
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["remediator"]["environment"]["GPUWARDEN_REMEDIATOR_ENFORCE"] == "false"
    # issue 26, item 1: the correlator's two lanes (samples, events) and the console
    assert services["correlator"]["environment"]["GPUWARDEN_CORRELATOR_LANE"] == "samples"
    assert services["correlator-events"]["environment"]["GPUWARDEN_CORRELATOR_LANE"] == "events"
    assert services["console"]["command"] == ["gpuwarden", "console"]


def test_invalid_compose_is_rejected(compose_schema: dict, compose: dict) -> None:
    bad = {
        **compose,
        "services": {**compose["services"], "detector": {**compose["services"]["detector"], "restart": ["always"]}},
    }
    assert list(jsonschema.Draft7Validator(compose_schema).iter_errors(bad))


@pytest.mark.parametrize("name", sorted(SERVICES | {"topics"}))
def test_each_compose_command_exists_in_the_cli(compose: dict, name: str) -> None:
    from gpuwarden.shared.cli import app, load_plugins

    load_plugins()
    cmd = compose["services"][name]["command"]
    assert cmd[0] == "gpuwarden"
    res = CliRunner().invoke(app, [*cmd[1:], "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output
