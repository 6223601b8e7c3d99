"""NvmlSource over scripted fakes: every field, unsupported fields absent, every NVML error path,
NVML events + kernel-log dedupe, /dev/kmsg resume by sequence number."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuwarden.collector.sources import EventDeduper, KmsgReader, NvmlEventWatcher, NvmlSource
from gpuwarden.shared.models import EventKind, GpuEvent

MIB = 1024 * 1024


class ScriptedNvml:
    """One GPU with fixed values; ``fail`` maps a call name to the NVML error code it raises."""

    NVMLError = pynvml.NVMLError

    def __init__(self, fail: dict[str, int] | None = None, count: int = 1) -> None:
        self.fail = dict(fail or {})
        self.count = count
        self.inits = 0
        self.shutdowns = 0

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        if name not in VALUES:
            raise AttributeError(name)

        def fn(*args: Any) -> Any:
            if name in self.fail:
                raise pynvml.NVMLError(self.fail[name])
            v = VALUES[name]
            return v(*args) if callable(v) else v

        return fn

    def nvmlInit(self) -> None:
        if "nvmlInit" in self.fail:
            raise pynvml.NVMLError(self.fail["nvmlInit"])
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if "nvmlDeviceGetCount" in self.fail:
            raise pynvml.NVMLError(self.fail["nvmlDeviceGetCount"])
        return self.count


VALUES: dict[str, Any] = {
    "nvmlSystemGetDriverVersion": "550.90.07",
    "nvmlDeviceGetHandleByIndex": lambda i: SimpleNamespace(index=i),
    "nvmlDeviceGetUUID": "GPU-1",
    "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:18:00.0"),
    "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
    "nvmlDeviceGetSerial": "1652",
    "nvmlDeviceGetVbiosVersion": "96.00.74.00.01",
    "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=97, memory=41),
    "nvmlDeviceGetMemoryInfo": SimpleNamespace(
        total=80 * 1024 * MIB, used=70 * 1024 * MIB, free=10 * 1024 * MIB, reserved=512 * MIB
    ),
    "nvmlDeviceGetTemperature": lambda h, s: 65,
    "nvmlDeviceGetTemperatureThreshold": lambda h, t: 92 if t == 0 else 89,
    "nvmlDeviceGetPowerUsage": 650_000,
    "nvmlDeviceGetEnforcedPowerLimit": 700_000,
    "nvmlDeviceGetPowerManagementLimit": 690_000,
    "nvmlDeviceGetTotalEnergyConsumption": 5_000_000,
    "nvmlDeviceGetClockInfo": lambda h, c: {0: 1755, 1: 1980, 2: 2619}[c],
    "nvmlDeviceGetMaxClockInfo": lambda h, c: {0: 1980, 1: 1980, 2: 2619}[c],
    "nvmlDeviceGetCurrentClocksEventReasons": 0x20 | 0x40,
    "nvmlDeviceGetPerformanceState": 0,
    "nvmlDeviceGetTotalEccErrors": lambda h, e, c: {(0, 0): 3, (1, 0): 1, (0, 1): 30, (1, 1): 2}[(e, c)],
    "nvmlDeviceGetRetiredPages": lambda h, cause: [0x1000] * (2 if cause == 0 else 1),
    "nvmlDeviceGetRetiredPagesPendingStatus": 1,
    "nvmlDeviceGetRemappedRows": (4, 1, 1, 0),
    "nvmlDeviceGetPcieReplayCounter": 7,
    "nvmlDeviceGetCurrPcieLinkGeneration": 4,
    "nvmlDeviceGetMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 8,
    "nvmlDeviceGetMaxPcieLinkWidth": 16,
    "nvmlDeviceGetPcieThroughput": lambda h, c: 1200 if c == 0 else 800,
    "nvmlDeviceGetNvLinkState": lambda h, k: _link_state(k),
    "nvmlDeviceGetNvLinkErrorCounter": lambda h, k, c: 10 * k + c,
    "nvmlDeviceGetFanSpeed": 35,
    "nvmlDeviceGetComputeRunningProcesses": [
        SimpleNamespace(pid=42, usedGpuMemory=2048 * MIB),
        SimpleNamespace(pid=43, usedGpuMemory=None),
    ],
    "nvmlDeviceGetMigMode": (1, 1),
    "nvmlDeviceGetMaxMigDeviceCount": 7,
    "nvmlDeviceGetMigDeviceHandleByIndex": lambda h, k: _mig(k),
}


def _link_state(k: int) -> int:
    if k >= 2:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return 1 if k == 0 else 0


def _mig(k: int) -> Any:
    if k >= 2:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    return SimpleNamespace(mig=k)


def _src(nvml: Any, **kw: Any) -> NvmlSource:
    return NvmlSource(nvml, "n1", lambda: 1000.0, collector_id="t", **kw)


def test_every_field_read_and_converted() -> None:
    g = _src(ScriptedNvml()).collect_sync().gpus[0]
    assert (g.uuid, g.pci_bus_id, g.name, g.serial, g.vbios_version) == (
        "GPU-1",
        "0000:18:00.0",
        "NVIDIA H100 80GB HBM3",
        "1652",
        "96.00.74.00.01",
    )
    assert (g.utilization_gpu_pct, g.utilization_memory_pct) == (97.0, 41.0)
    assert (g.memory_total_mib, g.memory_used_mib, g.memory_free_mib, g.memory_reserved_mib) == (
        81920,
        71680,
        10240,
        512,
    )
    assert (g.temperature_c, g.temperature_slowdown_c, g.temperature_shutdown_c) == (65, 89, 92)
    assert (g.power_w, g.power_limit_w, g.power_management_limit_w, g.energy_j) == (650, 700, 690, 5000)
    assert (g.graphics_clock_mhz, g.sm_clock_mhz, g.memory_clock_mhz) == (1755, 1980, 2619)
    assert (g.max_graphics_clock_mhz, g.max_sm_clock_mhz, g.max_memory_clock_mhz) == (1980, 1980, 2619)
    assert g.throttle_reasons == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert g.performance_state == 0
    assert (g.ecc_sbe_volatile, g.ecc_dbe_volatile, g.ecc_sbe_aggregate, g.ecc_dbe_aggregate) == (3, 1, 30, 2)
    assert (g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages, g.retired_pages_pending) == (2, 1, 3, True)
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable) == (4, 1)
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == (True, False)
    assert (g.pcie_link_gen, g.pcie_link_gen_max, g.pcie_link_width, g.pcie_link_width_max) == (4, 5, 8, 16)
    assert (g.pcie_replay_count, g.pcie_tx_kbps, g.pcie_rx_kbps, g.fan_speed_pct) == (7, 1200, 800, 35)
    assert g.nvlinks == [
        {
            "link": 0,
            "active": True,
            "replay_errors": 0,
            "recovery_errors": 1,
            "crc_flit_errors": 2,
            "crc_data_errors": 3,
        },
        {
            "link": 1,
            "active": False,
            "replay_errors": 10,
            "recovery_errors": 11,
            "crc_flit_errors": 12,
            "crc_data_errors": 13,
        },
    ]
    assert g.processes == [{"pid": 42, "used_memory_mib": 2048}, {"pid": 43}]
    assert (g.mig_mode, g.mig_instances) == (True, 2)


UNSUPPORTED_FIELDS = {
    "nvmlDeviceGetSerial": ["serial"],
    "nvmlDeviceGetTemperatureThreshold": ["temperature_slowdown_c", "temperature_shutdown_c"],
    "nvmlDeviceGetPowerManagementLimit": ["power_management_limit_w"],
    "nvmlDeviceGetPerformanceState": ["performance_state"],
    "nvmlDeviceGetTotalEccErrors": ["ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate"],
    "nvmlDeviceGetRetiredPages": ["retired_pages_sbe", "retired_pages_dbe", "retired_pages"],
    "nvmlDeviceGetRemappedRows": ["remapped_rows_pending", "remapped_rows_correctable"],
    "nvmlDeviceGetFanSpeed": ["fan_speed_pct"],
    "nvmlDeviceGetNvLinkState": ["nvlinks"],
    "nvmlDeviceGetComputeRunningProcesses": ["processes"],
    "nvmlDeviceGetMigMode": ["mig_mode", "mig_instances"],
    "nvmlDeviceGetPcieThroughput": ["pcie_tx_kbps", "pcie_rx_kbps"],
    "nvmlDeviceGetTotalEnergyConsumption": ["energy_j"],
    "nvmlDeviceGetMemoryInfo": ["memory_used_mib", "memory_reserved_mib"],
}


@pytest.mark.parametrize("call", sorted(UNSUPPORTED_FIELDS))
@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_TIMEOUT,
    ],
)
def test_unsupported_or_failing_call_leaves_field_absent_not_zero(call: str, code: int) -> None:
    src = _src(ScriptedNvml({call: code}))
    g = src.collect_sync().gpus[0]
    for f in UNSUPPORTED_FIELDS[call]:
        assert getattr(g, f) is None, f
    assert g.temperature_c == 65  # the rest is still read
    counted = sum(v for (name, c), v in src.call_errors.items() if name == call and c == code)
    assert counted == (0 if code == pynvml.NVML_ERROR_NOT_SUPPORTED else counted) and (
        code == pynvml.NVML_ERROR_NOT_SUPPORTED or counted >= 1
    )


def test_missing_function_in_old_bindings_is_absent() -> None:
    nv = ScriptedNvml()
    saved = VALUES.pop("nvmlDeviceGetPcieThroughput")
    try:
        g = _src(nv).collect_sync().gpus[0]
    finally:
        VALUES["nvmlDeviceGetPcieThroughput"] = saved
    assert g.pcie_tx_kbps is None and g.pcie_link_gen == 4


def test_gpu_lost_is_one_event_and_comes_back() -> None:
    nv = ScriptedNvml({"nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_GPU_IS_LOST})
    src = _src(nv)
    assert src.collect_sync().gpus == []
    assert src.collect_sync().gpus == []
    evs = src._pending
    assert [(e.kind, e.gpu_index) for e in evs] == [(EventKind.GPU_LOST, 0)]
    nv.fail.clear()
    assert len(src.collect_sync().gpus) == 1


@pytest.mark.parametrize(
    ("call", "code"),
    [
        ("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
        ("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
        ("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN),
        ("nvmlDeviceGetName", pynvml.NVML_ERROR_UNINITIALIZED),
        ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH),
    ],
)
def test_whole_nvml_lost_one_event_empty_samples_and_retry(call: str, code: int) -> None:
    nv = ScriptedNvml({call: code})
    src = _src(nv)
    s1, s2 = src.collect_sync(), src.collect_sync()
    assert s1.gpus == [] and s2.gpus == []
    lost = [e for e in src._pending if e.kind is EventKind.GPU_LOST]
    assert len(lost) == 1 and lost[0].gpu_index is None and "NVML" in lost[0].message
    assert src.problem is not None and src.problem.startswith("NVML unusable: NVMLError")  # /healthz says it
    nv.fail.clear()
    assert len(src.collect_sync().gpus) == 1  # re-initialised and read again
    assert nv.inits >= 1
    assert src.problem is None


async def test_nvml_event_and_kmsg_line_dedupe() -> None:
    class Lines:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def read_new_lines(self) -> list[str]:
            out, self.lines = self.lines, []
            return out

    now = [1000.0]
    kl = Lines()
    quiet = EventNvml()
    quiet._delivered = True  # the thread sees only timeouts; events are pushed by hand below
    w = NvmlEventWatcher(quiet, "n1", lambda: now[0], wait_ms=10)
    src = NvmlSource(
        ScriptedNvml(), "n1", lambda: now[0], kernel_log=kl, collector_id="t", event_watcher=w, dedupe=EventDeduper()
    )
    src.collect_sync()
    w.push(0, NvmlEventWatcher.XID, 79)
    assert await src.events() == []  # held for the kernel-log line
    kl.lines.append("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    now[0] = 1000.5
    evs = await src.events()
    assert [(e.code, e.source, e.gpu_index) for e in evs] == [(79, "kmsg", 0)]
    now[0] = 1010.0
    assert await src.events() == []  # the NVML copy was dropped
    assert src.dedupe is not None and src.dedupe.dropped == 1
    w.push(0, NvmlEventWatcher.XID, 13)  # no kernel line (e.g. no CAP_SYSLOG): published after hold
    assert await src.events() == []
    now[0] = 1013.0
    evs = await src.events()
    assert [(e.code, e.source, e.pci_bus_id) for e in evs] == [(13, "nvml-event", "0000:18:00.0")]
    await src.close()


def test_dedupe_keeps_bursts_from_one_path() -> None:
    d = EventDeduper()

    def ev(i: int) -> GpuEvent:
        return GpuEvent(
            event_id=str(i),
            node="n",
            ts=1.0 + i / 1000,
            kind=EventKind.XID,
            code=13,
            pci_bus_id="0000:38:00.0",
            raw=f"l{i}",
            source="kmsg",
        )

    assert len(d.filter([ev(i) for i in range(5)], 2.0)) == 5


def test_kmsg_resume_by_sequence(tmp_path: Path) -> None:
    state = tmp_path / "kmsg.seq"
    r = KmsgReader(str(tmp_path / "none"), state_path=state)
    recs = [f"6,{n},{n * 1000},-;NVRM: line {n}\n SUBSYSTEM=pci" for n in range(10, 13)]
    assert r.accept(recs) == [f"6,{n},{n * 1000},-;NVRM: line {n}" for n in range(10, 13)]
    assert state.read_text() == "12"
    r2 = KmsgReader(str(tmp_path / "none"), state_path=state)  # restart: ring buffer read from its start
    assert r2.last_seq == 12
    out = r2.accept([*recs, "6,13,1,-;NVRM: a", "6,17,2,-;NVRM: b", "not a record"])
    assert out == ["6,13,1,-;NVRM: a", "6,17,2,-;NVRM: b"]
    assert r2.lost_records == 3 and state.read_text() == "17"


def test_kmsg_records_get_event_time_from_boot_ts() -> None:
    class One:
        boot_ts = 1_700_000_000.0

        def read_new_lines(self) -> list[str]:
            return ["3,55,2500000,-;NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, DBE"]

    src = NvmlSource(ScriptedNvml(), "n1", lambda: 5.0, kernel_log=One(), collector_id="t")
    evs = src.parse_lines(One().read_new_lines())
    assert evs[0].ts == 1_700_000_002.5 and evs[0].code == 48


class EventNvml(ScriptedNvml):
    """ScriptedNvml plus an NVML event set that delivers one XID 48, then only timeouts."""

    def __init__(self, refuse_ecc: bool = False) -> None:
        super().__init__()
        self.refuse_ecc = refuse_ecc
        self.masks: list[int] = []
        self.freed = False
        self._delivered = False
        self._handle = SimpleNamespace(index=0)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return self._handle

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: Any, mask: int, es: object) -> None:
        if self.refuse_ecc and mask != NvmlEventWatcher.XID:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.masks.append(mask)

    def nvmlEventSetWait_v2(self, es: object, timeout_ms: int) -> Any:
        import time

        if not self._delivered:
            self._delivered = True
            return SimpleNamespace(device=self._handle, eventType=NvmlEventWatcher.XID, eventData=48)
        time.sleep(0.01)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, es: object) -> None:
        self.freed = True


@pytest.mark.parametrize("refuse_ecc", [False, True])
async def test_event_watcher_thread_delivers_xid_and_stops(refuse_ecc: bool) -> None:
    import asyncio

    nv = EventNvml(refuse_ecc)
    now = [50.0]
    w = NvmlEventWatcher(nv, "n1", lambda: now[0], wait_ms=10)
    src = NvmlSource(nv, "n1", lambda: now[0], collector_id="t", event_watcher=w, dedupe=EventDeduper(hold_s=0))
    src.collect_sync()  # starts the watcher once NVML is up
    assert w.started and nv.masks == [NvmlEventWatcher.XID if refuse_ecc else 11]
    evs: list[GpuEvent] = []
    for _ in range(100):
        evs += await src.events()
        if evs:
            break
        await asyncio.sleep(0.01)
    assert [(e.kind, e.code, e.gpu_index, e.pci_bus_id, e.source) for e in evs] == [
        (EventKind.XID, 48, 0, "0000:18:00.0", "nvml-event")
    ]
    await src.close()
    assert nv.freed and not w.started


def test_a_reading_the_model_cannot_hold_is_dropped_and_counted_not_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver's sentinel (a utilisation of 4294967295, a negative power draw) used to fail the
    whole node's sample every tick (the node then looked silent). Now only that reading goes."""
    monkeypatch.setitem(VALUES, "nvmlDeviceGetUtilizationRates", SimpleNamespace(gpu=4294967295, memory=41))
    monkeypatch.setitem(VALUES, "nvmlDeviceGetPcieReplayCounter", -1)
    src = _src(ScriptedNvml(count=2))
    s = src.collect_sync()
    assert [g.index for g in s.gpus] == [0, 1]
    g = s.gpus[0]
    assert g.utilization_gpu_pct is None and g.pcie_replay_count is None
    assert (g.utilization_memory_pct, g.power_w, g.temperature_c) == (41.0, 650.0, 65)  # the rest kept
    assert src.dropped.counts == {"utilization_gpu_pct": 2, "pcie_replay_count": 2}
    src.collect_sync()
    assert src.dropped.counts["utilization_gpu_pct"] == 4


def test_fan_speed_over_100_is_a_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML: the fan speed 'may exceed 100% in certain cases' (nvmlDeviceGetFanSpeed)."""
    monkeypatch.setitem(VALUES, "nvmlDeviceGetFanSpeed", 110)
    src = _src(ScriptedNvml())
    assert src.collect_sync().gpus[0].fan_speed_pct == 110.0
    assert not src.dropped.counts


def _lost_handle(lost: set[int]) -> Any:
    def handle(i: int) -> Any:
        if i in lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(index=i)

    return handle


def test_a_collector_started_after_a_gpu_fell_off_the_bus_names_the_xids_gpu_by_elimination(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started (or restarted) after XID 79, the collector cannot read the lost GPU's bus; the XID
    in the kernel log names the bus only. NVML still numbers the lost GPU: with one lost index
    and a bus no other GPU has, the XID is that GPU's."""
    buses = {0: b"00000000:18:00.0", 2: b"00000000:3A:00.0"}
    monkeypatch.setitem(VALUES, "nvmlDeviceGetHandleByIndex", _lost_handle({1}))
    monkeypatch.setitem(VALUES, "nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=buses[h.index]))
    src = _src(ScriptedNvml(count=3))
    s = src.collect_sync()
    assert [g.index for g in s.gpus] == [0, 2]
    line = "NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    (ev,) = src.parse_lines([line])
    assert (ev.code, ev.gpu_index, ev.pci_bus_id) == (79, 1, "0000:2a:00.0")
    # an XID of a GPU it knows keeps that GPU
    (known,) = src.parse_lines(["NVRM: Xid (PCI:0000:3a:00): 13, Graphics Exception"])
    assert known.gpu_index == 2


def test_two_lost_gpus_leave_a_bus_only_xid_without_an_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(VALUES, "nvmlDeviceGetHandleByIndex", _lost_handle({1, 2}))
    src = _src(ScriptedNvml(count=3))
    src.collect_sync()
    (ev,) = src.parse_lines(["NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus."])
    assert ev.gpu_index is None and ev.pci_bus_id == "0000:2a:00.0"  # nothing guessed
