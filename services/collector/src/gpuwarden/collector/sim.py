"""The simulated fleet's GPU side: a fake NVML, a kernel-log generator and ``SimulatedSource``.

Faults change raw telemetry and log lines only; the simulated path goes through the same
:class:`~gpuwarden.collector.sources.NvmlSource` and
:func:`~gpuwarden.collector.parsers.parse_kernel_log_line` as a real node.

Values model an HGX H100 80GB node (SXM5, 700 W, 1980 MHz max SM clock).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import hostlist
import pynvml

from gpuwarden.shared.models import GpuEvent, NodeSample
from gpuwarden.shared.scenario import Fault, Scenario, ScenarioClock

from .sources import NVML_ERROR_GPU_IS_LOST, THROTTLE_BITS, NvmlSource, default_collector_id

__all__ = ["HGX_H100_PCI", "FakeNvml", "KernelLogGenerator", "SimulatedSource", "xid_line"]

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
_XID_TEXT: dict[int, tuple[bool, str]] = {  # code -> (printed with pid/name?, text)
    13: (True, "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Out Of Range Address"),
    31: (
        True,
        "channel 0x00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ "
        "0x7f1e_2a000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    ),
    43: (True, "Ch 00000008"),
    45: (True, "Ch 00000008"),
    48: (
        True,
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
        "0x12bac1c3e0 partition 2, subpartition 1.",
    ),
    63: (True, "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate."),
    64: (True, "Row Remapper: Failed to remap row (0x00000012bac1c3e0), reset gpu to activate."),
    74: (False, "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    79: (False, "GPU has fallen off the bus."),
    92: (True, "High single-bit ECC error rate detected."),
    94: (True, "Contained: SM (0x1). RST: No, D-RST: No"),
    95: (True, "Uncontained: FBHUB. RST: Yes, D-RST: No"),
    119: (
        True,
        "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20801813 0x4c).",
    ),
    120: (True, "GSP task exception: (0x0) timeout."),
}
_UNKNOWN_PID = "pid='<unknown>', name=<unknown>, "


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")


def xid_line(ts: float, pci: str, code: int, pid: int | None, name: str = "python3") -> str:
    """A kernel-log XID line as ``dmesg --time-format iso`` prints it, in the driver's real format."""
    with_pid, text = _XID_TEXT.get(code, (True, "Ch 00000008"))
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
    util: float
    mem_util: float
    mem_used_mib: float
    temp: float
    power_w: float
    sm_mhz: float
    reasons: int
    sbe: int = 0
    dbe: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    replays: int = 0
    link_gen: int = 5
    link_width: int = 16
    lost: bool = False


class FakeNvml:
    """In-memory NVML of ONE simulated node, with the nvidia-ml-py call names and units.

    The node's state at scenario second ``t`` (``self.t`` when set, else the clock's current
    scenario second) follows the scenario's jobs (profile per GPU) and faults. Noise comes
    from an RNG seeded with (scenario seed, node, gpu, tick), so two runs agree exactly.
    A GPU behind ``gpu-lost`` or XID 79 raises ``NVMLError`` GPU_IS_LOST from then on;
    ``gpu-missing`` removes it from the enumeration.
    """

    NVMLError = pynvml.NVMLError

    def __init__(self, scenario: Scenario, clock: ScenarioClock, node: str) -> None:
        self.scenario = scenario
        self.clock = clock
        self.node = node
        self.t: float | None = None
        self.gpus = scenario.cluster.gpus_per_node
        self.calls = 0
        self._faults = [f for f in scenario.faults if f.node == node]
        self._jobs: list[tuple[int, float, float, str, list[int]]] = []  # gpu, start, end, profile, job gpus
        jobs = {str(j.id): j for j in scenario.jobs}
        for job_id, per in scenario.allocations().items():
            j = jobs[job_id]
            gl = per.get(node)
            if gl is None:
                continue
            end = j.end_s if j.end_s is not None else float("inf")
            for g in gl:
                self._jobs.append((g, j.start_s, end, j.profile, gl))
        self._cache: dict[int, tuple[float, _Gpu]] = {}
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

    def _compute(self, gpu: int, t: float) -> _Gpu:
        rng = random.Random(f"{self.scenario.seed}/{self.node}/{gpu}/{int(t * 1000)}")
        u = rng.uniform
        job = next((j for j in self._jobs if j[0] == gpu and j[1] <= t < j[2]), None)
        profile = job[3] if job else None
        if profile == "partial-idle" and job is not None and job[4].index(gpu) >= (len(job[4]) + 1) // 2:
            profile = "idle"
        if profile == "checkpoint-heavy" and job is not None and (t - job[1]) % 120 < 15:
            profile = "stall"
        if profile in {"training", "memory-leak"}:
            s = _Gpu(u(90, 100), u(40, 60), 71680 + u(-1024, 1024), u(60, 75), u(600, 690), H100_MAX_SM_MHZ, 0)
            if profile == "memory-leak" and job is not None:
                s.mem_used_mib = min(H100_MEMORY_MIB - 256, 30720 + 200 * (t - job[1]))
        elif profile == "inference":
            s = _Gpu(u(40, 70), u(20, 35), 40960 + u(-512, 512), u(50, 60), u(300, 450), H100_MAX_SM_MHZ, 0)
        elif profile == "input-bound":
            s = _Gpu(u(15, 45), u(5, 15), 61440 + u(-512, 512), u(45, 55), u(200, 320), H100_MAX_SM_MHZ, 0)
        elif profile == "low-tensor":
            s = _Gpu(u(95, 100), u(10, 20), 51200 + u(-512, 512), u(50, 58), u(240, 300), H100_MAX_SM_MHZ, 0)
        elif profile == "stall":
            s = _Gpu(0.0, u(0, 2), 71680 + u(-1024, 1024), u(40, 48), u(110, 130), H100_MAX_SM_MHZ, 0)
        elif profile == "idle":  # allocated but unused: context and a little memory, idle clocks
            s = _Gpu(0.0, 0.0, 512 + u(0, 64), u(30, 35), u(68, 75), IDLE_SM_MHZ, _BIT["gpu_idle"])
        else:  # no job
            s = _Gpu(0.0, 0.0, 0.0, u(28, 34), u(65, 75), IDLE_SM_MHZ, _BIT["gpu_idle"])
        busy = s.util > 0
        if self._active(t, gpu, "zombie-process") and not busy:
            s.mem_used_mib = 61440 + u(-256, 256)
        if f := self._active(t, gpu, "straggler-gpu", "straggler-node", "clocks-low"):
            factor = f.factor if f.factor is not None else 0.6
            s.sm_mhz = round(s.sm_mhz * factor)
            if f.kind != "clocks-low":
                s.util *= factor
                s.power_w *= factor
        if self._active(t, gpu, "collective-hang") and busy:
            s.util, s.power_w, s.mem_util = 100.0, u(105, 125), 0.0
        if self._active(t, gpu, "thermal-throttle"):
            s.reasons |= _BIT["sw_thermal_slowdown"]
            s.temp = u(87, 91)
            s.sm_mhz = round(min(s.sm_mhz, 1980) * 0.6)
            s.power_w *= 0.75
        if self._active(t, gpu, "power-brake"):
            s.reasons |= _BIT["hw_slowdown"] | _BIT["hw_power_brake_slowdown"]
            s.sm_mhz = min(s.sm_mhz, 810)
            s.power_w = min(s.power_w, u(280, 320))
        if self._active(t, gpu, "power-cap"):
            s.reasons |= _BIT["sw_power_cap"]
            s.sm_mhz = min(s.sm_mhz, 1410)
            s.power_w = u(690, 700)
        if s.reasons & ~_BIT["gpu_idle"]:
            s.reasons &= ~_BIT["gpu_idle"]
        s.sm_mhz = float(int(s.sm_mhz))
        s.sbe = int(50 * self._since(t, gpu, "ecc-sbe-storm"))
        dbe = [
            f
            for f in self._faults
            if f.at_s <= t
            and (f.gpu is None or f.gpu == gpu)
            and (f.kind == "ecc-dbe" or (f.kind == "xid" and f.xid in {48, 95}))
        ]
        s.dbe = len(dbe)
        s.remap_pending = bool(self._active(t, gpu, "row-remap-pending")) or bool(dbe)
        s.remap_failed = bool(self._active(t, gpu, "row-remap-failed"))
        s.replays = int(20 * self._since(t, gpu, "pcie-replays"))
        if self._active(t, gpu, "pcie-degraded"):
            s.link_gen, s.link_width = 3, 8
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
        s = self.state(handle.index)
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
        self._h(handle)  # HBM3 GPUs remap rows instead of retiring pages
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        self._h(handle)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        self._h(handle)
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        self._h(handle)
        return 16

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        s = self._h(handle)
        return int(s.util * 300) if counter == 0 else int(s.util * 120)  # KB/s

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._h(handle)
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if self._active(self.now(), handle.index, "nvlink-down") else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        self._h(handle)
        t = self.now()
        if counter in (0, 2) and self._active(t, handle.index, "nvlink-errors", "nvlink-down"):
            return int(10 * self._since(t, handle.index, "nvlink-errors")) + 1
        return 0

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        self._h(handle)  # SXM modules have no fan of their own
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        s = self._h(handle)
        if s.mem_used_mib <= 1024:
            return []
        pid = 10_000 + int(uuid_of(self.scenario.seed, self.node, handle.index)[4:9], 16) % 50_000
        return [SimpleNamespace(pid=pid, usedGpuMemory=int((s.mem_used_mib - 512) * MIB))]

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        self._h(handle)
        return (0, 0)


class KernelLogGenerator:
    """Kernel-log lines a simulated node prints for its faults, in the driver's real format.

    ``lines(t0, t1)`` returns the lines of faults starting in scenario seconds ``(t0, t1]``,
    each stamped with its event time (``clock.event_ts(at_s)``) in ``dmesg --time-format iso``
    form: ``xid`` (any code), ``sxid``, ``ecc-dbe`` (XID 48), ``row-remap-pending`` (XID 63),
    ``row-remap-failed`` (XID 64).
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
                out.append(xid_line(ts, pci_of(g), code, pid))
        return out


class SimulatedSource:
    """All GPUs of the scenario's nodes (or ``nodes``), one :class:`FakeNvml` per node read
    through :class:`NvmlSource`, plus the nodes' kernel-log lines through the real parser.

    Each ``collect()`` is one tick: scenario second ``t`` = 0, tick_s, 2*tick_s, ... with
    event time ``clock.event_ts(t)``; ``next_due()`` gives its wall time, None after
    ``duration_s``. A node under ``telemetry-silent`` produces no sample while it lasts.
    """

    name = "simulated"

    def __init__(
        self, scenario: Scenario, clock: ScenarioClock, nodes: list[str] | None = None, collector_id: str | None = None
    ) -> None:
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
                self.fakes[n], n, self._event_ts, collector_id=cid, sample_source="simulated", event_source="simulated"
            )
            for n in self.nodes
        }
        self._pending: list[GpuEvent] = []

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
            fake = self.fakes[n]
            fake.t = t
            src = self.sources[n]
            sample = src.collect_sync()
            silent = any(f.kind == "telemetry-silent" and f.node == n and f.active(t) for f in self.scenario.faults)
            if not silent:
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
