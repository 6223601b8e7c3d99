"""Run checks concurrently under a hard time budget; job context from Slurm's environment.

Each check runs in its own daemon thread (a hung NVML call or tool cannot be cancelled, but it
can be abandoned: a daemon thread never holds the process at exit). The runner waits for each
at most ``min(check_timeout_s, time left of budget_s)``; a check that does not finish in time
gets ``timeout_status`` (CRITICAL by default: a GPU or tool that hangs is not fit for a job).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .checks import CHECKS, CheckResult, Context, Inputs, NvmlUnavailable, Phase, Status, worst

__all__ = ["Summary", "gpu_windows", "job_gpus", "run_checks", "select_checks", "since_ts", "summarize"]


def select_checks(phase: Phase, names: Sequence[str] = (), dcgm_level: int = 0) -> list[str]:
    """Names to run: ``names`` when given (ValueError for an unknown one), else every check
    registered for ``phase`` plus ``dcgm`` when ``dcgm_level`` > 0."""
    if names:
        bad = [n for n in names if n not in CHECKS]
        if bad:
            raise ValueError(f"unknown check(s) {bad}; known: {sorted(CHECKS)}")
        return list(dict.fromkeys(names))
    out = [n for n, s in CHECKS.items() if phase in s.phases]
    if dcgm_level > 0:
        out.append("dcgm")
    return out


def _in_thread(fn: object, *args: object) -> asyncio.Future[CheckResult]:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[CheckResult] = loop.create_future()

    def target() -> None:
        def settle(res: CheckResult | None, err: BaseException | None) -> None:
            if fut.done():
                return
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(res)  # type: ignore[arg-type]

        def deliver(res: CheckResult | None, err: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(settle, res, err)
            except RuntimeError:
                pass  # the run that waited is over (this check was abandoned past its budget)

        try:
            res = fn(*args)  # type: ignore[operator]
        except BaseException as exc:
            deliver(None, exc)
        else:
            deliver(res, None)

    threading.Thread(target=target, daemon=True, name="health-check").start()
    return fut


async def run_checks(
    names: Sequence[str],
    inputs: Inputs,
    ctx: Context,
    budget_s: float = 10.0,
    check_timeout_s: float = 8.0,
    timeout_status: Status = Status.CRITICAL,
) -> list[CheckResult]:
    """Run ``names`` concurrently; return one result per name, in order, within ``budget_s``
    seconds (plus scheduling jitter). A check that raises is UNKNOWN (``NvmlUnavailable``:
    CRITICAL, or OK when ``ctx.expected_gpus`` is 0, a node that must have no GPUs); one that
    runs past its time is ``timeout_status``."""
    t0 = time.monotonic()
    deadline = t0 + budget_s

    async def one(name: str) -> CheckResult:
        start = time.monotonic()
        limit = max(0.0, min(check_timeout_s, deadline - start))
        fut = _in_thread(CHECKS[name].fn, inputs, ctx)
        try:
            res = await asyncio.wait_for(asyncio.shield(fut), limit)
        except TimeoutError:
            res = CheckResult(name, timeout_status, f"timed out after {limit:.1f}s")
        except NvmlUnavailable as exc:  # NVML absent or nvmlInit failed
            if ctx.expected_gpus == 0:  # a node configured to have no GPUs: nothing to check
                res = CheckResult(name, Status.OK, f"no GPUs expected ({str(exc)[:100]})")
            else:
                res = CheckResult(name, Status.CRITICAL, str(exc)[:160])
        except Exception as exc:
            res = CheckResult(name, Status.UNKNOWN, f"check error {type(exc).__name__}: {exc}"[:160])
        d = round(time.monotonic() - start, 4)
        return CheckResult(res.check, res.status, res.reason, res.gpu_index, d)

    return list(await asyncio.gather(*(one(n) for n in names)))


class Summary:
    """Overall status and the one line printed for Slurm/Nagios:
    ``CRITICAL: ecc: GPU 2 row remap pending (reset the GPU); xid: ... | 9 checks in 0.41s``."""

    def __init__(self, results: Sequence[CheckResult], elapsed_s: float) -> None:
        self.results = list(results)
        self.status = worst([r.status for r in self.results])
        self.elapsed_s = elapsed_s

    @property
    def line(self) -> str:
        bad = [r for r in self.results if r.status != Status.OK]
        order = {Status.CRITICAL: 0, Status.UNKNOWN: 1, Status.WARNING: 2, Status.OK: 3}
        bad.sort(key=lambda r: order[r.status])
        groups: dict[str, list[str]] = {}  # one reason shared by several checks is printed once
        for r in bad:
            groups.setdefault(r.reason, []).append(r.check)
        body = "; ".join(f"{','.join(c)}: {why}" for why, c in groups.items()) if bad else "all checks passed"
        line = f"{self.status.name}: {body} | {len(self.results)} checks in {self.elapsed_s:.2f}s"
        return " ".join(line.split())[:500]


def summarize(results: Sequence[CheckResult], elapsed_s: float) -> Summary:
    return Summary(results, elapsed_s)


def job_gpus(env: Mapping[str, str]) -> tuple[list[int], list[str]] | None:
    """The job's GPUs: ``(slurm_ids, uuids)`` from ``SLURM_JOB_GPUS`` (``"0,1"``: Slurm's GPU ids,
    the ``/dev/nvidiaN`` minor numbers), else ``CUDA_VISIBLE_DEVICES`` (ids, or ``GPU-``/``MIG-``
    UUIDs; ``NoDevFiles``, what Slurm sets for a job without GPUs, is none). None when neither
    is set.

    Raises:
        ValueError: a value that is neither an id nor a UUID (the variable is named)."""
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        ids: list[int] = []
        uuids: list[str] = []
        for tok in (t.strip() for t in raw.split(",")):
            if not tok or tok == "NoDevFiles":
                continue
            if tok.isascii() and tok.isdigit():
                ids.append(int(tok))
            elif tok.upper().startswith(("GPU-", "MIG-")):
                uuids.append(tok)
            else:
                raise ValueError(f"{var}={raw!r}: {tok!r} is not a GPU id or GPU-/MIG- UUID")
        return sorted(set(ids)), list(dict.fromkeys(uuids))
    return None


def _marker(path: Path, now: float) -> float | None:
    """A noted time, at most ``now`` (a clock stepped back must not hide what comes next)."""
    try:
        return min(float(path.read_text().strip()), now)
    except (OSError, ValueError):
        return None


def gpu_windows(state_dir: Path, now: float, lookback_s: float) -> tuple[dict[int, float], float]:
    """Prolog XID windows per GPU: ``({slurm_gpu_id: start}, default)``. A GPU's window starts at
    the end of the last epilog that checked it (``gpu-<id>.last-epilog``); a GPU no epilog checked
    yet starts at the last epilog that checked every GPU (``all-gpus.last-epilog``) or
    ``now - lookback_s``, whichever is later. (One node-wide marker would hide an XID on an idle
    GPU as soon as any other job's epilog passed.)"""
    fallback = now - lookback_s
    every = _marker(state_dir / "all-gpus.last-epilog", now)
    default = max(fallback, every) if every is not None else fallback
    out: dict[int, float] = {}
    try:
        files = list(state_dir.glob("gpu-*.last-epilog"))
    except OSError:
        files = []
    for f in files:
        m = re.fullmatch(r"gpu-(\d+)\.last-epilog", f.name)
        t = _marker(f, now)
        if m and t is not None:
            out[int(m.group(1))] = max(t, default)
    return out, default


def since_ts(phase: Phase, env: Mapping[str, str], state_dir: Path, now: float, lookback_s: float) -> float:
    """Epoch s from which kernel-log events count. Prolog: node-level events (NVSwitch SXIDs, a
    PCI address of no GPU) from the last epilog's time (``last-epilog`` in ``state_dir``), else
    ``now - lookback_s`` (a GPU's own window: :func:`gpu_windows`). Epilog: the job's prolog
    time (``job-<id>.start``), else ``SLURM_JOB_START_TIME``, else ``now - lookback_s``."""
    fallback = now - lookback_s
    files: list[Path] = []
    if phase == "prolog":
        files.append(state_dir / "last-epilog")
    elif phase == "epilog" and env.get("SLURM_JOB_ID"):
        files.append(state_dir / f"job-{env['SLURM_JOB_ID']}.start")
    for f in files:
        t = _marker(f, now)
        if t is not None:
            return t
    if phase == "epilog":
        try:
            return min(float(env["SLURM_JOB_START_TIME"]), now)
        except (KeyError, ValueError):
            pass
    return fallback
