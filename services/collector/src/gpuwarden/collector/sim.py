"""The simulated fleet's GPU side: a fake NVML, a kernel-log generator and ``SimulatedSource``.

Faults change raw telemetry and log lines only; the simulated path goes through the same
:class:`~gpuwarden.collector.sources.NvmlSource` and
:func:`~gpuwarden.collector.parsers.parse_kernel_log_line` as a real node.

Values model an HGX H100 80GB node (SXM5, 700 W, 1980 MHz max SM clock).
"""

from __future__ import annotations

import ctypes
import hashlib
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import hostlist
import pynvml

from gpuwarden.shared.models import GpuEvent, NodeSample
from gpuwarden.shared.scenario import Fault, Scenario, ScenarioClock

from .sources import NVML_ERROR_GPU_IS_LOST, THROTTLE_BITS, NvmlSource, default_collector_id

__all__ = [
    "HGX_H100_PCI",
    "FakeNvml",
    "GpuOffsets",
    "JobTiming",
    "KernelLogGenerator",
    "SimulatedSource",
    "gpu_offsets",
    "job_timing",
    "logger_gaps",
    "xid_line",
]

HGX_H100_PCI = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
]
NVSWITCH_PCI = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]

MIB = 1024 * 1024
H100_MEMORY_MIB = 81559.0
H100_POWER_LIMIT_W = 700.0
H100_MAX_SM_MHZ = 1980
H100_MEM_MHZ = 2619
IDLE_SM_MHZ = 345
_BIT = {v: k for k, v in THROTTLE_BITS.items()}


def pci_of(index: int) -> str:
    """PCI bus id of GPU ``index`` on an HGX H100 board (made-up ones beyond 8 GPUs)."""
    return HGX_H100_PCI[index] if index < len(HGX_H100_PCI) else f"0000:{0xE0 + index:02x}:00.0"


def uuid_of(seed: int, node: str, index: int) -> str:
    h = hashlib.sha256(f"{seed}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# Driver texts per XID (from real kernel logs, see tests/fixtures/xid-logs and NVIDIA's XID catalog).
# code -> (printed with pid/name?, text); "{link}" is the fault's NVLink (default 4).
_XID_TEXT: dict[int, tuple[bool, str]] = {
    8: (True, "Ch 00000010"),
    13: (True, "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Out Of Range Address"),
    31: (
        True,
        "channel 0x00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ "
        "0x7f1e_2a000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    ),
    32: (True, "Channel ID 00000010 intr0 00040000"),
    38: (True, "Ch 00000010"),
    43: (True, "Ch 00000008"),
    44: (True, "Ch 00000010, engmask 00000101, intr 10000000"),
    45: (True, "Ch 00000008"),
    48: (
        True,
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
        "0x12bac1c3e0 partition 2, subpartition 1.",
    ),
    61: (False, "0cec(3098) 00000000 00000000"),
    62: (False, "0ce4(2d10) 00000000 00000000"),
    63: (True, "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate."),
    64: (True, "Row Remapper: Failed to remap row (0x00000012bac1c3e0), reset gpu to activate."),
    68: (True, "NVDEC0 Exception: Invalid MMU fault"),
    69: (True, "Class Error: ChId 0010, Class 0000c7c0, Offset 00000000, Data 00000000, ErrorCode 0000000d"),
    74: (False, "NVLink: fatal error detected on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    79: (False, "GPU has fallen off the bus."),
    92: (True, "High single-bit ECC error rate detected."),
    94: (True, "Contained: SM (0x1). RST: No, D-RST: No"),
    95: (True, "Uncontained: FBHUB. RST: Yes, D-RST: No"),
    109: (True, "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c040"),
    119: (
        True,
        "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20801813 0x4c).",
    ),
    120: (True, "GSP task exception: (0x0) timeout."),
    122: (False, "SPI PMU RPC read fail"),
    123: (False, "SPI PMU RPC write fail"),
    136: (False, "Link Training failed: link {link}"),
    140: (True, "An uncorrectable ECC error detected (possible firmware handling failure) DRAM:-1, LTC:0, MMU:0, RM:0"),
    143: (False, "GPU Initialization Failure"),
    145: (False, "NVLink: RLW Error on link {link}"),
    149: (
        False,
        "NETIR_LINK_EVT Fatal XC0 i0 Link {link} (0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    ),
    154: (False, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
}
_UNKNOWN_PID = "pid='<unknown>', name=<unknown>, "


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")


def xid_line(ts: float, pci: str, code: int, pid: int | None, name: str = "python3", link: int | None = None) -> str:
    """A kernel-log XID line as ``dmesg --time-format iso`` prints it, in the driver's real format
    (text per code from real logs; an unlisted code gets the generic ``Ch 00000008`` form)."""
    with_pid, text = _XID_TEXT.get(code, (True, "Ch 00000008"))
    text = text.replace("{link}", str(link if link is not None else 4))
    bus = pci.rsplit(".", 1)[0]
    who = ""
    if with_pid:
        who = f"pid={pid}, name={name}, " if pid is not None else _UNKNOWN_PID
    return f"{_iso(ts)} NVRM: Xid (PCI:{bus}): {code}, {who}{text}"


def sxid_line(ts: float, switch: int, code: int, link: int | None) -> str:
    """An NVSwitch SXID line (``nvidia-nvswitchN: SXid (PCI:...): CODE, ...``)."""
    lk = link if link is not None else 0
    text = (
        f"Fatal, Link {lk:02d} LTSSM Fault Up"
        if code >= 20000
        else f"Non-fatal, Link {lk:02d} egress non-posted PRIV error (First)"
    )
    pci = NVSWITCH_PCI[switch % len(NVSWITCH_PCI)]
    return f"{_iso(ts)} nvidia-nvswitch{switch}: SXid (PCI:{pci}): {code}, {text}"


@dataclass
class _Gpu:
    """Raw telemetry of one simulated GPU at one scenario second (NVML units after conversion)."""

    util: float
    mem_util: float
    mem_used_mib: float
    temp: float
    power_w: float
    sm_mhz: float
    reasons: int
    tensor: float = 0.0  # GPM any-tensor activity, %
    occupancy: float = 0.0  # GPM SM occupancy, %
    sbe: int = 0
    dbe: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    replays: int = 0
    link_gen: int = 5
    link_width: int = 16
    lost: bool = False
    pcie_rx_factor: float = 120.0  # PCIe RX KB/s per % of utilisation
    procs: list[tuple[int, float]] = field(default_factory=list)  # (pid, used MiB)
    links_down: frozenset[int] = frozenset()
    link_errors: dict[int, tuple[int, int, int, int]] = field(
        default_factory=dict
    )  # link -> replay, recovery, flit, data
    retired: tuple[int, int, bool] | None = None  # (SBE pages, DBE pages, pending); None = not supported


_PRE_AMPERE = ("V100", "P100", "T4", "P40", "P4")  # page retirement instead of row remapping
_GPM_MODELS = ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200", "B300")  # GPM: Hopper and newer
NVLINKS = 18


class _GpmSample(ctypes.Structure):
    """What the fake stores in an ``nvmlGpmSample_t``: which GPU, at which scenario second."""

    _fields_ = [("gpu", ctypes.c_int), ("t", ctypes.c_double)]


def _speed(f: Fault) -> float:
    """A straggler/clocks-low ``factor`` as the fraction of normal speed: 0.6 stays 0.6, a factor
    above 1 (``2`` = twice as slow) becomes its inverse; absent = 0.6."""
    x = f.factor if f.factor is not None else 0.6
    return 1 / x if x > 1 else max(x, 0.01)


def _job_hash(job_id: str) -> int:
    return int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16)


# Working set (MiB) a job of each profile holds once loaded.
_WORKING_SET_MIB = {
    "training": 71680.0,
    "checkpoint-heavy": 71680.0,
    "memory-leak": 30720.0,
    "inference": 40960.0,
    "input-bound": 61440.0,
    "low-tensor": 51200.0,
    "comm-bound": 51200.0,
    "partial-idle": 71680.0,
}
_TRAINING_LIKE = {"training", "checkpoint-heavy", "memory-leak", "low-tensor", "comm-bound", "partial-idle"}


@dataclass(frozen=True)
class JobTiming:
    """A job's schedule, fixed by (scenario seed, job id, profile); all values in seconds.

    * ``startup_s`` - start-up phase (60-240 s: allocated, model loading, util 0-5 %); 0 for a
      job with ``start_s`` 0, which was already running when the scenario began.
    * ``step_s`` - synchronous training step (8-12 s).
    * ``ckpt_every_s`` / ``ckpt_len_s`` / ``ckpt_phase_s`` - checkpoint period, length and offset
      of the first one from the end of start-up: ``training`` 420-720 / 10-30 s, ``checkpoint-heavy``
      60-120 / 15-45 s; ``ckpt_per_node`` - rank 0 of every node writes (else global rank 0 only).
    * ``eval_every_s`` / ``eval_len_s`` / ``eval_phase_s`` - evaluation pauses (training only):
      every 900-1500 s for 10-30 s.
    * ``stagger_s`` - training-like jobs only: the upper half of the job's GPUs on each node
      finish this long before ``end_s`` (0 for most jobs, else 20-60 s).
    * ``comm_period_s`` - ``comm-bound``: one compute second per 4-7 s period (gloo-like).
    """

    startup_s: float
    step_s: int
    ckpt_every_s: float
    ckpt_len_s: float
    ckpt_phase_s: float
    ckpt_per_node: bool
    eval_every_s: float
    eval_len_s: float
    eval_phase_s: float
    stagger_s: float
    comm_period_s: int


def job_timing(seed: int, job_id: str, profile: str, start_s: float) -> JobTiming:
    """The :class:`JobTiming` of job ``job_id`` (profile ``profile``, starting at scenario
    second ``start_s``) in a scenario with ``seed``; deterministic."""
    r = random.Random(f"{seed}/{job_id}/timing")
    startup = r.uniform(60, 240)
    heavy = profile == "checkpoint-heavy"
    every = r.uniform(60, 120) if heavy else r.uniform(420, 720)
    length = r.uniform(15, 45) if heavy else r.uniform(10, 30)
    phase = r.uniform(0, every)
    per_node = r.random() < 0.5
    ev_every, ev_len = r.uniform(900, 1500), r.uniform(10, 30)
    ev_phase = r.uniform(0, ev_every)
    stagger = r.uniform(20, 60) if r.random() < 0.3 else 0.0
    return JobTiming(
        startup_s=startup if start_s > 0 else 0.0,
        step_s=8 + _job_hash(job_id) % 5,
        ckpt_every_s=every,
        ckpt_len_s=min(length, every / 2),
        ckpt_phase_s=phase,
        ckpt_per_node=per_node,
        eval_every_s=ev_every,
        eval_len_s=ev_len,
        eval_phase_s=ev_phase,
        stagger_s=stagger if profile in _TRAINING_LIKE else 0.0,
        comm_period_s=4 + r.randrange(4),
    )


@dataclass(frozen=True)
class GpuOffsets:
    """Stable per-GPU differences of one node (index = GPU): ``power_scale`` (x0.90-1.10 of the
    profile's power), ``temp_c`` (C added to the modelled temperature: -3..+6, the node's hot GPU
    +12..+20), ``busy_sm_mhz`` (the GPU's busy SM clock, 1800-1980 MHz), ``sbe`` / ``pcie_replays``
    (constant counts a GPU already carries: most 0, some a few), ``hot`` (the hot GPU, or None)."""

    power_scale: tuple[float, ...]
    temp_c: tuple[float, ...]
    busy_sm_mhz: tuple[float, ...]
    sbe: tuple[int, ...]
    pcie_replays: tuple[int, ...]
    hot: int | None


def gpu_offsets(seed: int, node: str, gpus: int) -> GpuOffsets:
    """The :class:`GpuOffsets` of ``node`` (``gpus`` GPUs) in a scenario with ``seed``; deterministic."""
    r = random.Random(f"{seed}/{node}/offsets")
    power = tuple(1 + r.choice((-1, 1)) * r.uniform(0.02, 0.10) for _ in range(gpus))
    temp = [r.uniform(-3, 6) for _ in range(gpus)]
    hot = r.randrange(gpus) if r.random() < 0.5 else None
    if hot is not None:
        temp[hot] = r.uniform(12, 20)
    clocks = tuple(float(H100_MAX_SM_MHZ - r.uniform(0, 180)) for _ in range(gpus))
    sbe = tuple(r.choice((1, 2, 3, 7, 12)) if r.random() < 0.25 else 0 for _ in range(gpus))
    replays = tuple(r.randrange(1, 60) if r.random() < 0.2 else 0 for _ in range(gpus))
    return GpuOffsets(power, tuple(temp), clocks, sbe, replays, hot)


class FakeNvml:
    """In-memory NVML of ONE simulated node, with the nvidia-ml-py call names and units.

    The node's state at scenario second ``t`` (``self.t`` when set, else the clock's current
    scenario second) follows the scenario's jobs (profile per GPU) and faults. Noise comes
    from an RNG seeded with (scenario seed, node, gpu, tick), so two runs agree exactly.

    Realism in every profile (values from the recordings in ``shared/realdata``): stable per-GPU
    offsets (:func:`gpu_offsets`: power x0.90-1.10, temperature -3..+6 C and in half the seeds
    one hot GPU per node at +12..+20 C, busy SM clock 1800-1980 MHz with +/-30 MHz jitter, on
    some GPUs constant non-zero correctable-ECC and PCIe replay counts); per job a schedule
    (:func:`job_timing`): a start-up phase for a job that starts after scenario second 0
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

    Faults (only raw telemetry and, via :class:`KernelLogGenerator`, log lines):

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
      :func:`_speed`; ``factor`` 0.6 or 1.67 both mean 60 % speed).
    * ``collective-hang`` - every GPU of every job holding the fault's node (or GPU) at
      ``at_s``, on all that job's nodes: util 100 %, ~115 W, memory util 0, tensor 0.
    * ``zombie-process`` - on a GPU without a job: a compute process with ~60 GiB, ~90 W.
    * ``telemetry-silent`` - handled by :class:`SimulatedSource` (no samples).
    * ``health-check-fail`` - nothing here: the node's fake ``dcgmi diag`` fails
      (:mod:`gpuwarden.health_check.sim`); NVML telemetry and the kernel log stay as they are.
    """

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

    def __init__(self, scenario: Scenario, clock: ScenarioClock, node: str) -> None:
        self.scenario = scenario
        self.clock = clock
        self.node = node
        self.t: float | None = None
        self.gpus = scenario.cluster.gpus_per_node
        self.calls = 0
        model = scenario.cluster.gpu_model.upper()
        self.page_retirement = any(m in model for m in _PRE_AMPERE)
        self.gpm = any(m in model for m in _GPM_MODELS)
        self._faults = [f for f in scenario.faults if f.node == node]
        # gpu, start, end, profile, the job's GPUs on this node, job id
        self._jobs: list[tuple[int, float, float, str, list[int], str]] = []
        jobs = {str(j.id): j for j in scenario.jobs}
        alloc = scenario.allocations()
        self._timing: dict[str, JobTiming] = {}
        self._writers: dict[str, set[int]] = {}  # job -> GPUs of this node that write checkpoints
        for job_id, per in alloc.items():
            j = jobs[job_id]
            gl = per.get(node)
            if gl is None:
                continue
            end = j.end_s if j.end_s is not None else float("inf")
            for g in gl:
                self._jobs.append((g, j.start_s, end, j.profile, gl, job_id))
            tm = job_timing(scenario.seed, job_id, j.profile, j.start_s)
            self._timing[job_id] = tm
            first = next(n for n in j.node_list() if n in per)
            self._writers[job_id] = {gl[0]} if gl and (tm.ckpt_per_node or node == first) else set()
        self.offsets = gpu_offsets(scenario.seed, node, self.gpus)
        self._bursts: dict[tuple[str, int], tuple[float, float]] = {}
        # collective hangs: (fault, GPUs of this node in a job the fault's node/GPU held at at_s)
        self._hangs: list[tuple[Fault, set[int]]] = []
        for f in scenario.faults:
            if f.kind != "collective-hang":
                continue
            hung: set[int] = set()
            for job_id, per in alloc.items():
                j = jobs[job_id]
                end = j.end_s if j.end_s is not None else float("inf")
                held = per.get(f.node)
                if held is None or not j.start_s <= f.at_s < end or (f.gpu is not None and f.gpu not in held):
                    continue
                hung.update(per.get(node, []))
            if hung:
                self._hangs.append((f, hung))
        self._cache: dict[int, tuple[float, _Gpu]] = {}
        self._energy_mj = [0.0] * self.gpus
        self._energy_t = [0.0] * self.gpus
        self._gpm_keep: list[_GpmSample] = []

    # -- state --------------------------------------------------------------------
    def now(self) -> float:
        return self.t if self.t is not None else self.clock.scenario_s()

    def _active(self, t: float, gpu: int, *kinds: str) -> Fault | None:
        for f in self._faults:
            if f.kind in kinds and (f.gpu is None or f.gpu == gpu) and f.active(t):
                return f
        return None

    def _since(self, t: float, gpu: int, kind: str) -> float:
        """Seconds a lasting fault of ``kind`` has been in effect (0 if not)."""
        f = self._active(t, gpu, kind)
        return t - f.at_s if f else 0.0

    def state(self, gpu: int) -> _Gpu:
        """Telemetry of ``gpu`` at the current scenario second (cached per second)."""
        t = self.now()
        hit = self._cache.get(gpu)
        if hit is not None and hit[0] == t:
            return hit[1]
        s = self._compute(gpu, t)
        dt = max(0.0, t - self._energy_t[gpu])
        self._energy_mj[gpu] += s.power_w * dt * 1000
        self._energy_t[gpu] = max(t, self._energy_t[gpu])
        self._cache[gpu] = (t, s)
        return s

    def _pid(self, gpu: int, salt: str) -> int:
        return (
            10_000
            + int(hashlib.sha256(f"{self.scenario.seed}/{self.node}/{gpu}/{salt}".encode()).hexdigest()[:6], 16)
            % 3_990_000
        )

    def _burst(self, job_id: str, t_rel: float) -> bool:
        """Inference: whether job ``job_id`` serves a burst at ``t_rel`` s into its run. Per 30 s
        slot, a burst with probability 0.3, of 2-8 s (80 %) or 10-25 s (20 %): busy ~7 % of the time."""
        k = int(t_rel // 30)
        hit = self._bursts.get((job_id, k))
        if hit is None:
            r = random.Random(f"{self.scenario.seed}/{job_id}/burst/{k}")
            if r.random() < 0.3:
                length = r.uniform(2, 8) if r.random() < 0.8 else r.uniform(10, 25)
                b0 = k * 30 + r.uniform(0, 30 - length)
                hit = (b0, b0 + length)
            else:
                hit = (-1.0, -1.0)
            self._bursts[(job_id, k)] = hit
        return hit[0] <= t_rel < hit[1]

    def _busy_mhz(self, gpu: int, rng: random.Random) -> float:
        return min(float(H100_MAX_SM_MHZ), self.offsets.busy_sm_mhz[gpu] + rng.uniform(-30, 30))

    def _profile(
        self,
        profile: str | None,
        job: tuple[int, float, float, str, list[int], str] | None,
        gpu: int,
        t: float,
        rng: random.Random,
    ) -> _Gpu:
        u = rng.uniform
        if job is None or profile is None:  # no job
            s = _Gpu(0.0, 0.0, 0.0, 0, u(62, 72), IDLE_SM_MHZ, _BIT["gpu_idle"])
            s.power_w *= self.offsets.power_scale[gpu]
            s.temp = 28 + s.power_w * 0.055 + self.offsets.temp_c[gpu] + u(-0.5, 0.5)
            return s
        tm = self._timing[job[5]]
        t_rel = t - job[1]
        if profile == "partial-idle":
            profile = "idle" if job[4].index(gpu) >= (len(job[4]) + 1) // 2 else "training"
        working = _WORKING_SET_MIB.get(profile, 71680.0)
        steady = t_rel - tm.startup_s  # seconds since the start-up phase ended
        busy = self._busy_mhz(gpu, rng)
        if profile == "idle":  # allocated but unused: a little memory, idle clocks
            s = _Gpu(0.0, 0.0, 512 + u(0, 64), 0, u(68, 75), IDLE_SM_MHZ, _BIT["gpu_idle"])
        elif steady < 0:  # start-up: allocated, then the model loads (memory ramps), util 0-5 %
            frac = t_rel / tm.startup_s
            ramp = min(1.0, max(0.0, (frac - 0.25) / 0.75))
            util = u(0, 5) if ramp > 0 and rng.random() < 0.3 else 0.0
            s = _Gpu(
                util,
                util * 0.3,
                17 + ramp * working,
                0,
                u(70, 80) + 40 * ramp,
                busy if ramp > 0 else IDLE_SM_MHZ,
                0 if ramp > 0 else _BIT["gpu_idle"],
            )
        elif tm.stagger_s and t >= job[2] - tm.stagger_s and job[4].index(gpu) >= len(job[4]) // 2:
            s = _Gpu(0.0, 0.0, 17 + u(0, 8), 0, u(68, 80), IDLE_SM_MHZ, _BIT["gpu_idle"])  # finished early
        elif profile in {"training", "memory-leak", "checkpoint-heavy"} and (
            (steady - tm.ckpt_phase_s) % tm.ckpt_every_s < tm.ckpt_len_s and steady >= tm.ckpt_phase_s
        ):
            # checkpoint: rank 0 writes (low util); the other ranks spin in the next collective
            if gpu in self._writers[job[5]]:
                s = _Gpu(u(2, 8), u(0, 3), working + u(-1024, 1024), 0, u(135, 160), busy, 0, u(0, 2), u(1, 3))
            else:
                s = _Gpu(u(99, 100), u(0, 2), working + u(-1024, 1024), 0, u(145, 185), busy, 0, 0.0, u(1, 3))
        elif profile in {"training", "memory-leak"} and (
            (steady - tm.eval_phase_s) % tm.eval_every_s < tm.eval_len_s and steady >= tm.eval_phase_s
        ):  # evaluation pause: every GPU of the job at low util
            s = _Gpu(u(2, 15), u(2, 8), working + u(-1024, 1024), 0, u(110, 160), busy, 0, u(0, 3), u(3, 8))
        elif profile in {"training", "memory-leak", "checkpoint-heavy"}:
            k = int(steady) % tm.step_s
            if k == 0:  # step boundary: optimizer step, next batch
                s = _Gpu(u(55, 75), u(20, 30), 0, 0, u(290, 370), busy, 0, u(10, 25), u(20, 35))
            elif k >= tm.step_s - 2:  # NCCL all-reduce: SMs busy with communication kernels
                s = _Gpu(u(97, 100), u(15, 25), 0, 0, u(380, 460), busy, 0, u(0, 5), u(8, 15))
            else:
                s = _Gpu(u(90, 100), u(40, 60), 0, 0, u(560, 630), busy, 0, u(55, 75), u(45, 65))
            s.mem_used_mib = working + u(-1024, 1024)
        elif profile == "comm-bound":  # gloo-like: one compute second per period, then waits on the CPU
            if int(steady) % tm.comm_period_s == 0:
                s = _Gpu(u(85, 100), u(30, 45), 0, 0, u(380, 480), busy, 0, u(40, 60), u(35, 50))
            else:
                s = _Gpu(u(4, 12), u(1, 4), 0, 0, u(115, 150), busy, 0, u(0, 3), u(2, 6))
            s.mem_used_mib = working + u(-512, 512)
        elif profile == "inference":  # bursty serving: mostly idle with the model loaded
            if self._burst(job[5], t_rel):
                util = u(60, 100)
                s = _Gpu(util, util * 0.5, 0, 0, 150 + util * 3.0 + u(-20, 20), busy, 0, util * 0.45, util * 0.4)
            else:
                s = _Gpu(u(0, 1) if rng.random() < 0.1 else 0.0, 0.0, 0, 0, u(60, 80), IDLE_SM_MHZ, _BIT["gpu_idle"])
            s.mem_used_mib = working + u(-512, 512)
        elif profile == "input-bound":
            duty = u(0.15, 0.40)
            s = _Gpu(duty * 100, duty * 30, working + u(-512, 512), 0, 110 + duty * 550, busy, 0, duty * 60, duty * 50)
            s.pcie_rx_factor = 2500.0
        elif profile == "low-tensor":
            s = _Gpu(u(95, 100), u(10, 20), working + u(-512, 512), 0, u(240, 300), busy, 0, u(1, 5), u(35, 55))
        else:  # pragma: no cover - PROFILES is validated by the scenario
            raise ValueError(f"unknown profile {profile!r}")
        if profile == "memory-leak" and steady >= 0:
            s.mem_used_mib = min(H100_MEMORY_MIB - 256, 30720 + 15 * steady)  # 900 MiB/min: full in ~56 min
        s.power_w = min(s.power_w * self.offsets.power_scale[gpu], H100_POWER_LIMIT_W - 5)  # below the cap
        s.temp = 28 + s.power_w * 0.055 + self.offsets.temp_c[gpu] + u(-0.5, 0.5)  # ~33 C idle, ~64 C at 650 W
        if s.mem_used_mib > 1024:  # the job's process holds the memory (also while it waits)
            s.procs = [(self._pid(gpu, job[5]), s.mem_used_mib - 512)]
        return s

    def _compute(self, gpu: int, t: float) -> _Gpu:
        rng = random.Random(f"{self.scenario.seed}/{self.node}/{gpu}/{int(t * 1000)}")
        u = rng.uniform
        job = next((j for j in self._jobs if j[0] == gpu and j[1] <= t < j[2]), None)
        s = self._profile(job[3] if job else None, job, gpu, t, rng)
        if job is None and self._active(t, gpu, "zombie-process"):
            s.mem_used_mib = 61440 + u(-256, 256)
            s.power_w = u(85, 95)
            s.procs = [(self._pid(gpu, "zombie"), s.mem_used_mib - 512)]
        if f := self._active(t, gpu, "straggler-gpu", "straggler-node", "clocks-low"):
            speed = _speed(f)
            s.sm_mhz = round(s.sm_mhz * speed)
            if f.kind != "clocks-low":
                s.util *= speed
                s.power_w *= speed
                s.tensor *= speed
            else:  # the SMs stay busy, but a GPU at a low clock draws less (dynamic power ~ f)
                s.power_w *= 0.4 + 0.6 * speed
        if any(gpu in hung and f.active(t) for f, hung in self._hangs) and s.util > 0:
            s.util, s.power_w, s.mem_util, s.tensor, s.occupancy = 100.0, u(105, 125), 0.0, 0.0, u(1, 3)
            s.sm_mhz = self._busy_mhz(gpu, rng)
        if since := self._active(t, gpu, "thermal-throttle"):
            dt = t - since.at_s
            s.reasons |= _BIT["sw_thermal_slowdown"]
            s.temp = 87 + min(1.5, 0.1 * dt) + u(0, 0.5)
            s.sm_mhz = round(H100_MAX_SM_MHZ * max(0.55, 0.75 - 0.008 * dt))
            s.power_w *= 0.75
        if self._active(t, gpu, "power-brake"):
            s.reasons |= _BIT["hw_slowdown"] | _BIT["hw_power_brake_slowdown"]
            s.sm_mhz = min(s.sm_mhz, 810)
            s.power_w = min(s.power_w, u(280, 320))
        if f := self._active(t, gpu, "power-cap"):
            s.reasons |= _BIT["sw_power_cap"]
            s.sm_mhz = round(self._busy_mhz(gpu, rng) * f.factor) if f.factor is not None else min(s.sm_mhz, 1410)
            s.power_w = u(690, 700)
        if s.reasons & ~_BIT["gpu_idle"]:
            s.reasons &= ~_BIT["gpu_idle"]
        s.sm_mhz = float(int(s.sm_mhz))
        s.sbe = self.offsets.sbe[gpu] + int(50 * self._since(t, gpu, "ecc-sbe-storm"))
        dbe = [
            f
            for f in self._faults
            if f.at_s <= t
            and (f.gpu is None or f.gpu == gpu)
            and (f.kind == "ecc-dbe" or (f.kind == "xid" and f.xid in {48, 94, 95}))
        ]
        s.dbe = len(dbe)
        s.remap_pending = bool(self._active(t, gpu, "row-remap-pending")) or (bool(dbe) and not self.page_retirement)
        s.remap_failed = bool(self._active(t, gpu, "row-remap-failed"))
        if self._active(t, gpu, "retired-pages"):
            s.retired = (2, 1, True)
        elif self.page_retirement:
            s.retired = (0, len(dbe), bool(dbe))
        s.replays = self.offsets.pcie_replays[gpu] + int(20 * self._since(t, gpu, "pcie-replays"))
        if self._active(t, gpu, "pcie-degraded"):
            s.link_gen, s.link_width = 3, 8
        if f := self._active(t, gpu, "nvlink-down"):
            s.links_down = frozenset(range(NVLINKS)) if f.link is None else frozenset({f.link})
        if f := self._active(t, gpu, "nvlink-errors"):
            d = t - f.at_s
            counts = (int(12 * d), int(d // 30), int(40 * d), int(3 * d))
            for k in range(NVLINKS) if f.link is None else [f.link]:
                s.link_errors[k] = counts
        s.lost = bool(self._active(t, gpu, "gpu-lost")) or any(
            f.kind == "xid" and f.xid == 79 and f.at_s <= t and (f.gpu is None or f.gpu == gpu) for f in self._faults
        )
        return s

    def _enumerated(self) -> list[int]:
        t = self.now()
        return [g for g in range(self.gpus) if not self._active(t, g, "gpu-missing")]

    # -- NVML calls ----------------------------------------------------------------
    def _h(self, handle: Any) -> _Gpu:
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


class KernelLogGenerator:
    """Kernel-log lines a simulated node prints for its faults, in the driver's real format.

    ``lines(t0, t1)`` returns the lines of faults starting in scenario seconds ``(t0, t1]``,
    each stamped with its event time (``clock.event_ts(at_s)``) in ``dmesg --time-format iso``
    form: ``xid`` (any code, the driver's text for that code; without ``gpu`` one line per GPU),
    ``sxid`` (an ``nvidia-nvswitchN: SXid`` line, ``Fatal`` for codes >= 20000), ``ecc-dbe``
    (XID 48), ``row-remap-pending`` (XID 63), ``row-remap-failed`` (XID 64). Every other fault
    kind shows in telemetry only, as on real hardware: no line.
    """

    _KIND_XID = {"ecc-dbe": 48, "row-remap-pending": 63, "row-remap-failed": 64}

    def __init__(self, scenario: Scenario, clock: ScenarioClock, node: str) -> None:
        self.scenario = scenario
        self.clock = clock
        self.node = node
        self._faults = sorted((f for f in scenario.faults if f.node == node), key=lambda f: f.at_s)

    def lines(self, t0: float, t1: float) -> list[str]:
        out = []
        for f in self._faults:
            if not t0 < f.at_s <= t1:
                continue
            ts = self.clock.event_ts(f.at_s)
            rng = random.Random(f"{self.scenario.seed}/{self.node}/{f.at_s}/{f.kind}")
            gpus = [f.gpu] if f.gpu is not None else list(range(self.scenario.cluster.gpus_per_node))
            if f.kind == "sxid" and f.sxid is not None:
                out.append(sxid_line(ts, rng.randrange(len(NVSWITCH_PCI)), f.sxid, f.link))
                continue
            code = f.xid if f.kind == "xid" else self._KIND_XID.get(f.kind)
            if code is None:
                continue
            for g in gpus:
                pid = rng.randrange(10_000, 4_000_000) if code not in {48, 63, 64} else None
                out.append(xid_line(ts, pci_of(g), code, pid, link=f.link))
        return out


def logger_gaps(seed: int, node: str, duration_s: float) -> list[tuple[float, float]]:
    """Scenario-second intervals ``[start, end)`` in which ``node``'s collector skips its ticks (a
    busy or descheduled logger, as real recordings show): half the nodes (by seed) have none; the
    others a 1-7 s gap every 30-60 s. Deterministic; far below telemetry-silent's 30 s."""
    r = random.Random(f"{seed}/{node}/gaps")
    if r.random() < 0.5:
        return []
    out = []
    t = r.uniform(30, 60)
    while t < duration_s:
        length = float(r.randint(1, 7))
        out.append((t, t + length))
        t += length + r.uniform(30, 60)
    return out


#: Default ``nvlink_every`` of the simulated collector: NVLink (90 of the ~130 fake NVML calls
#: per GPU per tick) is read every 5th tick, which keeps a node-tick well under 1 ms.
SIM_NVLINK_EVERY = 5


class SimulatedSource:
    """All GPUs of the scenario's nodes (or ``nodes``), one :class:`FakeNvml` per node read
    through :class:`NvmlSource`, plus the nodes' kernel-log lines through the real parser.

    Each ``collect()`` is one tick: scenario second ``t`` = 0, tick_s, 2*tick_s, ... with
    event time ``clock.event_ts(t)``; ``next_due()`` gives its wall time, None after
    ``duration_s``. A node under ``telemetry-silent`` produces no sample while it lasts, and a
    node skips the ticks inside its :func:`logger_gaps` (no sample; its kernel-log lines still
    come, as the kernel log is read separately).
    """

    name = "simulated"

    def __init__(
        self,
        scenario: Scenario,
        clock: ScenarioClock,
        nodes: list[str] | None = None,
        collector_id: str | None = None,
        nvlink_every: int = SIM_NVLINK_EVERY,
    ) -> None:
        """``nvlink_every``: NVLink state and counters are read every this many ticks
        (:class:`~gpuwarden.collector.sources.NvmlSource`); raises ValueError if < 1."""
        self.scenario = scenario
        self.clock = clock
        all_nodes = scenario.cluster.node_names()
        if nodes is not None:
            unknown = sorted(set(nodes) - set(all_nodes))
            if unknown:
                raise ValueError(f"nodes not in scenario {scenario.name!r}: {unknown}")
        self.nodes = [n for n in all_nodes if nodes is None or n in set(nodes)]
        self.t = 0.0
        self._prev = -1.0
        cid = collector_id or default_collector_id()
        self.fakes = {n: FakeNvml(scenario, clock, n) for n in self.nodes}
        self.logs = {n: KernelLogGenerator(scenario, clock, n) for n in self.nodes}
        self.sources = {
            n: NvmlSource(
                self.fakes[n],
                n,
                self._event_ts,
                collector_id=cid,
                sample_source="simulated",
                event_source="simulated",
                nvlink_every=nvlink_every,
            )
            for n in self.nodes
        }
        self._pending: list[GpuEvent] = []
        self.gaps = {n: logger_gaps(scenario.seed, n, scenario.duration_s) for n in self.nodes}
        silent = [f for f in scenario.faults if f.kind == "telemetry-silent"]
        self._silent = {n: [f for f in silent if f.node == n] for n in self.nodes}

    @classmethod
    def for_hostlist(cls, scenario: Scenario, clock: ScenarioClock, expr: str | None, **kw: Any) -> SimulatedSource:
        """Build for the nodes of a Slurm hostlist expression (``gpu-node-[001-004]``), all if None."""
        nodes = list(hostlist.expand_hostlist(expr)) if expr else None
        return cls(scenario, clock, nodes, **kw)

    def _event_ts(self) -> float:
        return self.clock.event_ts(self.t)

    def next_due(self) -> float | None:
        if self.t > self.scenario.duration_s:
            return None
        return self.clock.wall_of(self.t)

    async def collect(self) -> list[NodeSample]:
        return self.collect_sync()

    def collect_sync(self) -> list[NodeSample]:
        t = self.t
        out = []
        for n in self.nodes:
            src = self.sources[n]
            if not any(a <= t < b for a, b in self.gaps[n]):
                fake = self.fakes[n]
                fake.t = t
                sample = src.collect_sync()
                if not any(f.active(t) for f in self._silent[n]):
                    out.append(sample)
            self._pending.extend(src.parse_lines(self.logs[n].lines(self._prev, t)))
        self._prev = t
        self.t = t + self.scenario.tick_s
        return out

    async def events(self) -> list[GpuEvent]:
        out, self._pending = self._pending, []
        for src in self.sources.values():
            out.extend(await src.events())
        out.sort(key=lambda e: e.ts)
        return out

    async def close(self) -> None:
        for src in self.sources.values():
            await src.close()
