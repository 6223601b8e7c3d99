"""The systemd units in deploy/systemd: ``systemd-analyze verify`` accepts each (with its
ExecStart pointed at this checkout's ``gpuwarden``, since verify needs the binary to exist),
prints no warning, runs a real ``gpuwarden`` subcommand, and every ``GPUWARDEN_*`` key of its env
file is a setting of that service (and the file loads into the service's settings)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prerequisites import give_up

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SERVICES = ["collector", "otlp-bridge", "slurm-watcher", "correlator", "correlator-events", "detector", "remediator"]
GPUWARDEN = Path(sys.executable).with_name("gpuwarden")
#: A unit that runs another service's command (a second lane), and the env files it loads, in order.
COMMAND = {"correlator-events": "correlator"}
ENV_FILES = {"correlator-events": ["correlator.env", "correlator-events.env"]}


def env_files(service: str) -> list[str]:
    return ENV_FILES.get(service, [f"{service}.env"])


def settings_class(service: str) -> Any:
    from gpuwarden.collector.settings import CollectorSettings
    from gpuwarden.correlator.settings import CorrelatorSettings
    from gpuwarden.detector.service import DetectorSettings
    from gpuwarden.otlp_bridge.settings import OtlpBridgeSettings
    from gpuwarden.remediator import RemediatorSettings
    from gpuwarden.slurm_watcher.service import SlurmWatcherSettings

    return {
        "collector": CollectorSettings, "otlp-bridge": OtlpBridgeSettings, "slurm-watcher": SlurmWatcherSettings,
        "correlator": CorrelatorSettings, "correlator-events": CorrelatorSettings, "detector": DetectorSettings,
        "remediator": RemediatorSettings,
    }[service]  # fmt: skip


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        give_up("systemd-analyze not installed (Debian package systemd)")
    return str(path)


def env_pairs(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(.*)", line)
        assert m, f"{path.name}:{n} is not KEY=VALUE: {line!r}"
        out[m.group(1)] = m.group(2)
    return out


def verify(unit: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    text = unit.read_text().replace("/opt/gpuwarden/bin/gpuwarden", str(GPUWARDEN))
    copy = tmp_path / unit.name
    copy.write_text(text)
    return subprocess.run(
        [systemd_analyze(), "verify", str(copy)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
    )  # fmt: skip


@pytest.mark.parametrize("service", SERVICES)
def test_unit_passes_systemd_analyze_verify(service: str, tmp_path: Path) -> None:
    unit = UNITS / f"gpuwarden-{service}.service"
    assert GPUWARDEN.exists(), GPUWARDEN
    res = verify(unit, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr.strip() == "" and res.stdout.strip() == "", res.stdout + res.stderr  # not even a warning
    text = unit.read_text()
    assert f"ExecStart=/opt/gpuwarden/bin/gpuwarden {COMMAND.get(service, service)}\n" in text
    loads = [line.split("/")[-1] for line in text.splitlines() if line.startswith("EnvironmentFile=")]
    assert loads == env_files(service), loads
    for key in (
        "Restart=on-failure",
        "User=gpuwarden",
        "MemoryMax=",
        "NoNewPrivileges=yes",
        "WantedBy=multi-user.target",
    ):
        assert key in text, (service, key)


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    bad = tmp_path / "gpuwarden-broken.service"
    bad.write_text((UNITS / "gpuwarden-collector.service").read_text().replace("RestartSec=5s", "RestartSec=soon"))
    (tmp_path / "v").mkdir()
    res = verify(bad, tmp_path / "v")
    assert (
        "Failed to parse sec value" in res.stderr
        and "RestartSec" in (UNITS / "gpuwarden-collector.service").read_text()
    )


def test_collector_unit_can_reach_the_nvidia_devices_and_the_kernel_log() -> None:
    text = (UNITS / "gpuwarden-collector.service").read_text()
    assert "DevicePolicy=closed" in text
    for dev in ("char-nvidia-frontend rw", "char-nvidia-uvm rw", "/dev/kmsg r"):
        assert f"DeviceAllow={dev}\n" in text
    assert "AmbientCapabilities=CAP_SYSLOG" in text
    assert "PrivateDevices" not in text  # would hide /dev/nvidia*


@pytest.mark.parametrize("service", SERVICES)
def test_env_file_keys_are_settings_of_the_service(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs: dict[str, str] = {}
    for name in env_files(service):  # later files override earlier ones, as systemd reads them
        pairs.update(env_pairs(UNITS / name))
    cls = settings_class(service)
    fields = {f"GPUWARDEN_{name.upper()}" for name in cls.model_fields}
    unknown = {k for k in pairs if k.startswith("GPUWARDEN_")} - fields
    assert not unknown, f"{service}.env sets {unknown}, which {cls.__name__} does not read"
    for k in list(os.environ):
        if k.startswith("GPUWARDEN_"):
            monkeypatch.delenv(k)
    for k, v in pairs.items():
        monkeypatch.setenv(k, v)
    s = cls()
    assert s.bootstrap_servers == "kafka-1:9092,kafka-2:9092"  # type: ignore[attr-defined]
    assert s.http_port == int(pairs["GPUWARDEN_HTTP_PORT"])  # type: ignore[attr-defined]
    if service == "remediator":
        assert s.remediator_enforce is False  # type: ignore[attr-defined]


def test_ports_are_distinct_and_match_the_prometheus_example() -> None:
    ports = {s: env_pairs(UNITS / env_files(s)[-1])["GPUWARDEN_HTTP_PORT"] for s in SERVICES}
    assert len(set(ports.values())) == len(SERVICES), ports
    example = (ROOT / "deploy" / "prometheus" / "prometheus.example.yml").read_text()
    for s, port in ports.items():
        job = re.split(rf"job_name: gpuwarden-{COMMAND.get(s, s)}\b(?!-)", example)[1].split("job_name")[0]
        assert f":{port}'" in job, (s, port)


@pytest.mark.parametrize("service", SERVICES)
def test_unit_command_exists_in_the_cli(service: str) -> None:
    from gpuwarden.shared.cli import app, load_plugins

    load_plugins()
    res = CliRunner().invoke(app, [COMMAND.get(service, service), "--help"])
    assert res.exit_code == 0, res.output


def test_install_script_into_a_destdir(tmp_path: Path) -> None:
    env = {**os.environ, "DESTDIR": str(tmp_path)}
    res = subprocess.run(["bash", str(UNITS / "install.sh"), "collector", "remediator"], capture_output=True,
                         text=True, timeout=60, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "etc/systemd/system/gpuwarden-collector.service").read_text() == (
        UNITS / "gpuwarden-collector.service"
    ).read_text()
    mine = tmp_path / "etc/gpuwarden/remediator.env"
    mine.write_text("GPUWARDEN_REMEDIATOR_ENFORCE=true\n")
    res = subprocess.run(["bash", str(UNITS / "install.sh"), "remediator"], capture_output=True, text=True,
                         timeout=60, env=env)  # fmt: skip
    assert res.returncode == 0 and "kept" in res.stdout
    assert mine.read_text() == "GPUWARDEN_REMEDIATOR_ENFORCE=true\n"  # the site's settings are never overwritten
    bad = subprocess.run(["bash", str(UNITS / "install.sh"), "nope"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown service" in bad.stderr
