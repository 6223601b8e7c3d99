"""CollectorService ticks against MemoryPublisher (no broker), settings and CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError
from typer.testing import CliRunner

from gpuwarden.collector.cli import app
from gpuwarden.collector.service import CollectorService, build_source
from gpuwarden.collector.settings import CollectorSettings
from gpuwarden.collector.sources import ReplaySource
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import EventKind, GpuEvent, NodeSample
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.sim.collector import SimulatedSource

FIX = Path(__file__).resolve().parents[1] / "fixtures"
START = 1_750_000_000.0

SCENARIO = {
    "name": "svc",
    "seed": 1,
    "duration_s": 3,
    "tick_s": 1,
    "cluster": {"nodes": 2, "gpus_per_node": 8},
    "jobs": [{"id": 7, "nodes": "gpu-node-001", "start_s": 0, "profile": "training"}],
    "faults": [{"at_s": 1, "kind": "xid", "node": "gpu-node-001", "gpu": 2, "xid": 48}],
}


def settings(**kw: object) -> CollectorSettings:
    return CollectorSettings(collector_source="replay", collector_replay_dir=Path("/nonexistent"), **kw)


async def test_tick_publishes_samples_and_events_keyed_by_node() -> None:
    src = SimulatedSource(Scenario.model_validate(SCENARIO), ScenarioClock(START))
    pub = MemoryPublisher()
    svc = CollectorService(settings(), producer=pub, source=src)
    assert await svc.tick() == (2, 0)
    assert await svc.tick() == (2, 1)
    samples = pub.of("gpu.samples")
    assert all(isinstance(s, NodeSample) for s in samples)
    assert [(t, k) for t, k, _ in pub.sent if t == "gpu.samples"] == [
        ("gpu.samples", "gpu-node-001"),
        ("gpu.samples", "gpu-node-002"),
    ] * 2
    [ev] = pub.of("gpu.events")
    assert isinstance(ev, GpuEvent) and (ev.kind, ev.code, ev.gpu_index, ev.ts) == (EventKind.XID, 48, 2, START + 1)
    assert ev.pid is None  # XID 48 is printed with pid='<unknown>'
    assert samples[-2].gpus[2].ecc_dbe_volatile == 1 and samples[-2].gpus[2].remapped_rows_pending is True
    text = generate_latest(svc.metrics.registry).decode()
    assert 'gpuwarden_collector_source_calls_total{call="events",outcome="ok",source="simulated"} 1.0' in text
    assert 'gpuwarden_collector_source_calls_total{call="events",outcome="no_data",source="simulated"} 1.0' in text


class FailingSource:
    name = "failing"

    async def collect(self) -> list[NodeSample]:
        raise OSError("nvml went away")

    async def events(self) -> list[GpuEvent]:
        return []

    async def close(self) -> None:
        return None


async def test_source_error_is_counted_not_raised() -> None:
    pub = MemoryPublisher()
    svc = CollectorService(settings(), producer=pub, source=FailingSource())
    assert await svc.tick() == (0, 0)
    text = generate_latest(svc.metrics.registry).decode()
    assert 'gpuwarden_collector_source_calls_total{call="collect",outcome="error",source="failing"} 1.0' in text
    assert pub.sent == []


async def test_run_loop_stops_after_scenario_duration() -> None:
    clock = ScenarioClock(START, speed=1)  # wall times far in the past: no real waiting
    slept: list[float] = []

    async def sleep(d: float) -> None:
        slept.append(d)

    src = SimulatedSource(Scenario.model_validate(SCENARIO), clock)
    pub = MemoryPublisher()
    svc = CollectorService(settings(), producer=pub, source=src, sleep=sleep)
    await svc.run_loop()
    assert svc.finished.is_set()
    assert len(pub.of("gpu.samples")) == 2 * 4  # t = 0, 1, 2, 3 for 2 nodes
    assert slept == []


async def test_replay_service_tick(tmp_path: Path) -> None:
    (tmp_path / "n1").mkdir()
    shutil.copy(FIX / "nvidia-smi" / "tesla-t4-xml-v11-processes.xml", tmp_path / "n1" / "a.xml")
    pub = MemoryPublisher()
    s = CollectorSettings(collector_source="replay", collector_replay_dir=tmp_path)
    svc = CollectorService(s, producer=pub)
    assert isinstance(svc.source, ReplaySource)
    await svc.tick()
    [(topic, key, val)] = pub.sent
    assert (topic, key, val.gpus[0].name) == ("gpu.samples", "n1", "Tesla T4")


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUWARDEN_COLLECTOR_SOURCE", "simulated")
    monkeypatch.setenv("GPUWARDEN_COLLECTOR_SCENARIO", str(tmp_path / "s.yaml"))
    monkeypatch.setenv("GPUWARDEN_COLLECTOR_INTERVAL_S", "0.5")
    monkeypatch.setenv("GPUWARDEN_COLLECTOR_NODES", "gpu-node-[001-002]")
    s = CollectorSettings()
    assert (s.collector_source, s.collector_interval_s, s.collector_nodes) == ("simulated", 0.5, "gpu-node-[001-002]")
    assert s.collector_node  # short hostname
    assert "." not in s.collector_node


def test_settings_need_their_inputs() -> None:
    with pytest.raises(ValidationError, match="collector_replay_dir"):
        CollectorSettings(collector_source="replay")
    with pytest.raises(ValidationError, match="collector_scenario"):
        CollectorSettings(collector_source="simulated")


def test_build_simulated_source_from_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(SCENARIO))
    monkeypatch.setenv("GPUWARDEN_SIM_START", str(START))
    monkeypatch.setenv("GPUWARDEN_SIM_SPEED", "5")
    src = build_source(
        CollectorSettings(collector_source="simulated", collector_scenario=p, collector_nodes="gpu-node-002")
    )
    assert isinstance(src, SimulatedSource)
    assert src.nodes == ["gpu-node-002"] and src.clock.speed == 5 and src.next_due() == START


def test_cli_parse_xml_and_log() -> None:
    r = CliRunner().invoke(app, ["parse-xml", str(FIX / "nvidia-smi" / "rtx3080-xml-v13-595.xml")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["dtd_version"] == "13" and out["gpus"][0]["power_w"] == 139.62
    r = CliRunner().invoke(
        app, ["parse-log", str(FIX / "xid-logs" / "xid119-gsp-rpc-timeout-h100.txt"), "--node", "n9"]
    )
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 5 and {x["code"] for x in lines} == {119} and lines[0]["node"] == "n9"


def test_cli_bad_settings_exit_2() -> None:
    r = CliRunner().invoke(app, ["--source", "replay"])
    assert r.exit_code == 2
    assert "collector_replay_dir" in r.output
    # one line, as every service prints it: a check across settings gives its own message
    assert r.output.strip() == (
        "error: invalid settings: collector_source=replay needs collector_replay_dir (GPUWARDEN_COLLECTOR_REPLAY_DIR)"
    )
    r = CliRunner().invoke(app, ["--source", "bogus"])
    assert r.exit_code == 2
    assert r.output.strip() == (
        "error: invalid settings: GPUWARDEN_COLLECTOR_SOURCE='bogus': "
        "Input should be 'nvml', 'dcgm-exporter', 'replay' or 'simulated'"
    )
