"""The health check on a simulated node: the real checks over the simulator's raw inputs.

A ``health-check-fail`` fault changes what a diagnostic reads, never a verdict: the node's fake
``dcgmi`` (:class:`SimulatedDcgmi`) prints a ``dcgmi diag`` table (DCGM 3.3 layout, as in
``tests/fixtures/dcgm``) whose ``Memory`` test fails on the fault's GPU (every GPU without one).
NVML is the node's :class:`~gpuwarden.sim.nvml.FakeNvml` and the kernel log the node's
:class:`~gpuwarden.sim.kernel_log.KernelLogGenerator` lines, so the other checks see the
node's other faults too. :func:`simulated_health_check` runs the prolog set plus ``dcgm`` (level 1)
through :func:`~gpuwarden.health_check.suite.run_checks` and returns the
:class:`~gpuwarden.shared.models.HealthCheckResult` s the prolog would publish on ``health``.

:func:`simulated_nvml` is the NVML that ``gpuwarden health-check`` reads when
``GPUWARDEN_HEALTH_SCENARIO`` is set (entry point ``gpuwarden.health_check_nvml: simulated``,
looked up by :func:`gpuwarden.health_check.run.default_inputs`).
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.health_check.checks import Context, Inputs
from gpuwarden.health_check.io import ToolMissing, ToolOutput
from gpuwarden.health_check.publish import to_models
from gpuwarden.health_check.suite import run_checks, select_checks
from gpuwarden.shared.models import HealthCheckResult
from gpuwarden.shared.scenario import Scenario, ScenarioClock, load_scenario

from .kernel_log import KernelLogGenerator
from .nvml import FakeNvml

__all__ = [
    "SIM_CHECKS",
    "SimulatedDcgmi",
    "SimulatedKernelLog",
    "check_phase",
    "dcgmi_diag_text",
    "simulated_health_check",
    "simulated_nvml",
]

# The prolog's checks that a simulated node has inputs for (no sysfs InfiniBand, no fabric manager), plus dcgm.
SIM_CHECKS = [n for n in select_checks("prolog") if n not in ("infiniband", "fabric")] + ["dcgm"]

_ROW = "| {:<25} | {:<46} |"
_BORDER = "+---------------------------+------------------------------------------------+"


def _section(name: str, closing: str = "+") -> str:
    head = f"+-----  {name}  "
    return head + "-" * (28 - len(head)) + "+" + "-" * 48 + closing


def dcgmi_diag_text(gpus: int, failing: set[int] | None) -> str:
    """A ``dcgmi diag -r 1`` table (DCGM 3.3.8 layout) for ``gpus`` H100 GPUs: every test passes,
    except ``GPU Memory`` when ``failing`` is given (``Pass - GPUs: ...`` for the others, then
    ``Fail - GPUs: ...`` and a DBE warning per failing GPU; an empty set = every GPU)."""
    lines = [
        "Successfully ran diagnostic for group.",
        _BORDER,
        _ROW.format("Diagnostic", "Result"),
        _BORDER.replace("-", "="),
        _section("Metadata", "|").replace("+", "|", 1),
        _ROW.format("DCGM Version", "3.3.8"),
        _ROW.format("Driver Version Detected", "550.90.07"),
        _ROW.format("GPU Device IDs Detected", ",".join(["2330"] * gpus)),
        _section("Deployment", "|").replace("+", "|", 1),
    ]
    for test in ("Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Environment Variables"):
        lines.append(_ROW.format(test, "Pass"))
    lines.append(_section("Hardware"))
    if failing is None:
        lines.append(_ROW.format("GPU Memory", "Pass - All"))
    else:
        bad = sorted(failing) if failing else list(range(gpus))
        good = [g for g in range(gpus) if g not in bad]
        if good:
            lines.append(_ROW.format("GPU Memory", "Pass - GPUs: " + ", ".join(str(g) for g in good)))
        lines.append(_ROW.format("" if good else "GPU Memory", "Fail - GPUs: " + ", ".join(str(g) for g in bad)))
        for g in bad:
            lines.append(_ROW.format("Warning", f"GPU {g} A DBE occurred during the memory"))
            lines.append(_ROW.format("", "test. Drain the GPU and reset it."))
    lines.append(_BORDER)
    return "\n".join(lines) + "\n"


class SimulatedDcgmi:
    """A :class:`~gpuwarden.health_check.io.ToolRunner` for one simulated node at scenario second
    ``t``: answers ``dcgmi diag`` with :func:`dcgmi_diag_text` (failing on the GPUs of the node's
    active ``health-check-fail`` faults); every other tool is missing (:class:`ToolMissing`)."""

    def __init__(self, scenario: Scenario, node: str, t: float) -> None:
        self.scenario, self.node, self.t = scenario, node, t

    def failing(self) -> set[int] | None:
        """GPUs the diag fails on (empty = all), None when it passes."""
        faults = [f for f in self.scenario.faults if f.kind == "health-check-fail" and f.node == self.node]
        active = [f for f in faults if f.active(self.t)]
        if not active:
            return None
        return set() if any(f.gpu is None for f in active) else {f.gpu for f in active if f.gpu is not None}

    def run(self, argv: list[str], timeout_s: float) -> ToolOutput:
        if argv[:2] != ["dcgmi", "diag"]:
            raise ToolMissing(argv[0])
        return ToolOutput(0, dcgmi_diag_text(self.scenario.cluster.gpus_per_node, self.failing()))


class SimulatedKernelLog:
    """A :class:`~gpuwarden.health_check.io.KernelLog`: the node's simulated kernel-log lines up to
    scenario second ``t``."""

    def __init__(self, scenario: Scenario, clock: ScenarioClock, node: str, t: float) -> None:
        self._gen = KernelLogGenerator(scenario, clock, node)
        self.t = t

    def read_lines(self) -> list[str]:
        return self._gen.lines(-1.0, self.t)


def check_phase(scenario: Scenario, node: str, t: float) -> str:
    """``prolog`` when a job lands on ``node`` within 1 s of scenario second ``t`` (the check Slurm
    runs before the job), else ``periodic`` (a node health check while jobs run: it skips the
    leftover-process check, since a running job's processes are no fault)."""
    for j in scenario.jobs:
        if node in j.node_list() and abs(j.start_s - t) <= 1.0:
            return "prolog"
    return "periodic"


async def simulated_health_check(
    scenario: Scenario, clock: ScenarioClock, node: str, t: float, phase: str | None = None
) -> list[HealthCheckResult]:
    """Run :data:`SIM_CHECKS` (those of ``phase``, default :func:`check_phase`) on simulated
    ``node`` at scenario second ``t`` (whole node, kernel log from the scenario start) and return
    one result per check, stamped ``clock.event_ts(t)``.

    Raises:
        ValueError: ``node`` is not in the scenario.
    """
    if node not in scenario.cluster.node_names():
        raise ValueError(f"node {node!r} not in scenario {scenario.name!r}")
    phase = phase or check_phase(scenario, node, t)
    if phase not in ("prolog", "epilog", "periodic"):
        raise ValueError(f"unknown phase {phase!r}")
    fake = FakeNvml(scenario, clock, node)
    fake.t = t
    ts = clock.event_ts(t)
    inputs = Inputs(
        nvml=fake,
        runner=SimulatedDcgmi(scenario, node, t),
        kernel_log=SimulatedKernelLog(scenario, clock, node, t),
        clock=lambda: ts,
    )
    ctx = Context(
        phase=phase,  # type: ignore[arg-type]
        node=node,
        since_ts=clock.event_ts(0.0),
        expected_gpus=scenario.cluster.gpus_per_node,
        dcgm_level=1,
    )
    names = [n for n in SIM_CHECKS if n == "dcgm" or n in select_checks(phase)]  # type: ignore[arg-type]
    results = await run_checks(names, inputs, ctx, budget_s=10.0, check_timeout_s=8.0)
    return to_models(results, ctx, ts)


def simulated_nvml(scenario: Path | str, scenario_s: float, node: str) -> FakeNvml:
    """The NVML of simulated ``node`` at scenario second ``scenario_s`` (>= 0) of the scenario
    YAML at ``scenario``: a :class:`~gpuwarden.sim.nvml.FakeNvml` on a clock starting at 0.

    Raises:
        FileNotFoundError: the scenario file does not exist.
        ValueError: the scenario is invalid.
    """
    fake = FakeNvml(load_scenario(scenario), ScenarioClock(0.0), node)
    fake.t = scenario_s
    return fake
