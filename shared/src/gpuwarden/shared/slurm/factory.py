"""Build the :class:`SlurmClient` a service is configured for (``cli`` or ``simulated``)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from .client import CliSlurm, SlurmClient

__all__ = ["DEFAULT_REST_URL", "DEFAULT_SIM_STATE_FILE", "build_client"]

DEFAULT_SIM_STATE_FILE = Path(tempfile.gettempdir()) / "gpuwarden-sim-slurm.json"


DEFAULT_REST_URL = "unix:/run/gpuwarden-slurm/rest/slurmrestd.sock"


def build_client(
    backend: Literal["cli", "simulated", "rest"],
    *,
    scenario: Path | str | None = None,
    state_file: Path | str | None = None,
    timeout_s: float = 10.0,
    retries: int = 2,
    rest_url: str = DEFAULT_REST_URL,
    rest_token: str | None = None,
    rest_user: str | None = None,
    rest_version: str = "v0.0.38",
) -> tuple[SlurmClient, Callable[[], float]]:
    """A Slurm client and the clock of its observations (event time, epoch s).

    ``cli``: :class:`CliSlurm` with wall-clock time. ``rest``: :class:`RestSlurm` on
    slurmrestd at ``rest_url`` (``unix:/path`` or ``http://host:port``; token header if
    ``rest_token``; paths of ``rest_version``), wall-clock time. ``simulated``: the simulation
    layer's :class:`~gpuwarden.sim.slurm.SimulatedSlurm` of ``scenario`` (YAML path) on
    ``ScenarioClock.from_env()`` (``GPUWARDEN_SIM_START``, ``GPUWARDEN_SIM_SPEED``), drain state
    in ``state_file`` (default :data:`DEFAULT_SIM_STATE_FILE`), found through the entry point
    ``gpuwarden.slurm_backends: simulated`` of the ``gpuwarden`` package.

    Raises:
        ValueError: unknown backend, or ``simulated`` without a scenario / with an invalid one.
        PluginMissing: ``simulated`` without the simulation layer installed (a ValueError).
        FileNotFoundError: the scenario file does not exist.
    """
    if backend == "cli":
        c = CliSlurm(timeout_s=timeout_s, retries=retries)
        return c, c.now
    if backend == "rest":
        from .rest import AiohttpTransport, RestSlurm

        transport = AiohttpTransport(rest_url, token=rest_token, user=rest_user, timeout_s=timeout_s)
        r = RestSlurm(transport, version=rest_version, retries=retries)
        return r, r.now
    if backend == "simulated":
        from ..plugins import load_plugin

        if scenario is None:
            raise ValueError("the simulated Slurm backend needs a scenario file")
        simulated = load_plugin("gpuwarden.slurm_backends", "simulated", "the simulated Slurm backend")
        client, now = simulated(scenario, state_file)
        return client, now
    raise ValueError(f"unknown Slurm backend {backend!r}: cli, rest or simulated")
