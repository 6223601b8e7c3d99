"""Issue 26, item 1 (artifacts): the image's install line works from built files alone.

``deploy/build-dist.sh`` builds every package's wheel and sdist (``make dist``) and fetches the
files of ``requirements.lock`` into a wheelhouse, each checked against its hash
(``make wheelhouse``, the only step with the network); then the exact install line of
``deploy/Dockerfile`` (``install-from-dist.sh``, its arguments read from the Dockerfile) runs in a
fresh venv with no index — in a network namespace of its own where ``unshare -n`` works — and the
installed ``gpuwarden --version`` and ``gpuwarden demo`` run. A GPU node's install (``node``)
gets the collector without OpenTelemetry or the embedded broker.

The wheelhouse is cached per lock (``~/.cache/gpuwarden/wheelhouse-<sha256 of the lock>``).
Without the network to PyPI the test skips; under CI it fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from factories import version_report
from prerequisites import give_up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuwarden"
# no pip settings of this machine leak in (an index, find-links, a config file)
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
ENV.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PY=sys.executable, PYTHON=sys.executable)


def dockerfile_install_args() -> list[str]:
    """The install-from-dist.sh line of deploy/Dockerfile: its VENV DIST WHEELHOUSE PACKAGE... words."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    m = re.search(r"^RUN bash \S*/install-from-dist\.sh\s+([^&\\\n]+)", text, re.M)
    assert m, "deploy/Dockerfile does not run install-from-dist.sh"
    return m.group(1).split()


def sh(args: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """The lock's files (downloaded once per lock, hash-checked by pip on the way in)."""
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]
    wh = CACHE / f"wheelhouse-{key}"
    if not (wh / ".complete").exists():
        shutil.rmtree(wh, ignore_errors=True)
        res = sh(["bash", str(ROOT / "deploy" / "build-dist.sh"), "wheelhouse", str(wh)], timeout=600)
        if res.returncode != 0:
            shutil.rmtree(wh, ignore_errors=True)
            give_up(f"cannot download requirements.lock's files from PyPI (no network?): {res.stderr[-2000:]}")
        (wh / ".complete").touch()
    return wh


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Path:
    """``make dist`` into a temporary folder (the build backend comes from PyPI, as the wheelhouse)."""
    try:
        import build  # noqa: F401
    except ImportError:
        give_up("the `build` package is not installed (requirements-dev.txt; make dev)")
    out = tmp_path_factory.mktemp("dist")
    res = sh(["bash", str(ROOT / "deploy" / "build-dist.sh"), "dist", str(out)], timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def install(venv: Path, dist: Path, wheelhouse: Path, packages: list[str]) -> float:
    """Run dist's install-from-dist.sh with no network where a network namespace can be made."""
    cmd = ["bash", str(dist / "install-from-dist.sh"), str(venv), str(dist), str(wheelhouse), *packages]
    if shutil.which("unshare") and sh(["unshare", "-n", "true"], timeout=30).returncode == 0:
        cmd = ["unshare", "-n", *cmd]
    t0 = time.monotonic()
    res = sh(cmd, timeout=600)
    assert res.returncode == 0, f"{cmd}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return time.monotonic() - t0


def installed(venv: Path) -> dict[str, str]:
    res = sh([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"], timeout=120)
    assert res.returncode == 0, res.stderr
    return {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in json.loads(res.stdout)}


def test_the_dockerfiles_install_line_works_from_dist_and_the_lock_alone(
    tmp_path: Path, dist: Path, wheelhouse: Path
) -> None:
    _venv, dist_arg, wh_arg, *packages = dockerfile_install_args()
    assert (dist_arg, wh_arg) == ("/dist", "/wheelhouse") and packages, packages
    venv = tmp_path / "venv"
    install(venv, dist, wheelhouse, packages)

    wheels = dict(line.split()[0].split("==") for line in (dist / "gpuwarden-wheels.txt").read_text().splitlines())
    assert len(wheels) == 10, wheels  # shared, the eight services, the umbrella
    have = installed(venv)
    assert {name: have.get(name) for name in wheels} == wheels
    locked = dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+)", LOCK.read_text(), re.M))
    third_party = {n: v for n, v in have.items() if not n.startswith("gpuwarden")}
    for name, version in third_party.items():  # every third-party package is the locked one
        assert locked.get(name) == version or name in ("setuptools",), (name, version, locked.get(name))

    gw = str(venv / "bin" / "gpuwarden")
    out = sh([gw, "--version"], timeout=60)
    assert out.returncode == 0, out.stderr
    assert version_report(out.stdout) == wheels, out.stdout

    report = tmp_path / "report.json"
    demo = sh([gw, "demo", "--report", str(report), "--no-live"], timeout=300, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    assert json.loads(report.read_text())["score"]["passed"] is True


def test_a_gpu_node_gets_the_collector_and_only_its_dependencies(tmp_path: Path, dist: Path, wheelhouse: Path) -> None:
    venv = tmp_path / "node"
    install(venv, dist, wheelhouse, ["node"])
    have = installed(venv)
    assert {"gpuwarden-shared", "gpuwarden-collector", "gpuwarden-health-check", "python-hostlist"} <= set(have)
    assert not {n for n in have if n.startswith(("opentelemetry", "grpcio", "calfkit"))}, sorted(have)
    assert "gpuwarden-detector" not in have and "gpuwarden" not in have
    out = sh([str(venv / "bin" / "gpuwarden"), "collector", "--help"], timeout=60)
    assert out.returncode == 0, out.stderr
