"""gpuwarden.shared: models, JSON schemas, topic registry, decoding, scenario format, settings."""

from __future__ import annotations

import base64
import importlib
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from gpuwarden.shared import models as m
from gpuwarden.shared.bus import decode
from gpuwarden.shared.scenario import Scenario, ScenarioClock, load_scenario
from gpuwarden.shared.schemas import MODELS, write_schemas
from gpuwarden.shared.settings import BusSettings
from gpuwarden.shared.topics import TOPICS, topic

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "gpuwarden" / "demo" / "scenarios" / "demo-xid79.yaml"


def sample() -> m.NodeSample:
    return m.NodeSample(
        node="gpu-node-001",
        ts=1700000000.5,
        collector_id="c1",
        source="nvml",
        gpus=[
            m.GpuSample(
                index=0,
                uuid="GPU-1",
                pci_bus_id="0000:18:00.0",
                power_w=650.5,
                throttle_reasons=["sw_thermal_slowdown"],
            )
        ],
    )


def test_models_roundtrip_through_orjson() -> None:
    s = sample()
    assert m.NodeSample.model_validate(orjson.loads(s.to_json())) == s
    assert orjson.loads(s.to_json())["schema_version"] == 1


UNIT_SUFFIXES = ("_w", "_c", "_mhz", "_mib", "_pct", "_s", "_ts", "_j", "_count", "_usd_per_hour")


def test_every_numeric_field_states_its_unit() -> None:
    """A number on the bus is useless without its unit: in the name or in the description."""
    missing = []
    for model in MODELS:
        for name, f in model.model_fields.items():
            ann = str(f.annotation)
            if "float" not in ann or name == "ts" or name.endswith(UNIT_SUFFIXES):
                continue
            if not f.description:
                missing.append(f"{model.__name__}.{name}")
    assert not missing, missing


def test_models_reject_unknown_fields_and_wrong_units() -> None:
    with pytest.raises(ValidationError):
        m.NodeSample.model_validate({**orjson.loads(sample().to_json()), "power": 3})
    with pytest.raises(ValidationError):
        m.GpuSample(index=0, utilization_gpu_pct=140)
    with pytest.raises(ValidationError):
        m.GpuSample(index=-1)


def test_json_schemas_in_docs_are_current() -> None:
    assert write_schemas(ROOT / "docs" / "schemas", check=True) == [], "run: gpuwarden schemas"


def test_schemas_into_a_place_it_cannot_write_is_one_line(tmp_path: Path) -> None:
    """In an image the working directory may be read-only: one line, exit 1, not a traceback."""
    from typer.testing import CliRunner

    from gpuwarden.shared.cli import app

    (tmp_path / "file").write_text("")
    res = CliRunner().invoke(app, ["schemas", "--out", str(tmp_path / "file" / "schemas")], env={"COLUMNS": "300"})
    assert res.exit_code == 1, res.output
    assert res.output.startswith(f"error: cannot write the schemas in {tmp_path / 'file' / 'schemas'}: "), res.output
    ok = CliRunner().invoke(app, ["schemas", "--out", str(tmp_path / "s")])
    assert ok.exit_code == 0 and (tmp_path / "s" / "NodeSample.json").is_file(), ok.output


def test_topic_registry_names_and_models() -> None:
    assert topic("failures") == "gpuwarden.failures"
    assert BusSettings(topic_prefix="x.").topic("gpu.samples") == "x.gpu.samples"
    assert TOPICS["failures"].model is m.Failure and TOPICS["gpu.samples"].key == "node"
    with pytest.raises(KeyError):
        topic("nope")


def test_decode_validates_against_the_topic_schema() -> None:
    assert decode("gpu.samples", sample().to_json()) == sample()
    with pytest.raises(ValueError, match="not JSON"):
        decode("gpu.samples", b"\x00garbage")
    with pytest.raises(ValidationError):
        decode("gpu.samples", b'{"node": "n"}')
    with pytest.raises(ValueError, match="tombstone"):
        decode("failures", None)


def test_decode_tolerates_fields_from_a_newer_producer_but_nothing_else() -> None:
    data = orjson.loads(sample().to_json())
    data["gpus"][0]["serial_v2"] = "x"  # a field this version does not know
    data["new_top_level"] = 1
    assert decode("gpu.samples", orjson.dumps(data)) == sample()
    data["gpus"][0]["power_w"] = "lots"  # plus a real violation: still rejected
    with pytest.raises(ValidationError):
        decode("gpu.samples", orjson.dumps(data))


def test_stable_id_is_deterministic() -> None:
    assert m.stable_id("a", 1, None) == m.stable_id("a", 1, None) != m.stable_id("a", 1, 0)


def test_dead_letter_keeps_original_bytes() -> None:
    raw = b"\xff\xfe not utf8"
    dl = m.DeadLetter(
        service="s",
        source_topic="t",
        partition=0,
        offset=3,
        value_b64=base64.b64encode(raw).decode(),
        error="e",
        ts=1.0,
    )
    assert base64.b64decode(dl.value_b64) == raw


def test_demo_scenario_loads_and_allocates_lowest_free_gpus() -> None:
    sc = load_scenario(DEMO)
    assert sc.cluster.node_names()[0] == "gpu-node-001" and len(sc.cluster.node_names()) == 8
    alloc = sc.allocations()["1001"]
    assert alloc["gpu-node-003"] == list(range(8)) and len(alloc) == 8


def test_scenario_allocation_in_start_order_and_validation() -> None:
    sc = Scenario.model_validate(
        {
            "name": "x",
            "duration_s": 10,
            "cluster": {"nodes": 2, "gpus_per_node": 8},
            "jobs": [
                {"id": 2, "nodes": "gpu-node-001", "gpus_per_node": 4, "start_s": 5},
                {"id": 1, "nodes": "gpu-node-[001-002]", "gpus_per_node": 2, "start_s": 0},
            ],
        }
    )
    a = sc.allocations()
    assert a["1"] == {"gpu-node-001": [0, 1], "gpu-node-002": [0, 1]} and a["2"] == {"gpu-node-001": [2, 3, 4, 5]}
    with pytest.raises(ValidationError, match="unknown node"):
        Scenario.model_validate(
            {
                "name": "x",
                "duration_s": 1,
                "cluster": {"nodes": 1},
                "faults": [{"at_s": 1, "kind": "xid", "xid": 79, "node": "gpu-node-009"}],
            }
        )
    with pytest.raises(ValidationError, match="needs 'xid'"):
        Scenario.model_validate(
            {
                "name": "x",
                "duration_s": 1,
                "cluster": {"nodes": 1},
                "faults": [{"at_s": 1, "kind": "xid", "node": "gpu-node-001"}],
            }
        )


def test_scenario_clock_maps_scenario_seconds_to_event_time() -> None:
    c = ScenarioClock(start=1000.0, speed=10)
    assert c.event_ts(15) == 1015.0 and c.wall_of(15) == 1001.5 and c.scenario_s(1001.5) == pytest.approx(15)
    with pytest.raises(ValueError):
        ScenarioClock(0, speed=0)


@pytest.mark.parametrize(
    "mod",
    [
        "gpuwarden.shared.models",
        "gpuwarden.shared.bus",
        "gpuwarden.shared.topics",
        "gpuwarden.shared.service",
        "gpuwarden.shared.scenario",
        "gpuwarden.shared.settings",
        "gpuwarden.sim.brokers",
        "gpuwarden.detector",
    ],
)
def test_public_names_exist(mod: str) -> None:
    module = importlib.import_module(mod)
    assert module.__all__, f"{mod} has an empty __all__"
    for name in module.__all__:
        assert hasattr(module, name), f"{mod}.{name}"
