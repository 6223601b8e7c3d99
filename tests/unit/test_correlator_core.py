"""The correlator's message handling (decode, join, dead-letter) without a broker."""

from __future__ import annotations

import base64

import orjson
import pytest

from gpuwarden.correlator.core import Correlator, MemoryAllocationStore, Output
from gpuwarden.shared.bus import decode
from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    DeadLetter,
    EventKind,
    GpuEvent,
    GpuSample,
    JobState,
    NodeSample,
)

NODE = "gpu-node-001"


def topic(short: str) -> str:
    return f"t.{short}"


@pytest.fixture
def core() -> Correlator:
    return Correlator(
        MemoryAllocationStore(), topic, retention_s=600, metrics=ServiceMetrics("correlator"), clock=lambda: 1234.0
    )


def run(core: Correlator, short: str, value: bytes, key: bytes | None = None) -> list[Output]:
    """Handle one message and loop allocations back like the broker would."""
    outs = core.handle(short, value, key)
    rest = []
    for o in outs:
        if o.topic == "allocations":
            assert core.handle("allocations", o.value, o.key.encode() if o.key else None) == []
        else:
            rest.append(o)
    return rest


def job(state: str = "RUNNING", ts: float = 100.0, end_ts: float | None = None) -> bytes:
    return JobState(
        job_id="1001", ts=ts, state=state, user="alice", nodes=[NODE], gpus={NODE: [0, 1]}, start_ts=50.0, end_ts=end_ts
    ).to_json()


def sample(ts: float) -> bytes:
    return NodeSample(
        node=NODE, ts=ts, collector_id="c", source="simulated", gpus=[GpuSample(index=i) for i in range(4)]
    ).to_json()


def xid(ts: float, gpu: int) -> bytes:
    return GpuEvent(
        event_id="e1",
        node=NODE,
        ts=ts,
        kind=EventKind.XID,
        code=79,
        gpu_index=gpu,
        raw="NVRM: Xid 79",
        source="simulated",
    ).to_json()


def test_job_fans_out_to_allocations_keyed_by_node(core: Correlator) -> None:
    outs = core.handle("slurm.jobs", job(), b"1001")
    assert [(o.topic, o.key) for o in outs] == [("allocations", NODE)]
    rec = orjson.loads(outs[0].value)
    assert rec["node"] == NODE and rec["job_id"] == "1001" and rec["gpus"] == [0, 1]
    assert set(rec) >= {
        "node",
        "job_id",
        "gpus",
        "user",
        "account",
        "partition",
        "start_ts",
        "end_ts",
        "state",
        "job_gpus",
    }


def test_sample_and_event_are_attributed(core: Correlator) -> None:
    run(core, "slurm.jobs", job())
    [s] = run(core, "gpu.samples", sample(60.0))
    assert (s.topic, s.key) == ("gpu.attributed", NODE)
    att = decode("gpu.attributed", s.value)
    assert isinstance(att, AttributedSample)
    assert [(j.gpu_index, j.job_id) for j in att.jobs] == [(0, "1001"), (1, "1001")]
    [e] = run(core, "gpu.events", xid(61.0, 1))
    ev = decode("gpu.events.attributed", e.value)
    assert isinstance(ev, AttributedEvent)
    assert (e.topic, e.key) == ("gpu.events.attributed", NODE)
    assert ev.job is not None and ev.job.job_id == "1001" and ev.job.gpu_index == 1


def test_attributed_sample_is_exactly_the_pure_join(core: Correlator) -> None:
    """The hot path builds the AttributedSample without re-validating and caches attributions
    per node: the bytes must equal the pure join's, also across a job ending and expiring."""
    from gpuwarden.shared.allocations import attribute_sample
    from gpuwarden.shared.models import dumps

    run(core, "slurm.jobs", job())
    for ts, update in [(60.0, None), (61.0, None), (150.0, job("COMPLETED", ts=200.0, end_ts=190.0)), (195.0, None)]:
        if update is not None:
            run(core, "slurm.jobs", update)
        allocs = core._allocations(NODE)
        expected = dumps(attribute_sample(decode("gpu.samples", sample(ts)), allocs))  # type: ignore[arg-type]
        [s] = [o for o in run(core, "gpu.samples", sample(ts)) if o.topic == "gpu.attributed"]
        assert s.value == expected


def test_sample_of_unknown_node_is_published_without_jobs(core: Correlator) -> None:
    [s] = run(core, "gpu.samples", sample(60.0))
    assert decode("gpu.attributed", s.value).jobs == []  # type: ignore[attr-defined]


def test_finished_job_expires_after_retention_in_event_time(core: Correlator) -> None:
    run(core, "slurm.jobs", job())
    run(core, "slurm.jobs", job("COMPLETED", ts=200.0, end_ts=190.0))
    late = decode("gpu.attributed", run(core, "gpu.samples", sample(150.0))[0].value)
    assert late.jobs  # type: ignore[attr-defined]
    run(core, "gpu.samples", sample(190.0 + 600))  # event time passes the retention
    assert core.store.get(NODE) == {}
    late = decode("gpu.attributed", run(core, "gpu.samples", sample(150.0))[0].value)
    assert late.jobs == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("short", ["slurm.jobs", "allocations", "gpu.samples", "gpu.events"])
@pytest.mark.parametrize("value", [b"not json", b'{"schema_version": 1, "node": "x"}', b"[]"])
def test_malformed_message_on_any_input_becomes_a_dead_letter(core: Correlator, short: str, value: bytes) -> None:
    [o] = core.handle(short, value, b"k", partition=3, offset=42)
    assert (o.topic, o.key) == ("deadletter", f"t.{short}")
    dl = decode("deadletter", o.value)
    assert isinstance(dl, DeadLetter)
    assert (dl.service, dl.source_topic, dl.partition, dl.offset, dl.key) == ("correlator", f"t.{short}", 3, 42, "k")
    assert base64.b64decode(dl.value_b64) == value
    assert dl.error.startswith("schema:") and dl.ts == 1234.0
    assert core.metrics is not None
    assert core.metrics.dead_lettered.labels(short)._value.get() == 1


def test_tombstone_is_dead_lettered(core: Correlator) -> None:
    [o] = core.handle("gpu.samples", None)
    assert o.topic == "deadletter"
    assert "empty value" in decode("deadletter", o.value).error  # type: ignore[attr-defined]


def test_handler_error_is_dead_lettered_and_processing_goes_on(core: Correlator) -> None:
    class Broken(MemoryAllocationStore):
        def get(self, node: str) -> dict[str, object] | None:
            raise RuntimeError("store down")

    c = Correlator(Broken(), topic)
    [o] = c.handle("gpu.samples", sample(1.0))
    assert o.topic == "deadletter"
    assert decode("deadletter", o.value).error == "handler: RuntimeError: store down"  # type: ignore[attr-defined]


def test_unknown_topic_is_a_programming_error(core: Correlator) -> None:
    with pytest.raises(KeyError):
        core.handle("failures", b"{}")


def test_metrics_count_in_and_out(core: Correlator) -> None:
    run(core, "slurm.jobs", job())
    run(core, "gpu.samples", sample(60.0))
    m = core.metrics
    assert m is not None
    assert m.messages_in.labels("gpu.samples")._value.get() == 1
    assert m.messages_out.labels("gpu.attributed")._value.get() == 1
    assert m.messages_out.labels("allocations")._value.get() == 1
