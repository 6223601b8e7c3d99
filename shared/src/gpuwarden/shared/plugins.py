"""Backends that another installed distribution provides, found through entry points.

A service's runtime names some backends it does not ship itself: the simulated collector
source, the simulated Slurm backend and the health check's simulated NVML live in the
simulation layer (``gpuwarden.sim`` of the ``gpuwarden`` umbrella distribution), which depends
on the services, never the other way round. The service looks such a backend up by name in an
entry-point group that the umbrella registers:

* ``gpuwarden.collector_sources`` - ``name = "module:fn"``, ``fn(CollectorSettings) -> Source``;
* ``gpuwarden.slurm_backends`` - ``fn(scenario, state_file) -> (SlurmClient, clock)``;
* ``gpuwarden.health_check_nvml`` - ``fn(scenario, scenario_s, node) -> NVML-like object``.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

__all__ = ["SIM_LAYER_HINT", "PluginMissing", "load_plugin"]

#: What to install for a backend of the simulation layer (appended to :class:`PluginMissing`).
SIM_LAYER_HINT = "needs the gpuwarden package (simulation layer): pip install gpuwarden"


class PluginMissing(ValueError):
    """A setting names a backend that no installed distribution provides.

    A ValueError, so a service that cannot start for it reports a one-line error
    (:func:`gpuwarden.shared.service.run_service`) like any other unusable setting."""


def load_plugin(group: str, name: str, what: str, hint: str = SIM_LAYER_HINT) -> Any:
    """The object entry point ``name`` of ``group`` refers to, loaded (imported).

    Args:
        group: the entry-point group, e.g. ``gpuwarden.slurm_backends``.
        name: the entry point's name, e.g. ``simulated``.
        what: the backend in words, for the error (``"the simulated Slurm backend"``).
        hint: what to install, appended to ``what`` in the error.

    Raises:
        PluginMissing: no installed distribution registers ``name`` in ``group``; the message is
            ``"<what> <hint> (no entry point <name> in <group>)"``.
        ImportError: the entry point is registered but its module cannot be imported.
    """
    found = entry_points(group=group, name=name)
    if not found:
        raise PluginMissing(f"{what} {hint} (no entry point {name!r} in {group!r})")
    return next(iter(found)).load()
