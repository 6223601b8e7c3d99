"""The Slurm wrapper for Slurm admins: a cluster-wide ``Prolog=`` passes CPU-only nodes (no
NVIDIA device, or a job outside the GPU partitions) without running anything, still checks a
node configured as a GPU node, and the ``HealthCheckProgram`` mode (``periodic``) runs
``gpuwarden health-check run`` and drains with a ``gpuwarden periodic:`` reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_health_check_wrapper import NODE, Rig

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "deploy" / "slurm" / "healthcheck-gpuwarden.sh"
CRIT = "CRITICAL: gpu-count: 7 GPUs, expected 8 | 9 checks in 0.1s\n"


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def _ran(rig: Rig) -> bool:
    return (rig.dir / "argv").exists()


def test_cpu_only_node_passes_without_running_the_checks(rig: Rig) -> None:
    (rig.devdir / "nvidia0").unlink()
    rig.result(CRIT, 2)  # would fail if it ran
    p = rig.run()
    assert p.returncode == 0, p.stderr
    assert not _ran(rig) and rig.scontrol == []
    assert any("OK: no NVIDIA device in" in line and "CPU-only node" in line for line in rig.log_lines())


def test_nvidiactl_alone_counts_as_a_gpu_node(rig: Rig) -> None:
    (rig.devdir / "nvidia0").unlink()
    (rig.devdir / "nvidiactl").write_text("")
    rig.result(CRIT, 2)
    assert rig.run().returncode == 1 and _ran(rig)


def test_an_nvidia_gpu_on_the_pci_bus_without_its_devices_is_checked(rig: Rig) -> None:
    """The driver failed to create /dev/nvidia*: the H100 on the bus makes it a GPU node, not CPU-only."""
    (rig.devdir / "nvidia0").unlink()
    sysdir = rig.dir / "sys"
    for bdf, vendor, cls in (("0000:00:1f.0", "0x8086", "0x060100"), ("0000:18:00.0", "0x10de", "0x030200")):
        d = sysdir / "bus" / "pci" / "devices" / bdf
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
    rig.result(CRIT, 2)
    assert rig.run(GPUWARDEN_HEALTH_SYS_DIR=str(sysdir)).returncode == 1 and _ran(rig)
    env = dict(rig.env)
    del env["SLURM_JOB_ID"]  # HealthCheckProgram (periodic) too
    rig.env = env
    assert rig.run(script=HEALTHCHECK, GPUWARDEN_HEALTH_SYS_DIR=str(sysdir)).returncode == 1


def test_a_job_with_gpus_is_always_checked(rig: Rig) -> None:
    (rig.devdir / "nvidia0").unlink()  # the driver did not create the devices: a real failure
    rig.result(CRIT, 2)
    p = rig.run(SLURM_JOB_GPUS="0,1")
    assert p.returncode == 1 and _ran(rig)
    assert rig.scontrol[-1][:3] == ["update", f"nodename={NODE}", "state=drain"]


def test_a_configured_gpu_node_is_checked_even_without_devices(rig: Rig) -> None:
    (rig.devdir / "nvidia0").unlink()
    rig.result(CRIT, 2)
    assert rig.run(GPUWARDEN_HEALTH_EXPECTED_GPUS="8").returncode == 1 and _ran(rig)
    rig.result("OK: no GPUs expected | 9 checks in 0.1s\n", 0)
    assert rig.run(GPUWARDEN_HEALTH_EXPECTED_GPUS="0").returncode == 0  # 0 = a CPU node: skipped too


@pytest.mark.parametrize(("partition", "runs"), [("cpu", False), ("gpu", True), ("a100", True), ("", True)])
def test_only_jobs_of_the_gpu_partitions_are_checked(rig: Rig, partition: str, runs: bool) -> None:
    rig.result(CRIT, 2)
    env = {"GPUWARDEN_HEALTH_GPU_PARTITIONS": "gpu, a100"}
    if partition:
        env["SLURM_JOB_PARTITION"] = partition
    p = rig.run(**env)
    assert _ran(rig) is runs
    assert p.returncode == (1 if runs else 0)
    if not runs:
        assert any("partition cpu is not a GPU partition" in line for line in rig.log_lines())


def test_healthcheckprogram_mode_runs_the_periodic_checks_and_drains_with_its_prefix(rig: Rig) -> None:
    rig.result(CRIT, 2)
    env = dict(rig.env)
    del env["SLURM_JOB_ID"]  # HealthCheckProgram runs outside any job
    rig.env = env
    p = rig.run(script=HEALTHCHECK)
    assert p.returncode == 1
    assert rig.argv == ["health-check", "run"]
    reason = rig.scontrol[-1][-1]
    assert reason == "reason=gpuwarden periodic: " + CRIT.strip()


def test_healthcheckprogram_guard_stays_inside_slurmds_60s_kill(rig: Rig) -> None:
    rig.result("OK: all checks passed | 9 checks in 0.02s\n", 0)
    p = rig.run("periodic", record_timeout=True)
    assert p.returncode == 0
    argv = rig.timeout_argv
    assert argv[:3] == ["-k", "2", "15"]  # 15 s guard + 2 s kill grace: far below 60 s
    assert int(argv[1]) + int(argv[2]) < 60
