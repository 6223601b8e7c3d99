"""The prolog wrapper on the real local Slurm: a failing prolog keeps the job off the node and
Slurm drains it; a passing one lets the job run.

deploy/slurm/start-local-slurm.sh writes no Prolog= and has no include/extra-config hook, so
this test appends ``Prolog=``/``PrologFlags=Alloc`` to the generated /etc/slurm/slurm.conf,
runs ``scontrol reconfigure``, and restores the file byte for byte (and reconfigures again)
afterwards. The prolog is a shim that runs the real wrapper on gpu-node-004 only (exit 0 on
every other node, so jobs of concurrent tests elsewhere are untouched); NVML is the
collector's FakeNvml of a scenario (no GPU here), switched between healthy and faulty.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "deploy" / "slurm" / "prolog-gpuwarden.sh"
GPUWARDEN = ROOT / ".venv" / "bin" / "gpuwarden"
CONF = Path("/etc/slurm/slurm.conf")
NODE = "gpu-node-004"
HEALTHY = "name: hc\nduration_s: 600\ncluster: {nodes: 4}\n"
FAULTY = HEALTHY + "faults:\n  - {at_s: 0, kind: ecc-dbe, node: gpu-node-004}\n"


def sh(*argv: str, timeout: float = 30) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{argv}: {p.stderr}"
    return p.stdout


def wait(what: str, fn: object, timeout: float = 60) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()  # type: ignore[operator]
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def job_state(job: str) -> str:
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else ""


def node_line(node: str) -> str:
    return sh("scontrol", "-o", "show", "node", node)


@contextmanager
def prolog_configured(shim: Path) -> Iterator[None]:
    orig = CONF.read_bytes()
    assert b"Prolog=" not in orig, "slurm.conf already has a Prolog: not ours to change"
    extra = f"\n# gpuwarden test_health_check_slurm.py (restored after the test)\nProlog={shim}\nPrologFlags=Alloc\n"
    try:
        CONF.write_bytes(orig + extra.encode())
        sh("scontrol", "reconfigure")
        wait("Prolog in the running config", lambda: str(shim) in sh("scontrol", "show", "config"))
        yield
    finally:
        CONF.write_bytes(orig)
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, timeout=30)


def test_prolog_drains_a_bad_node_and_passes_a_good_one(slurm_cluster: list[str], tmp_path: Path) -> None:
    assert NODE in slurm_cluster
    tmp_path.chmod(0o755)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(HEALTHY)
    (tmp_path / "kern.log").write_text("")
    env_file = tmp_path / "health.env"
    env_file.write_text(
        f"GPUWARDEN_BIN={GPUWARDEN}\nGPUWARDEN_HEALTH_SCENARIO={scenario}\nGPUWARDEN_HEALTH_PUBLISH=false\n"
        f"GPUWARDEN_HEALTH_STATE_DIR={tmp_path / 'state'}\nGPUWARDEN_HEALTH_KERNEL_LOG={tmp_path / 'kern.log'}\n"
    )
    shim = tmp_path / "prolog-shim.sh"
    shim.write_text(
        "#!/bin/bash\n"
        f'[ "$SLURMD_NODENAME" = {NODE} ] || exit 0\n'
        f'echo "gpus=$SLURM_JOB_GPUS job=$SLURM_JOB_ID" >> {tmp_path}/prolog-env\n'
        f"export GPUWARDEN_HEALTH_ENV_FILE={env_file} GPUWARDEN_HEALTH_LOG={tmp_path}/health.log\n"
        f"exec {WRAPPER} prolog\n"
    )
    shim.chmod(0o755)
    sbatch = ["sbatch", "--parsable", "-w", NODE, "--gres=gpu:2", "-t", "2", "--wrap", "echo ran-on-$SLURMD_NODENAME"]
    with prolog_configured(shim):
        # healthy: the prolog passes and the job runs
        t0 = time.monotonic()
        ok = sh(*sbatch, "-o", str(tmp_path / "ok-%j.out")).strip().split(";")[0]
        wait("healthy job to complete", lambda: job_state(ok) == "COMPLETED")
        ran_s = time.monotonic() - t0
        assert (tmp_path / f"ok-{ok}.out").read_text().strip() == f"ran-on-{NODE}"
        assert re.search(rf"gpus=\d+,\d+ job={ok}\n", (tmp_path / "prolog-env").read_text())
        assert f"job={ok} phase=prolog rc=0 OK: all checks passed" in (tmp_path / "health.log").read_text()
        assert "DRAIN" not in node_line(NODE)

        # faulty: the prolog fails -> node drained with the one-line reason, the job never runs
        scenario.write_text(FAULTY)
        bad = sh(*sbatch, "-o", str(tmp_path / "bad-%j.out")).strip().split(";")[0]
        try:
            line = str(wait("node drained", lambda: next((ln for ln in [node_line(NODE)] if "DRAIN" in ln), "")))
            reason = re.search(r"Reason=(.*?) \[", line)
            assert reason and "gpuwarden prolog: CRITICAL: ecc: GPU" in reason.group(1), line
            assert "uncorrectable ECC" in reason.group(1)
            time.sleep(1)
            assert job_state(bad) != "COMPLETED" and not (tmp_path / f"bad-{bad}.out").exists()
            assert f"job={bad} phase=prolog rc=2 CRITICAL: ecc" in (tmp_path / "health.log").read_text()
        finally:
            subprocess.run(["scancel", bad], capture_output=True, timeout=30)
            subprocess.run(["scontrol", "update", f"nodename={NODE}", "state=RESUME"], capture_output=True, timeout=30)
    assert "Prolog" not in CONF.read_text()
    print(f"healthy job through the prolog in {ran_s:.1f}s")
