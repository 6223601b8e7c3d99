"""Issue 25: the input contract at each topic's edge, and text made safe for people.

Hostile records here are schema-shaped (valid JSON, the right fields) with values no collector or
slurm-watcher writes: ``ts=1e308``, a day in the future, node names with shell, control and
bidirectional characters, 65 GPUs. Each is refused by the schema or the edge check, dead-lettered
by the topic's edge service only, and never handed to the service's handler.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import ConsumerRecord
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuwarden.shared.bus import Consumer, MemoryPublisher, decode
from gpuwarden.shared.contract import ContractError, EdgeCheck, event_time_of
from gpuwarden.shared.eventtime import EventTimeGuard
from gpuwarden.shared.logfilter import RateLimitFilter
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.models import (
    MAX_EVENT_TS,
    NODE_NAME_PATTERN,
    DeadLetter,
    EventKind,
    GpuEvent,
    GpuSample,
    JobState,
    NodeSample,
)
from gpuwarden.shared.settings import BusSettings
from gpuwarden.shared.text import SafeFormatter, markdown, one_line
from gpuwarden.shared.topics import TOPICS

ROOT = Path(__file__).resolve().parents[2]
NOW = time.time()

HOSTILE_NAMES = [
    "gpu-node-001$(id)",
    "gpu-node-`reboot`",
    "gpu\x00node",
    "gpu-node-001\nexecuted drain on gpu-node-002",
    "gpu-node-\u202e100-edon",  # right-to-left override
    "gpu-node-\u200b001",  # zero-width space
    "gpu-node-🙂",
    "x" * 10_000,
    "-rf",
    "",
    "node with space",
    "node;rm",
]


def _sample(node: str = "gpu-node-001", ts: float = NOW, gpus: int = 8) -> dict[str, Any]:
    good = NodeSample(
        node="gpu-node-001",
        ts=NOW,
        collector_id="c:1",
        source="simulated",
        gpus=[GpuSample(index=i, power_w=300.0) for i in range(min(gpus, 8))],
    )
    d = orjson.loads(good.to_json())
    d.update(node=node, ts=ts)
    d["gpus"] = [{"index": i, "power_w": 300.0} for i in range(gpus)]
    return d


def _xid(ts: float) -> dict[str, Any]:
    ev = GpuEvent(
        event_id="e1",
        node="gpu-node-001",
        ts=NOW,
        kind=EventKind.XID,
        code=79,
        message="GPU has fallen off the bus.",
        raw="NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.",
        source="kmsg",
    )
    return {**orjson.loads(ev.to_json()), "ts": ts}


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=lambda n: repr(n[:20]))
def test_a_hostile_node_name_breaks_the_schema(name: str) -> None:
    with pytest.raises(ValidationError):
        decode("gpu.samples", orjson.dumps(_sample(node=name)))
    with pytest.raises(ValidationError):
        decode("gpu.events", orjson.dumps({**_xid(NOW), "node": name}))
    with pytest.raises(ValidationError):
        decode("slurm.jobs", orjson.dumps({"job_id": "7", "ts": NOW, "state": "RUNNING", "nodes": [name]}))


@pytest.mark.parametrize(
    "bad",
    [
        {"ts": 1e308},
        {"ts": MAX_EVENT_TS + 1},
        {"ts": -1.0},
        {"gpus": 65},
    ],
    ids=str,
)
def test_out_of_range_values_break_the_schema(bad: dict[str, Any]) -> None:
    kw = {"ts": bad.get("ts", NOW), "gpus": bad.get("gpus", 8)}
    with pytest.raises(ValidationError):
        decode("gpu.samples", orjson.dumps(_sample(**kw)))


def test_other_bounds_of_the_schema() -> None:
    d = _sample()
    d["gpus"][0]["index"] = 64
    with pytest.raises(ValidationError, match="index"):
        decode("gpu.samples", orjson.dumps(d))
    d = _sample()
    d["gpus"][0]["nvlinks"] = [{"link": i} for i in range(37)]
    with pytest.raises(ValidationError, match="nvlinks"):
        decode("gpu.samples", orjson.dumps(d))
    d = _sample()
    d["gpus"][0]["uuid"] = "GPU-1234\n$(id)"
    with pytest.raises(ValidationError, match="uuid"):
        decode("gpu.samples", orjson.dumps(d))
    with pytest.raises(ValidationError, match="raw"):
        decode("gpu.events", orjson.dumps({**_xid(NOW), "raw": "x" * 5000}))
    for job_id in ("1; rm -rf /", "$(id)", "7\n8", ""):
        with pytest.raises(ValidationError, match="job_id"):
            JobState(job_id=job_id, ts=NOW, state="RUNNING")
    # what Slurm and NVML really print passes
    for job_id in ("123", "123_4", "123_[1-5%2]", "123+1", "recording"):
        assert JobState(job_id=job_id, ts=NOW, state="PENDING").job_id == job_id
    d = _sample()
    d["gpus"][0].update(uuid="GPU-a1b2c3d4-0000-1111-2222-333344445555", pci_bus_id="00000000:9B:00.0")
    d.update(node="ip-10-0-0-1.ec2.internal", driver_version="550.54.15", collector_id="ip-10-0-0-1:4242")
    assert decode("gpu.samples", orjson.dumps(d)).node == "ip-10-0-0-1.ec2.internal"  # type: ignore[attr-defined]


def test_the_json_schemas_say_the_same_bounds() -> None:
    """A consumer in another language reads the bounds from docs/schemas."""
    ns = json.loads((ROOT / "docs/schemas/NodeSample.json").read_text())
    assert ns["properties"]["ts"]["maximum"] == MAX_EVENT_TS
    assert ns["properties"]["node"]["pattern"] == NODE_NAME_PATTERN
    assert ns["properties"]["gpus"]["maxItems"] == 64
    ev = json.loads((ROOT / "docs/schemas/GpuEvent.json").read_text())
    assert ev["properties"]["ts"]["maximum"] == MAX_EVENT_TS and ev["properties"]["raw"]["maxLength"] == 4096


@given(st.text(max_size=80))
@settings(max_examples=300, deadline=None)
def test_any_node_name_the_schema_accepts_is_safe_in_argv_and_text(name: str) -> None:
    try:
        s = decode("gpu.samples", orjson.dumps(_sample(node=name)))
    except (ValidationError, ValueError):
        return
    node = s.node  # type: ignore[attr-defined]
    assert node.isascii() and node.isprintable() and not set(node) & set(" $`;|&<>()\\'\"\n")
    assert one_line(node) == node and markdown(node).replace("\\_", "_") == node


def test_edge_check_event_time_against_the_wall_clock_and_the_topic_progress() -> None:
    edge = EdgeCheck("correlator", max_ahead_s=600, max_behind_s=3600, wall=lambda: NOW)
    ok = NodeSample.model_validate(_sample(ts=NOW))
    edge.check("gpu.samples", ok)
    with pytest.raises(ContractError, match="ahead") as e:
        edge.check("gpu.samples", NodeSample.model_validate(_sample(ts=NOW + 86400)))
    assert e.value.rule == "event-time"
    with pytest.raises(ContractError, match="behind"):
        edge.check("gpu.samples", NodeSample.model_validate(_sample(ts=NOW - 7200)))
    # each topic has its own progress; records without event time pass
    edge.check("gpu.events", GpuEvent.model_validate(_xid(NOW - 7200)))
    assert event_time_of(object()) is None
    # accepted records never ratchet the ahead bound: 9 minutes ahead, then 9 more, is refused
    edge.check("gpu.samples", NodeSample.model_validate(_sample(ts=NOW + 540)))
    with pytest.raises(ContractError):
        edge.check("gpu.samples", NodeSample.model_validate(_sample(ts=NOW + 1080)))


def test_every_input_topic_names_its_edge_service() -> None:
    for name in ("gpu.samples", "gpu.events", "slurm.jobs", "slurm.nodes", "health"):
        spec = TOPICS[name]
        assert spec.edge in spec.consumers, name
    assert EdgeCheck("correlator").is_edge("gpu.events") and not EdgeCheck("detector").is_edge("gpu.events")
    assert EdgeCheck("otlp-bridge").is_edge("failures")  # one of our validated outputs: every reader


def _record(topic: str, value: bytes, offset: int = 0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic, 0, offset, 0, 0, b"gpu-node-001", value, None, 12, len(value), ())


def _consumer(service: str, topics: list[str]) -> tuple[Consumer, MemoryPublisher, list[Any]]:
    handled: list[Any] = []

    async def handler(_topic: str, value: Any, _rec: Any) -> None:
        handled.append(value)

    prod = MemoryPublisher()
    c = Consumer(BusSettings(), service, topics, "g", handler, prod, ServiceMetrics(service))
    return c, prod, handled


HOSTILE_SAMPLES = [
    _sample(ts=1e308),
    _sample(ts=NOW + 86400),
    _sample(node="gpu-node-001$(id)"),
    _sample(gpus=65),
    {**_sample(), "gpus": "x" * 2000},
]


async def test_the_edge_service_dead_letters_each_hostile_record_once_and_never_handles_it() -> None:
    c, prod, handled = _consumer("correlator", ["gpu.samples", "gpu.events"])
    for i, rec in enumerate(HOSTILE_SAMPLES):
        await c._one("gpu.samples", _record("gpuwarden.gpu.samples", orjson.dumps(rec), i))
    await c._one("gpu.events", _record("gpuwarden.gpu.events", orjson.dumps(_xid(1e308)), 9))
    await c._one("gpu.samples", _record("gpuwarden.gpu.samples", orjson.dumps(_sample()), 10))
    dead: list[DeadLetter] = prod.of("deadletter")
    assert len(dead) == len(HOSTILE_SAMPLES) + 1 and c.rejected == len(dead)
    assert all(d.service == "correlator" and d.error for d in dead)
    assert [d.offset for d in dead] == [0, 1, 2, 3, 4, 9]
    assert "contract event-time" in dead[1].error and dead[0].error.startswith("schema: ts")
    assert len(handled) == 1 and handled[0].ts == NOW  # only the good sample reached the handler


async def test_another_reader_drops_them_counted_without_a_second_dead_letter() -> None:
    c, prod, handled = _consumer("detector", ["gpu.events"])
    await c._one("gpu.events", _record("gpuwarden.gpu.events", orjson.dumps(_xid(1e308))))
    await c._one("gpu.events", _record("gpuwarden.gpu.events", orjson.dumps(_xid(NOW + 86400)), 1))
    assert prod.of("deadletter") == [] and handled == [] and c.rejected == 2
    text = c._metrics.registry.get_sample_value  # type: ignore[attr-defined]
    assert text("gpuwarden_rejected_records_total", {"topic": "gpu.events", "rule": "schema"}) == 1.0
    assert text("gpuwarden_rejected_records_total", {"topic": "gpu.events", "rule": "event-time"}) == 1.0


def test_one_line_and_markdown_escape_what_could_forge_or_disguise() -> None:
    assert one_line("a\nb\rc\x1b[31md\x00") == "a\\x0ab\\x0dc\\x1b[31md\\x00"
    assert one_line("gpu-\u202e100") == "gpu-\\u202e100" and one_line("a\u2028b") == "a\\u2028b"
    assert one_line("GPU 3 🙂 é") == "GPU 3 🙂 é"  # printable text of any script stays
    assert one_line("x" * 50, 10) == "x" * 9 + "…"
    assert markdown("a|b [x](http://e) <img> `c` *d*") == "a\\|b \\[x\\](http://e) \\<img\\> \\`c\\` \\*d\\*"


def test_a_log_record_is_one_line_and_a_flood_is_a_few_lines() -> None:
    fmt = SafeFormatter("%(levelname)s %(message)s")
    rec = logging.LogRecord("gpuwarden.x", logging.WARNING, __file__, 1, "drain %s", ("n1\nINFO executed drain",), None)
    assert fmt.format(rec) == "WARNING drain n1\\x0aINFO executed drain"
    now = [0.0]
    flt = RateLimitFilter(10.0, clock=lambda: now[0])
    passed = 0
    for i in range(10_000):
        now[0] = i * 0.01  # 10,000 dead letters in 100 s
        r = logging.LogRecord(
            "gpuwarden.shared.bus.consumer", logging.WARNING, __file__, 1, "dead-lettering %s", (i,), None
        )
        r.rate_limited = True
        passed += flt.filter(r)
    assert passed == 10 and flt.suppressed_total == 9_990


@pytest.mark.parametrize("topic", ["gpu.samples", "gpu.events", "slurm.jobs", "slurm.nodes", "health"])
def test_every_generated_hostile_record_is_outside_the_contract(topic: str) -> None:
    """The chaos bench's hostile records (gpuwarden.sim.hostile): each one is refused by the schema
    or by the edge check of a reader whose topic progress is near the wall clock."""
    from gpuwarden.sim.hostile import hostile_records

    edge = EdgeCheck("x", wall=lambda: NOW)
    edge.guards[topic] = EventTimeGuard(600, 365 * 86400, lambda: NOW, wall_only=True)
    edge.guards[topic].watermark = NOW  # the topic's progress: now
    values = list(hostile_records(topic, 2000, NOW))
    assert len(set(values)) > 200  # varied, not one record repeated
    for v in values:
        try:
            rec = decode(topic, v)
        except (ValidationError, ValueError):
            continue
        with pytest.raises(ContractError):
            edge.check(topic, rec)
