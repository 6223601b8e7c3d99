"""The scenario format (docs/architecture.md#scenarios): a simulated fleet, its jobs, injected faults and
what must be found. Shared by the simulated collector, the simulated Slurm and the demo.

A scenario never tells the detector what was injected: only the simulators read ``faults``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import hostlist
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .models import Pattern

__all__ = [
    "Allowance",
    "Cluster",
    "Expectation",
    "Fault",
    "Scenario",
    "ScenarioClock",
    "ScenarioJob",
    "load_scenario",
]

FAULT_KINDS = {
    "xid",
    "sxid",
    "gpu-lost",
    "gpu-missing",
    "ecc-dbe",
    "ecc-sbe-storm",
    "row-remap-pending",
    "row-remap-failed",
    "retired-pages",
    "nvlink-errors",
    "nvlink-down",
    "pcie-degraded",
    "pcie-replays",
    "thermal-throttle",
    "power-brake",
    "power-cap",
    "clocks-low",
    "straggler-gpu",
    "straggler-node",
    "collective-hang",
    "zombie-process",
    "telemetry-silent",
    "health-check-fail",
}
PROFILES = {
    "training",
    "inference",
    "idle",
    "partial-idle",
    "input-bound",
    "checkpoint-heavy",
    "memory-leak",
    "low-tensor",
    "comm-bound",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cluster(_Strict):
    nodes: int = Field(ge=1, le=10000)
    gpus_per_node: int = Field(8, ge=1, le=64)
    gpu_model: str = "H100-SXM5-80GB"
    price_usd_per_gpu_hour: float = Field(3.26, ge=0)
    node_prefix: str = "gpu-node-"
    partition: str = "gpu"

    def node_names(self) -> list[str]:
        """``gpu-node-001`` ... zero-padded to 3 digits (more if needed)."""
        width = max(3, len(str(self.nodes)))
        return [f"{self.node_prefix}{i:0{width}d}" for i in range(1, self.nodes + 1)]


class ScenarioJob(_Strict):
    id: int | str
    user: str = "user1"
    account: str | None = None
    partition: str | None = None
    nodes: str = Field(description="Slurm hostlist, e.g. gpu-node-[001-004]")
    gpus_per_node: int = Field(8, ge=1)
    gpus: list[int] | None = None
    start_s: float = Field(0, ge=0)
    end_s: float | None = None
    profile: str = "training"
    name: str | None = None

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: str) -> str:
        if v not in PROFILES:
            raise ValueError(f"unknown profile {v!r}; one of {sorted(PROFILES)}")
        return v

    def node_list(self) -> list[str]:
        return list(hostlist.expand_hostlist(self.nodes))


class Fault(_Strict):
    at_s: float = Field(ge=0)
    kind: str
    node: str
    gpu: int | None = Field(None, ge=0)
    duration_s: float | None = Field(None, gt=0)
    xid: int | None = None
    sxid: int | None = None
    link: int | None = None
    factor: float | None = None

    @model_validator(mode="after")
    def _kind(self) -> Fault:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {sorted(FAULT_KINDS)}")
        if self.kind == "xid" and self.xid is None:
            raise ValueError("fault kind xid needs 'xid'")
        if self.kind == "sxid" and self.sxid is None:
            raise ValueError("fault kind sxid needs 'sxid'")
        return self

    def active(self, t: float) -> bool:
        """True while a lasting fault is in effect at scenario second ``t``."""
        if t < self.at_s:
            return False
        return self.duration_s is None or t < self.at_s + self.duration_s


class Expectation(_Strict):
    pattern: Pattern

    node: str | None = None
    gpu: int | None = None
    job: int | str | None = None
    within_s: float = Field(60, gt=0)
    count: int | None = Field(
        None,
        ge=1,
        description="Exactly this many distinct failures (failure ids) may match: one fault, one finding. "
        "Further matching failures are false positives (None: any number)",
    )


class Allowance(_Strict):
    """A pattern that may show up without counting as a false positive: on ``node`` only when
    given, else anywhere (``allow: [gpu-missing]`` is short for ``[{pattern: gpu-missing}]``)."""

    pattern: Pattern
    node: str | None = None

    def covers(self, pattern: str, node: str) -> bool:
        return pattern == self.pattern and self.node in (None, node)


class Scenario(_Strict):
    name: str
    seed: int = 0
    duration_s: float = Field(gt=0)
    tick_s: float = Field(1, gt=0)
    cluster: Cluster
    jobs: list[ScenarioJob] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    expect: list[Expectation] = Field(default_factory=list)
    allow: list[Allowance] = Field(default_factory=list)
    description: str | None = None

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, v: Any) -> Any:
        return [{"pattern": a} if isinstance(a, str) else a for a in v] if isinstance(v, list) else v

    def allowed(self, pattern: str, node: str) -> bool:
        """True when ``allow`` lets ``pattern`` appear on ``node``."""
        return any(a.covers(pattern, node) for a in self.allow)

    @model_validator(mode="after")
    def _refs(self) -> Scenario:
        names = set(self.cluster.node_names())
        for f in self.faults:
            if f.node not in names:
                raise ValueError(f"fault at {f.at_s}s names unknown node {f.node!r}")
            if f.gpu is not None and f.gpu >= self.cluster.gpus_per_node:
                raise ValueError(f"fault at {f.at_s}s names GPU {f.gpu} but nodes have {self.cluster.gpus_per_node}")
        for j in self.jobs:
            unknown = set(j.node_list()) - names
            if unknown:
                raise ValueError(f"job {j.id} names unknown nodes {sorted(unknown)}")
        return self

    def allocations(self) -> dict[str, dict[str, list[int]]]:
        """``{job id: {node: [gpu indices]}}``: explicit ``gpus`` or the lowest free indices,
        assigned in job start order (a GPU is free again after its job's ``end_s``)."""
        busy: dict[str, list[tuple[int, float, float]]] = {}
        out: dict[str, dict[str, list[int]]] = {}
        for j in sorted(self.jobs, key=lambda j: (j.start_s, str(j.id))):
            end = j.end_s if j.end_s is not None else float("inf")
            per: dict[str, list[int]] = {}
            for n in j.node_list():
                taken = {g for g, s, e in busy.get(n, []) if s < end and j.start_s < e}
                if j.gpus is not None:
                    gpus = list(j.gpus)
                else:
                    free = [g for g in range(self.cluster.gpus_per_node) if g not in taken]
                    if len(free) < j.gpus_per_node:
                        raise ValueError(f"job {j.id}: not enough free GPUs on {n}")
                    gpus = free[: j.gpus_per_node]
                per[n] = gpus
                busy.setdefault(n, []).extend((g, j.start_s, end) for g in gpus)
            out[str(j.id)] = per
        return out


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: YAML syntax error or a field that fails validation (pydantic message).
    """
    text = Path(path).read_text()
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a scenario is a YAML mapping")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "scenario"
            problems.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
        raise ValueError(f"{path}: invalid scenario: " + "; ".join(problems)) from None


class ScenarioClock:
    """Event time of a simulated run shared by separate processes.

    Scenario second ``t`` has event time ``start + t``; wall time runs ``speed`` times
    slower than scenario time, from ``wall_start`` (default ``start``: event time = wall time
    at speed 1). Processes agree through ``GPUWARDEN_SIM_START`` (event time, epoch s, of
    scenario second 0), ``GPUWARDEN_SIM_WALL_START`` (wall time, epoch s, of scenario second 0;
    default the former) and ``GPUWARDEN_SIM_SPEED``. A fixed ``start`` with the run's own
    ``wall_start`` gives the same event times, and so the same failure ids, at every speed.
    """

    def __init__(self, start: float, speed: float = 1.0, wall_start: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.start = start
        self.speed = speed
        self.wall_start = start if wall_start is None else wall_start

    @classmethod
    def from_env(cls) -> ScenarioClock:
        wall = os.environ.get("GPUWARDEN_SIM_WALL_START")
        return cls(
            float(os.environ.get("GPUWARDEN_SIM_START", time.time())),
            float(os.environ.get("GPUWARDEN_SIM_SPEED", "1")),
            float(wall) if wall else None,
        )

    def scenario_s(self, wall: float | None = None) -> float:
        """Scenario seconds elapsed at wall time ``wall`` (default now); negative before start."""
        return ((wall if wall is not None else time.time()) - self.wall_start) * self.speed

    def event_ts(self, t: float) -> float:
        """Event time (epoch s) of scenario second ``t``."""
        return self.start + t

    def wall_of(self, t: float) -> float:
        """Wall time (epoch s) at which scenario second ``t`` happens."""
        return self.wall_start + t / self.speed
