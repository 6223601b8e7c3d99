"""Issue 26, item 1 (artifacts): what installs gpuwarden does not drift apart.

The Dockerfile and README's install section both run deploy/install-from-dist.sh (the line
tests/integration/test_artifacts.py runs in a fresh venv); requirements.in is what
deploy/requirements-in.py makes of the pyproject.toml files and every requirement of it is pinned
with hashes in requirements.lock; the install script's groups name every package; dist/ and
wheelhouse/ are ignored by git.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "deploy" / "install-from-dist.sh"


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Install (systemd")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_dockerfile_builds_wheels_then_installs_them_with_the_script() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.M), "the base is python:3.11-slim by default"
    assert len(stages) == 2 and stages[0].startswith("${PYTHON_IMAGE} AS build"), stages[:1]
    assert stages[1].startswith("${PYTHON_IMAGE}\n"), stages[1][:40]
    assert "build-dist.sh dist /dist" in stages[0] and "build-dist.sh wheelhouse /wheelhouse" in stages[0]
    runs = re.findall(r"^RUN (.*?)(?<!\\)$", stages[1], flags=re.M | re.S)
    pip_runs = [r for r in runs if "pip " in r or "install-from-dist.sh" in r]
    assert len(pip_runs) == 1 and "install-from-dist.sh /opt/gpuwarden /dist /wheelhouse all" in pip_runs[0], runs
    assert "pip install" not in stages[1]


def test_the_readme_installs_with_the_script_and_no_index() -> None:
    section = install_section()
    assert "install-from-dist.sh" in section and "--no-index" in section
    assert not re.search(r"pip install \.?/", section), "the install section still installs from a clone"
    for word in ("make dist", "make wheelhouse", "python3.11", "RHEL", "deadsnakes", "rollback"):
        assert word in section, word
    assert "pip install ./" not in (ROOT / "README.md").read_text()


def test_requirements_in_is_generated_from_the_pyprojects() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "requirements-in.py")], capture_output=True, text=True, check=True
    )
    assert out.stdout == (ROOT / "requirements.in").read_text(), "run make lock"


def test_every_requirement_is_pinned_with_hashes_in_the_lock() -> None:
    lock = (ROOT / "requirements.lock").read_text()
    blocks = re.findall(r"^([A-Za-z0-9][^=\s]*)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", lock, re.M)
    pinned = {norm(name) for name, _v, _h in blocks}
    assert len(pinned) == len([ln for ln in lock.splitlines() if ln[:1].isalnum()]), "a lock entry without hashes"
    wanted = set()
    for line in (ROOT / "requirements.in").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            wanted.add(norm(re.split(r"[<>=!~\[; ]", line)[0]))
    assert wanted <= pinned, wanted - pinned
    assert not {n for n in pinned if n.startswith("gpuwarden")}, "gpuwarden packages are built, never locked"
    assert "--index-url" not in lock and "--find-links" not in lock


def test_the_install_groups_name_every_package() -> None:
    script = INSTALL.read_text()
    group = {m[0]: set(m[1].split()) for m in re.findall(r"^\s+(node|central|all)\) want\+=\(([^)]*)\)", script, re.M)}
    services = {p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").is_file()}
    assert group["all"] == services | {"gpuwarden"}
    assert group["node"] | group["central"] == services
    assert "collector" not in group["central"]
    for p in services:
        assert (
            tomllib.loads((ROOT / "services" / p / "pyproject.toml").read_text())["project"]["name"] == f"gpuwarden-{p}"
        )


def test_dist_and_wheelhouse_are_ignored_by_git() -> None:
    for path in ("dist/x.whl", "wheelhouse/x.whl"):
        res = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert res.returncode == 0, f"{path} is not git-ignored"


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    """.dockerignore excludes everything (.venv, .git) but the paths deploy/Dockerfile copies."""
    ignore = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ignore[0] == "*", ignore
    allowed = {ln[1:] for ln in ignore if ln.startswith("!")}
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    copied = set()
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        copied.update(line.split()[:-1])  # the last word is the destination
    assert copied and copied == allowed, (copied - allowed, allowed - copied)
