"""A fake NVML of one simulated node: :class:`FakeNvml`, the nvidia-ml-py call names and units
over :class:`~gpuwarden.sim.gpu_model.NodeModel`.

Faults change raw telemetry only; the simulated collector reads the fake through the same
:class:`~gpuwarden.collector.sources.NvmlSource` as a real node reads ``pynvml``.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pynvml

from gpuwarden.shared.fields import FIELDS
from gpuwarden.shared.nvidia.nvml import NVML_ERROR_GPU_IS_LOST
from gpuwarden.shared.scenario import Scenario, ScenarioClock

from .gpu_model import (
    H100_MAX_SM_MHZ,
    H100_MEM_MHZ,
    H100_MEMORY_MIB,
    H100_POWER_LIMIT_W,
    MIB,
    NVLINKS,
    GpuState,
    NodeModel,
    pci_of,
    uuid_of,
)

__all__ = ["REGISTRY_CALLS", "FakeNvml"]

#: The NVML functions the field registry (``fields.csv`` ``nvml``) reads: the fake answers each one,
#: those it does not model with ``NVML_ERROR_NOT_SUPPORTED`` (as a GPU without the feature does).
REGISTRY_CALLS = frozenset(r.call for f in FIELDS if (r := f.nvml_read) is not None)


class _GpmSample(ctypes.Structure):
    """What the fake stores in an ``nvmlGpmSample_t``: which GPU, at which scenario second."""

    _fields_ = [("gpu", ctypes.c_int), ("t", ctypes.c_double)]


class FakeNvml(NodeModel):
    """In-memory NVML of ONE simulated node, with the nvidia-ml-py call names and units.

    The node's state at scenario second ``t`` (``self.t`` when set, else the clock's current
    scenario second) follows the scenario's jobs (profile per GPU) and faults. Noise comes
    from an RNG seeded with (scenario seed, node, gpu, tick), so two runs agree exactly.

    Realism in every profile (values from the recordings in ``shared/realdata``): stable per-GPU
    offsets (:func:`~gpuwarden.sim.gpu_model.gpu_offsets`: power x0.90-1.10, temperature -3..+6 C and in half the seeds
    one hot GPU per node at +12..+20 C, busy SM clock 1800-1980 MHz with +/-30 MHz jitter, on
    some GPUs constant non-zero correctable-ECC and PCIe replay counts); per job a schedule
    (:func:`~gpuwarden.sim.gpu_model.job_timing`): a start-up phase for a job that starts after scenario second 0
    (60-240 s: allocated at ~17 MiB, then memory ramps to the working set, util 0-5 %,
    ~70-120 W), checkpoints, evaluation pauses and, for some jobs, a staggered end.

    Job profiles (HGX H100 values; the raw signal only):

    * ``training`` - synchronous data-parallel steps of 8-12 s (per job, all its GPUs in
      phase): compute (util 90-100 %, 560-630 W, tensor 55-75 %), a 1 s step-boundary dip
      (util 55-75 %, ~330 W) and a 2 s NCCL all-reduce phase (util stays 97-100 %: the
      communication kernels occupy the SMs, but power ~420 W, tensor < 5 %). A checkpoint every
      7-12 min for 10-30 s: rank 0 (of each node, or global rank 0 only, per job) writes at
      2-8 % util / ~150 W while the other ranks spin in the next collective at 99-100 % util,
      ~145-185 W, tensor 0. An evaluation pause every 15-25 min for 10-30 s: every GPU at
      2-15 % util, ~110-160 W.
    * ``inference`` - really bursty serving, per job (all its GPUs together): per 30 s slot a
      burst with probability 0.3, of 2-8 s or (1 in 5) 10-25 s, at util 60-100 %, ~330-450 W;
      in between util 0, 60-80 W, idle clocks, the model (40 GiB) kept: busy ~5-10 % of the time.
    * ``comm-bound`` - gloo-like data parallel: one compute second (util 85-100 %, ~430 W) per
      4-7 s, the rest waiting on the host (util 4-12 %, ~130 W): ~20-35 % util on average.
    * ``input-bound`` - the GPU waits for data: duty 15-40 % per second, power to match,
      high PCIe RX.
    * ``checkpoint-heavy`` - training with the checkpoint signature above every 60-120 s for
      15-45 s (the ckpt100 recording: ~16 s every ~40 s).
    * ``idle`` - allocated, unused: 0 %, ~70 W, idle clocks, ``gpu_idle`` reason, ~0.5 GiB.
    * ``partial-idle`` - the upper half of the job's GPUs on the node idle, the rest training.
    * ``memory-leak`` - training whose memory grows 15 MiB/s (900 MiB/min) from 30 GiB after the
      start-up phase, up to 256 MiB short of the total (full in ~56 min).
    * ``low-tensor`` - SMs busy (util 95-100 %, occupancy 35-55 %) but tensor activity 1-5 %.

    Faults (only raw telemetry and, via :class:`~gpuwarden.sim.kernel_log.KernelLogGenerator`, log lines):

    * ``gpu-lost`` / ``xid`` 79 - every call on the GPU raises ``GPU_IS_LOST`` (back after
      ``duration_s`` for gpu-lost); ``gpu-missing`` - the GPU is absent from the enumeration
      (count drops, later GPUs shift down one index, as NVML numbers them).
    * ``ecc-dbe`` and ``xid`` 48/94/95 - volatile and aggregate DBE count +1 each, row remap
      pending (HBM); ``ecc-sbe-storm`` - SBE counter +50/s; ``row-remap-pending`` /
      ``row-remap-failed`` - the remapper's pending / failure flags (+ uncorrectable rows);
      ``retired-pages`` - 2 SBE + 1 DBE retired pages, retirement pending (the page-retirement
      calls answer NOT_SUPPORTED on HBM GPUs without such a fault, as Ampere+ do).
    * ``nvlink-errors`` - replay +12/s, CRC flit +40/s, CRC data +3/s, recovery +1/30 s on
      ``link`` (all links when absent); ``nvlink-down`` - ``link`` (or all) inactive.
    * ``pcie-degraded`` - link at Gen3 x8 of Gen5 x16; ``pcie-replays`` - replay counter +20/s.
    * ``thermal-throttle`` - temperature 87-89 C (slowdown 89 C), ``sw_thermal_slowdown``,
      SM clock falling from 75 % to 55 % of max over 25 s, power -25 %.
    * ``power-brake`` - ``hw_slowdown`` + ``hw_power_brake_slowdown``, SM <= 810 MHz, <= 320 W.
    * ``power-cap`` - ``sw_power_cap``, 690-700 W at the 700 W limit, SM <= 1410 MHz (with
      ``factor``: the GPU's busy SM clock x factor, a legit cap such as 0.8).
    * ``clocks-low`` - SM clock x speed with no throttle reason; power x (0.4 + 0.6 x speed).
    * ``straggler-gpu`` / ``straggler-node`` - util, SM clock and power x speed (see
      :func:`~gpuwarden.sim.gpu_model._speed`; ``factor`` 0.6 or 1.67 both mean 60 % speed).
    * ``collective-hang`` - every GPU of every job holding the fault's node (or GPU) at
      ``at_s``, on all that job's nodes: util 100 %, ~115 W, memory util 0, tensor 0.
    * ``zombie-process`` - on a GPU without a job: a compute process with ~60 GiB, ~90 W.
    * ``telemetry-silent`` - handled by :class:`~gpuwarden.sim.collector.SimulatedSource` (no samples).
    * ``health-check-fail`` - nothing here: the node's fake ``dcgmi diag`` fails
      (:mod:`gpuwarden.sim.health_check`); NVML telemetry and the kernel log stay as they are.
    """

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

    def __init__(self, scenario: Scenario, clock: ScenarioClock, node: str) -> None:
        super().__init__(scenario, clock, node)
        self._gpm_keep: list[_GpmSample] = []

    # -- NVML calls ----------------------------------------------------------------
    def _h(self, handle: Any) -> GpuState:
        self.calls += 1
        # The hot path of every fake NVML call (~130 per GPU per tick): the cached state of this
        # scenario second without the two calls of state()/now().
        t = self.t if self.t is not None else self.clock.scenario_s()
        hit = self._cache.get(handle.index)
        s = hit[1] if hit is not None and hit[0] == t else self.state(handle.index)
        if s.lost:
            raise pynvml.NVMLError(NVML_ERROR_GPU_IS_LOST)
        return s

    def nvmlInit(self) -> None:
        self.calls += 1

    def nvmlShutdown(self) -> None:
        self.calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlDeviceGetCount(self) -> int:
        self.calls += 1
        return len(self._enumerated())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.calls += 1
        gl = self._enumerated()
        if not 0 <= index < len(gl):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        h = SimpleNamespace(index=gl[index])
        self._h(h)
        return h

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """The ``/dev/nvidiaN`` number: the GPU's physical position, which does not shift when an
        earlier GPU drops out of the enumeration (what Slurm's GPU ids follow)."""
        self._h(handle)
        return int(handle.index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._h(handle)
        return uuid_of(self.scenario.seed, self.node, handle.index)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        self._h(handle)
        return SimpleNamespace(busId=("0000" + pci_of(handle.index).upper()).encode())

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._h(handle)
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        s = self._h(handle)
        return SimpleNamespace(gpu=int(s.util), memory=int(s.mem_util))

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        s = self._h(handle)
        total = int(H100_MEMORY_MIB * MIB)
        used = int(s.mem_used_mib * MIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(self._h(handle).temp)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._h(handle).power_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        self._h(handle)
        return int(H100_POWER_LIMIT_W * 1000)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        s = self._h(handle)
        return int(s.sm_mhz) if clock in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS) else H100_MEM_MHZ

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        self._h(handle)
        return H100_MAX_SM_MHZ if clock in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS) else H100_MEM_MHZ

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._h(handle).reasons

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        s = self._h(handle)
        return s.sbe if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else s.dbe

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        s = self._h(handle)
        return (0, int(s.remap_pending or s.remap_failed), int(s.remap_pending), int(s.remap_failed))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._h(handle).replays

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._h(handle).link_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._h(handle).link_width

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._h(handle)
        return int(self._energy_mj[handle.index])

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        self._h(handle)
        return f"16523{int(uuid_of(self.scenario.seed, self.node, handle.index)[4:12], 16) % 10**8:08d}"

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        self._h(handle)
        return "96.00.74.00.01"

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        self._h(handle)
        return 92 if threshold == 0 else 89  # shutdown, slowdown (H100 SXM)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        self._h(handle)
        return int(H100_POWER_LIMIT_W * 1000)

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return 0 if self._h(handle).util > 0 else 8

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        r = self._h(handle).retired
        if r is None:  # HBM GPUs (Ampere+) remap rows instead of retiring pages
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        n = r[0] if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else r[1]
        base = 0x3F2A000 if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else 0x7C11000
        return [base + 0x1000 * k for k in range(n)]  # page addresses

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        r = self._h(handle).retired
        if r is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(r[2])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        self._h(handle)
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        self._h(handle)
        return 16

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        s = self._h(handle)
        return int(s.util * 300) if counter == 0 else int(s.util * s.pcie_rx_factor)  # KB/s

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        s = self._h(handle)
        if link >= NVLINKS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in s.links_down else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        """Counters 0-3: DL replay, DL recovery, CRC flit, CRC data (cumulative counts)."""
        s = self._h(handle)
        if link >= NVLINKS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        counts = s.link_errors.get(link, (0, 0, 0, 0))
        return counts[counter] + (1 if counter == 1 and link in s.links_down else 0)

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        self._h(handle)  # SXM modules have no fan of their own
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        s = self._h(handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=int(mib * MIB)) for pid, mib in s.procs]

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        self._h(handle)
        return (0, 0)

    # -- GPM (Hopper+): samples are ctypes pointers, as in nvidia-ml-py -------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        self._h(handle)
        return SimpleNamespace(version=1, isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        self.calls += 1
        raw = _GpmSample(-1, 0.0)
        self._gpm_keep.append(raw)
        return ctypes.cast(ctypes.pointer(raw), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.calls += 1
        raw = ctypes.cast(sample, ctypes.POINTER(_GpmSample)).contents
        self._gpm_keep = [k for k in self._gpm_keep if ctypes.addressof(k) != ctypes.addressof(raw)]

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        self._h(handle)
        if not self.gpm:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        raw = ctypes.cast(sample, ctypes.POINTER(_GpmSample)).contents
        raw.gpu, raw.t = handle.index, self.now()
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        """Fill ``request.metrics[:numMetrics]`` for the interval sample1..sample2 (the fake
        reports the GPU's state at sample2): SM occupancy, any/HMMA tensor, graphics/SM util."""
        self.calls += 1
        s1 = ctypes.cast(request.sample1, ctypes.POINTER(_GpmSample)).contents
        s2 = ctypes.cast(request.sample2, ctypes.POINTER(_GpmSample)).contents
        if s1.gpu < 0 or s2.gpu != s1.gpu or s2.t <= s1.t:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        st = self._cache.get(s2.gpu)
        s = st[1] if st is not None and st[0] == s2.t else self._compute(s2.gpu, s2.t)
        values = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: s.util,
            pynvml.NVML_GPM_METRIC_SM_UTIL: s.util * 0.97,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: s.occupancy,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: s.tensor,
            pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: s.tensor,
        }
        for k in range(request.numMetrics):
            m = request.metrics[k]
            v = values.get(m.metricId)
            m.nvmlReturn = pynvml.NVML_SUCCESS if v is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
            m.value = float(v) if v is not None else 0.0
        return request


def _not_supported(name: str) -> Any:
    def call(self: FakeNvml, handle: Any, *args: Any) -> Any:
        self._h(handle)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = "A registry call the fake does not model (a field added to fields.csv): NOT_SUPPORTED."
    return call


# methods, not __getattr__: a class with __getattr__ loses CPython's fast attribute access
for _name in sorted(REGISTRY_CALLS - set(vars(FakeNvml))):
    setattr(FakeNvml, _name, _not_supported(_name))
