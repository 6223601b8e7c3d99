"""``gpuwarden bench health-check``: what each check and parser costs, and a whole prolog process.

Three tables, all measured in this run:

* per check (median / p95 ms over ``--runs``) with the simulated 8-GPU H100 node of the
  simulation layer's ``FakeNvml`` and the RECORDED tool outputs of ``tests/fixtures`` replayed by a
  fake tool runner (so ``infiniband`` parses a real ``ibstat`` and ``dcgm`` a real
  ``dcgmi discovery`` + ``dcgmi diag``), next to the same check on THIS HOST's real tools
  (``dmesg``, ``/sys/class/infiniband``, ``ibstat``... where installed);
* per parser on each recorded fixture (median us);
* ``gpuwarden health-check prolog --no-publish`` as a process (median wall s of ``--procs``
  runs: Python start, imports, every default check).

NVML here is the fake (no GPU on the dev VM): a real ``nvmlDevice*`` call costs 0.1-1 ms and a
GPU falling off the bus can hang it for seconds, which the run's time budget bounds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuwarden.health_check.checks import CHECKS, Context, Inputs
from gpuwarden.health_check.io import DmesgLog, FileLog, SubprocessRunner, ToolMissing, ToolOutput
from gpuwarden.health_check.parsers import (
    parse_dcgmi_diag,
    parse_dcgmi_discovery,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
    parse_nvidia_smi_nvlink,
)
from gpuwarden.health_check.suite import run_checks, select_checks

__all__ = ["bench_health_check"]

_NODE = "gpu-node-001"
_SCENARIO = "name: bench\nduration_s: 600\ncluster: {nodes: 2}\n"


class _Replay:
    """ToolRunner replaying recorded output: ``"argv0 argv1"`` or ``argv0`` -> text."""

    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs

    def run(self, argv: list[str], timeout_s: float) -> ToolOutput:
        text = self.outputs.get(" ".join(argv[:2]), self.outputs.get(argv[0]))
        if text is None:
            raise ToolMissing(argv[0])
        return ToolOutput(0, text)


def _fake_nvml() -> Any:
    import yaml

    from gpuwarden.shared.scenario import Scenario, ScenarioClock
    from gpuwarden.sim.nvml import FakeNvml

    fake = FakeNvml(Scenario.model_validate(yaml.safe_load(_SCENARIO)), ScenarioClock(0.0), _NODE)
    fake.t = 10.0
    return fake


def _discovery_for(fake: Any, recorded: str) -> str:
    """The recorded 4-GPU discovery table with its UUIDs replaced by the fake node's GPUs 0-3."""
    import re

    for i, rec in enumerate(re.findall(r"GPU-[0-9a-f-]{36}", recorded)):
        recorded = recorded.replace(rec, fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(i)))
    return recorded


def _time(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _ms(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=20)[-1] if len(xs) >= 2 else xs[0]
    return f"{statistics.median(xs) * 1e3:.3f} / {q * 1e3:.3f}"


def bench_health_check(
    fixtures: Annotated[Path, typer.Option(help="Recorded tool outputs (tests/fixtures of a checkout)")] = Path(
        "tests/fixtures"
    ),
    runs: Annotated[int, typer.Option(min=2, help="Runs per check and per parser")] = 200,
    procs: Annotated[int, typer.Option(min=0, help="Whole `health-check prolog` processes to time (0 = skip)")] = 3,
) -> None:
    """Median/p95 ms per health check (recorded tool output and this host's tools), per parser,
    and the wall time of a whole ``health-check prolog`` process."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(150, Console().width))
    fx = fixtures
    if not (fx / "infiniband").is_dir():
        console.print(f"[red]error:[/] {fx} has no infiniband/ fixtures: run from a checkout or pass --fixtures")
        raise typer.Exit(2)

    def read(rel: str) -> str:
        return (fx / rel).read_text()

    fake = _fake_nvml()
    recorded = {
        "ibstat": read("infiniband/ibstat-h100-ndr-8ib-1eth-all-active.txt"),
        "dcgmi discovery": _discovery_for(fake, read("dcgm/discovery-l-h100-4gpu-null-names-dcgm317.txt")),
        "dcgmi diag": read("dcgm/diag-r2-dcgm441-b200-8gpu-pcie-fail.txt"),
        "nvidia-smi": read("nvlink/nvlink-status-a100-8gpu.txt"),
    }
    klog = fx / "xid-logs/xid48-63-94-dbe-row-remap-sequence.txt"
    empty_sys = Path(tempfile.mkdtemp(prefix="gpuwarden-bench-"))
    rec_inputs = Inputs(nvml=fake, runner=_Replay(recorded), kernel_log=FileLog(klog), sysfs_root=empty_sys)
    host_runner = SubprocessRunner()
    host_inputs = Inputs(nvml=fake, runner=host_runner, kernel_log=DmesgLog(host_runner), sysfs_root=Path("/"))
    ctx = Context(phase="prolog", node=_NODE, gpus=[0, 1, 2, 3], since_ts=0.0, dcgm_level=1)

    table = Table(title=f"health checks, ms median / p95 over {runs} runs (FakeNvml: 8 x H100)")
    table.add_column("check")
    table.add_column("recorded tool output", justify="right")
    table.add_column("status")
    table.add_column("this host", justify="right")
    table.add_column("status")
    for name in CHECKS:
        spec = CHECKS[name]
        r_rec = spec.fn(rec_inputs, ctx)
        t_rec = _time(lambda: spec.fn(rec_inputs, ctx), runs)  # noqa: B023
        try:
            r_host = spec.fn(host_inputs, ctx)
            host_runs = max(2, runs // 20) if name in ("xid", "infiniband", "dcgm") else runs
            t_host = _ms(_time(lambda: spec.fn(host_inputs, ctx), host_runs))  # noqa: B023
            st_host = f"{r_host.status.name}: {r_host.reason[:40]}"
        except Exception as exc:  # this host's kernel log may be unreadable
            t_host, st_host = "-", f"error {type(exc).__name__}"
        table.add_row(name, _ms(t_rec), f"{r_rec.status.name}: {r_rec.reason[:40]}", t_host, st_host)
    console.print(table)

    names = select_checks("prolog")
    t_suite = _time(lambda: asyncio.run(run_checks(names, rec_inputs, ctx)), max(2, runs // 10))
    console.print(f"all {len(names)} prolog checks concurrently (threads, recorded outputs): {_ms(t_suite)} ms")

    ptable = Table(title=f"parsers on recorded fixtures, us median over {runs} runs")
    ptable.add_column("parser")
    ptable.add_column("fixture")
    ptable.add_column("us", justify="right")
    parsers: list[tuple[str, Callable[[str], object], str]] = [
        ("ibstat", parse_ibstat, "infiniband/ibstat-h100-ndr-8ib-1eth-all-active.txt"),
        ("ibstatus", parse_ibstatus, "infiniband/ibstatus-a100-hdr-all-active.txt"),
        ("ibv-devinfo", parse_ibv_devinfo, "infiniband/ibv-devinfo-cx3-2hca-port2-down.txt"),
        ("ibv-devinfo", parse_ibv_devinfo, "infiniband/ibv-devinfo-v-cx3-port2-down-polling.txt"),
        ("dcgmi-diag", parse_dcgmi_diag, "dcgm/diag-r2-go-dcgm-gpu1-pass-excerpt.txt"),
        ("dcgmi-diag", parse_dcgmi_diag, "dcgm/diag-r2-dcgm441-b200-8gpu-pcie-fail.txt"),
        ("dcgmi-diag", parse_dcgmi_diag, "dcgm/diag-r3-dcgm338-h100-8gpu-cuinit-fail.txt"),
        ("dcgmi-discovery", parse_dcgmi_discovery, "dcgm/discovery-l-h100-4gpu-null-names-dcgm317.txt"),
        ("nvidia-smi-nvlink", parse_nvidia_smi_nvlink, "nvlink/nvlink-status-a100-8gpu.txt"),
    ]
    for pname, fn, rel in parsers:
        text = read(rel)
        us = statistics.median(_time(lambda: fn(text), runs)) * 1e6  # noqa: B023
        ptable.add_row(pname, Path(rel).name, f"{us:.0f}")
    console.print(ptable)

    if procs:
        exe = Path(sys.executable).with_name("gpuwarden")
        with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as d:
            sc = Path(d) / "scenario.yaml"
            sc.write_text(_SCENARIO)
            env = {
                **os.environ,
                "GPUWARDEN_HEALTH_SCENARIO": str(sc),
                "GPUWARDEN_HEALTH_NODE": _NODE,
                "GPUWARDEN_HEALTH_STATE_DIR": str(Path(d) / "state"),
                "GPUWARDEN_HEALTH_KERNEL_LOG": str(klog.resolve()),
                "GPUWARDEN_HEALTH_PUBLISH": "false",
            }
            walls = []
            line = ""
            for _ in range(procs):
                t = time.perf_counter()
                p = subprocess.run(
                    [str(exe), "health-check", "prolog", "--no-publish"], env=env, capture_output=True, text=True
                )
                walls.append(time.perf_counter() - t)
                line = p.stdout.strip()
        console.print(
            f"`gpuwarden health-check prolog` process: median {statistics.median(walls):.2f} s wall over {procs} "
            f"(min {min(walls):.2f}, max {max(walls):.2f}); it printed: {line[:150]}"
        )
