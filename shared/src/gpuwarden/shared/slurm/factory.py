"""Build the :class:`SlurmClient` a service is configured for (``cli`` or ``simulated``)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from .client import CliSlurm, SlurmClient

__all__ = ["DEFAULT_SIM_STATE_FILE", "build_client"]

DEFAULT_SIM_STATE_FILE = Path(tempfile.gettempdir()) / "gpuwarden-sim-slurm.json"


def build_client(
    backend: Literal["cli", "simulated"],
    *,
    scenario: Path | str | None = None,
    state_file: Path | str | None = None,
    timeout_s: float = 10.0,
    retries: int = 2,
) -> tuple[SlurmClient, Callable[[], float]]:
    """A Slurm client and the clock of its observations (event time, epoch s).

    ``cli``: :class:`CliSlurm` with wall-clock time. ``simulated``: :class:`SimulatedSlurm`
    of ``scenario`` (YAML path) on ``ScenarioClock.from_env()`` (``GPUWARDEN_SIM_START``,
    ``GPUWARDEN_SIM_SPEED``), drain state in ``state_file`` (default
    :data:`DEFAULT_SIM_STATE_FILE`).

    Raises:
        ValueError: unknown backend, or ``simulated`` without a scenario / with an invalid one.
        FileNotFoundError: the scenario file does not exist.
    """
    if backend == "cli":
        c = CliSlurm(timeout_s=timeout_s, retries=retries)
        return c, c.now
    if backend == "simulated":
        from ..scenario import ScenarioClock, load_scenario
        from .simulated import SimulatedSlurm

        if scenario is None:
            raise ValueError("the simulated Slurm backend needs a scenario file")
        clock = ScenarioClock.from_env()
        sim = SimulatedSlurm(load_scenario(scenario), clock, Path(state_file or DEFAULT_SIM_STATE_FILE))
        return sim, lambda: clock.event_ts(clock.scenario_s(time.time()))
    raise ValueError(f"unknown Slurm backend {backend!r}: cli or simulated")
