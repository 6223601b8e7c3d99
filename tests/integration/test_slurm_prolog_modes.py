"""The Slurm admin's cases of deploy/slurm/prolog-gpuwarden.sh on the real local Slurm 22.05
(issue 17, point 5), with the wrapper installed cluster-wide as ``Prolog=`` and
``healthcheck-gpuwarden.sh`` as ``HealthCheckProgram=``:

* a job with no GPUs on a node with no NVIDIA device, and a GPU job in a partition that is not
  listed in ``GPUWARDEN_HEALTH_GPU_PARTITIONS``, pass the prolog and run, while the node's
  (simulated) GPUs would fail the check: nothing was checked;
* a node the prolog drained is resumed by the real remediator service (enforcing, ``scontrol``
  backend, real Kafka) once a later ``HealthCheckProgram`` run passes and publishes on ``health``;
  a node whose reason an admin changed meanwhile stays drained with the admin's reason;
* a ``HealthCheckProgram`` run finishes well inside the 60 s after which slurmd kills it: a
  passing run in a few seconds, and a hung ``gpuwarden`` is killed by the wrapper's default guard
  (15 s), counted CRITICAL and drains the node with the wrapper's reason.

Set-up as in test_health_check_slurm.py (whose helpers it uses): shims appended to
/etc/slurm/gpuwarden-extra.conf, ``scontrol reconfigure``, the file's bytes written back at the
end. The shims act only on gpu-node-004 and only while a flag file exists: the prolog shim for
this module's jobs (``SLURM_JOB_WORK_DIR``), the health-check shim while ``periodic-on`` exists
(slurmd runs it for every node every ``HealthCheckInterval``; one run at a time, by a lock
directory). Observed on 22.05: ``scontrol reconfigure`` starts a ``HealthCheckProgram`` run on
every node at once, and slurmd gives it only ``SLURMD_NODENAME`` (no PATH).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafkatools import read
from test_health_check_slurm import (
    CONF,
    ECC,
    EXTRA,
    GPUWARDEN,
    HEALTHY,
    NODE,
    PROLOG,
    job,
    node,
    settled,
    sh,
    wait,
    wait_until,
)

from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.shared.models import Action, HealthCheckResult, Remediation, RemediationDecision
from gpuwarden.shared.slurm import CliSlurm

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

HEALTHCHECK = PROLOG.with_name("healthcheck-gpuwarden.sh")
INTERVAL_S = 3  # HealthCheckInterval while this module runs
CPU_PARTITION = "cpu-i17"  # a partition created (and deleted) here, outside the GPU partitions
SLURM_KILL_S = 60  # slurmd kills a HealthCheckProgram after this long (slurm.conf(5))


@dataclass
class Site:
    """The shims' directory and what the tests switch in it."""

    dir: Path

    @property
    def scenario(self) -> Path:
        return self.dir / "scenario.yaml"

    def set_scenario(self, text: str) -> None:
        tmp = self.dir / "scenario.yaml.new"
        tmp.write_text(text)
        tmp.replace(self.scenario)

    def write_env(self, *, gpu_node: bool = False, bin: Path = GPUWARDEN, bus: dict[str, str] | None = None) -> None:
        """The wrapper's env file: the simulated node, GPU partition ``gpu`` only; ``gpu_node``:
        NVIDIA device files in the wrapper's dev dir (else this machine's /dev, which has none);
        publish to ``bus`` (bootstrap + prefix) if given."""
        d = self.dir
        lines = [
            f"GPUWARDEN_BIN={bin}",
            f"GPUWARDEN_HEALTH_SCENARIO={self.scenario}",
            f"GPUWARDEN_HEALTH_STATE_DIR={d / 'state'}",
            f"GPUWARDEN_HEALTH_KERNEL_LOG={d / 'kern.log'}",
            "GPUWARDEN_HEALTH_GPU_PARTITIONS=gpu",
        ]
        if gpu_node:
            # a GPU node: /dev/nvidia<N> present (a periodic run outside any job checks it)
            lines.append(f"GPUWARDEN_HEALTH_DEV_DIR={d / 'gpu-dev'}")
        elif list(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/nvidiactl").exists():
            # a machine with a real NVIDIA driver: the CPU-only case needs a /dev without one
            lines.append(f"GPUWARDEN_HEALTH_DEV_DIR={d / 'dev'}")
        if bus:
            lines += [
                "GPUWARDEN_HEALTH_PUBLISH=true",
                f"GPUWARDEN_BOOTSTRAP_SERVERS={bus['GPUWARDEN_BOOTSTRAP_SERVERS']}",
                f"GPUWARDEN_TOPIC_PREFIX={bus['GPUWARDEN_TOPIC_PREFIX']}",
                "GPUWARDEN_HEALTH_PUBLISH_TIMEOUT_S=5",
            ]
        else:
            lines.append("GPUWARDEN_HEALTH_PUBLISH=false")
        (d / "health.env").write_text("\n".join(lines) + "\n")

    def log_lines(self, phase: str) -> list[str]:
        f = self.dir / "health.log"
        text = f.read_text() if f.exists() else ""
        return [ln for ln in text.splitlines() if f" phase={phase} rc=" in ln]

    def job_log(self, job_id: str) -> str:
        return next((ln for ln in self.log_lines("prolog") if f" job={job_id} phase=prolog " in ln), "")

    def periodic_runs(self) -> list[tuple[float, float, int]]:
        """(start, end, exit code) of each finished periodic run, wall s."""
        f = self.dir / "periodic"
        runs = re.findall(r"^start (\S+) end (\S+) rc=(\d+)$", f.read_text() if f.exists() else "", re.M)
        return [(float(a), float(b), int(c)) for a, b, c in runs]

    def periodic(self, on: bool) -> None:
        """Let the HealthCheckProgram shim run the wrapper (on), or stop it and wait for a run in
        flight to end (off)."""
        flag = self.dir / "periodic-on"
        if on:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)
            wait("no periodic run in flight", lambda: not (self.dir / "periodic.lock").exists(), timeout=30)

    def reset_node(self) -> None:
        """No periodic runs, healthy scenario, no publishing, NODE idle and undrained."""
        self.periodic(False)
        self.set_scenario(HEALTHY)
        self.write_env()
        wait(f"no job on {NODE}", lambda: not sh("squeue", "-h", "-w", NODE, "-o", "%i").strip())
        settled()
        if "DRAIN" in node()["State"]:
            sh("scontrol", "update", f"nodename={NODE}", "state=RESUME")
        wait(f"{NODE} idle and undrained", lambda: node()["State"] == "IDLE", timeout=30)


def _shims(d: Path) -> tuple[Path, Path]:
    env = f"export GPUWARDEN_HEALTH_ENV_FILE={d}/health.env GPUWARDEN_HEALTH_LOG={d}/health.log\n"
    prolog = d / "prolog-shim.sh"
    prolog.write_text(
        "#!/bin/bash\n"
        f"# tests/integration/test_slurm_prolog_modes.py: the real prolog for its jobs on {NODE}\n"
        f'[ "$SLURMD_NODENAME" = {NODE} ] && [ -e {d}/active ] || exit 0\n'
        'case "$SLURM_JOB_WORK_DIR" in\n'
        f'    {d}/probe) echo "probe job=$SLURM_JOB_ID" >> {d}/calls; exit 0 ;;\n'
        f"    {d}) ;;\n"
        "    *) exit 0 ;;\n"
        "esac\n"
        f'echo "prolog job=$SLURM_JOB_ID partition=$SLURM_JOB_PARTITION gpus=$SLURM_JOB_GPUS" >> {d}/calls\n'
        f"{env}exec {PROLOG}\n"
    )
    hc = d / "healthcheck-shim.sh"
    hc.write_text(
        "#!/bin/bash\n"
        f"# tests/integration/test_slurm_prolog_modes.py: the real HealthCheckProgram on {NODE}\n"
        f'[ "$SLURMD_NODENAME" = {NODE} ] && [ -e {d}/active ] && [ -e {d}/periodic-on ] || exit 0\n'
        f"mkdir {d}/periodic.lock 2>/dev/null || exit 0   # one run at a time\n"
        "t0=$(date +%s.%N)\n"
        f"( {env}exec {HEALTHCHECK} )\n"
        "rc=$?\n"
        f'echo "start $t0 end $(date +%s.%N) rc=$rc" >> {d}/periodic\n'
        f"rmdir {d}/periodic.lock\n"
        "exit $rc\n"
    )
    for f in (prolog, hc):
        f.chmod(0o755)
    return prolog, hc


def _probe(d: Path) -> bool:
    j = sh("sbatch", "--parsable", "-w", NODE, "-D", str(d / "probe"), "-o", "/dev/null", "--wrap", "true").strip()
    wait(f"probe job {j} to end", lambda: job(j).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), timeout=30)
    return f"probe job={j}\n" in (d / "calls").read_text()


@pytest.fixture(scope="module")
def site(slurm_cluster: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """Prolog= and HealthCheckProgram= shims in the running cluster for this module."""
    assert NODE in slurm_cluster
    if not (EXTRA.exists() and f"Include {EXTRA}" in CONF.read_text()):
        pytest.fail(f"{CONF} does not Include {EXTRA}: cluster started by an older start-local-slurm.sh?")
    d = tmp_path_factory.mktemp("prolog-modes")
    d.chmod(0o755)
    for sub in ("probe", "dev", "gpu-dev", "state"):
        (d / sub).mkdir()
    for i in range(8):
        (d / "gpu-dev" / f"nvidia{i}").touch()
    (d / "calls").touch()
    (d / "kern.log").touch()
    s = Site(d)
    s.set_scenario(HEALTHY)
    s.write_env()
    prolog, hc = _shims(d)
    orig = EXTRA.read_bytes()
    extra = (
        "\n# test_slurm_prolog_modes.py (removed after it)\n"
        f"Prolog={prolog}\nPrologFlags=Alloc\n"
        f"HealthCheckProgram={hc}\nHealthCheckInterval={INTERVAL_S}\nHealthCheckNodeState=ANY\n"
    )
    (d / "active").touch()
    try:
        EXTRA.write_bytes(orig + extra.encode())
        sh("scontrol", "reconfigure")
        cfg = sh("scontrol", "show", "config")
        assert re.search(rf"^HealthCheckProgram\s+= {hc}$", cfg, re.M), cfg
        wait("a probe job through the prolog shim on " + NODE, lambda: _probe(d), timeout=90, step=0)
        sh("scontrol", "create", f"partitionname={CPU_PARTITION}", f"nodes={NODE}", "state=up")
        yield s
        s.reset_node()
    finally:
        (d / "active").unlink()
        subprocess.run(["scontrol", "delete", f"partitionname={CPU_PARTITION}"], capture_output=True, timeout=30)
        EXTRA.write_bytes(orig)
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, timeout=30)
    cfg = sh("scontrol", "show", "config")
    assert re.search(r"^Prolog\s+= \(null\)$", cfg, re.M) and re.search(r"^HealthCheckProgram\s+= \(null\)$", cfg, re.M)


def _run(s: Site, name: str, *extra: str) -> str:
    """A job on NODE (working directory: the shims' dir); its id."""
    out = str(s.dir / f"{name}-%j.out")
    argv = ["sbatch", "--parsable", "-w", NODE, "-t", "2", "-D", str(s.dir), "-o", out, *extra]
    return sh(*argv, "--wrap", "echo ran-on-$SLURMD_NODENAME").strip().split(";")[0]


def _prolog_drain(s: Site) -> str:
    """A GPU job in the GPU partition while the node's GPUs are faulty: the prolog drains NODE.
    Returns the drain reason."""
    s.set_scenario(ECC)
    j = _run(s, "bad", "--gres=gpu:2", "-p", "gpu")
    try:
        n = wait_until("prolog drain", node, lambda n: "DRAIN" in n["State"] and bool(n["Reason"]))
        assert n["Reason"].startswith("gpuwarden prolog: CRITICAL: ecc: GPU "), n["line"]
        wait("the prolog's log line", lambda: " rc=2 CRITICAL: ecc: " in s.job_log(j))
    finally:
        subprocess.run(["scancel", j], capture_output=True, timeout=30)
    wait(f"no job on {NODE}", lambda: not sh("squeue", "-h", "-w", NODE, "-o", "%i").strip())
    return n["Reason"]


def test_prolog_passes_cpu_only_jobs_and_non_gpu_partitions(site: Site) -> None:
    s = site
    s.reset_node()
    s.set_scenario(ECC)  # the node's (simulated) GPUs would fail: a check that ran would drain
    try:
        # no NVIDIA device on this machine's /dev, no GPUs for the job: a CPU-only node
        cpu = _run(s, "cpu", "-p", "gpu")
        wait("CPU-only job to complete", lambda: job(cpu).get("JobState") == "COMPLETED")
        assert (s.dir / f"cpu-{cpu}.out").read_text().strip() == f"ran-on-{NODE}"
        assert f"prolog job={cpu} partition=gpu gpus=\n" in (s.dir / "calls").read_text()
        dev = "/dev" if "GPUWARDEN_HEALTH_DEV_DIR" not in (s.dir / "health.env").read_text() else str(s.dir / "dev")
        assert s.job_log(cpu).endswith(f"rc=0 OK: no NVIDIA device in {dev}: CPU-only node, nothing to check")
        assert settled()["State"] == "IDLE"

        # a GPU job, but in a partition outside GPUWARDEN_HEALTH_GPU_PARTITIONS=gpu
        part = _run(s, "part", "--gres=gpu:2", "-p", CPU_PARTITION)
        wait("non-GPU-partition job to complete", lambda: job(part).get("JobState") == "COMPLETED")
        assert (s.dir / f"part-{part}.out").read_text().strip() == f"ran-on-{NODE}"
        assert re.search(
            rf"^prolog job={part} partition={CPU_PARTITION} gpus=\d+,\d+$", (s.dir / "calls").read_text(), re.M
        )
        why = f"partition {CPU_PARTITION} is not a GPU partition (GPUWARDEN_HEALTH_GPU_PARTITIONS)"
        assert s.job_log(part).endswith(f"rc=0 OK: {why}, nothing to check"), s.job_log(part)
        assert settled()["State"] == "IDLE"

        # the same node and scenario, a GPU job in the GPU partition: checked, drained
        _prolog_drain(s)
    finally:
        s.reset_node()


async def test_remediator_resumes_a_prolog_drained_node_after_a_passing_periodic_check(
    site: Site, bus_env: dict[str, str]
) -> None:
    """Issue 17: "a node the prolog/epilog drained is returned to service by the remediator after
    a later passing check, under the same own-reason rule"."""
    s = site
    bs, prefix = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"]
    await asyncio.to_thread(s.reset_node)
    s.write_env(gpu_node=True, bus=bus_env)
    await asyncio.to_thread(_prolog_drain, s)
    svc = Remediator(
        RemediatorSettings(
            remediator_enforce=True,
            remediator_resume_interval_s=0.5,
            remediator_retry_backoff_s=0.05,
            remediator_min_drain_allowance=4,
        ),
        client=CliSlurm(timeout_s=15),
    )
    await svc.start()  # seed: NODE drained with the prolog's reason
    try:
        assert svc.nodes[NODE].reason and svc.nodes[NODE].reason.startswith("gpuwarden prolog: ")

        # 1. an admin takes the node over (new reason): later passes do not resume it
        admin = "admin: reseat GPU 3, ticket 4711"
        sh("scontrol", "update", f"nodename={NODE}", "state=drain", f"reason={admin}")
        t_admin = time.time()
        s.set_scenario(HEALTHY)
        s.periodic(True)
        await _until("2 passing periodic runs", lambda: len([r for r in s.periodic_runs() if r[2] == 0]) >= 2, 60)
        await _until("the passes on health", lambda: svc.history.health_pass.get(NODE, 0.0) > t_admin, 30)
        await asyncio.sleep(2 * 0.5 + 2.0 + 0.5)  # resume intervals + the remediator's settle time
        n = node()
        assert "DRAIN" in n["State"] and n["Reason"] == admin, n["line"]
        assert svc.nodes[NODE].reason == admin  # re-read from Slurm, not ours any more
        assert not [r for r in svc.recent if r["action"] == "resume"], svc.recent

        # 2. the prolog drains it again; slurm.nodes (what slurm-watcher publishes) tells the
        # remediator; the node recovers and a periodic check passes: resumed
        await asyncio.to_thread(s.periodic, False)
        sh("scontrol", "update", f"nodename={NODE}", "state=resume")
        reason = await asyncio.to_thread(_prolog_drain, s)
        state = await CliSlurm(timeout_s=15).node(NODE)
        assert state is not None and state.reason == reason
        await svc.publish("slurm.nodes", NODE, state)
        await _until("the remediator to see the prolog's drain", lambda: svc.nodes[NODE].reason == reason, 20)
        t_healthy = time.time()
        s.set_scenario(HEALTHY)
        s.periodic(True)
        await _until(f"{NODE} resumed", lambda: node()["State"] == "IDLE", 60)
        resumed_s = time.time() - t_healthy
        await asyncio.to_thread(s.periodic, False)
    finally:
        await svc.stop()

    rems = [Remediation.model_validate_json(v) for v in await read(bs, f"{prefix}remediations", 1)]
    [rem] = [r for r in rems if r.action == Action.RESUME]
    assert rem.node == NODE and rem.decision == RemediationDecision.EXECUTED and not rem.dry_run
    assert rem.reason.startswith("resume: [rule=health-check-passed] drained by the health check ('gpuwarden prolog: ")
    assert rem.argv[1:] == ["update", f"nodename={NODE}", "state=RESUME"], rem.argv
    passes = [r for r in s.periodic_runs() if r[0] >= t_healthy and r[2] == 0]
    assert passes, s.periodic_runs()
    health = [HealthCheckResult.model_validate_json(v) for v in await read(bs, f"{prefix}health", 200, timeout_s=5)]
    periodic = [h for h in health if h.node == NODE and h.phase == "periodic" and h.ts >= t_healthy]
    assert periodic and all(h.passed for h in periodic), periodic
    assert any(h.node == NODE and h.phase == "prolog" and not h.passed for h in health)  # the drains' checks
    assert all(" rc=0 OK: all checks passed | " in ln for ln in s.log_lines("periodic")[-len(passes) :])
    print(f"prolog-drained {NODE} resumed {resumed_s:.1f}s after it became healthy (HealthCheckInterval={INTERVAL_S}s)")


async def _until(what: str, cond: object, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not await asyncio.to_thread(cond):  # type: ignore[arg-type]
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.2)


def test_healthcheck_program_finishes_within_slurms_60s(site: Site) -> None:
    s = site
    s.reset_node()
    try:
        # a passing run: the real `gpuwarden health-check run` on the simulated node
        s.write_env(gpu_node=True)
        n0 = len(s.periodic_runs())
        s.periodic(True)
        wait("a periodic run", lambda: len(s.periodic_runs()) > n0, timeout=30)
        s.periodic(False)
        start, end, rc = s.periodic_runs()[n0]
        ok_s = end - start
        assert rc == 0, rc
        line = s.log_lines("periodic")[-1]
        assert f" node={NODE} job=none phase=periodic rc=0 OK: all checks passed | " in line, line
        assert ok_s < 10, ok_s
        assert settled()["State"] == "IDLE"

        # a hung gpuwarden (a stuck NVML call, a dead NFS mount): the default guard kills it
        hang = s.dir / "hang.sh"
        hang.write_text(f"#!/bin/bash\necho $$ > {s.dir}/hang.pid\nexec sleep 300\n")
        hang.chmod(0o755)
        s.write_env(gpu_node=True, bin=hang)
        n1 = len(s.periodic_runs())
        s.periodic(True)
        wait("the hung periodic run to end", lambda: len(s.periodic_runs()) > n1, timeout=SLURM_KILL_S)
        s.periodic(False)
        start, end, rc = s.periodic_runs()[n1]
        hung_s = end - start
        assert rc == 1, rc  # the wrapper failed the check ...
        line = s.log_lines("periodic")[-1]
        assert line.endswith("rc=2 CRITICAL: gpuwarden health-check run ran past 15s and was killed"), line
        assert 15 <= hung_s < 20 < SLURM_KILL_S, hung_s  # ... well before slurmd's kill
        pid = int((s.dir / "hang.pid").read_text())
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        n = node()
        assert "DRAIN" in n["State"], n["line"]
        assert n["Reason"] == "gpuwarden periodic: CRITICAL: gpuwarden health-check run ran past 15s and was killed"
    finally:
        s.reset_node()
    print(f"HealthCheckProgram: passing run {ok_s:.1f}s, hung run killed after {hung_s:.1f}s (slurmd kills at 60s)")
