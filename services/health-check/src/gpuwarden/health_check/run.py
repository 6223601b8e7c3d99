"""One health-check run: build the context from settings and Slurm's environment, run the
checks under the budget, note prolog/epilog times, publish, and summarise."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpuwarden.shared.bus import ProducerLike
from gpuwarden.shared.plugins import load_plugin

from .checks import Context, Inputs, Phase, Status
from .io import DmesgLog, FileLog, KernelLog, SubprocessRunner
from .publish import publish_results, to_models
from .settings import HealthCheckSettings
from .suite import Summary, gpu_windows, job_gpus, run_checks, select_checks, since_ts

__all__ = ["build_context", "default_inputs", "health_run"]

log = logging.getLogger(__name__)


def build_context(
    phase: Phase, s: HealthCheckSettings, env: Mapping[str, str], now: float, gpus: list[int] | None = None
) -> Context:
    """Context of a run: the job id and GPUs from ``env`` in prolog/epilog (``gpus`` overrides;
    a job with no GPU variable has no GPUs: ``gpus=[]``, its per-GPU checks look at nothing),
    XID windows from the state directory, thresholds from settings.

    Raises ValueError for an unreadable ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES``."""
    job = env.get("SLURM_JOB_ID") if phase != "periodic" else None
    uuids: list[str] | None = None
    if gpus is None and phase != "periodic":
        found = job_gpus(env)
        if found is not None:
            gpus, uuids = found
            if uuids and not gpus:
                gpus = None  # the job's GPUs are named by UUID only
        elif job:
            gpus = []  # a job without GPUs on this node
    since = since_ts(phase, env, s.health_state_dir, now, s.health_xid_lookback_s)
    since_by_gpu: dict[int, float] = {}
    since_gpu_ts: float | None = None
    if phase == "prolog":
        since_by_gpu, since_gpu_ts = gpu_windows(s.health_state_dir, now, s.health_xid_lookback_s)
    elif phase == "epilog":  # from the job's start, but never before the GPU's last epilog
        marks, _ = gpu_windows(s.health_state_dir, now, s.health_xid_lookback_s)
        since_by_gpu, since_gpu_ts = {g: max(t, since) for g, t in marks.items()}, since
    # the grace must end inside the check's own time, or the leftover's pid is lost in a timeout
    grace = min(s.health_process_grace_s, max(0.0, min(s.health_check_timeout_s, s.health_budget_s) - 1.5))
    return Context(
        phase=phase,
        node=env.get("SLURMD_NODENAME") or s.health_node,
        job_id=job or None,
        gpus=gpus,
        gpu_uuids=uuids or None,
        since_ts=since,
        since_by_gpu=since_by_gpu,
        since_gpu_ts=since_gpu_ts,
        expected_gpus=s.health_expected_gpus,
        ib_rate_gbps=s.health_ib_rate_gbps,
        ib_ports=s.health_ib_ports,
        ib_ignore=frozenset(x.strip() for x in s.health_ib_ignore.split(",") if x.strip()),
        nvlinks=s.health_nvlinks,
        max_used_mib=s.health_max_used_mib,
        process_grace_s=grace if phase == "epilog" else 0.0,
        dcgm_level=s.health_dcgm_level,
        tool_timeout_s=min(s.health_tool_timeout_s, s.health_check_timeout_s),
        dcgm_timeout_s=max(0.5, s.health_check_timeout_s - 0.5),
    )


def default_inputs(s: HealthCheckSettings, node: str | None = None) -> Inputs:
    """Production inputs: ``pynvml`` (None if not installed), subprocess tools, the kernel log.

    With ``health_scenario`` set, NVML is the simulation layer's fake NVML of ``node`` at
    scenario second ``health_scenario_s`` (entry point ``gpuwarden.health_check_nvml: simulated``,
    :func:`gpuwarden.sim.health_check.simulated_nvml`; Raises ValueError for a bad scenario, and
    :class:`~gpuwarden.shared.plugins.PluginMissing`, a ValueError, when the simulation layer is
    not installed)."""
    nvml: object | None
    if s.health_scenario is not None:
        simulated = load_plugin("gpuwarden.health_check_nvml", "simulated", "the simulated NVML (health_scenario)")
        nvml = simulated(s.health_scenario, s.health_scenario_s, node or s.health_node)
    else:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency of gpuwarden-shared
            nvml = None
    runner = SubprocessRunner()
    klog: KernelLog | None = None
    if s.health_kernel_log == "dmesg":
        klog = DmesgLog(runner, timeout_s=min(s.health_tool_timeout_s, s.health_check_timeout_s))
    elif s.health_kernel_log:
        klog = FileLog(Path(s.health_kernel_log))
    return Inputs(nvml=nvml, runner=runner, kernel_log=klog, sysfs_root=s.health_sysfs_root)  # type: ignore[arg-type]


def _note_times(ctx: Context, state_dir: Path, now: float, slurm_ids: list[int] | None, xid_ok: bool) -> None:
    """Prolog: ``job-<id>.start`` (the epilog's XID window). Epilog, only when its ``xid`` check
    read the kernel log (else the next prolog must look again): ``last-epilog`` (node-level
    events), ``gpu-<id>.last-epilog`` for each GPU it checked (Slurm ids; for a job named by
    UUID the ids NVML resolved), or ``all-gpus.last-epilog`` when it checked every GPU."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        if ctx.phase == "prolog" and ctx.job_id:
            (state_dir / f"job-{ctx.job_id}.start").write_text(f"{now}\n")
        elif ctx.phase == "epilog":
            if xid_ok:
                (state_dir / "last-epilog").write_text(f"{now}\n")
                if ctx.whole_node:
                    (state_dir / "all-gpus.last-epilog").write_text(f"{now}\n")
                for g in slurm_ids or []:
                    (state_dir / f"gpu-{g}.last-epilog").write_text(f"{now}\n")
            if ctx.job_id:
                (state_dir / f"job-{ctx.job_id}.start").unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot note %s time in %s: %s", ctx.phase, state_dir, exc)


def _checked_slurm_ids(inputs: Inputs, ctx: Context) -> list[int] | None:
    """Slurm GPU ids the run covered: ``ctx.gpus``, plus the minor numbers of UUID-named GPUs."""
    ids = set(ctx.gpus or [])
    if ctx.gpu_uuids:
        try:
            jg = inputs.job_gpus(ctx)
            ids |= {jg.slurm_ids[i] for i in jg.indices or [] if i in jg.slurm_ids}
        except Exception as exc:  # NVML unusable: no marker for those GPUs (they are looked at again)
            log.debug("cannot resolve the job's GPU UUIDs for the epilog markers: %s", exc)
    return sorted(ids)


async def health_run(
    phase: Phase,
    names: Sequence[str],
    s: HealthCheckSettings,
    inputs: Inputs,
    env: Mapping[str, str] | None = None,
    make_producer: Callable[[], ProducerLike] | None = None,
    gpus: list[int] | None = None,
) -> tuple[Summary, Context]:
    """Run the checks of ``phase`` (or ``names``) and return the summary and context.

    ``make_producer`` None = do not publish. Raises ValueError for an unknown check name or an
    unreadable job GPU list (the CLI turns it into UNKNOWN)."""
    env = os.environ if env is None else env
    now = inputs.clock()
    t0 = time.monotonic()
    ctx = build_context(phase, s, env, now, gpus)
    chosen = select_checks(phase, names, s.health_dcgm_level)
    status = Status.CRITICAL if s.health_timeout_status == "critical" else Status.UNKNOWN
    results = await run_checks(chosen, inputs, ctx, s.health_budget_s, s.health_check_timeout_s, status)
    summary = Summary(results, time.monotonic() - t0)
    kill_all = getattr(inputs.runner, "kill_all", None)
    if kill_all is not None and (n := kill_all()):  # tools of checks abandoned past the budget
        log.warning("killed %d tool process(es) still running past the time budget", n)
    if phase != "periodic":
        xid = next((r for r in results if r.check == "xid"), None)
        xid_ok = xid is not None and not xid.reason.startswith("timed out") and xid.status != Status.UNKNOWN
        _note_times(ctx, s.health_state_dir, now, _checked_slurm_ids(inputs, ctx), xid_ok)
    if make_producer is not None and s.health_publish:
        await publish_results(to_models(results, ctx, now), make_producer, s.health_publish_timeout_s)
    return summary, ctx
