"""``docker-compose config`` (Debian 12's docker-compose 1.29.2: parses and resolves the file
without a container engine) accepts docker-compose.yml alone and with the real-Slurm override;
every path the compose files mount from the repository exists (a missing folder would be created
empty by Docker and the collector would publish nothing without a warning)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from prerequisites import give_up

ROOT = Path(__file__).resolve().parents[2]
OVERRIDE = ROOT / "deploy" / "compose" / "slurm.yml"


def compose_config(*files: Path) -> dict:
    exe = shutil.which("docker-compose")
    if exe is None:
        give_up("docker-compose not installed (Debian package docker-compose, in deploy/debian-packages.txt)")
    args = [str(exe)] + [a for f in files for a in ("-f", str(f))] + ["config"]
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COMPOSE_PROJECT_NAME": "gpuwarden"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    return yaml.safe_load(res.stdout)


def _mounts(svc: dict) -> dict[str, str]:
    """target -> source of a service's volumes (docker-compose 1.29 prints them as strings)."""
    out = {}
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out[v["target"]] = v.get("source", "")
        else:
            src, target = v.split(":")[:2]
            out[target] = src
    return out


def test_compose_config_passes_and_the_collector_runs_the_simulator() -> None:
    cfg = compose_config(ROOT / "docker-compose.yml")
    col = cfg["services"]["collector"]
    assert col["environment"]["GPUWARDEN_COLLECTOR_SOURCE"] == "simulated"
    scenario = col["environment"]["GPUWARDEN_COLLECTOR_SCENARIO"]
    src = _mounts(col)["/scenarios"]
    assert (Path(src) / Path(scenario).name).is_file(), (src, scenario)
    for name in ("slurm-watcher", "remediator"):
        env = cfg["services"][name]["environment"]
        backend = env.get("GPUWARDEN_SLURM_WATCHER_BACKEND") or env.get("GPUWARDEN_REMEDIATOR_BACKEND")
        assert backend == "simulated", name  # no sinfo in the image: simulated unless the override is used
    assert cfg["services"]["remediator"]["environment"]["GPUWARDEN_REMEDIATOR_ENFORCE"] == "false"


def test_every_bind_mount_from_the_repository_exists() -> None:
    for f in (ROOT / "docker-compose.yml", OVERRIDE):
        for name, svc in yaml.safe_load(f.read_text())["services"].items():
            for v in svc.get("volumes", []):
                src = v.split(":")[0]
                if src.startswith("."):
                    assert (ROOT / src).exists(), f"{f.name}: {name} mounts {src}, which does not exist"


def test_the_real_slurm_override_mounts_what_the_slurm_client_needs() -> None:
    cfg = compose_config(ROOT / "docker-compose.yml", OVERRIDE)
    for name in ("slurm-watcher", "remediator"):
        svc = cfg["services"][name]
        targets = set(_mounts(svc))
        assert {"/etc/slurm", "/run/munge"} <= targets, (name, targets)
        assert svc["build"]["args"]["SLURM_CLIENT"] == "1"
    assert cfg["services"]["slurm-watcher"]["environment"]["GPUWARDEN_SLURM_WATCHER_BACKEND"] == "cli"
    assert cfg["services"]["remediator"]["environment"]["GPUWARDEN_REMEDIATOR_BACKEND"] == "cli"
    assert cfg["services"]["collector"]["profiles"] == ["sim"]
    assert "SLURM_CLIENT" in (ROOT / "deploy" / "Dockerfile").read_text()


def test_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    bad = tmp_path / "docker-compose.yml"
    bad.write_text((ROOT / "docker-compose.yml").read_text().replace("restart: unless-stopped", "restart: [1]"))
    exe = shutil.which("docker-compose")
    if exe is None:
        give_up("docker-compose not installed (Debian package docker-compose, in deploy/debian-packages.txt)")
    res = subprocess.run(
        [exe, "-f", str(bad), "config", "-q"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert res.returncode != 0
