"""Each service installs alone with only its own dependencies: the node-side packages
(collector, health-check) neither declare nor import faust or OpenTelemetry, and the correlator
(off faust-streaming: the shared aiokafka consumer) neither declares nor imports faust."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("faust", "opentelemetry", "mode")


def deps(package_dir: str) -> list[str]:
    data = tomllib.loads((ROOT / package_dir / "pyproject.toml").read_text())
    return [d.lower() for d in data["project"]["dependencies"]]


@pytest.mark.parametrize("package_dir", ["shared", "services/collector", "services/health-check"])
def test_node_side_packages_do_not_declare_heavy_dependencies(package_dir: str) -> None:
    assert not [d for d in deps(package_dir) if d.startswith(("faust", "opentelemetry"))]


@pytest.mark.parametrize(
    "module",
    ["gpuwarden.collector.service", "gpuwarden.collector.cli", "gpuwarden.health_check.cli", "gpuwarden.shared.cli"],
)
def test_node_side_modules_import_without_faust_or_opentelemetry(module: str) -> None:
    """Import the module in a fresh interpreter where faust and OpenTelemetry cannot be imported."""
    proc = _import_blocked(module)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "module",
    [
        "gpuwarden.correlator.core",
        "gpuwarden.correlator.slurmview",
        "gpuwarden.correlator.service",
        "gpuwarden.correlator.cli",
    ],
)
def test_correlator_modules_import_without_faust(module: str) -> None:
    proc = _import_blocked(module, ("faust", "mode"))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_import_blocker_does_block() -> None:
    proc = _import_blocked("gpuwarden.correlator.service", ("aiokafka",))  # the shared consumer needs aiokafka
    assert proc.returncode != 0 and "blocked: aiokafka" in proc.stderr


def _import_blocked(module: str, blocked: tuple[str, ...] = HEAVY) -> subprocess.CompletedProcess[str]:
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"import {module}\n"
    )
    return subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60)


def test_service_packages_declare_what_they_import() -> None:
    assert not [d for d in deps("services/correlator") if d.startswith(("faust", "mode"))]
    assert any(d.startswith("gpuwarden-shared") for d in deps("services/correlator"))
    assert any(d.startswith("aiokafka") for d in deps("shared"))  # the correlator's consumer and producer
    assert any(d.startswith("opentelemetry-sdk") for d in deps("services/otlp-bridge"))
    assert any(d.startswith("nvidia-ml-py") for d in deps("services/collector"))
