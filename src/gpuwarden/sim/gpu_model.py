"""The simulated GPU node's raw telemetry: what one HGX H100 GPU reads at one scenario second.

:class:`NodeModel` turns a scenario's jobs (profile per GPU) and faults into the raw state of
each GPU of one node (:class:`GpuState`, NVML units); :class:`~gpuwarden.sim.nvml.FakeNvml`
serves it through the nvidia-ml-py call names. Stable per-GPU differences
(:func:`gpu_offsets`) and per-job schedules (:func:`job_timing`) are deterministic in the
scenario seed.

Values model an HGX H100 80GB node (SXM5, 700 W, 1980 MHz max SM clock).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from gpuwarden.shared.nvidia.nvml import THROTTLE_BITS
from gpuwarden.shared.scenario import Fault, Scenario, ScenarioClock

__all__ = [
    "H100_MAX_SM_MHZ",
    "H100_MEMORY_MIB",
    "H100_MEM_MHZ",
    "H100_POWER_LIMIT_W",
    "HGX_H100_PCI",
    "MIB",
    "NVLINKS",
    "NVSWITCH_PCI",
    "GpuOffsets",
    "GpuState",
    "JobTiming",
    "NodeModel",
    "gpu_offsets",
    "job_timing",
    "pci_of",
    "uuid_of",
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
    """PCI bus id of GPU ``index`` on an HGX H100 board (made-up ones beyond 8 GPUs: bus
    0xe0 + index in domain 0 up to index 31, then domain 1, bus = index, up to index 255)."""
    if index < len(HGX_H100_PCI):
        return HGX_H100_PCI[index]
    return f"0000:{0xE0 + index:02x}:00.0" if 0xE0 + index <= 0xFF else f"0001:{index:02x}:00.0"


def uuid_of(seed: int, node: str, index: int) -> str:
    h = hashlib.sha256(f"{seed}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class GpuState:
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


class NodeModel:
    """The raw state of every GPU of ONE simulated node, from the scenario's jobs and faults.

    The node's state at scenario second ``t`` (``self.t`` when set, else the clock's current
    scenario second) follows the scenario's jobs (profile per GPU) and faults; :meth:`state`
    gives it per GPU (cached per scenario second). The job profiles and faults it models are
    described on :class:`~gpuwarden.sim.nvml.FakeNvml`, which reads it through the NVML calls.
    """

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
        self._cache: dict[int, tuple[float, GpuState]] = {}
        self._energy_mj = [0.0] * self.gpus
        self._energy_t = [0.0] * self.gpus

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

    def state(self, gpu: int) -> GpuState:
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
    ) -> GpuState:
        u = rng.uniform
        if job is None or profile is None:  # no job
            s = GpuState(0.0, 0.0, 0.0, 0, u(62, 72), IDLE_SM_MHZ, _BIT["gpu_idle"])
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
            s = GpuState(0.0, 0.0, 512 + u(0, 64), 0, u(68, 75), IDLE_SM_MHZ, _BIT["gpu_idle"])
        elif steady < 0:  # start-up: allocated, then the model loads (memory ramps), util 0-5 %
            frac = t_rel / tm.startup_s
            ramp = min(1.0, max(0.0, (frac - 0.25) / 0.75))
            util = u(0, 5) if ramp > 0 and rng.random() < 0.3 else 0.0
            s = GpuState(
                util,
                util * 0.3,
                17 + ramp * working,
                0,
                u(70, 80) + 40 * ramp,
                busy if ramp > 0 else IDLE_SM_MHZ,
                0 if ramp > 0 else _BIT["gpu_idle"],
            )
        elif tm.stagger_s and t >= job[2] - tm.stagger_s and job[4].index(gpu) >= len(job[4]) // 2:
            s = GpuState(0.0, 0.0, 17 + u(0, 8), 0, u(68, 80), IDLE_SM_MHZ, _BIT["gpu_idle"])  # finished early
        elif profile in {"training", "memory-leak", "checkpoint-heavy"} and (
            (steady - tm.ckpt_phase_s) % tm.ckpt_every_s < tm.ckpt_len_s and steady >= tm.ckpt_phase_s
        ):
            # checkpoint: rank 0 writes (low util); the other ranks spin in the next collective
            if gpu in self._writers[job[5]]:
                s = GpuState(u(2, 8), u(0, 3), working + u(-1024, 1024), 0, u(135, 160), busy, 0, u(0, 2), u(1, 3))
            else:
                s = GpuState(u(99, 100), u(0, 2), working + u(-1024, 1024), 0, u(145, 185), busy, 0, 0.0, u(1, 3))
        elif profile in {"training", "memory-leak"} and (
            (steady - tm.eval_phase_s) % tm.eval_every_s < tm.eval_len_s and steady >= tm.eval_phase_s
        ):  # evaluation pause: every GPU of the job at low util
            s = GpuState(u(2, 15), u(2, 8), working + u(-1024, 1024), 0, u(110, 160), busy, 0, u(0, 3), u(3, 8))
        elif profile in {"training", "memory-leak", "checkpoint-heavy"}:
            k = int(steady) % tm.step_s
            if k == 0:  # step boundary: optimizer step, next batch
                s = GpuState(u(55, 75), u(20, 30), 0, 0, u(290, 370), busy, 0, u(10, 25), u(20, 35))
            elif k >= tm.step_s - 2:  # NCCL all-reduce: SMs busy with communication kernels
                s = GpuState(u(97, 100), u(15, 25), 0, 0, u(380, 460), busy, 0, u(0, 5), u(8, 15))
            else:
                s = GpuState(u(90, 100), u(40, 60), 0, 0, u(560, 630), busy, 0, u(55, 75), u(45, 65))
            s.mem_used_mib = working + u(-1024, 1024)
        elif profile == "comm-bound":  # gloo-like: one compute second per period, then waits on the CPU
            if int(steady) % tm.comm_period_s == 0:
                s = GpuState(u(85, 100), u(30, 45), 0, 0, u(380, 480), busy, 0, u(40, 60), u(35, 50))
            else:
                s = GpuState(u(4, 12), u(1, 4), 0, 0, u(115, 150), busy, 0, u(0, 3), u(2, 6))
            s.mem_used_mib = working + u(-512, 512)
        elif profile == "inference":  # bursty serving: mostly idle with the model loaded
            if self._burst(job[5], t_rel):
                util = u(60, 100)
                s = GpuState(util, util * 0.5, 0, 0, 150 + util * 3.0 + u(-20, 20), busy, 0, util * 0.45, util * 0.4)
            else:
                s = GpuState(
                    u(0, 1) if rng.random() < 0.1 else 0.0, 0.0, 0, 0, u(60, 80), IDLE_SM_MHZ, _BIT["gpu_idle"]
                )
            s.mem_used_mib = working + u(-512, 512)
        elif profile == "input-bound":
            duty = u(0.15, 0.40)
            s = GpuState(
                duty * 100, duty * 30, working + u(-512, 512), 0, 110 + duty * 550, busy, 0, duty * 60, duty * 50
            )
            s.pcie_rx_factor = 2500.0
        elif profile == "low-tensor":
            s = GpuState(u(95, 100), u(10, 20), working + u(-512, 512), 0, u(240, 300), busy, 0, u(1, 5), u(35, 55))
        else:  # pragma: no cover - PROFILES is validated by the scenario
            raise ValueError(f"unknown profile {profile!r}")
        if profile == "memory-leak" and steady >= 0:
            s.mem_used_mib = min(H100_MEMORY_MIB - 256, 30720 + 15 * steady)  # 900 MiB/min: full in ~56 min
        s.power_w = min(s.power_w * self.offsets.power_scale[gpu], H100_POWER_LIMIT_W - 5)  # below the cap
        s.temp = 28 + s.power_w * 0.055 + self.offsets.temp_c[gpu] + u(-0.5, 0.5)  # ~33 C idle, ~64 C at 650 W
        if s.mem_used_mib > 1024:  # the job's process holds the memory (also while it waits)
            s.procs = [(self._pid(gpu, job[5]), s.mem_used_mib - 512)]
        return s

    def _compute(self, gpu: int, t: float) -> GpuState:
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
