"""Health checks over the collector's FakeNvml (scenario-driven), recorded tool output, a fake
tool runner and a temporary sysfs tree; the time budget; publishing; the CLI exit codes."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuwarden.health_check.checks import (
    CHECKS,
    CheckResult,
    Context,
    Inputs,
    Status,
    evaluate_dcgm,
    evaluate_infiniband,
    evaluate_nvlink,
    worst,
)
from gpuwarden.health_check.io import FileLog, SubprocessRunner, ToolMissing, ToolOutput, ToolTimeout, read_sysfs_ib
from gpuwarden.health_check.parsers import (
    NvlinkGpu,
    NvlinkLink,
    parse_dcgmi_diag,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
    parse_nvidia_smi_nvlink,
)
from gpuwarden.health_check.publish import publish_results, to_models
from gpuwarden.health_check.run import build_context, health_run
from gpuwarden.health_check.settings import HealthCheckSettings
from gpuwarden.health_check.suite import Summary, job_gpus, run_checks, select_checks, since_ts
from gpuwarden.shared.bus import MemoryPublisher, Producer
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.shared.settings import BusSettings
from gpuwarden.sim.gpu_model import pci_of
from gpuwarden.sim.kernel_log import xid_line
from gpuwarden.sim.nvml import FakeNvml

FIX = Path(__file__).resolve().parents[1] / "fixtures"
NODE = "gpu-node-004"


class FakeRunner:
    """ToolRunner fake: ``"argv0 argv1"`` (e.g. ``"dcgmi diag"``) or ``argv0`` -> text (or an
    exception, or a sleep in seconds); anything else is not installed."""

    def __init__(self, outputs: dict[str, ToolOutput | Exception | float] | None = None) -> None:
        self.outputs = outputs or {}
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], timeout_s: float) -> ToolOutput:
        self.calls.append(argv)
        out = self.outputs.get(" ".join(argv[:2]), self.outputs.get(argv[0], ToolMissing(argv[0])))
        if isinstance(out, float):
            time.sleep(out)
            raise ToolTimeout(argv[0])
        if isinstance(out, Exception):
            raise out
        return out


class Lines:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def read_lines(self) -> list[str]:
        return self.lines


def fake(faults: list[dict[str, object]] | None = None, jobs: list[dict[str, object]] | None = None) -> FakeNvml:
    sc = Scenario.model_validate(
        {"name": "t", "duration_s": 100, "cluster": {"nodes": 4}, "faults": faults or [], "jobs": jobs or []}
    )
    f = FakeNvml(sc, ScenarioClock(0.0), NODE)
    f.t = 10.0
    return f


def inputs(nv: FakeNvml | None = None, **kw: object) -> Inputs:
    return Inputs(
        nvml=nv if nv is not None else fake(),
        runner=kw.pop("runner", FakeRunner()),
        kernel_log=kw.pop("log", Lines([])),
        **kw,
    )  # type: ignore[arg-type]


def run1(name: str, inp: Inputs, **ctx: object) -> CheckResult:
    return CHECKS[name].fn(inp, Context(node=NODE, **ctx))  # type: ignore[arg-type]


# -- healthy node: every default check OK ---------------------------------------------------


def test_healthy_fake_node_passes_every_check() -> None:
    inp = inputs()
    for name in select_checks("prolog"):
        r = run1(name, inp, expected_gpus=8)
        assert r.status == Status.OK, (name, r)


# -- one fault per check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "fault", "status", "text"),
    [
        ("gpu-count", {"kind": "gpu-missing", "gpu": 7}, Status.CRITICAL, "7/8 GPUs visible"),
        ("nvml", {"kind": "gpu-lost", "gpu": 3}, Status.CRITICAL, "GPU 3"),
        ("processes", {"kind": "zombie-process", "gpu": 1}, Status.CRITICAL, "GPU 1: 1 leftover process"),
        ("ecc", {"kind": "ecc-dbe", "gpu": 2}, Status.CRITICAL, "GPU 2: 1 uncorrectable ECC"),
        ("ecc", {"kind": "row-remap-failed", "gpu": 2}, Status.CRITICAL, "row remapping failed"),
        ("pcie", {"kind": "pcie-degraded", "gpu": 6}, Status.CRITICAL, "GPU 6: PCIe x8 of x16"),
        ("nvlink", {"kind": "nvlink-down", "gpu": 4}, Status.CRITICAL, "GPU 4: NVLink [0, 1"),
        ("clocks", {"kind": "power-brake", "gpu": 5}, Status.CRITICAL, "HW slowdown + power brake"),
        ("clocks", {"kind": "thermal-throttle", "gpu": 5}, Status.WARNING, "SW thermal"),
    ],
)
def test_fault_is_found(check: str, fault: dict[str, object], status: Status, text: str) -> None:
    nv = fake([{"at_s": 0, "node": NODE, **fault}])
    r = run1(check, inputs(nv), expected_gpus=8)
    assert r.status == status and text in r.reason, r
    if "gpu" in fault and check != "gpu-count":
        assert r.gpu_index == fault["gpu"] or check == "nvml"


def test_job_gpus_only() -> None:
    nv = fake([{"at_s": 0, "node": NODE, "kind": "row-remap-pending", "gpu": 5}])
    assert run1("ecc", inputs(nv), gpus=[0, 1]).status == Status.OK
    r = run1("ecc", inputs(nv), gpus=[4, 5])
    assert r.status == Status.CRITICAL and r.gpu_index == 5 and "pending" in r.reason
    assert run1("gpu-count", inputs(nv), gpus=[9]).reason == "job GPU(s) [9] absent (8 visible)"


def test_nvml_unavailable_is_critical_through_the_runner() -> None:
    res = asyncio.run(run_checks(["nvml", "ecc"], Inputs(None, FakeRunner(), None), Context()))
    assert [r.status for r in res] == [Status.CRITICAL, Status.CRITICAL]
    assert "NVML unavailable" in res[0].reason


def test_nvml_init_failure_is_critical() -> None:
    class Broken:
        NVMLError = RuntimeError

        def nvmlInit(self) -> None:
            raise OSError("NVML Shared Library Not Found")

    (r,) = asyncio.run(run_checks(["gpu-count"], Inputs(Broken(), FakeRunner(), None), Context()))  # type: ignore[arg-type]
    assert r.status == Status.CRITICAL and "nvmlInit failed" in r.reason


# -- XID -------------------------------------------------------------------------------------


def test_xid_window_and_severity() -> None:
    t0 = 1_700_000_000.0
    lines = [
        xid_line(t0 - 100, pci_of(2), 79, None),  # before the window
        xid_line(t0 + 5, pci_of(1), 13, 4242),  # application XID -> WARNING
        "some other kernel line",
    ]
    r = run1("xid", inputs(log=Lines(lines), clock=lambda: t0 + 10), since_ts=t0)
    assert r.status == Status.WARNING and "XID 13" in r.reason
    lines.append(xid_line(t0 + 6, pci_of(3), 48, 4242))
    r = run1("xid", inputs(log=Lines(lines), clock=lambda: t0 + 10), since_ts=t0)
    assert r.status == Status.CRITICAL and r.reason.startswith("XID 48 on PCI 0000:5d:00.0")


def test_xid_job_aware_maps_bus_id_to_gpu() -> None:
    t0 = 1_700_000_000.0
    lines = [xid_line(t0 + 1, pci_of(3), 94, 1)]
    assert run1("xid", inputs(log=Lines(lines), clock=lambda: t0), since_ts=t0, gpus=[0, 1]).status == Status.OK
    r = run1("xid", inputs(log=Lines(lines), clock=lambda: t0), since_ts=t0, gpus=[3])
    assert r.status == Status.CRITICAL and r.gpu_index == 3 and "GPU 3" in r.reason


@pytest.mark.parametrize(
    ("fixture", "status", "code"),
    [
        # no wall-clock stamp: counted, but WARNING (it would be counted again on every later run)
        ("xid79-fallen-off-bus-short.txt", Status.WARNING, "XID 79 on PCI 0000:44:00.0 (undated log line)"),
        ("xid13-43-sm-warp-exception-burst.txt", Status.WARNING, "XID 13"),
    ],
)
def test_xid_on_recorded_kernel_logs(fixture: str, status: Status, code: str) -> None:
    r = run1("xid", inputs(log=FileLog(FIX / "xid-logs" / fixture)), since_ts=0.0)
    assert r.status == status and code in r.reason


def test_xid_without_kernel_log_is_unknown() -> None:
    assert run1("xid", Inputs(fake(), FakeRunner(), None)).status == Status.UNKNOWN


# -- InfiniBand ------------------------------------------------------------------------------


def test_infiniband_recorded_all_active_ethernet_ignored() -> None:
    r = evaluate_infiniband(
        parse_ibstat((FIX / "infiniband/ibstat-h100-ndr-8ib-1eth-all-active.txt").read_text()), 400, 8
    )
    assert r.status == Status.OK and r.reason == "8 InfiniBand port(s) ACTIVE at 400 Gb/s"
    r = evaluate_infiniband(parse_ibstatus((FIX / "infiniband/ibstatus-a100-hdr-all-active.txt").read_text()))
    assert r.status == Status.OK and "8 InfiniBand" in r.reason and "200" in r.reason


def test_infiniband_slow_missing_and_down_ports() -> None:
    ports = parse_ibstat((FIX / "infiniband/ibstat-h100-ndr-8ib-1eth-all-active.txt").read_text())
    r = evaluate_infiniband(ports, rate_gbps=800)
    assert r.status == Status.CRITICAL and "mlx5_0/1 at 400 Gb/s, expected 800" in r.reason
    assert evaluate_infiniband(ports, min_ports=9).reason.startswith("8/9 InfiniBand ports")
    text = (FIX / "infiniband/ibstat-h100-ndr-8ib-1eth-all-active.txt").read_text()
    down = text.replace("State: Active", "State: Down", 1).replace(
        "Physical state: LinkUp", "Physical state: Polling", 1
    )
    r = evaluate_infiniband(parse_ibstat(down))
    assert r.status == Status.CRITICAL and r.reason.startswith("mlx5_0/1 DOWN/Polling")


def _sysfs(root: Path, dev: str, state: str, phys: str, rate: str, layer: str) -> None:
    p = root / "sys/class/infiniband" / dev / "ports" / "1"
    p.mkdir(parents=True)
    for k, v in {"state": state, "phys_state": phys, "rate": rate, "link_layer": layer}.items():
        (p / k).write_text(v + "\n")


def test_infiniband_sysfs_netdev_down_is_not_an_ib_failure(tmp_path: Path) -> None:
    _sysfs(tmp_path, "mlx5_0", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
    _sysfs(tmp_path, "mlx5_1", "1: DOWN", "3: Disabled", "25 Gb/sec (1X EDR)", "Ethernet")
    ports = read_sysfs_ib(tmp_path)
    assert [(p.device, p.state, p.rate_gbps) for p in ports] == [("mlx5_0", "ACTIVE", 400.0), ("mlx5_1", "DOWN", 25.0)]
    r = run1("infiniband", inputs(sysfs_root=tmp_path))
    assert r.status == Status.OK and r.reason.startswith("1 InfiniBand")


def test_infiniband_falls_back_to_ibstat(tmp_path: Path) -> None:
    text = (FIX / "infiniband/ibstat-h100-ndr-8ib-1eth-all-active.txt").read_text()
    runner = FakeRunner({"ibstat": ToolOutput(0, text)})
    r = run1("infiniband", inputs(runner=runner, sysfs_root=tmp_path), ib_ports=8)
    assert r.status == Status.OK and runner.calls == [["ibstat"]]
    assert r.reason == "8 InfiniBand port(s) ACTIVE at 400 Gb/s (ibstat)"
    assert run1("infiniband", inputs(sysfs_root=tmp_path)).reason == "no InfiniBand ports"


def test_infiniband_tool_chain_ibstatus_then_ibv_devinfo(tmp_path: Path) -> None:
    ibstatus = (FIX / "infiniband/ibstatus-a100-hdr-all-active.txt").read_text()
    # ibstat present but failing (no umad device) -> ibstatus
    runner = FakeRunner(
        {"ibstat": ToolOutput(255, "", "ibpanic: ... No such file"), "ibstatus": ToolOutput(0, ibstatus)}
    )
    r = run1("infiniband", inputs(runner=runner, sysfs_root=tmp_path))
    assert r.status == Status.OK and r.reason.endswith("(ibstatus)")
    assert runner.calls == [["ibstat"], ["ibstatus"]]
    # only the verbs utilities installed: two dual-port HCAs with port 2 down
    cx3 = (FIX / "infiniband/ibv-devinfo-cx3-2hca-port2-down.txt").read_text()
    runner = FakeRunner({"ibv_devinfo": ToolOutput(0, cx3)})
    r = run1("infiniband", inputs(runner=runner, sysfs_root=tmp_path))
    assert runner.calls == [["ibstat"], ["ibstatus"], ["ibv_devinfo", "-v"]]
    assert r.status == Status.CRITICAL and r.reason == "mlx4_1/2 DOWN/?; mlx4_0/2 DOWN/?"
    # the -v port: down and polling
    v = (FIX / "infiniband/ibv-devinfo-v-cx3-port2-down-polling.txt").read_text()
    r = run1("infiniband", inputs(runner=FakeRunner({"ibv_devinfo": ToolOutput(0, v)}), sysfs_root=tmp_path))
    assert r.status == Status.CRITICAL and r.reason == "mlx4_1/2 DOWN/Polling"


def test_infiniband_ibv_devinfo_roce_only_and_unreported_rate(tmp_path: Path) -> None:
    roce = (FIX / "infiniband/ibv-devinfo-cx7-roce-tabs-excerpt.txt").read_text()
    r = run1("infiniband", inputs(runner=FakeRunner({"ibv_devinfo": ToolOutput(0, roce)}), sysfs_root=tmp_path))
    assert (r.status, r.reason) == (Status.OK, "no InfiniBand ports (ibv_devinfo)")  # Ethernet, LID 0: not IB
    ib = (FIX / "infiniband/ibv-devinfo-ib-sm-lid-active-excerpt.txt").read_text()
    runner = FakeRunner({"ibv_devinfo": ToolOutput(0, ib)})
    assert run1("infiniband", inputs(runner=runner, sysfs_root=tmp_path)).status == Status.OK
    r = run1("infiniband", inputs(runner=runner, sysfs_root=tmp_path), ib_rate_gbps=400)
    assert (r.status, r.reason) == (Status.WARNING, "mlx5_3/1 rate not reported (expected 400 Gb/s)")
    # no RDMA device at all: "No IB devices found" on stderr, exit 255
    none = FakeRunner({"ibv_devinfo": ToolOutput(255, "", "No IB devices found\n")})
    assert run1("infiniband", inputs(runner=none, sysfs_root=tmp_path)).reason == "no InfiniBand ports"


def test_node_without_gpus_expected_passes_without_a_driver() -> None:
    res = asyncio.run(
        run_checks(["gpu-count", "nvml", "ecc"], Inputs(None, FakeRunner(), None), Context(expected_gpus=0))
    )
    assert [(r.status, r.reason) for r in res] == [
        (Status.OK, "no GPUs expected (NVML unavailable (no driver / nvidia-ml-py))")
    ] * 3
    res = asyncio.run(run_checks(["gpu-count"], Inputs(None, FakeRunner(), None), Context()))
    assert res[0].status == Status.CRITICAL  # GPUs expected (default): a missing driver is a fault


# -- NVLink and DCGM from recorded output ----------------------------------------------------


def test_nvlink_recorded_all_up_and_one_inactive() -> None:
    text = (FIX / "nvlink/nvlink-status-a100-8gpu.txt").read_text()
    r = evaluate_nvlink(parse_nvidia_smi_nvlink(text))
    assert r.status == Status.OK and r.reason == "96/96 NVLinks up on 8 GPU(s)"
    lines = text.splitlines()
    i = [n for n, ln in enumerate(lines) if ln.strip() == "Link 7: 25 GB/s"][2]  # GPU 2
    lines[i] = lines[i].replace("25 GB/s", "<inactive>")
    r = evaluate_nvlink(parse_nvidia_smi_nvlink("\n".join(lines)))
    assert r.status == Status.CRITICAL and r.reason == "GPU 2: NVLink [7] inactive" and r.gpu_index == 2
    assert evaluate_nvlink(parse_nvidia_smi_nvlink("\n".join(lines)), selected=[0, 1]).status == Status.OK


def test_dcgm_recorded_cut_off_is_unknown_not_pass() -> None:
    d = parse_dcgmi_diag((FIX / "dcgm/diag-r2-go-dcgm-gpu1-pass-excerpt.txt").read_text())
    r = evaluate_dcgm(d)
    assert r.status == Status.UNKNOWN and "cut off after 7 rows" in r.reason


def test_dcgm_fail_warn_skip() -> None:
    from test_health_check_parsers import DIAG_FULL

    r = evaluate_dcgm(parse_dcgmi_diag(DIAG_FULL))
    assert r.status == Status.CRITICAL and r.gpu_index == 0 and "GPU Memory" in r.reason
    no_fail = DIAG_FULL.replace("Fail - GPU: 0", "Pass")
    r = evaluate_dcgm(parse_dcgmi_diag(no_fail))
    assert r.status == Status.WARNING and "Persistence Mode skip" in r.reason
    all_skip = "\n".join(ln.replace("| Pass ", "| Skip ") for ln in no_fail.splitlines() if "Warn" not in ln)
    assert evaluate_dcgm(parse_dcgmi_diag(all_skip.replace("Pass", "Skip"))).status == Status.UNKNOWN


def _discovery_of(nv: FakeNvml, order: list[int]) -> str:
    """The recorded 4-GPU ``dcgmi discovery -l`` table with its UUIDs replaced by the fake node's
    GPUs ``order`` (DCGM id k lists NVML GPU order[k]: DCGM numbers GPUs itself)."""
    text = (FIX / "dcgm/discovery-l-h100-4gpu-null-names-dcgm317.txt").read_text()
    recorded = re.findall(r"GPU-[0-9a-f-]{36}", text)
    for rec, idx in zip(recorded, order, strict=True):
        text = text.replace(rec, nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(idx)))
    return text


def test_dcgm_check_maps_job_gpus_to_dcgm_ids_by_uuid() -> None:
    from test_health_check_parsers import DIAG_FULL

    nv = fake()
    diag = ToolOutput(226, DIAG_FULL.replace("Fail - GPU: 0", "Pass"))
    runner = FakeRunner({"dcgmi discovery": ToolOutput(0, _discovery_of(nv, [3, 2, 1, 0])), "dcgmi diag": diag})
    r = run1("dcgm", inputs(nv, runner=runner), gpus=[0, 1], dcgm_level=2)
    # NVML GPUs 0 and 1 are DCGM GPUs 3 and 2
    assert runner.calls == [["dcgmi", "discovery", "-l"], ["dcgmi", "diag", "-r", "2", "-i", "3,2"]]
    assert r.status == Status.WARNING  # the diag's Warn/Skip rows


def test_dcgm_check_job_gpu_unknown_to_dcgm_is_unknown_not_pass() -> None:
    nv = fake()
    runner = FakeRunner({"dcgmi discovery": ToolOutput(0, _discovery_of(nv, [0, 1, 2, 3]))})
    r = run1("dcgm", inputs(nv, runner=runner), gpus=[2, 5])
    assert (
        r.status == Status.UNKNOWN
        and r.reason.startswith("GPU 5 (GPU-")
        and "not listed by dcgmi discovery" in r.reason
    )
    assert runner.calls == [["dcgmi", "discovery", "-l"]]  # no diag that would silently skip GPU 5


def test_dcgm_check_without_job_gpus_runs_the_default_group_and_handles_missing_tool() -> None:
    from test_health_check_parsers import DIAG_FULL

    runner = FakeRunner({"dcgmi diag": ToolOutput(226, DIAG_FULL)})
    r = run1("dcgm", inputs(runner=runner), dcgm_level=1)
    assert runner.calls == [["dcgmi", "diag", "-r", "1"]] and r.status == Status.CRITICAL
    assert run1("dcgm", inputs()).reason == "dcgmi not installed"
    assert run1("dcgm", inputs(), gpus=[0]).reason == "dcgmi not installed"
    down = ToolOutput(255, "", "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.")
    r = run1("dcgm", inputs(runner=FakeRunner({"dcgmi": down})), gpus=[0])
    assert r.status == Status.UNKNOWN and r.reason.startswith("dcgmi discovery exited 255: Error: Unable to connect")
    r = run1("dcgm", inputs(runner=FakeRunner({"dcgmi": down})))
    assert r.status == Status.UNKNOWN and r.reason.startswith("dcgmi diag exited 255")


# -- budget, summary, context ----------------------------------------------------------------


def test_hung_check_is_abandoned_within_the_budget() -> None:
    class Hang(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
            time.sleep(5)
            return 0

    base = fake()
    nv = Hang(base.scenario, base.clock, NODE)
    t = time.monotonic()
    res = asyncio.run(run_checks(["clocks", "ecc"], inputs(nv), Context(), budget_s=0.5, check_timeout_s=0.4))
    assert time.monotonic() - t < 1.5
    assert (res[0].status, res[0].reason) == (Status.CRITICAL, "timed out after 0.4s")
    assert res[1].status == Status.OK and res[1].duration_s is not None and res[1].duration_s < 0.4
    res = asyncio.run(run_checks(["clocks"], inputs(nv), Context(), 0.3, 1.0, timeout_status=Status.UNKNOWN))
    assert res[0].status == Status.UNKNOWN and res[0].reason == "timed out after 0.3s"


def test_worst_and_summary_line() -> None:
    assert worst([]) == Status.OK
    assert worst([Status.WARNING, Status.UNKNOWN]) == Status.UNKNOWN
    assert worst([Status.UNKNOWN, Status.CRITICAL, Status.OK]) == Status.CRITICAL
    s = Summary(
        [
            CheckResult("xid", Status.WARNING, "XID 13 on GPU 1"),
            CheckResult("ecc", Status.CRITICAL, "GPU 2: row remap pending"),
            CheckResult("nvml", Status.CRITICAL, "GPU 2: row remap pending"),
            CheckResult("pcie", Status.OK, "fine"),
        ],
        0.123,
    )
    assert s.status == Status.CRITICAL
    assert s.line == "CRITICAL: ecc,nvml: GPU 2: row remap pending; xid: XID 13 on GPU 1 | 4 checks in 0.12s"
    assert "\n" not in Summary([CheckResult("a", Status.OK, "x\ny")], 0).line


def test_select_checks() -> None:
    assert "dcgm" not in select_checks("prolog") and "dcgm" in select_checks("prolog", dcgm_level=1)
    assert select_checks("periodic", ["ecc", "xid", "ecc"]) == ["ecc", "xid"]
    with pytest.raises(ValueError, match="unknown check"):
        select_checks("periodic", ["nope"])


def test_job_gpus_from_slurm_env() -> None:
    assert job_gpus({"SLURM_JOB_GPUS": "3,1", "CUDA_VISIBLE_DEVICES": "0"}) == ([1, 3], [])
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a,MIG-b,GPU-a"}) == ([], ["GPU-a", "MIG-b"])
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == ([], [])  # Slurm: a job without GPUs
    assert job_gpus({}) is None
    with pytest.raises(ValueError, match=r"SLURM_JOB_GPUS=.*'²' is not a GPU id"):
        job_gpus({"SLURM_JOB_GPUS": "0,²"})


def test_job_without_gpus_checks_none_of_the_nodes_gpus() -> None:
    # another job holds GPUs 0-3 (leftover-looking processes on them); a CPU-only job's prolog
    s = HealthCheckSettings(health_state_dir=Path("/nonexistent"))
    ctx = build_context("prolog", s, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": NODE}, 0.0)
    assert ctx.gpus == [] and not ctx.whole_node
    nv = fake([{"at_s": 0, "node": NODE, "kind": "zombie-process", "gpu": g} for g in range(4)])
    assert run1("processes", inputs(nv)).status == Status.CRITICAL  # the whole node: busy
    r = CHECKS["processes"].fn(inputs(nv), ctx)
    assert (r.status, r.reason) == (Status.OK, "0 GPU(s) free")
    assert "processes" not in select_checks("periodic")  # `run` on a busy node is no fault


def test_job_gpus_follow_minor_numbers_when_a_gpu_drops_out() -> None:
    # GPU 3 fell off the bus: NVML lists 7 GPUs and physical GPU 4 is NVML index 3
    nv = fake(
        [
            {"at_s": 0, "node": NODE, "kind": "gpu-missing", "gpu": 3},
            {"at_s": 0, "node": NODE, "kind": "row-remap-pending", "gpu": 4},
        ]
    )
    r = run1("gpu-count", inputs(nv), gpus=[3])  # EXPECTED_GPUS unset: 7 GPUs alone would pass
    assert (r.status, r.reason) == (Status.CRITICAL, "job GPU(s) [3] absent (7 visible)")
    r = run1("ecc", inputs(nv), gpus=[4])  # Slurm's GPU 4 is NVML index 3, and it has the fault
    assert r.status == Status.CRITICAL and r.reason == "GPU 3: row remap pending (reset the GPU)"
    assert run1("ecc", inputs(nv), gpus=[5]).status == Status.OK


def test_job_gpus_given_as_uuids() -> None:
    nv = fake([{"at_s": 0, "node": NODE, "kind": "row-remap-pending", "gpu": 5}])
    u5 = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(5))
    u1 = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(1))
    s = HealthCheckSettings(health_state_dir=Path("/nonexistent"))
    ctx = build_context("prolog", s, {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": u5}, 0.0)
    assert ctx.gpus is None and ctx.gpu_uuids == [u5]
    assert CHECKS["ecc"].fn(inputs(nv), ctx).gpu_index == 5
    ctx = build_context("prolog", s, {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": u1.lower()}, 0.0)
    assert CHECKS["ecc"].fn(inputs(nv), ctx).status == Status.OK
    ctx = build_context("prolog", s, {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "MIG-0d6c-unknown"}, 0.0)
    r = CHECKS["gpu-count"].fn(inputs(nv), ctx)
    assert r.status == Status.CRITICAL and "MIG-0d6c-unknown" in r.reason  # NVML does not list it


async def test_xid_on_an_idle_gpu_survives_another_jobs_epilog(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0
    s = HealthCheckSettings(health_state_dir=tmp_path, health_node=NODE)
    klog = Lines([xid_line(t0 - 60, pci_of(5), 119, None)])  # GSP timeout on GPU 5, idle
    env = {"SLURMD_NODENAME": NODE}
    summary, _ = await health_run(
        "prolog", [], s, inputs(clock=lambda: t0, log=klog), {**env, "SLURM_JOB_ID": "10", "SLURM_JOB_GPUS": "5"}
    )
    assert summary.status == Status.CRITICAL and "XID 119 on GPU 5" in summary.line
    # job 11 on GPU 0 ends: its epilog checks GPU 0 only
    summary, _ = await health_run(
        "epilog", [], s, inputs(clock=lambda: t0 + 30, log=klog), {**env, "SLURM_JOB_ID": "11", "SLURM_JOB_GPUS": "0"}
    )
    assert summary.status == Status.OK and (tmp_path / "gpu-0.last-epilog").exists()
    # the next job on GPU 5 must still see GPU 5's XID (one node-wide marker would hide it)
    summary, ctx = await health_run(
        "prolog", [], s, inputs(clock=lambda: t0 + 40, log=klog), {**env, "SLURM_JOB_ID": "12", "SLURM_JOB_GPUS": "5"}
    )
    assert summary.status == Status.CRITICAL and "XID 119 on GPU 5" in summary.line
    assert ctx.since_by_gpu == {0: t0 + 30}
    # ... and a job on GPU 0 does not see it (GPU 5 is not its GPU), nor anything before the epilog
    summary, _ = await health_run(
        "prolog", [], s, inputs(clock=lambda: t0 + 40, log=klog), {**env, "SLURM_JOB_ID": "13", "SLURM_JOB_GPUS": "0"}
    )
    assert summary.status == Status.OK


def test_xid_severity_of_repair_and_recovery_notices() -> None:
    t0 = 1_700_000_000.0
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0))
    base = f"{stamp},000000+00:00 NVRM: Xid (PCI:{pci_of(2).rsplit('.', 1)[0]}): "
    done = base + "154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    reset = base + "154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    sbe = base + "92, High single-bit ECC error rate"
    run = lambda lines: run1("xid", inputs(log=Lines(lines), clock=lambda: t0 + 1), since_ts=t0 - 1)
    assert run([done]).status == Status.OK
    r = run([reset])
    assert r.status == Status.CRITICAL and "XID 154" in r.reason
    assert run([sbe]).status == Status.WARNING


def test_since_ts_prolog_and_epilog(tmp_path: Path) -> None:
    now = 1000.0
    assert since_ts("prolog", {}, tmp_path, now, 60) == 940.0
    (tmp_path / "last-epilog").write_text("900.5\n")
    assert since_ts("prolog", {}, tmp_path, now, 60) == 900.5
    assert since_ts("epilog", {"SLURM_JOB_ID": "7", "SLURM_JOB_START_TIME": "950"}, tmp_path, now, 60) == 950.0
    (tmp_path / "job-7.start").write_text("960")
    assert since_ts("epilog", {"SLURM_JOB_ID": "7"}, tmp_path, now, 60) == 960.0


async def test_health_run_prolog_epilog_publishes_and_notes_times(tmp_path: Path) -> None:
    s = HealthCheckSettings(health_state_dir=tmp_path, health_node="n")
    nv = fake([{"at_s": 0, "node": NODE, "kind": "row-remap-pending", "gpu": 1}])
    pub = MemoryPublisher()
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1", "SLURMD_NODENAME": NODE}
    summary, ctx = await health_run("prolog", [], s, inputs(nv, clock=lambda: 5000.0), env, lambda: pub)
    assert summary.status == Status.CRITICAL and ctx.gpus == [0, 1] and ctx.job_id == "42"
    assert (tmp_path / "job-42.start").read_text().strip() == "5000.0"
    sent = pub.of("health")
    assert len(sent) == len(select_checks("prolog"))
    ecc = next(m for m in sent if m.check == "ecc")
    assert (ecc.node, ecc.phase, ecc.job_id, ecc.passed, ecc.gpu_index) == (NODE, "prolog", "42", False, 1)
    assert ecc.detail.startswith("CRITICAL: GPU 1: row remap pending") and ecc.ts == 5000.0
    summary, ctx = await health_run("epilog", [], s, inputs(fake(), clock=lambda: 6000.0), env, lambda: pub)
    assert summary.status == Status.OK and ctx.since_ts == 5000.0
    assert not (tmp_path / "job-42.start").exists() and (tmp_path / "last-epilog").read_text().strip() == "6000.0"


def test_periodic_run_has_no_job() -> None:
    ctx = build_context("periodic", HealthCheckSettings(), {"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0"}, 0.0)
    assert ctx.job_id is None and ctx.gpus is None and ctx.phase == "periodic"


async def test_publish_never_waits_on_a_dead_broker() -> None:
    models = to_models([CheckResult("ecc", Status.WARNING, "x")], Context(node="n", phase="epilog"), 1.0)
    assert models[0].passed is True and models[0].detail == "WARNING: x"
    t = time.monotonic()
    ok = await publish_results(models, lambda: Producer(BusSettings(bootstrap_servers="127.0.0.1:1")), budget_s=0.5)
    assert ok is False and time.monotonic() - t < 1.5
    pub = MemoryPublisher()
    assert await publish_results(models, lambda: pub, 0.5) is True and pub.of("health") == models


# -- CLI exit codes (simulated NVML, no Kafka) --------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "rc", "start"),
    [
        ("", 0, "OK: all checks passed"),
        ("  - {at_s: 0, kind: ecc-dbe, node: gpu-node-004, gpu: 0}\n", 2, "CRITICAL: ecc: GPU 0"),
    ],
)
def test_cli_prolog_exit_codes(tmp_path: Path, faults: str, rc: int, start: str) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("name: t\nduration_s: 10\ncluster: {nodes: 4}\n" + ("faults:\n" + faults if faults else ""))
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURMD_NODENAME": NODE,
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_GPUS": "0",
        "GPUWARDEN_HEALTH_SCENARIO": str(sc),
        "GPUWARDEN_HEALTH_STATE_DIR": str(tmp_path / "st"),
        "GPUWARDEN_HEALTH_KERNEL_LOG": str(tmp_path / "kern.log"),
    }
    (tmp_path / "kern.log").touch()
    exe = Path(sys.executable).with_name("gpuwarden")
    p = subprocess.run(
        [str(exe), "health-check", "prolog", "--no-publish"], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == rc, p.stderr
    assert p.stdout.startswith(start) and p.stdout.count("\n") == 1


def test_cli_unknown_check_is_unknown() -> None:
    exe = Path(sys.executable).with_name("gpuwarden")
    p = subprocess.run(
        [str(exe), "health-check", "run", "nope", "--no-publish"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 3 and p.stdout.startswith("UNKNOWN: unknown check")


@pytest.mark.parametrize("mod", ["checks", "io", "parsers", "publish", "run", "settings", "suite", "cli"])
def test_public_names_exist(mod: str) -> None:
    import importlib

    module = importlib.import_module(f"gpuwarden.health_check.{mod}")
    assert module.__all__ and all(hasattr(module, n) for n in module.__all__)


def test_bench_health_check_prints_every_check_and_parser() -> None:
    out = subprocess.run(
        [
            str(Path(sys.executable).with_name("gpuwarden")),
            "bench",
            "health-check",
            "--runs",
            "3",
            "--procs",
            "0",
            "--fixtures",
            str(FIX),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for name in CHECKS:
        assert re.search(rf"│ {re.escape(name)} +│ +\d+\.\d{{3}} / \d+\.\d{{3}} │", out.stdout), name
    # the recorded outputs reach the checks: 8 IB ports from the ibstat capture, the XID 48 capture
    assert "OK: 8 InfiniBand port(s) ACTIVE at 400 Gb/s" in out.stdout and "CRITICAL: XID 48" in out.stdout
    assert out.stdout.count("│ ibv-devinfo ") == 2 and "dcgmi-discovery" in out.stdout


def test_nvlink_pcie_node_without_bridges_is_not_a_failure() -> None:
    class Pcie(FakeNvml):
        def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
            if link >= 12:
                raise self.NVMLError(2)  # type: ignore[attr-defined]
            return 0  # A100/H100 PCIe without a bridge: every link reported inactive

    base = fake()
    r = run1("nvlink", inputs(Pcie(base.scenario, base.clock, NODE)))
    assert (r.status, r.reason) == (Status.OK, "no NVLink connected on this node (8 GPU(s) report only inactive links)")
    # an SXM node where one GPU lost every link is still a failure (other GPUs have links up)
    nv = fake([{"at_s": 0, "node": NODE, "kind": "nvlink-down", "gpu": 4}])
    r = run1("nvlink", inputs(nv), gpus=[4])
    assert r.status == Status.CRITICAL and r.reason.startswith("GPU 4: NVLink [0, 1")


def test_nvlink_expected_count_for_bridged_pairs() -> None:
    gpus = [NvlinkGpu(i, "", None, [NvlinkLink(k, k < 4, None) for k in range(12)]) for i in range(2)]
    assert evaluate_nvlink(gpus).status == Status.CRITICAL  # unbridged links look inactive
    r = evaluate_nvlink(gpus, expected=4)
    assert (r.status, r.reason) == (Status.OK, "8/8 NVLinks up on 2 GPU(s)")
    gpus[1].links[0] = NvlinkLink(0, False, None)
    r = evaluate_nvlink(gpus, expected=4)
    assert r.status == Status.CRITICAL and r.reason.startswith("GPU 1: 3/4 NVLinks active, [0, 4,")


def test_infiniband_required_ports_and_ignored_ports() -> None:
    ports = parse_ibv_devinfo((FIX / "infiniband/ibv-devinfo-cx3-2hca-port2-down.txt").read_text())
    assert evaluate_infiniband(ports).status == Status.CRITICAL  # every IB port must be up
    r = evaluate_infiniband(ports, min_ports=2, source="ibv_devinfo")
    assert r.status == Status.OK
    assert r.reason == "2 InfiniBand port(s) ACTIVE (ibv_devinfo); not required: mlx4_1/2 DOWN/?, mlx4_0/2 DOWN/?"
    r = evaluate_infiniband(ports, min_ports=3)
    assert r.status == Status.CRITICAL and r.reason.startswith("2/3 InfiniBand ports ACTIVE; mlx4_1/2 DOWN/?")
    r = evaluate_infiniband(ports, ignore=frozenset({"mlx4_1/2", "mlx4_0/2"}))
    assert (r.status, r.reason) == (Status.OK, "2 InfiniBand port(s) ACTIVE")
    assert evaluate_infiniband(ports, ignore=frozenset({"mlx4_1"})).reason == "mlx4_0/2 DOWN/?"


def test_infiniband_hung_tool_is_skipped_for_the_next_source(tmp_path: Path) -> None:
    ibstatus = (FIX / "infiniband/ibstatus-a100-hdr-all-active.txt").read_text()
    runner = FakeRunner({"ibstat": 0.05, "ibstatus": ToolOutput(0, ibstatus)})  # ibstat hangs past its time
    r = run1("infiniband", inputs(runner=runner, sysfs_root=tmp_path), tool_timeout_s=0.05)
    assert r.status == Status.OK and r.reason.endswith("(ibstatus)") and runner.calls == [["ibstat"], ["ibstatus"]]


def test_epilog_waits_for_exiting_processes_within_the_grace() -> None:
    class Exiting(FakeNvml):
        left = 3  # calls until the job's processes are gone

        def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[object]:
            Exiting.left -= 1
            return super().nvmlDeviceGetComputeRunningProcesses(handle) if Exiting.left > 0 else []

        def nvmlDeviceGetMemoryInfo(self, handle: object) -> object:
            mem = super().nvmlDeviceGetMemoryInfo(handle)
            return mem if Exiting.left > 0 else SimpleNamespace(total=mem.total, used=0, free=mem.total)

    base = fake([{"at_s": 0, "node": NODE, "kind": "zombie-process", "gpu": 1}])
    nv = Exiting(base.scenario, base.clock, NODE)
    nv.t = base.t
    assert run1("processes", inputs(nv), gpus=[1]).status == Status.CRITICAL  # no grace: still there
    Exiting.left = 3
    t = time.monotonic()
    r = run1("processes", inputs(nv), gpus=[1], process_grace_s=3.0)
    assert r.status == Status.OK and time.monotonic() - t < 2.0
    r = run1("processes", inputs(base), gpus=[1], process_grace_s=0.6)  # never exits
    assert r.status == Status.CRITICAL and "GPU 1: 1 leftover process(es)" in r.reason


def test_clock_reasons_on_drivers_before_r535() -> None:
    class Old(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
            raise self.NVMLError(13)  # type: ignore[attr-defined]  # NVML_ERROR_FUNCTION_NOT_FOUND

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
            return 0x80 if handle.index == 2 else 0  # type: ignore[attr-defined]

    base = fake()
    nv = Old(base.scenario, base.clock, NODE)
    r = run1("clocks", inputs(nv))
    assert r.status == Status.CRITICAL and r.reason == "GPU 2: clocks held by power brake"
    assert run1("pcie", inputs(nv)).status == Status.OK


def test_subprocess_runner_kills_a_hung_tool_and_its_children(tmp_path: Path) -> None:
    runner = SubprocessRunner()
    pidfile = tmp_path / "child.pid"
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    t = time.monotonic()
    with pytest.raises(ToolTimeout):
        runner.run(["bash", "-c", script], 0.5)
    assert time.monotonic() - t < 3
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    with pytest.raises(ToolMissing):
        runner.run(["/nonexistent/ibstat"], 1)
    assert runner.run(["bash", "-c", "echo hi; exit 3"], 5) == ToolOutput(3, "hi\n", "")


async def test_tools_still_running_after_the_budget_are_killed(tmp_path: Path) -> None:
    runner = SubprocessRunner()

    class Hang(FakeNvml):
        pass

    fake_bin = tmp_path / "dcgmi"
    fake_bin.write_text(f"#!/bin/bash\necho $$ > {tmp_path}/pid\nexec sleep 30\n")
    fake_bin.chmod(0o755)
    s = HealthCheckSettings(health_state_dir=tmp_path, health_budget_s=0.5, health_check_timeout_s=5)
    inp = Inputs(fake(), runner, Lines([]))
    import os

    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{old}"
    try:
        summary, _ = await health_run("periodic", ["dcgm"], s, inp, {})
    finally:
        os.environ["PATH"] = old
    assert summary.status == Status.CRITICAL and "timed out" in summary.line
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _fabric_nvml(states: dict[int, tuple[int, int]], unsupported: bool = False) -> FakeNvml:
    """FakeNvml with nvidia-ml-py's GPU fabric call: GPU index -> (state, status)."""
    import pynvml

    class Fabric(FakeNvml):
        c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t

        def nvmlDeviceGetGpuFabricInfo(self, handle: object, ref: object) -> int:
            if unsupported:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            info = ref._obj  # type: ignore[attr-defined]  # ctypes.byref(...)
            info.state, info.status = states.get(handle.index, (3, 0))  # type: ignore[attr-defined]
            return 0

    base = fake()
    nv = Fabric(base.scenario, base.clock, NODE)
    nv.t = base.t
    return nv


def test_fabric_registration_of_nvswitch_gpus() -> None:
    r = run1("fabric", inputs(_fabric_nvml({})))
    assert (r.status, r.reason) == (Status.OK, "8 GPU(s) registered with the NVLink fabric")
    r = run1("fabric", inputs(_fabric_nvml({2: (1, 0)})))  # fabric manager not running
    assert r.status == Status.CRITICAL
    assert r.reason == "GPU 2: NVLink fabric not started (is nvidia-fabricmanager running?)" and r.gpu_index == 2
    assert run1("fabric", inputs(_fabric_nvml({2: (1, 0)})), gpus=[0, 1]).status == Status.OK  # not the job's
    r = run1("fabric", inputs(_fabric_nvml({5: (3, 999)})))
    assert r.status == Status.CRITICAL and "GPU 5: NVLink fabric registration failed (NVML status 999)" in r.reason
    # PCIe / A100 GPUs: state "not supported", or the call itself not supported
    r = run1("fabric", inputs(_fabric_nvml({g: (0, 0) for g in range(8)})))
    assert (r.status, r.reason) == (Status.OK, "8 GPU(s) without an NVSwitch fabric")
    assert run1("fabric", inputs(_fabric_nvml({}, unsupported=True))).status == Status.OK
    r = run1("fabric", inputs())  # an NVML without the call (drivers before R530)
    assert r.status == Status.OK and "not checked" in r.reason


# -- second review: windows, markers, unreadable sources ---------------------------------------


def test_infiniband_tools_that_hang_or_print_garbage_are_unknown_not_ok(tmp_path: Path) -> None:
    runner = FakeRunner({"ibstat": 0.01, "ibstatus": ToolOutput(0, "garbage\n"), "ibv_devinfo": ToolOutput(255, "")})
    r = run1("infiniband", inputs(runner=runner, sysfs_root=tmp_path))
    assert r.status == Status.UNKNOWN and r.reason.startswith("InfiniBand ports unreadable: ibstat")
    assert "ibstatus output unreadable" in r.reason
    # tools that exit non-zero ("No IB devices found") mean no ports
    none = FakeRunner({"ibstat": ToolOutput(255, ""), "ibv_devinfo": ToolOutput(255, "", "No IB devices found")})
    assert run1("infiniband", inputs(runner=none, sysfs_root=tmp_path)).reason == "no InfiniBand ports"


def test_missing_kernel_log_file_is_unknown(tmp_path: Path) -> None:
    r = run1("xid", inputs(log=FileLog(tmp_path / "nope.log")))
    assert r.status == Status.UNKNOWN and r.reason.startswith("kernel log unreadable: FileNotFoundError")


async def test_epilog_markers_need_a_conclusive_xid_check(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0
    s = HealthCheckSettings(health_state_dir=tmp_path, health_node=NODE)
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "2"}
    summary, _ = await health_run("epilog", [], s, inputs(log=FileLog(tmp_path / "missing"), clock=lambda: t0), env)
    assert "xid: kernel log unreadable" in summary.line
    assert not (tmp_path / "gpu-2.last-epilog").exists() and not (tmp_path / "last-epilog").exists()
    summary, _ = await health_run("epilog", [], s, inputs(log=Lines([]), clock=lambda: t0), env)
    assert (tmp_path / "gpu-2.last-epilog").read_text().strip() == str(t0)


async def test_epilog_without_a_job_start_uses_the_gpus_last_epilog(tmp_path: Path) -> None:
    # no PrologFlags=Alloc / no prolog note: the same XID must not fail every later epilog
    t0 = 1_700_000_000.0
    s = HealthCheckSettings(health_state_dir=tmp_path, health_node=NODE)
    klog = Lines([xid_line(t0 - 60, pci_of(0), 48, 1)])
    run = lambda job, t: health_run(
        "epilog",
        [],
        s,
        inputs(log=klog, clock=lambda: t),
        {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": "0"},
    )
    assert (await run("401", t0))[0].status == Status.CRITICAL
    assert (await run("402", t0 + 30))[0].status == Status.OK  # reported once, by job 401's epilog


async def test_markers_in_the_future_are_clamped_and_uuid_jobs_get_markers(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0
    s = HealthCheckSettings(health_state_dir=tmp_path, health_node=NODE)
    (tmp_path / "gpu-5.last-epilog").write_text(f"{t0 + 3600}\n")  # the clock was stepped back since
    klog = Lines([xid_line(t0 - 10, pci_of(5), 119, None)])
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "5"}
    summary, ctx = await health_run("prolog", [], s, inputs(log=klog, clock=lambda: t0), env)
    assert ctx.since_by_gpu == {5: t0}  # clamped to now: an XID written after this moment still counts
    assert summary.status == Status.OK  # the XID before the (clamped) epilog was that epilog's to report
    nv = fake()
    u3 = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(3))
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "10", "CUDA_VISIBLE_DEVICES": u3}
    await health_run("epilog", [], s, inputs(nv, log=Lines([]), clock=lambda: t0), env)
    assert (tmp_path / "gpu-3.last-epilog").exists()


def test_process_grace_ends_inside_the_checks_time() -> None:
    s = HealthCheckSettings(health_process_grace_s=9, health_check_timeout_s=8)
    assert build_context("epilog", s, {}, 0.0).process_grace_s == 6.5
    s = HealthCheckSettings(health_process_grace_s=9, health_budget_s=4)
    assert build_context("epilog", s, {}, 0.0).process_grace_s == 2.5
    assert build_context("prolog", s, {}, 0.0).process_grace_s == 0.0


def test_empty_settings_values_mean_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("BUDGET_S", "CHECK_TIMEOUT_S", "STATE_DIR", "DCGM_LEVEL", "PUBLISH", "EXPECTED_GPUS"):
        monkeypatch.setenv(f"GPUWARDEN_HEALTH_{k}", " ")
    monkeypatch.setenv("GPUWARDEN_HEALTH_TIMEOUT_STATUS", "UNKNOWN")
    s = HealthCheckSettings()
    assert (s.health_budget_s, s.health_dcgm_level, s.health_publish, s.health_expected_gpus) == (10.0, 0, True, None)
    assert s.health_state_dir == Path("/var/lib/gpuwarden/health") and s.health_timeout_status == "unknown"


def test_runner_starts_nothing_after_kill_all() -> None:
    runner = SubprocessRunner()
    assert runner.kill_all() == 0
    with pytest.raises(ToolTimeout, match="not started"):
        runner.run(["true"], 1)


def test_nvlink_ignores_another_jobs_lost_gpu() -> None:
    nv = fake([{"at_s": 0, "node": NODE, "kind": "gpu-lost", "gpu": 3}])
    assert run1("nvlink", inputs(nv), gpus=[0]).status == Status.OK
    r = run1("nvlink", inputs(nv), gpus=[3])
    assert r.status == Status.CRITICAL and r.reason.startswith("GPU 3:")


# -- incomplete tool output is UNKNOWN, never OK (issue 15) ---------------------------------


def test_ibstat_ibpanic_partial_output_is_unknown_not_ok() -> None:
    from gpuwarden.health_check.checks import check_infiniband

    partial = (Path(__file__).resolve().parents[1] / "fixtures/infiniband/ibstat-ibpanic-partial.txt").read_text()

    class _Out:
        def __init__(self, rc: int, stdout: str, stderr: str = "") -> None:
            self.returncode, self.stdout, self.stderr = rc, stdout, stderr

    class _Runner:
        def run(self, argv: list[str], timeout_s: float) -> _Out:
            if argv[0] == "ibstat":
                body, _, panic = partial.rpartition("ibpanic:")
                return _Out(255, body, "ibpanic:" + panic)
            raise ToolMissing(argv[0])

    class _Inp:
        sysfs_root = Path("/nonexistent-sysfs-root")
        runner = _Runner()

    class _Ctx:
        tool_timeout_s = 5.0
        ib_rate_gbps = None
        ib_ports = None
        ib_ignore: list[str] = []

    r = check_infiniband(_Inp(), _Ctx())  # type: ignore[arg-type]
    assert r.status.name == "UNKNOWN", r
    assert "ibstat exited 255" in r.reason


def test_ibstat_ibpanic_in_stdout_is_unknown_not_ok() -> None:
    from gpuwarden.health_check.checks import read_ib_ports

    partial = (Path(__file__).resolve().parents[1] / "fixtures/infiniband/ibstat-ibpanic-partial.txt").read_text()

    class _Out:
        returncode, stdout, stderr = 0, partial, ""

    class _Runner:
        def run(self, argv: list[str], timeout_s: float) -> _Out:
            if argv[0] == "ibstat":
                return _Out()
            raise ToolMissing(argv[0])

    class _Inp:
        sysfs_root = Path("/nonexistent-sysfs-root")
        runner = _Runner()

    class _Ctx:
        tool_timeout_s = 5.0

    ports, source, problems = read_ib_ports(_Inp(), _Ctx())  # type: ignore[arg-type]
    assert (ports, source) == ([], None)
    assert problems and "ibstat died after 1 port" in problems[0]


def test_dcgm_cut_off_diag_is_unknown_never_ok() -> None:
    text = (Path(__file__).resolve().parents[1] / "fixtures/dcgm/diag-r4-dcgm2x-blacklist-all-pass.txt").read_text()
    res = evaluate_dcgm(parse_dcgmi_diag("\n".join(text.splitlines()[:10])))
    assert res.status.name == "UNKNOWN"
