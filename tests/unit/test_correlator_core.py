"""The correlator's message handling (decode, join, dead-letter) without a broker."""

from __future__ import annotations

import base64

import orjson
import pytest

from gpuwarden.correlator.core import INPUT_TOPICS, OUTPUT_TOPICS, Correlator, MemoryAllocationStore, Output
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
    """Without a view: an ungated SlurmView (no hold), as in-process runs use it."""
    return Correlator(topic_name=topic, retention_s=600, metrics=ServiceMetrics("correlator"), clock=lambda: 1234.0)


def run(core: Correlator, short: str, value: bytes, key: bytes | None = None) -> list[Output]:
    """Handle one message; nothing is looped back (there is no ``allocations`` topic any more)."""
    outs = core.handle(short, value, key)
    assert all(o.topic in OUTPUT_TOPICS for o in outs)
    return outs


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


def test_job_is_applied_to_the_view_per_node(core: Correlator) -> None:
    """A JobState fans out into the view's allocations of each of its nodes; nothing is published."""
    assert core.handle("slurm.jobs", job(), b"1001") == []
    assert "allocations" not in INPUT_TOPICS + OUTPUT_TOPICS
    [alloc] = core.view.allocations(NODE).values()
    rec = orjson.loads(alloc.model_dump_json())
    assert rec["node"] == NODE and rec["job_id"] == "1001" and rec["gpus"] == [0, 1]
    assert (rec["user"], rec["start_ts"], rec["end_ts"], rec["state"]) == ("alice", 50.0, None, "RUNNING")
    assert core.view.allocations("other-node") == {}
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
        allocs = core.view.allocations(NODE)
        pure = attribute_sample(decode("gpu.samples", sample(ts)), allocs)  # type: ignore[arg-type]
        [s] = [o for o in run(core, "gpu.samples", sample(ts)) if o.topic == "gpu.attributed"]
        # The hot path writes ``attribution`` only when it is not the default ("known").
        assert s.value == orjson.dumps(pure.model_dump(mode="json", exclude_none=True, exclude={"attribution"}))
        assert decode("gpu.attributed", s.value) == pure and pure.attribution == "known"
        assert orjson.loads(s.value) | {"attribution": "known"} == orjson.loads(dumps(pure))


def test_sample_of_unknown_node_is_published_without_jobs(core: Correlator) -> None:
    [s] = run(core, "gpu.samples", sample(60.0))
    assert decode("gpu.attributed", s.value).jobs == []  # type: ignore[attr-defined]


def test_finished_job_expires_after_retention_in_event_time(core: Correlator) -> None:
    run(core, "slurm.jobs", job())
    run(core, "slurm.jobs", job("COMPLETED", ts=200.0, end_ts=190.0))
    late = decode("gpu.attributed", run(core, "gpu.samples", sample(150.0))[0].value)
    assert late.jobs  # type: ignore[attr-defined]
    # Ungated, event time is the newest JobState's ts: a job elsewhere passes the retention.
    other = JobState(job_id="2002", ts=190.0 + 600, state="RUNNING", nodes=["gpu-node-002"], gpus={"gpu-node-002": [0]})
    assert run(core, "slurm.jobs", other.to_json()) == []
    assert core.view.allocations(NODE) == {}
    late = decode("gpu.attributed", run(core, "gpu.samples", sample(150.0))[0].value)
    assert late.jobs == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("short", ["slurm.jobs", "slurm.watermarks", "gpu.samples", "gpu.events"])
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

    c = Correlator(topic_name=topic, windows=Broken())
    [o] = c.handle("gpu.samples", sample(1.0))
    assert o.topic == "deadletter"
    assert decode("deadletter", o.value).error == "handler: RuntimeError: store down"  # type: ignore[attr-defined]


def test_unknown_topic_is_a_programming_error(core: Correlator) -> None:
    with pytest.raises(KeyError):
        core.handle("failures", b"{}")
    with pytest.raises(KeyError):  # the internal topic of the faust app is gone
        core.handle("allocations", b"{}")


def test_metrics_count_in_and_out(core: Correlator) -> None:
    run(core, "slurm.jobs", job())
    run(core, "gpu.samples", sample(60.0))
    m = core.metrics
    assert m is not None
    assert m.messages_in.labels("slurm.jobs")._value.get() == 1
    assert m.messages_in.labels("gpu.samples")._value.get() == 1
    assert m.messages_out.labels("gpu.attributed")._value.get() == 1
    assert m.messages_out.labels("job.windows")._value.get() == 0
