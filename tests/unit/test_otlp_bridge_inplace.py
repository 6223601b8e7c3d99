"""The direct path's in-place export: over exports where series come, go and change job, the
requests one encoder updates in place equal (message for message, byte for byte) what a fresh
encoder gives for the same store; the request plan; the store's per-GPU attribute cache."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint
from opentelemetry.sdk.resources import Resource

from gpuwarden.otlp_bridge.encoder import MetricEncoder, plan_requests
from gpuwarden.otlp_bridge.metrics import (
    GPU_METRICS,
    GPU_MULTI_METRICS,
    OTEL_SHARED_DESCRIPTIONS,
    gpu_attributes,
    metric_attributes,
    prom_gpu_labels,
)
from gpuwarden.otlp_bridge.store import LatestStore, gpu_identity
from gpuwarden.shared.models import (
    Action,
    AttributedEvent,
    AttributedSample,
    Category,
    CostEstimate,
    EventKind,
    Failure,
    FailureState,
    GpuAttribution,
    GpuEvent,
    GpuSample,
    NodeSample,
    Severity,
)

NOW = 10_000.0
START_NS = 1_700_000_000_000_000_000
RESOURCE = Resource({"service.name": "t", "deployment.environment": "test"})


def gpu(index: int, step: int = 0, **kw: Any) -> GpuSample:
    """A fully populated GPU whose readings depend on ``step`` (a new value per export)."""
    base: dict[str, Any] = dict(
        index=index, uuid=f"GPU-{index}", pci_bus_id=f"0000:{index + 1:02x}:00.0", name="NVIDIA H100 80GB HBM3",
        utilization_gpu_pct=10.0 + step, utilization_memory_pct=5.0, memory_used_mib=1024 * (step + 1),
        memory_total_mib=81920, temperature_c=60 + step, memory_temperature_c=70.0, power_w=300.5 + step,
        power_limit_w=700, sm_clock_mhz=1980, memory_clock_mhz=2619, energy_j=1000.0 * (step + 1),
        ecc_sbe_volatile=step, ecc_dbe_volatile=0, pcie_replay_count=0, pcie_link_gen=5, pcie_link_width=16,
        throttle_reasons=["sw_power_cap"], tensor_activity_pct=30.0, sm_occupancy_pct=20.0 + step,
        pcie_tx_kbps=1000.0, pcie_rx_kbps=2000.0, performance_state=0, ecc_sbe_aggregate=step,
        ecc_dbe_aggregate=0, retired_pages_sbe=0, retired_pages_dbe=0, retired_pages_pending=False,
        remapped_rows_correctable=0, remapped_rows_uncorrectable=0,
        nvlinks=[{"link": k, "active": True, "crc_flit_errors": step, "crc_data_errors": 0, "replay_errors": k,
                  "recovery_errors": 0} for k in range(4)],
    )  # fmt: skip
    base.update(kw)
    return GpuSample(**base)


def job(index: int, job_id: str = "42", user: str = "alice") -> GpuAttribution:
    return GpuAttribution(gpu_index=index, job_id=job_id, user=user, partition="gpu", account="a")


def sample(node: str, ts: float, gpus: list[GpuSample], jobs: list[GpuAttribution]) -> AttributedSample:
    return AttributedSample(
        sample=NodeSample(node=node, ts=ts, collector_id="c", source="simulated", gpus=gpus,
                          driver_version="550.54.15"),
        jobs=jobs,
    )  # fmt: skip


def failure(state: FailureState = FailureState.OPEN, last_seen: float = NOW) -> Failure:
    return Failure(
        failure_id="f1", pattern="gpu-fallen-off-bus", rule_id="xid-79", category=Category.HARDWARE,
        severity=Severity.CRITICAL, node="n1", gpu_index=0, gpu_uuid="GPU-0", first_seen=NOW - 10,
        last_seen=last_seen, verdict="GPU 0 fell off the bus", recommended_action=Action.DRAIN, state=state,
        cost=CostEstimate(affected_gpus=1, usd_per_hour=2.5, gpu_hours_lost=0.01),
    )  # fmt: skip


def xid(ts: float) -> AttributedEvent:
    return AttributedEvent(
        event=GpuEvent(event_id="e1", node="n1", ts=ts, kind=EventKind.XID, code=79, gpu_index=0,
                       message="GPU has fallen off the bus.", raw="NVRM: Xid (PCI:0000:01:00): 79", source="kmsg"),
        job=job(0, "43", "bob-with-a-longer-name"),
    )  # fmt: skip


def n1(step: int, gpus: int = 2, job0: GpuAttribution | None = None, **kw: Any) -> AttributedSample:
    return sample("n1", NOW + step, [gpu(i, step, **kw) for i in range(gpus)], [job0 or job(0)])


def n2(step: int, indices: tuple[int, ...] = (0, 1, 2), **kw: Any) -> AttributedSample:
    return sample("n2", NOW + step, [gpu(i, step, **kw) for i in indices], [job(i, "7", "carol") for i in indices])


LONGER_JOB = job(0, "43", "bob-with-a-longer-name")
THROTTLED = ["hw_slowdown", "sw_power_cap"]


def n3(step: int) -> AttributedSample:
    return sample("n3", NOW + step, [gpu(k, step) for k in range(8)], [])


def update(store: LatestStore, what: str, i: int) -> None:
    """The store's input before export ``i`` of :data:`STEPS`."""
    base = {
        "first": [n1(i), n2(i)],
        "new readings": [n1(i), n2(i)],
        "a GPU appears": [n1(i, gpus=3), n2(i)],
        "a GPU is lost": [n1(i, gpus=3), n2(i, (0, 2))],
        "a job changes": [n1(i, 3, LONGER_JOB), n2(i, (0, 2))],
        "throttle, XID and a failure": [n1(i, 3, LONGER_JOB), n2(i, (0, 2), throttle_reasons=THROTTLED)],
        "new readings again": [n1(i, 3, LONGER_JOB), n2(i, (0, 2), throttle_reasons=THROTTLED)],
        "resolved, a new node": [n1(i, 3, LONGER_JOB), n2(i, (0, 2)), n3(i)],
        "back to the first job": [n1(i, 3), n2(i, (0, 2)), n3(i)],
    }[what]
    for s in base:
        store.update_sample(s)
    if what == "throttle, XID and a failure":
        store.update_event(xid(NOW + i))
        store.update_failure(failure(last_seen=NOW + i))
    if what == "resolved, a new node":
        store.update_failure(failure(FailureState.RESOLVED, NOW + i))


#: (what changes, whether the series are those of the export before)
STEPS = [("first", False), ("new readings", True), ("a GPU appears", False), ("a GPU is lost", False),
         ("a job changes", False), ("throttle, XID and a failure", False), ("new readings again", True),
         ("resolved, a new node", False), ("back to the first job", False)]  # fmt: skip
CASES = [("otel", 4_000_000, 100_000), ("otel", 10_000, 100_000), ("otel", 12_000, 7), ("dcgm", 10_000, 100_000),
         ("dcgm", 4_000_000, 5)]  # fmt: skip


def encode(enc: MetricEncoder, store: LatestStore, step: int) -> list[tuple[ExportMetricsServiceRequest, int]]:
    opens = [(g.attributes, g.count) for g in store.open_failures()]
    requests, n = enc.encode(store.views(), store.failure_counts(), opens, time_ns=START_NS + step * 10**9,
                             descriptions=OTEL_SHARED_DESCRIPTIONS)  # fmt: skip
    assert n == sum(k for _, k in requests)
    return requests


@pytest.mark.parametrize(("naming", "max_request_bytes", "cardinality_limit"), CASES)
def test_requests_updated_in_place_equal_a_fresh_encode(
    naming: str, max_request_bytes: int, cardinality_limit: int
) -> None:
    store = LatestStore(clock=lambda: NOW)
    kw: dict[str, Any] = dict(naming=naming, max_request_bytes=max_request_bytes, cardinality_limit=cardinality_limit,
                              start_time_ns=START_NS)  # fmt: skip
    enc = MetricEncoder(RESOURCE, "s", "1", **kw)
    before: list[ExportMetricsServiceRequest] = []
    kept_after_change = 0
    for step, (what, steady) in enumerate(STEPS):
        update(store, what, step)
        got = encode(enc, store, step)
        fresh_encoder = MetricEncoder(RESOURCE, "s", "1", **kw)
        want = encode(fresh_encoder, store, step)
        assert [r for r, _ in got] == [r for r, _ in want], what
        assert [n for _, n in got] == [n for _, n in want], what
        assert [r.SerializeToString() for r, _ in got] == [r.SerializeToString() for r, _ in want], what
        assert enc.series_over_limit == fresh_encoder.series_over_limit, what
        assert all(r.ByteSize() <= max_request_bytes for r, _ in got), what
        now = [r for r, _ in got]
        if steady:  # the same messages, only time and value set
            assert all(a is b for a, b in zip(now, before, strict=True)), what
        elif step:
            kept_after_change += sum(any(r is b for b in before) for r in now)
        before = now
    assert kept_after_change > 0  # changes rebuilt only some requests (or patched them in place)
    if cardinality_limit < 10:
        assert enc.series_over_limit["hw.errors" if naming == "otel" else "DCGM_FI_DEV_GPU_UTIL"] > 0


def naive_points(store: LatestStore, time_ns: int) -> dict[str, list[NumberDataPoint]]:
    """Each GPU metric's points as the catalog defines them, encoded one by one (no cache)."""
    out: dict[str, list[NumberDataPoint]] = {}
    views = store.views()

    def point(attrs: dict[str, Any], value: float) -> NumberDataPoint:
        return NumberDataPoint(attributes=_encode_attributes(attrs), start_time_unix_nano=START_NS,
                               time_unix_nano=time_ns, as_double=value)  # fmt: skip

    for spec in GPU_METRICS:
        out.setdefault(spec.otel_name, []).extend(
            point(metric_attributes(spec, e.attributes), v) for e, _ in views if (v := spec.value(e.gpu)) is not None
        )
    for multi in GPU_MULTI_METRICS:
        out[multi.otel_name] = [point({**e.attributes, **dict(zip(multi.otel_keys, vk, strict=True))}, v)
                                for e, view in views for vk, v in multi.points(view)]  # fmt: skip
    return {name: pts for name, pts in out.items() if pts}


def test_each_point_is_what_the_catalog_says_in_order_after_every_change() -> None:
    store = LatestStore(clock=lambda: NOW)
    enc = MetricEncoder(RESOURCE, "s", "1", start_time_ns=START_NS)
    for step, (what, _) in enumerate(STEPS):
        update(store, what, step)
        [(req, _)] = encode(enc, store, step)
        got = {m.name: list(getattr(m, m.WhichOneof("data")).data_points)
               for m in req.resource_metrics[0].scope_metrics[0].metrics}  # fmt: skip
        want = naive_points(store, START_NS + step * 10**9)
        assert {n: got[n] for n in want} == want, what
        assert set(got) - set(want) <= {"gpuwarden.failures", "gpuwarden.failure.open"}, what


def test_a_point_that_changes_in_place_has_its_new_attributes_time_and_value() -> None:
    store = LatestStore(clock=lambda: NOW)
    enc = MetricEncoder(RESOURCE, "s", "1", start_time_ns=START_NS)
    store.update_sample(n1(0))
    [(req, _)] = encode(enc, store, 0)
    store.update_sample(n1(1, job0=job(0, "43", "bob")))  # same length: the request is kept and patched
    [(again, _)] = encode(enc, store, 1)
    assert again is req
    [util] = [m for m in req.resource_metrics[0].scope_metrics[0].metrics if m.name == "hw.gpu.utilization"]
    p = util.gauge.data_points[0]
    attrs = {kv.key: kv.value.string_value for kv in p.attributes}
    assert (attrs["slurm.job.id"], attrs["slurm.user"], attrs["host.name"]) == ("43", "bob", "n1")
    assert (p.start_time_unix_nano, p.time_unix_nano, p.as_double) == (START_NS, START_NS + 10**9, 0.11)


def test_an_export_that_fails_half_way_leaves_no_stale_message_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    store = LatestStore(clock=lambda: NOW)
    enc = MetricEncoder(RESOURCE, "s", "1", start_time_ns=START_NS)
    store.update_sample(n1(0))
    encode(enc, store, 0)
    replan = MetricEncoder._replan

    def failing(self: MetricEncoder, *args: Any) -> None:
        replan(self, *args)  # kept requests patched to job 43...
        raise RuntimeError("boom")  # ...and the export fails before it is sent

    monkeypatch.setattr(MetricEncoder, "_replan", failing)
    store.update_sample(n1(1, job0=job(0, "43", "bob")))
    with pytest.raises(RuntimeError):
        encode(enc, store, 1)
    monkeypatch.undo()
    store.update_sample(n1(2))  # back to job 42, the series of the last export that went out
    got = encode(enc, store, 2)
    assert [r for r, _ in got] == [r for r, _ in encode(MetricEncoder(RESOURCE, "s", "1", start_time_ns=START_NS),
                                                        store, 2)]  # fmt: skip


def test_the_plan_cuts_big_metrics_where_a_few_bytes_more_do_not_move_them() -> None:
    a, b, small = ("big", "", "", "gauge"), ("next", "", "", "gauge"), ("small", "", "", "gauge")
    points = [b"x" * 200] * 100  # 232 bytes each with the overhead: 256-byte slots
    plan = plan_requests(100, 10_000, [(small, [b"y"] * 3), (a, points), (b, [b"z" * 10])])
    k = (10_000 - 100 - (len("big") + 32)) // 256
    assert plan[0] == ((small, 0, 3),)
    assert [seg for [seg] in plan[1:-1]] == [(a, s, min(100, s + k)) for s in range(0, 100, k)]
    assert plan[-1] == ((b, 0, 1),)  # a big metric's last request is its own
    longer = [b"x" * 210, *points[1:]]  # a job with a longer name: same slots, same cuts
    assert plan_requests(100, 10_000, [(small, [b"y"] * 3), (a, longer), (b, [b"z" * 10])]) == plan
    grown = plan_requests(100, 10_000, [(small, [b"y"] * 3), (a, [*points, b"x" * 200]), (b, [b"z" * 10])])
    assert grown[: len(plan) - 2] == plan[: len(plan) - 2]  # one point more: only the last cut moves
    assert plan_requests(100, 10_000, [(a, [])]) == []  # an empty metric is left out
    fits = plan_requests(100, 10_000, [(small, [b"y" * 4000]), (b, [b"z" * 4000]), (a, [b"x" * 4000])])
    assert fits == [((small, 0, 1), (b, 0, 1)), ((a, 0, 1),)]  # whole metrics while they fit


# -- the store: a steady GPU keeps its attribute dict and labels ---------------------------


def test_a_steady_gpu_keeps_its_attributes_and_labels_objects() -> None:
    store = LatestStore(clock=lambda: NOW)
    store.update_sample(n1(0))
    [e0, _] = store.gpus()
    store.update_sample(n1(1))
    [e1, _] = store.gpus()
    assert e1.gpu.utilization_gpu_pct == 11.0 and e1.ts == NOW + 1
    assert e1.attributes is e0.attributes and e1.labels is e0.labels
    store.update_sample(n1(2, job0=job(0, "43")))  # a new job: new attributes
    [e2, _] = store.gpus()
    assert e2.attributes["slurm.job.id"] == "43" and e2.labels[5] == "43"
    assert e2.attributes is not e1.attributes
    s = n1(3, job0=job(0, "43"))
    s.sample.__dict__["driver_version"] = "560.1"  # pydantic models are frozen: a new driver version
    store.update_sample(s)
    [e3, _] = store.gpus()
    assert e3.attributes["hw.driver_version"] == "560.1" and e3.attributes is not e2.attributes


def test_attributes_and_labels_depend_only_on_the_identity_fields() -> None:
    """What the store's cache key leaves out must not change a GPU's attributes or labels."""
    full, bare = gpu(3, 5), GpuSample(index=3, uuid="GPU-3", pci_bus_id="0000:04:00.0", name="NVIDIA H100 80GB HBM3")
    assert set(full.model_fields_set) > {"index", "uuid", "pci_bus_id", "name"}
    j = GpuAttribution(gpu_index=3, job_id="9", user="u", partition="p", account="a", job_start_ts=1.0, job_gpus=8)
    j_bare = GpuAttribution(gpu_index=3, job_id="9", user="u", partition="p", account="a")
    assert gpu_identity(full, j, "550") == gpu_identity(bare, j_bare, "550")
    assert gpu_attributes("n", full, j, "550") == gpu_attributes("n", bare, j_bare, "550")
    assert prom_gpu_labels("n", full, j) == prom_gpu_labels("n", bare, j_bare)
    for changed in (bare.model_copy(update={"uuid": "GPU-x"}), bare.model_copy(update={"pci_bus_id": "x"}),
                    bare.model_copy(update={"name": "x"})):  # fmt: skip
        assert gpu_identity(changed, j, "550") != gpu_identity(bare, j, "550")
    for field in ("job_id", "user", "partition", "account"):
        other = j.model_copy(update={field: "x"})
        assert gpu_identity(bare, other, "550") != gpu_identity(bare, j, "550"), field
        assert gpu_attributes("n", bare, other, "550") != gpu_attributes("n", bare, j, "550"), field
    assert gpu_identity(bare, None, "550") != gpu_identity(bare, j, "550")
    assert gpu_identity(bare, j, "551") != gpu_identity(bare, j, "550")
