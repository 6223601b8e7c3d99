"""Package boundaries, read from the source (ast, nothing imported): a service package imports only
``gpuwarden.shared`` and itself (NVIDIA node primitives live in ``gpuwarden.shared.nvidia``, not in
the collector), a runtime module imports no simulator (``*.sim``, ``FakeNvml`` ...), no service
package and not ``gpuwarden.shared`` imports the simulation layer (``gpuwarden.sim``) or the demo
(``gpuwarden.demo``): a service finds a simulated backend through an entry point
(:mod:`gpuwarden.shared.plugins`), and simulators and bench modules live in ``gpuwarden.sim``.

The exceptions that remain are listed below, each with why; a new one fails the test, and so does
a listed one that is gone (remove it from the list)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [ROOT / "shared" / "src", *sorted((ROOT / "services").glob("*/src"))]

# (importing module, imported module) pairs that cross a package boundary today: none.
KNOWN_CROSS_PACKAGE: set[tuple[str, str]] = set()
# (runtime module, simulator it imports): none.
KNOWN_RUNTIME_SIM: set[tuple[str, str]] = set()
# Simulator / bench modules still inside a service package: none.
KNOWN_SIM_MODULES: set[str] = set()
SIM_NAMES = {
    "FakeNvml",
    "SimulatedSource",
    "KernelLogGenerator",
    "SimulatedSlurm",
    "FakeSlurm",
    "TansuBroker",
    "ApacheKafka",
}
UMBRELLA = ("sim", "demo")  # gpuwarden.sim, gpuwarden.demo: the umbrella distribution only


def _modules(roots: list[Path] | None = None) -> Iterator[tuple[Path, str, bool]]:
    for src in SOURCE_ROOTS if roots is None else roots:
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            yield path, ".".join(parts[:-1] if is_pkg else parts), is_pkg


def _imports(path: Path, module: str, is_pkg: bool) -> Iterator[tuple[str, str | None]]:
    """(absolute module, imported name or None) of every import statement, relative ones resolved."""
    package = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield target, alias.name


def _is_sim_module(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return "sim" in module.split(".") or last == "bench" or last.startswith("bench_")


def _scan() -> tuple[set[tuple[str, str]], set[tuple[str, str]], set[str]]:
    cross: set[tuple[str, str]] = set()
    runtime_sim: set[tuple[str, str]] = set()
    seen: set[str] = set()
    for path, module, is_pkg in _modules():
        seen.add(module)
        own = module.split(".")[1]
        for target, name in _imports(path, module, is_pkg):
            parts = target.split(".")
            if parts[0] == "gpuwarden" and len(parts) > 1 and parts[1] not in (own, "shared"):
                cross.add((module, target))
            if not _is_sim_module(module) and ("sim" in parts or name in SIM_NAMES or name == "sim"):
                runtime_sim.add((module, target if name != "sim" else f"{target}.sim"))
    return cross, runtime_sim, seen


def _umbrella_imports(roots: list[Path] | None = None) -> set[tuple[str, str]]:
    """(module, imported) where a module of ``shared/src`` or ``services/*/src`` imports
    ``gpuwarden.sim`` / ``gpuwarden.demo`` (or a name from them via ``from gpuwarden import``)."""
    found: set[tuple[str, str]] = set()
    for path, module, is_pkg in _modules(roots):
        for target, name in _imports(path, module, is_pkg):
            full = f"{target}.{name}" if target == "gpuwarden" and name else target
            parts = full.split(".")
            if parts[0] == "gpuwarden" and len(parts) > 1 and parts[1] in UMBRELLA:
                found.add((module, full))
    return found


def test_scan_reads_every_package() -> None:
    _, _, seen = _scan()
    assert len(seen) > 100
    assert {"gpuwarden.health_check.checks.kernel_log", "gpuwarden.collector.sources.nvml"} <= seen
    assert {"gpuwarden.shared.nvidia.kernel_log", "gpuwarden.detector.catalog"} <= seen


def test_service_packages_import_only_shared_and_themselves() -> None:
    cross, _, _ = _scan()
    assert cross - KNOWN_CROSS_PACKAGE == set(), "new import across packages (use gpuwarden.shared)"
    assert KNOWN_CROSS_PACKAGE - cross == set(), "an exception is gone: remove it from KNOWN_CROSS_PACKAGE"


def test_no_service_and_not_shared_imports_the_sim_layer_or_the_demo() -> None:
    assert _umbrella_imports() == set(), "use an entry point (gpuwarden.shared.plugins) instead"


def test_simulators_and_benches_live_in_the_sim_layer() -> None:
    _, _, seen = _scan()
    in_services = {m for m in seen if _is_sim_module(m)}
    assert in_services - KNOWN_SIM_MODULES == set(), "a simulator or bench module belongs in src/gpuwarden/sim"
    assert KNOWN_SIM_MODULES - in_services == set(), "an exception is gone: remove it from KNOWN_SIM_MODULES"
    sim = ROOT / "src" / "gpuwarden" / "sim"
    moved = {"gpu_model", "nvml", "kernel_log", "collector", "health_check", "slurm", "brokers"}
    assert moved <= {p.stem for p in sim.glob("*.py")}
    benches = {p.stem for p in (sim / "bench").glob("*.py")}
    assert {"collector", "correlator", "health_check", "slurm_watcher"} <= benches


def test_runtime_modules_import_no_simulator() -> None:
    _, runtime_sim, _ = _scan()
    assert runtime_sim - KNOWN_RUNTIME_SIM == set(), "a runtime module imports a simulator"
    assert KNOWN_RUNTIME_SIM - runtime_sim == set(), "an exception is gone: remove it from KNOWN_RUNTIME_SIM"


def test_the_scan_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The checks above can fail: a relative import of a simulator and an absolute one of the
    collector are both found."""
    mod = tmp_path / "checks.py"
    mod.write_text(
        "from .sim import FakeNvml\nfrom ..collector import sources\nimport gpuwarden.shared.nvidia.smi_xml\n"
    )
    got = set(_imports(mod, "gpuwarden.health_check.checks", False))
    assert got == {
        ("gpuwarden.health_check.sim", "FakeNvml"),
        ("gpuwarden.collector", "sources"),
        ("gpuwarden.shared.nvidia.smi_xml", None),
    }
    pkg = set(_imports(mod, "gpuwarden.health_check.checks", True))  # as checks/__init__.py
    assert ("gpuwarden.health_check.checks.sim", "FakeNvml") in pkg


def test_the_scan_sees_an_import_of_the_sim_layer(tmp_path: Path) -> None:
    """The umbrella check can fail: ``import gpuwarden.sim.slurm``, ``from gpuwarden import demo``
    and ``from gpuwarden.sim.nvml import FakeNvml`` in a service module are all found."""
    src = tmp_path / "src"
    mod = src / "gpuwarden" / "remediator" / "bad.py"
    mod.parent.mkdir(parents=True)
    mod.write_text(
        "import gpuwarden.sim.slurm\nfrom gpuwarden import demo\nfrom gpuwarden.sim.nvml import FakeNvml\n"
        "from gpuwarden.shared import plugins\n"
    )
    assert _umbrella_imports([src]) == {
        ("gpuwarden.remediator.bad", "gpuwarden.sim.slurm"),
        ("gpuwarden.remediator.bad", "gpuwarden.demo"),
        ("gpuwarden.remediator.bad", "gpuwarden.sim.nvml"),
    }
