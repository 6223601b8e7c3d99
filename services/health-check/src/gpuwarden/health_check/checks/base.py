"""What every health check shares: statuses, results, the run's context and its inputs.

A check is ``fn(inputs, context) -> CheckResult``: :class:`Inputs` are the outside systems (NVML
through the :class:`~gpuwarden.shared.nvidia.nvml.Nvml` protocol, a tool runner, the kernel log,
sysfs, a clock), :class:`Context` what the run is about; :class:`Status` is a Nagios code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from gpuwarden.shared.nvidia.nvml import Nvml, nvml_str

from ..io import KernelLog, ToolOutput, ToolRunner

__all__ = [
    "CheckResult",
    "Context",
    "Inputs",
    "JobGpus",
    "NvmlUnavailable",
    "Phase",
    "Status",
    "worst",
]

Phase = Literal["prolog", "epilog", "periodic"]


class Status(IntEnum):
    """Nagios plugin exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


_SEVERITY = {Status.OK: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.CRITICAL: 3}


def worst(statuses: Sequence[Status]) -> Status:
    """The overall status: CRITICAL > UNKNOWN > WARNING > OK (OK for an empty list)."""
    return max(statuses, key=lambda s: _SEVERITY[s], default=Status.OK)


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``reason`` is one line; ``gpu_index`` the first GPU at fault (None if
    node-wide or fine); ``duration_s`` wall seconds the check took (set by the runner)."""

    check: str
    status: Status
    reason: str
    gpu_index: int | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class Context:
    """What a run is about.

    * ``gpus``: the job's GPUs as Slurm numbers them (``SLURM_JOB_GPUS``: the ``/dev/nvidiaN``
      minor numbers), resolved to NVML indices by minor number (NVML renumbers the GPUs after
      one falls off the bus); ``gpu_uuids``: job GPUs given as ``GPU-``/``MIG-`` UUIDs
      (``CUDA_VISIBLE_DEVICES``). Both None = every GPU; ``gpus=[]`` = a job without GPUs.
    * ``since_ts``: epoch s from which kernel-log XIDs count (node-level events; GPU events too
      unless the next two say otherwise); ``since_by_gpu``: per Slurm GPU id, the end of the
      last epilog that checked it, and ``since_gpu_ts`` the start for a GPU not in it (prolog).
    * ``expected_gpus``: GPUs the node must have (None = any number >= 1, 0 = no GPUs).
    * ``ib_rate_gbps``: rate every IB port must reach (None = the fastest IB port's);
      ``ib_ports``: ACTIVE IB ports the node must have (None = every IB port must be ACTIVE);
      ``ib_ignore``: ``device`` or ``device/port`` names left out (uncabled ports).
    * ``nvlinks``: active NVLinks each GPU must have (None = every link a GPU reports; a node
      where no GPU has an active link has no NVLink).
    * ``max_used_mib``: used GPU memory (MiB) above which a GPU counts as not released;
      ``process_grace_s``: how long ``processes`` waits for leftovers to exit (epilog: CUDA
      teardown after the job's kill).
    * ``dcgm_level``: ``dcgmi diag -r`` level (0 = not run by default).
    * ``tool_timeout_s``: per external tool (ibstat, dmesg ...), s; ``dcgm_timeout_s``: for
      ``dcgmi diag``, s."""

    phase: Phase = "periodic"
    node: str = "localhost"
    job_id: str | None = None
    gpus: list[int] | None = None
    gpu_uuids: list[str] | None = None
    since_ts: float = 0.0
    since_by_gpu: dict[int, float] = field(default_factory=dict)
    since_gpu_ts: float | None = None
    expected_gpus: int | None = None
    ib_rate_gbps: float | None = None
    ib_ports: int | None = None
    ib_ignore: frozenset[str] = frozenset()
    nvlinks: int | None = None
    max_used_mib: float = 1024.0
    process_grace_s: float = 0.0
    dcgm_level: int = 0
    tool_timeout_s: float = 3.0
    dcgm_timeout_s: float = 8.0

    @property
    def whole_node(self) -> bool:
        """True when the run covers every GPU (no job GPU list)."""
        return self.gpus is None and self.gpu_uuids is None


@dataclass(frozen=True)
class JobGpus:
    """The job's GPUs resolved against NVML: ``indices`` (NVML), ``slurm_ids`` (NVML index ->
    Slurm GPU id, i.e. minor number, for every GPU NVML lists) and ``missing`` (one line per job
    GPU NVML does not list)."""

    indices: list[int] | None
    slurm_ids: dict[int, int]
    missing: list[str]
    missing_ids: list[int | str]


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node: no driver / nvidia-ml-py, or ``nvmlInit`` failed."""


@dataclass
class Inputs:
    """The outside systems, passed in (fakes in tests). ``nvml`` may be None (no driver): the
    NVML checks then report CRITICAL ``NVML unavailable``."""

    nvml: Nvml | None
    runner: ToolRunner
    kernel_log: KernelLog | None
    sysfs_root: Path = Path("/")
    clock: Callable[[], float] = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _init: BaseException | bool | None = field(default=None, repr=False)
    _job_cache: dict[object, JobGpus] = field(default_factory=dict, repr=False)

    def ready_nvml(self) -> Nvml:
        """``nvmlInit`` once for every check; raises :class:`NvmlUnavailable` when NVML is absent or failed."""
        with self._lock:
            if self.nvml is None:
                raise NvmlUnavailable("NVML unavailable (no driver / nvidia-ml-py)")
            if self._init is None:
                try:
                    self.nvml.nvmlInit()
                    self._init = True
                except Exception as exc:
                    self._init = exc
            if isinstance(self._init, BaseException):
                raise NvmlUnavailable(f"nvmlInit failed: {self._init}")
            return self.nvml

    def job_gpus(self, ctx: Context) -> JobGpus:
        """The job's GPUs of ``ctx`` as NVML indices (resolved once per GPU list; thread-safe).

        Slurm GPU ids match NVML devices by minor number (``nvmlDeviceGetMinorNumber``; an NVML
        without it: the index), UUIDs by ``nvmlDeviceGetUUID``, a ``MIG-`` UUID by its parent GPU.
        Raises NvmlUnavailable when NVML is unusable (as :meth:`ready_nvml`)."""
        key = (tuple(ctx.gpus) if ctx.gpus is not None else None, tuple(ctx.gpu_uuids or ()))
        with self._lock:
            hit = self._job_cache.get(key)
        if hit is not None:
            return hit
        nv = self.ready_nvml()
        n = nv.nvmlDeviceGetCount()
        minor_of: dict[int, int] = {}
        uuid_of: dict[str, int] = {}
        get_minor = getattr(nv, "nvmlDeviceGetMinorNumber", None)
        unreadable: list[int] = []
        for i in range(n):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                minor_of[i] = int(get_minor(h)) if get_minor is not None else i
            except nv.NVMLError:
                unreadable.append(i)  # the nvml check reports it
                continue
            try:
                uuid_of[nvml_str(nv.nvmlDeviceGetUUID(h)).lower()] = i
            except nv.NVMLError:
                pass
        taken = set(minor_of.values())
        for i in unreadable:  # assume the usual order where that names no readable GPU
            if i not in taken:
                minor_of[i] = i
                taken.add(i)
        index_of_minor = {m: i for i, m in minor_of.items()}
        if ctx.whole_node:
            res = JobGpus(None, minor_of, [], [])
        else:
            found: set[int] = set()
            missing: list[str] = []
            missing_ids: list[int | str] = []
            for g in ctx.gpus or []:
                if g in index_of_minor:
                    found.add(index_of_minor[g])
                else:
                    missing.append(f"job GPU {g} (/dev/nvidia{g}) not visible to NVML")
                    missing_ids.append(g)
            for u in ctx.gpu_uuids or []:
                idx = uuid_of.get(u.lower())
                if idx is None and u.upper().startswith("MIG-"):
                    idx = _mig_parent_index(nv, u)
                if idx is None:
                    missing.append(f"job GPU {u} not visible to NVML")
                    missing_ids.append(u)
                else:
                    found.add(idx)
            res = JobGpus(sorted(found), minor_of, missing, missing_ids)
        with self._lock:
            self._job_cache[key] = res
        return res

    def shutdown(self) -> None:
        with self._lock:
            if self._init is True and self.nvml is not None:
                try:
                    self.nvml.nvmlShutdown()
                except Exception:  # best effort at exit
                    pass
            self._init = None


def _nvml_err(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _mig_parent_index(nv: Any, uuid: str) -> int | None:
    """NVML index of the GPU holding MIG device ``uuid`` (None when NVML cannot tell)."""
    try:
        mig = nv.nvmlDeviceGetHandleByUUID(uuid)
        return int(nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)))
    except Exception:  # no such calls (old NVML, fakes) or an unknown UUID
        return None


def _gpu_indices(inp: Inputs, nv: Nvml, ctx: Context) -> list[int]:
    jg = inp.job_gpus(ctx)
    return list(jg.indices) if jg.indices is not None else list(range(nv.nvmlDeviceGetCount()))


def _handles(inp: Inputs, ctx: Context) -> tuple[Nvml, list[tuple[int, Any]], list[str]]:
    """(nvml, [(index, handle)], [errors]) for the selected GPUs; a GPU whose handle fails is an error."""
    nv = inp.ready_nvml()
    out: list[tuple[int, Any]] = []
    errs: list[str] = []
    for i in _gpu_indices(inp, nv, ctx):
        try:
            out.append((i, nv.nvmlDeviceGetHandleByIndex(i)))
        except nv.NVMLError as exc:
            errs.append(f"GPU {i}: {_nvml_err(exc)}")
    return nv, out, errs


def _result(name: str, problems: list[tuple[Status, str, int | None]], ok: str) -> CheckResult:
    if not problems:
        return CheckResult(name, Status.OK, ok)
    st = worst([p[0] for p in problems])
    first = [p for p in problems if p[0] == st]
    reasons = [p[1] for p in first] + [p[1] for p in problems if p[0] != st]
    more = f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return CheckResult(name, st, "; ".join(reasons[:3]) + more, first[0][2])


def _last_line(out: ToolOutput) -> str:
    text = (out.stdout + out.stderr).strip().splitlines()
    return (text or ["(no output)"])[-1][:100]
