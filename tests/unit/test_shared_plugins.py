"""Simulated backends found through entry points (gpuwarden.shared.plugins): the umbrella package
registers them, each service's setting finds them, and without the simulation layer the service
says what to install instead of failing on an import."""

from __future__ import annotations

import time
from importlib.metadata import EntryPoints, entry_points
from pathlib import Path

import pytest
import yaml

from gpuwarden.collector.service import build_source
from gpuwarden.collector.settings import CollectorSettings
from gpuwarden.health_check.run import default_inputs
from gpuwarden.health_check.settings import HealthCheckSettings
from gpuwarden.shared import plugins
from gpuwarden.shared.plugins import SIM_LAYER_HINT, PluginMissing, load_plugin
from gpuwarden.shared.slurm import build_client
from gpuwarden.sim.collector import SimulatedSource, simulated_source
from gpuwarden.sim.health_check import simulated_nvml
from gpuwarden.sim.nvml import FakeNvml
from gpuwarden.sim.slurm import SimulatedSlurm, simulated_backend

START = 1_700_000_000.0
SCENARIO = {
    "name": "plugins",
    "seed": 3,
    "duration_s": 60,
    "cluster": {"nodes": 2},
    "jobs": [{"id": 7, "nodes": "gpu-node-001", "start_s": 0, "end_s": 50, "profile": "training"}],
}


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUWARDEN_SIM_START", str(START))
    monkeypatch.setenv("GPUWARDEN_SIM_SPEED", "1")
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(SCENARIO))
    return p


@pytest.fixture
def no_sim_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a node with only the service packages installed: no entry point in any group."""
    monkeypatch.setattr(plugins, "entry_points", lambda **kw: EntryPoints(()))


def test_the_umbrella_registers_every_simulated_backend() -> None:
    expect = {
        "gpuwarden.collector_sources": simulated_source,
        "gpuwarden.slurm_backends": simulated_backend,
        "gpuwarden.health_check_nvml": simulated_nvml,
    }
    for group, fn in expect.items():
        (ep,) = entry_points(group=group, name="simulated")
        assert ep.dist is not None and ep.dist.name == "gpuwarden"
        assert ep.load() is fn
        assert load_plugin(group, "simulated", "x") is fn


def test_collector_simulated_source_through_the_entry_point(scenario: Path) -> None:
    src = build_source(
        CollectorSettings(collector_source="simulated", collector_scenario=scenario, collector_nodes="gpu-node-002")
    )
    assert isinstance(src, SimulatedSource)
    assert src.nodes == ["gpu-node-002"] and src.next_due() == START


def test_slurm_simulated_backend_through_the_entry_point(scenario: Path, tmp_path: Path) -> None:
    client, now = build_client("simulated", scenario=scenario, state_file=tmp_path / "state.json")
    assert isinstance(client, SimulatedSlurm)
    assert client.state.path == tmp_path / "state.json"
    assert abs(now() - time.time()) < 5  # the scenario's clock at speed 1 from START: event time = wall time
    with pytest.raises(ValueError, match="needs a scenario file"):
        build_client("simulated")


def test_health_check_simulated_nvml_through_the_entry_point(scenario: Path) -> None:
    s = HealthCheckSettings(health_scenario=scenario, health_scenario_s=12.5)
    inputs = default_inputs(s, "gpu-node-001")
    assert isinstance(inputs.nvml, FakeNvml)
    assert inputs.nvml.node == "gpu-node-001" and inputs.nvml.t == 12.5
    assert inputs.nvml.nvmlDeviceGetCount() == 8


def test_missing_plugin_says_what_to_install(no_sim_layer: None) -> None:
    with pytest.raises(PluginMissing) as err:
        load_plugin("gpuwarden.slurm_backends", "simulated", "the simulated Slurm backend")
    assert str(err.value) == (
        "the simulated Slurm backend needs the gpuwarden package (simulation layer): pip install gpuwarden"
        " (no entry point 'simulated' in 'gpuwarden.slurm_backends')"
    )
    assert isinstance(err.value, ValueError)  # run_service reports it as a one-line start error
    assert SIM_LAYER_HINT in str(err.value)


def test_each_service_without_the_sim_layer(no_sim_layer: None, scenario: Path) -> None:
    with pytest.raises(PluginMissing, match=r"^the simulated collector source needs the gpuwarden package"):
        build_source(CollectorSettings(collector_source="simulated", collector_scenario=scenario))
    with pytest.raises(PluginMissing, match=r"^the simulated Slurm backend needs the gpuwarden package"):
        build_client("simulated", scenario=scenario)
    with pytest.raises(PluginMissing, match=r"^the simulated NVML \(health_scenario\) needs the gpuwarden package"):
        default_inputs(HealthCheckSettings(health_scenario=scenario))
    # the built-in backends need no plugin
    client, _ = build_client("cli")
    assert type(client).__name__ == "CliSlurm"
