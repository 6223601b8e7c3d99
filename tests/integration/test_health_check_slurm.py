"""The prolog and epilog wrappers (deploy/slurm/prolog-gpuwarden.sh, epilog-gpuwarden.sh) on the
real local Slurm 22.05: a failing prolog keeps the job off the node and drains it, a passing one
lets the job run; a passing epilog leaves the node idle, a failing one drains it after the job,
which has run and completed all the same.

How Prolog=/Epilog= get into the running cluster: the slurm.conf that
deploy/slurm/start-local-slurm.sh generates always ends with
``Include /etc/slurm/gpuwarden-extra.conf`` (comments only unless SLURM_EXTRA_CONF is given).
The module fixture appends ``Prolog=``/``Epilog=``/``PrologFlags=Alloc`` (naming shims) to that
file, runs ``scontrol reconfigure``, and at the end writes the file's earlier bytes back and
reconfigures again, so the cluster is as it was. Chosen over restarting the cluster with
SLURM_EXTRA_CONF (which works too) because a restart of every Slurm daemon costs ~6 s twice
and would also restart slurmrestd and slurmdbd under the other tests; a reconfigure takes
milliseconds and, on 22.05, is enough for all three settings (checked: ``PrologFlags=Alloc``
switched on and off by reconfigure alone, seen from ``salloc --no-shell`` running the prolog
or not). slurmctld re-reads the config before ``scontrol reconfigure`` returns, the slurmds a
moment later and asynchronously, so the fixture does not trust ``scontrol show config`` alone:
it waits until a probe job on gpu-node-004 has gone through both shims. Crash safety: the shims
act only while a flag file exists (removed first at teardown), and the next run of
start-local-slurm.sh (the ``slurm_cluster`` fixture of the next session) rewrites the extra
file and restarts the daemons if a killed test left it changed.

The shims run the real wrappers only for this module's jobs (``SLURM_JOB_WORK_DIR``, set by
slurmd for prolog and epilog) on gpu-node-004 and exit 0 for anything else, so jobs of other
tests, on any node, are untouched. NVML is the collector's FakeNvml of a scenario (no GPU here),
switched between healthy and faulty; nothing is published (GPUWARDEN_HEALTH_PUBLISH=false).

Observed Slurm 22.05 behaviour asserted here: a failing Epilog does not change the job
(COMPLETED, ExitCode 0:0, its output written); slurmctld logs ``job_epilog_complete: JobId=N
epilog error on <node>, draining the node`` and drains it with reason ``Epilog error``, unless
the node is already draining: then the wrapper's own ``scontrol update state=drain`` reason
(``gpuwarden epilog: CRITICAL: ...``) stays. The same holds for the prolog and ``Prolog error``.
After a failed prolog Slurm requeues the job and runs the epilog for it too. The wrapper drains
only a node that is not drained already, so the first reason (the prolog's, an operator's, the
remediator's) is the one ``sinfo -R`` keeps showing.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "deploy" / "slurm" / "prolog-gpuwarden.sh"
EPILOG = ROOT / "deploy" / "slurm" / "epilog-gpuwarden.sh"
GPUWARDEN = ROOT / ".venv" / "bin" / "gpuwarden"
CONF = Path("/etc/slurm/slurm.conf")
EXTRA = Path("/etc/slurm/gpuwarden-extra.conf")
CTLD_LOG = Path("/var/log/gpuwarden-slurm/slurmctld.log")
NODE = "gpu-node-004"
HEALTHY = "name: hc\nduration_s: 600\ncluster: {nodes: 4}\n"
ECC = HEALTHY + f"faults:\n  - {{at_s: 0, kind: ecc-dbe, node: {NODE}}}\n"
# a compute process left on every GPU of the node (the collector's FakeNvml: ~60 GiB each)
ZOMBIE = HEALTHY + f"faults:\n  - {{at_s: 0, kind: zombie-process, node: {NODE}}}\n"

T = TypeVar("T")


def sh(*argv: str, timeout: float = 30) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{argv}: {p.stderr}"
    return p.stdout


def wait(what: str, fn: Callable[[], T], timeout: float = 60, step: float = 0.2) -> T:
    """Poll ``fn`` until it returns something true; return that."""
    return wait_until(what, fn, bool, timeout, step)


def wait_until(what: str, get: Callable[[], T], ok: Callable[[T], bool], timeout: float = 60, step: float = 0.2) -> T:
    """Poll ``get`` until ``ok`` holds for its value; return the value."""
    end = time.monotonic() + timeout
    while True:
        v = get()
        if ok(v):
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {v!r})")
        time.sleep(step)


def job(job_id: str) -> dict[str, str]:
    """``scontrol -o show job`` as a dict ({} once the job is gone)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out.split(" Command=")[0]))


def node() -> dict[str, str]:
    """``scontrol -o show node`` of NODE: State, and Reason without its ``[user@time]`` suffix."""
    line = sh("scontrol", "-o", "show", "node", NODE)
    m = re.search(r" Reason=(.*) \[(\S+)@\S+\]", line)
    state = re.search(r" State=(\S+)", line)
    return {"State": state.group(1) if state else "", "Reason": m.group(1) if m else "", "line": line}


def settled() -> dict[str, str]:
    """:func:`node` once NODE is not COMPLETING any more."""
    return wait_until(f"{NODE} done completing", node, lambda n: "COMPLETING" not in n["State"])


def submit(d: Path, name: str, wrap: str, *extra: str) -> str:
    """A job on NODE with 2 GPUs, working directory ``d`` (what the shims look for)."""
    out = str(d / f"{name}-%j.out")
    argv = ["sbatch", "--parsable", "-w", NODE, "--gres=gpu:2", "-t", "2", "-D", str(d), "-o", out, *extra]
    return sh(*argv, "--wrap", wrap).strip().split(";")[0]


@dataclass
class Hooks:
    """The shims' directory (the jobs' working directory) and its files."""

    dir: Path

    @property
    def scenario(self) -> Path:
        return self.dir / "scenario.yaml"

    def set_scenario(self, text: str) -> None:
        tmp = self.dir / "scenario.yaml.new"
        tmp.write_text(text)
        tmp.replace(self.scenario)

    def write_env(self, drain: bool = True) -> None:
        d = self.dir
        (d / "health.env").write_text(
            f"GPUWARDEN_BIN={GPUWARDEN}\nGPUWARDEN_HEALTH_SCENARIO={self.scenario}\nGPUWARDEN_HEALTH_PUBLISH=false\n"
            f"GPUWARDEN_HEALTH_STATE_DIR={d / 'state'}\nGPUWARDEN_HEALTH_KERNEL_LOG={d / 'kern.log'}\n"
            f"GPUWARDEN_HEALTH_DRAIN={1 if drain else 0}\n"
        )

    def calls(self) -> str:
        """``<phase> job=<id> gpus=<SLURM_JOB_GPUS>`` per shim run for this module's jobs."""
        f = self.dir / "calls"
        return f.read_text() if f.exists() else ""

    def health_log(self, job_id: str, phase: str) -> str:
        """The wrapper's log line of ``job_id`` in ``phase`` ('' if none yet)."""
        f = self.dir / "health.log"
        text = f.read_text() if f.exists() else ""
        return next((ln for ln in text.splitlines() if f" job={job_id} phase={phase} " in ln), "")

    def reset_node(self) -> None:
        """Healthy scenario, default env, and NODE idle and undrained (after anything in flight)."""
        self.set_scenario(HEALTHY)
        self.write_env()
        wait(f"no job running or completing on {NODE}", lambda: not _running())
        settled()
        if "DRAIN" in node()["State"]:
            sh("scontrol", "update", f"nodename={NODE}", "state=RESUME")
        wait(f"{NODE} idle and undrained", lambda: node()["State"] == "IDLE", timeout=30)


def log_mark() -> int:
    """Where slurmctld's log ends now (it is appended across runs; job ids may repeat)."""
    return CTLD_LOG.stat().st_size


def ctld_log(text: str, since: int) -> bool:
    """True if slurmctld has logged ``text`` (info level) after ``since`` (a :func:`log_mark`)."""
    with CTLD_LOG.open("rb") as f:
        f.seek(since)
        return text.encode() in f.read()


def _running() -> str:
    return sh("squeue", "-h", "-w", NODE, "-t", "CF,R,CG", "-o", "%i").strip()


def _shim(d: Path, phase: str, wrapper: Path) -> Path:
    f = d / f"{phase}-shim.sh"
    f.write_text(
        "#!/bin/bash\n"
        f"# {phase} shim of tests/integration/test_health_check_slurm.py: the real wrapper for this\n"
        f"# module's jobs on {NODE} while {d}/active exists; exit 0 for anything else\n"
        f'[ "$SLURMD_NODENAME" = {NODE} ] && [ -e {d}/active ] || exit 0\n'
        'case "$SLURM_JOB_WORK_DIR" in\n'
        f'    {d}/probe) echo "{phase} probe job=$SLURM_JOB_ID" >> {d}/calls; exit 0 ;;\n'
        f"    {d}) ;;\n"
        "    *) exit 0 ;;\n"
        "esac\n"
        f'echo "{phase} job=$SLURM_JOB_ID gpus=$SLURM_JOB_GPUS" >> {d}/calls\n'
        f"export GPUWARDEN_HEALTH_ENV_FILE={d}/health.env GPUWARDEN_HEALTH_LOG={d}/health.log\n"
        f"exec {wrapper}\n"
    )
    f.chmod(0o755)
    return f


def _probe(d: Path) -> bool:
    """One job through NODE's slurmd: True if both shims ran for it (the slurmd has the config)."""
    j = sh("sbatch", "--parsable", "-w", NODE, "-D", str(d / "probe"), "-o", "/dev/null", "--wrap", "true").strip()
    wait(f"probe job {j} to end", lambda: job(j).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), timeout=30)
    calls = (d / "calls").read_text()
    return f"prolog probe job={j}\n" in calls and f"epilog probe job={j}\n" in calls


@pytest.fixture(scope="module")
def hooks(slurm_cluster: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hooks]:
    """Prolog=/Epilog= shims in the running cluster for this module (see the module docstring)."""
    assert NODE in slurm_cluster
    if not (EXTRA.exists() and f"Include {EXTRA}" in CONF.read_text()):
        pytest.fail(f"{CONF} does not Include {EXTRA}: cluster started by an older start-local-slurm.sh?")
    d = tmp_path_factory.mktemp("hc-slurm")
    d.chmod(0o755)
    (d / "probe").mkdir()
    (d / "calls").touch()
    (d / "kern.log").touch()
    h = Hooks(d)
    h.set_scenario(HEALTHY)
    h.write_env()
    prolog, epilog = _shim(d, "prolog", PROLOG), _shim(d, "epilog", EPILOG)
    orig = EXTRA.read_bytes()
    extra = f"\n# test_health_check_slurm.py (removed after it)\nProlog={prolog}\nEpilog={epilog}\nPrologFlags=Alloc\n"
    (d / "active").touch()
    try:
        EXTRA.write_bytes(orig + extra.encode())
        sh("scontrol", "reconfigure")
        cfg = sh("scontrol", "show", "config")
        assert re.search(rf"^Prolog\s+= {prolog}$", cfg, re.M) and re.search(rf"^Epilog\s+= {epilog}$", cfg, re.M)
        assert re.search(r"^PrologFlags\s+= Alloc$", cfg, re.M), cfg
        t0 = time.monotonic()
        wait("a probe job through both shims on " + NODE, lambda: _probe(d), timeout=90, step=0)
        print(f"slurmd of {NODE} runs the shims {time.monotonic() - t0:.1f}s after reconfigure")
        yield h
        h.reset_node()
    finally:
        (d / "active").unlink()  # any shim still configured in a slurmd now exits 0
        EXTRA.write_bytes(orig)
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, timeout=30)
    cfg = sh("scontrol", "show", "config")
    assert re.search(r"^Prolog\s+= \(null\)$", cfg, re.M) and re.search(r"^Epilog\s+= \(null\)$", cfg, re.M)
    assert re.search(r"^PrologFlags\s+= \(null\)$", cfg, re.M)


def test_prolog_drains_a_bad_node_and_passes_a_good_one(hooks: Hooks) -> None:
    d = hooks.dir
    hooks.reset_node()
    # healthy: the prolog passes and the job runs
    t0 = time.monotonic()
    ok = submit(d, "ok", "echo ran-on-$SLURMD_NODENAME")
    wait("healthy job to complete", lambda: job(ok).get("JobState") == "COMPLETED")
    ran_s = time.monotonic() - t0
    assert (d / f"ok-{ok}.out").read_text().strip() == f"ran-on-{NODE}"
    assert re.search(rf"^prolog job={ok} gpus=\d+,\d+$", hooks.calls(), re.M)
    assert "OK: all checks passed" in hooks.health_log(ok, "prolog")
    assert settled()["State"] == "IDLE"

    # faulty: the prolog fails -> node drained with the one-line reason, the job never runs
    hooks.set_scenario(ECC)
    mark = log_mark()
    bad = submit(d, "bad", "echo ran-on-$SLURMD_NODENAME")
    try:
        wait("node drained", lambda: "DRAIN" in node()["State"])
        assert " rc=2 CRITICAL: ecc: GPU " in hooks.health_log(bad, "prolog")
        # the wrapper drains the node before it exits 2; slurmctld logs the prolog's failure only
        # once slurmd has reported the exit, which can come after the drain is visible (under load)
        wait("slurmctld logs the prolog failure", lambda: ctld_log(f"error: Prolog launch failure, JobId={bad}", mark))
        reason = f"update_node: node {NODE} reason set to: gpuwarden prolog: CRITICAL: ecc: GPU "
        wait("slurmctld logs the drain reason", lambda: ctld_log(reason, mark))
        # Slurm requeues the job, held: pending again, its script never started
        j = wait_until("bad job requeued", lambda: job(bad), lambda j: j.get("JobState") == "PENDING")
        assert j["Reason"] == "launch_failed_requeued_held" and int(j["Restarts"]) >= 1, j
        assert not (d / f"bad-{bad}.out").exists()
        # ... and runs the Epilog for it on the node. The node is still faulty, so the epilog
        # wrapper fails too, but the node is already drained: the prolog's reason is kept
        # (first reason wins; an unconditional scontrol update would replace it)
        wait("the epilog of the requeued job", lambda: ctld_log(f"JobId={bad} epilog error on {NODE}", mark))
        assert " rc=2 CRITICAL: ecc: GPU " in hooks.health_log(bad, "epilog")
        n = node()
        assert "DRAIN" in n["State"] and n["Reason"].startswith("gpuwarden prolog: CRITICAL: ecc: GPU "), n["line"]
        assert "uncorrectable ECC" in n["Reason"]
        assert not (d / f"bad-{bad}.out").exists()
    finally:
        subprocess.run(["scancel", bad], capture_output=True, timeout=30)
        hooks.reset_node()
    print(f"healthy job through the prolog in {ran_s:.1f}s")


def test_epilog_leaves_a_clean_node_idle(hooks: Hooks) -> None:
    d = hooks.dir
    hooks.reset_node()
    t0 = time.monotonic()
    ok = submit(d, "epi-ok", "echo ran-on-$SLURMD_NODENAME")
    # COMPLETING until the epilog has finished, COMPLETED after
    wait("job to complete", lambda: job(ok).get("JobState") == "COMPLETED")
    done_s = time.monotonic() - t0
    assert (d / f"epi-ok-{ok}.out").read_text().strip() == f"ran-on-{NODE}"
    m = re.search(rf"^prolog job={ok} gpus=(\S+)$", hooks.calls(), re.M)
    assert m and re.fullmatch(r"\d+,\d+", m.group(1))
    assert f"epilog job={ok} gpus={m.group(1)}\n" in hooks.calls()  # the epilog sees the job's GPUs
    line = hooks.health_log(ok, "epilog")
    assert f"node={NODE} job={ok} phase=epilog rc=0 OK: all checks passed" in line, line
    assert not (d / "state" / f"job-{ok}.start").exists()  # noted by the prolog, removed by the epilog
    assert (d / "state" / "last-epilog").exists()
    n = settled()
    assert n["State"] == "IDLE" and n["Reason"] == "", n["line"]
    print(f"job through prolog + epilog in {done_s:.1f}s")


def _epilog_failure(hooks: Hooks, name: str, drain: bool) -> tuple[dict[str, str], str]:
    """A job that passes the prolog, then leaves a process on every GPU (it switches the scenario
    itself) so that the epilog fails; returns NODE once drained and the job's GPUs."""
    d = hooks.dir
    hooks.reset_node()
    hooks.write_env(drain=drain)
    (d / "zombie.yaml").write_text(ZOMBIE)
    mark = log_mark()
    new = f"{d}/scenario.yaml.job"
    wrap = f"cp {d}/zombie.yaml {new} && mv {new} {hooks.scenario} && echo ran-on-$SLURMD_NODENAME"
    j = submit(d, name, wrap)
    wait(f"job {j} to complete", lambda: job(j).get("JobState") == "COMPLETED")
    # slurmd reported the failed epilog, and slurmctld drains the node on its own too
    wait("slurmctld's epilog error", lambda: ctld_log(f"JobId={j} epilog error on {NODE}, draining the node", mark))
    n = node()
    assert "DRAIN" in n["State"], n["line"]
    # the job itself ran to the end: an epilog cannot stop it
    info = job(j)
    assert info["ExitCode"] == "0:0", info
    assert (d / f"{name}-{j}.out").read_text().strip() == f"ran-on-{NODE}"
    assert " rc=0 OK: all checks passed" in hooks.health_log(j, "prolog")
    gpus = re.search(rf"^epilog job={j} gpus=(\d+),(\d+)$", hooks.calls(), re.M)
    assert gpus, hooks.calls()
    line = hooks.health_log(j, "epilog")
    assert f"node={NODE} job={j} phase=epilog rc=2 CRITICAL: processes: " in line, line
    for g in gpus.groups():  # only the job's GPUs are checked
        assert f"GPU {g}: 1 leftover process(es) pid " in line, line
    return n, gpus.group(1)


def test_epilog_drains_a_node_the_job_left_dirty(hooks: Hooks) -> None:
    t0 = time.monotonic()
    try:
        n, gpu = _epilog_failure(hooks, "epi-bad", drain=True)
        took = time.monotonic() - t0
        # the wrapper drained first (scontrol update ... reason=...); Slurm's own "Epilog error"
        # drain leaves the reason of a node that is already draining alone
        want = f"gpuwarden epilog: CRITICAL: processes: GPU {gpu}: 1 leftover process(es) pid "
        assert n["Reason"].startswith(want), n["line"]
        assert n["State"] in ("IDLE+DRAIN", "DRAINED"), n["line"]
    finally:
        hooks.reset_node()
    print(f"job + failing epilog + drain in {took:.1f}s: {n['Reason']}")


def test_epilog_failure_keeps_an_operators_drain_reason(hooks: Hooks) -> None:
    """An operator drains the node while a job runs (maintenance); the job leaves the GPUs dirty
    and the epilog fails: the node stays drained with the operator's reason, not the wrapper's."""
    d = hooks.dir
    hooks.reset_node()
    (d / "zombie.yaml").write_text(ZOMBIE)
    mark = log_mark()
    new = f"{d}/scenario.yaml.job"
    operator = "operator: maintenance window"
    wrap = (
        f"scontrol update nodename={NODE} state=drain reason='{operator}' && "
        f"cp {d}/zombie.yaml {new} && mv {new} {hooks.scenario} && echo ran"
    )
    try:
        j = submit(d, "epi-op", wrap)
        wait(f"job {j} to complete", lambda: job(j).get("JobState") == "COMPLETED")
        wait("slurmctld's epilog error", lambda: ctld_log(f"JobId={j} epilog error on {NODE}", mark))
        assert " rc=2 CRITICAL: processes: " in hooks.health_log(j, "epilog")
        n = node()
        assert "DRAIN" in n["State"] and n["Reason"] == operator, n["line"]
    finally:
        hooks.reset_node()


def test_epilog_failure_without_the_wrappers_drain_shows_slurms_reason(hooks: Hooks) -> None:
    try:
        n, _gpu = _epilog_failure(hooks, "epi-nodrain", drain=False)  # GPUWARDEN_HEALTH_DRAIN=0
        assert n["Reason"] == "Epilog error", n["line"]
        assert n["State"] in ("IDLE+DRAIN", "DRAINED"), n["line"]
    finally:
        hooks.reset_node()
