"""The otlp-bridge's direct (fast) metric path on the OTLP exporter packages, new signals (hw.errors,
hw.status, XID and node-state logs), dcgm naming, bounds and export accounting. Network only on loopback, in-process."""

from __future__ import annotations

import gzip
import http.server
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.otlp_bridge import OtlpBridge, OtlpBridgeService, OtlpBridgeSettings
from gpuwarden.otlp_bridge.dcgm import DCGM_LABELS, DCGM_METRICS, dcgm_labels
from gpuwarden.otlp_bridge.direct import DirectMetricExporter
from gpuwarden.otlp_bridge.encoder import MetricEncoder
from gpuwarden.otlp_bridge.exporters import MetricNameCaseExporter, build_otlp_exporters
from gpuwarden.otlp_bridge.logs import event_log, node_state_log
from gpuwarden.otlp_bridge.metrics import OTEL_SHARED_DESCRIPTIONS, GpuView, error_counts, gpu_state
from gpuwarden.otlp_bridge.store import LatestStore
from gpuwarden.otlp_bridge.transports import GrpcMetricTransport, HttpMetricTransport
from gpuwarden.shared.models import (
    Action,
    AttributedEvent,
    AttributedSample,
    Category,
    CostEstimate,
    EventKind,
    Failure,
    GpuAttribution,
    GpuEvent,
    GpuSample,
    NodeSample,
    NodeState,
    Severity,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "otlp"))
from receiver import OtlpReceiver, any_value

NOW = 10_000.0
JOB = GpuAttribution(gpu_index=0, job_id="42", user="alice", partition="gpu")


def gpu(index: int, **kw: Any) -> GpuSample:
    base: dict[str, Any] = dict(
        index=index, uuid=f"GPU-{index}", pci_bus_id=f"0000:{index:02x}:00.0", name="NVIDIA H100",
        utilization_gpu_pct=50.0, utilization_memory_pct=10.0, memory_used_mib=1024, memory_total_mib=81920,
        temperature_c=60.0, memory_temperature_c=70.0, power_w=300.0, power_limit_w=700.0, sm_clock_mhz=1980,
        memory_clock_mhz=2619, energy_j=1000.0, ecc_sbe_volatile=3, ecc_dbe_volatile=0, pcie_replay_count=7,
        pcie_link_gen=5, pcie_link_width=16, throttle_reasons=["sw_power_cap", "sw_thermal_slowdown"],
    )  # fmt: skip
    base.update(kw)
    return GpuSample(**base)


def sample(
    node: str = "n1", ts: float = NOW, gpus: list[GpuSample] | None = None, jobs: Any = None
) -> AttributedSample:
    return AttributedSample(
        sample=NodeSample(node=node, ts=ts, collector_id="c", source="simulated", gpus=gpus or [gpu(0), gpu(1)],
                          driver_version="550.54.15"),
        jobs=[JOB] if jobs is None else jobs,
    )  # fmt: skip


def xid(
    event_id: str = "e1",
    code: int = 79,
    gpu_index: int | None = 0,
    kind: EventKind = EventKind.XID,
    ts: float = NOW - 1,
) -> AttributedEvent:
    return AttributedEvent(
        event=GpuEvent(event_id=event_id, node="n1", ts=ts, kind=kind, code=code, gpu_index=gpu_index,
                       pci_bus_id="0000:00:00.0", gpu_uuid="GPU-0", pid=123, process_name="python",
                       message="GPU has fallen off the bus.", raw=f"NVRM: Xid (PCI:0000:00:00): {code}, ...",
                       source="kmsg"),
        job=JOB,
    )  # fmt: skip


def failure(severity: Severity = Severity.CRITICAL, **kw: Any) -> Failure:
    base: dict[str, Any] = dict(
        failure_id="f1", pattern="gpu-fallen-off-bus", rule_id="xid-79", category=Category.HARDWARE,
        severity=severity, node="n1", gpu_index=0, gpu_uuid="GPU-0", first_seen=NOW - 10, last_seen=NOW - 2,
        verdict="GPU 0 fell off the bus", recommended_action=Action.DRAIN,
        cost=CostEstimate(affected_gpus=1, usd_per_hour=2.5, gpu_hours_lost=0.01),
    )  # fmt: skip
    base.update(kw)
    return Failure(**base)


def decode(requests: list[tuple[metrics_service_pb2.ExportMetricsServiceRequest, int]]) -> dict[str, dict[str, Any]]:
    """{name: {"unit", "kind", "monotonic", "points": {frozenset(attrs): value}}} of encoded requests
    (serialised and parsed again, as a receiver gets them)."""
    out: dict[str, dict[str, Any]] = {}
    for message, _ in requests:
        req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(message.SerializeToString())
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    data = getattr(m, kind)
                    entry = out.setdefault(m.name, {"unit": m.unit, "kind": kind, "points": {},
                                                    "monotonic": getattr(data, "is_monotonic", None)})  # fmt: skip
                    for p in data.data_points:
                        attrs = frozenset((kv.key, _hashable(any_value(kv.value))) for kv in p.attributes)
                        entry["points"][attrs] = p.as_double
    return out


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


class CapturingMetricExporter(MetricExporter):
    """Keeps the last ``MetricsData`` exported to it."""

    def __init__(self) -> None:
        super().__init__()
        self.data: MetricsData | None = None

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kw: Any) -> MetricExportResult:
        self.data = metrics_data
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
        pass


class CapturingReader(PeriodicExportingMetricReader):
    """An SDK reader whose exports land in a :class:`CapturingMetricExporter` behind ``wrap``."""

    def __init__(self, wrap: Any = lambda e: e) -> None:
        self.sink = CapturingMetricExporter()
        super().__init__(wrap(self.sink), export_interval_millis=3_600_000)

    def get_metrics_data(self) -> MetricsData | None:
        self.force_flush()
        return self.sink.data


def sdk_points(bridge: OtlpBridge, reader: InMemoryMetricReader | CapturingReader) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = type(m.data).__name__.lower()
                entry = out.setdefault(m.name, {"unit": m.unit, "kind": kind, "points": {},
                                                "monotonic": getattr(m.data, "is_monotonic", None)})  # fmt: skip
                for p in m.data.data_points:
                    attrs = frozenset((k, _hashable(v)) for k, v in p.attributes.items())
                    entry["points"][attrs] = float(p.value)
    return out


@pytest.fixture
def sdk_bridge() -> Iterator[tuple[OtlpBridge, InMemoryMetricReader, InMemoryLogRecordExporter]]:
    reader, logs = InMemoryMetricReader(), InMemoryLogRecordExporter()
    b = OtlpBridge(resource=Resource({"service.name": "t"}), metric_readers=[reader], log_exporters=[logs],
                   log_processor="simple", clock=lambda: NOW)  # fmt: skip
    b.start()
    yield b, reader, logs
    b.stop()


#: NVLink, profiling (GPM), PCIe throughput, fan, P-state, retirement and remap readings of one GPU
PROFILED: dict[str, Any] = dict(
    nvlinks=[{"link": 1, "active": False, "crc_flit_errors": 2, "replay_errors": 1},
             {"link": 0, "active": True, "crc_flit_errors": 5, "crc_data_errors": 1, "replay_errors": 0,
              "recovery_errors": 3}],
    tensor_activity_pct=42.0, sm_occupancy_pct=25.0, pcie_tx_kbps=1000.0, pcie_rx_kbps=2000.0, fan_speed_pct=30.0,
    performance_state=0, ecc_sbe_aggregate=11, ecc_dbe_aggregate=2, retired_pages_sbe=4, retired_pages_dbe=1,
    retired_pages_pending=False, remapped_rows_correctable=6, remapped_rows_uncorrectable=0,
)  # fmt: skip


def direct_and_sdk(
    b: OtlpBridge, reader: InMemoryMetricReader | CapturingReader, naming: str = "otel"
) -> dict[str, dict[str, Any]]:
    """The direct encoding of ``b``'s store, asserted equal to what the SDK path exports."""
    sdk = sdk_points(b, reader)
    enc = MetricEncoder(b.resource, "s", "1", naming=naming)  # type: ignore[arg-type]
    requests, n = enc.encode(b.store.views(), b.store.failure_counts(),
                             [(g.attributes, g.count) for g in b.store.open_failures()],
                             descriptions=OTEL_SHARED_DESCRIPTIONS)  # fmt: skip
    direct = decode(requests)
    assert set(direct) == set(sdk)
    for name, d in direct.items():
        s = sdk[name]
        assert (d["unit"], d["kind"], d["monotonic"]) == (s["unit"], s["kind"], s["monotonic"]), name
        assert d["points"] == pytest.approx(s["points"]), name
    assert n == sum(len(d["points"]) for d in direct.values())
    return direct


def gpu_points(direct: dict[str, dict[str, Any]], name: str, hw_id: str, *keys: str) -> dict[Any, float]:
    """{values of ``keys``: value} of metric ``name``'s points on GPU ``hw_id``."""
    out = {}
    for a, v in direct.get(name, {"points": {}})["points"].items():
        d = dict(a)
        if d.get("hw.id", d.get("UUID")) == hw_id:
            out[tuple(d[k] for k in keys) if len(keys) != 1 else d[keys[0]]] = v
    return out


def test_direct_encoding_equals_the_sdk_path(sdk_bridge: tuple[OtlpBridge, InMemoryMetricReader, Any]) -> None:
    b, reader, _ = sdk_bridge
    b.on_sample(sample(gpus=[gpu(0, **PROFILED), gpu(1)]))
    b.on_event(xid())
    b.on_failure(failure())
    direct = direct_and_sdk(b, reader)
    errors = gpu_points(direct, "hw.errors", "GPU-0", "error.type")
    assert errors == {"corrected": 3, "uncorrected": 0, "pcie_replay": 7, "xid_79": 1, "nvlink_crc_flit": 7,
                      "nvlink_crc_data": 1, "nvlink_replay": 1, "nvlink_recovery": 3}  # fmt: skip
    assert gpu_points(direct, "hw.errors", "GPU-1", "error.type") == {"corrected": 3, "uncorrected": 0,
                                                                      "pcie_replay": 7}  # fmt: skip
    nvl = direct["gpuwarden.gpu.nvlink.errors"]
    assert (nvl["unit"], nvl["kind"], nvl["monotonic"]) == ("{error}", "sum", True)
    assert gpu_points(direct, "gpuwarden.gpu.nvlink.errors", "GPU-0", "gpuwarden.nvlink.link", "error.type") == {
        (0, "crc_flit"): 5, (0, "crc_data"): 1, (0, "replay"): 0, (0, "recovery"): 3,
        (1, "crc_flit"): 2, (1, "replay"): 1}  # fmt: skip
    assert gpu_points(direct, "gpuwarden.gpu.nvlink.active", "GPU-0", "gpuwarden.nvlink.link") == {0: 1, 1: 0}
    assert gpu_points(direct, "gpuwarden.gpu.tensor.activity", "GPU-0") == {(): pytest.approx(0.42)}
    assert gpu_points(direct, "gpuwarden.gpu.sm.occupancy", "GPU-0") == {(): 0.25}
    assert gpu_points(direct, "gpuwarden.gpu.fan.speed", "GPU-0") == {(): pytest.approx(0.30)}
    assert gpu_points(direct, "gpuwarden.gpu.performance_state", "GPU-0") == {(): 0}
    assert gpu_points(direct, "gpuwarden.gpu.pcie.throughput", "GPU-0", "network.io.direction") == {
        "transmit": 1_024_000, "receive": 2_048_000}  # fmt: skip
    assert direct["gpuwarden.gpu.pcie.throughput"]["unit"] == "By/s"
    assert gpu_points(direct, "gpuwarden.gpu.memory.ecc.errors.lifetime", "GPU-0", "error.type") == {
        "corrected": 11, "uncorrected": 2}  # fmt: skip
    assert gpu_points(direct, "gpuwarden.gpu.memory.retired_pages", "GPU-0", "gpuwarden.retirement.cause") == {
        "multiple_sbe": 4, "dbe": 1}  # fmt: skip
    assert gpu_points(direct, "gpuwarden.gpu.memory.retired_pages.pending", "GPU-0") == {(): 0}
    assert gpu_points(direct, "gpuwarden.gpu.memory.remapped_rows", "GPU-0", "gpuwarden.remap.cause") == {
        "correctable": 6, "uncorrectable": 0}  # fmt: skip
    # GPU 1 reports none of them: no point (never 0)
    for name in ("gpuwarden.gpu.nvlink.errors", "gpuwarden.gpu.nvlink.active", "gpuwarden.gpu.tensor.activity",
                 "gpuwarden.gpu.sm.occupancy", "gpuwarden.gpu.pcie.throughput", "gpuwarden.gpu.fan.speed",
                 "gpuwarden.gpu.memory.retired_pages", "gpuwarden.gpu.memory.remapped_rows"):  # fmt: skip
        assert gpu_points(direct, name, "GPU-1") == {}, name


def test_dcgm_naming_direct_equals_the_sdk_path() -> None:
    raw = InMemoryMetricReader()
    b = OtlpBridge(resource=Resource({}), metric_readers=[raw], naming="dcgm", clock=lambda: NOW)
    b.start()
    b.on_sample(sample())
    assert "dcgm_fi_dev_gpu_util" in sdk_points(b, raw)  # the SDK lower-cases instrument names...
    b.stop()
    # ...so the sdk path wraps its exporter to spell them as dcgm-exporter does
    reader = CapturingReader(lambda e: MetricNameCaseExporter(e, (d.name for d in DCGM_METRICS)))
    b = OtlpBridge(resource=Resource({"service.name": "t"}), metric_readers=[reader], naming="dcgm",
                   clock=lambda: NOW)  # fmt: skip
    b.start()
    try:
        b.on_sample(sample(gpus=[gpu(0, **PROFILED), gpu(1)]))
        b.on_event(xid("e1", code=48))
        b.on_event(xid("e2", code=79))
        b.on_event(xid("e0", code=13, ts=NOW - 5))  # older (event time): not the last XID
        b.on_failure(failure())
        direct = direct_and_sdk(b, reader, naming="dcgm")
    finally:
        b.stop()
    assert not any(n.startswith(("hw.", "gpuwarden.gpu.")) for n in direct)
    want = {"DCGM_FI_DEV_XID_ERRORS": 79, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.42, "DCGM_FI_PROF_SM_OCCUPANCY": 0.25,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 7, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 1,
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 1, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 3,
            "DCGM_FI_PROF_PCIE_TX_BYTES": 1_024_000, "DCGM_FI_PROF_PCIE_RX_BYTES": 2_048_000,
            "DCGM_FI_DEV_FAN_SPEED": 30, "DCGM_FI_DEV_PSTATE": 0, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 11,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 2, "DCGM_FI_DEV_RETIRED_SBE": 4, "DCGM_FI_DEV_RETIRED_DBE": 1,
            "DCGM_FI_DEV_RETIRED_PENDING": 0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 6,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0}  # fmt: skip
    for name, value in want.items():
        assert gpu_points(direct, name, "GPU-0") == {(): pytest.approx(value)}, name
        assert gpu_points(direct, name, "GPU-1") == {}, name  # not reported (no XID on GPU 1): absent
    assert direct["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]["monotonic"] is True
    assert direct["DCGM_FI_DEV_XID_ERRORS"]["kind"] == "gauge"
    [attrs] = direct["DCGM_FI_DEV_XID_ERRORS"]["points"]
    assert dict(attrs)["hpc_job"] == "42" and dict(attrs)["Hostname"] == "n1"


def test_xid_counts_do_not_carry_over_to_the_next_job(
    sdk_bridge: tuple[OtlpBridge, InMemoryMetricReader, Any],
) -> None:
    b, reader, _ = sdk_bridge
    job43 = GpuAttribution(gpu_index=0, job_id="43", user="bob", partition="gpu")

    def xids(direct: dict[str, dict[str, Any]]) -> dict[tuple[str, str], float]:
        return {(d["slurm.job.id"], d["error.type"]): v for a, v in direct["hw.errors"]["points"].items()
                if (d := dict(a))["hw.id"] == "GPU-0" and str(d["error.type"]).startswith("xid")}  # fmt: skip

    b.on_sample(sample(jobs=[JOB]))
    b.on_event(xid("e1"))
    b.on_event(xid("e2"))
    assert xids(direct_and_sdk(b, reader)) == {("42", "xid_79"): 2}
    b.on_sample(sample(ts=NOW + 10, jobs=[job43]))  # the GPU moves to job 43: job 42's series ends
    assert xids(direct_and_sdk(b, reader)) == {}
    b.on_event(AttributedEvent(event=xid("e3").event.model_copy(update={"event_id": "e3", "ts": NOW + 11}),
                               job=job43))  # fmt: skip
    b.on_event(xid("e4"))  # a late event of job 42: logged, not counted under job 43
    assert xids(direct_and_sdk(b, reader)) == {("43", "xid_79"): 1}
    samples = [s for f in text_string_to_metric_families(generate_latest(registry(b)).decode()) for s in f.samples]
    # /metrics (job labels on gpuwarden_gpu_job_info): the GPU's XID series counts job 43's events only
    prom = {
        s.labels["error_type"]: s.value
        for s in samples
        if s.name == "gpuwarden_gpu_errors_total" and s.labels["gpu"] == "0" and s.labels["error_type"][:3] == "xid"
    }
    assert prom == {"xid_79": 1}
    assert [s.labels["job_id"] for s in samples if s.name == "gpuwarden_gpu_job_info" and s.labels["gpu"] == "0"] == [
        "43"
    ]


def registry(b: OtlpBridge) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(b.collector)
    return reg


def test_prometheus_exposes_nvlink_and_profiling_series() -> None:
    b = OtlpBridge(resource=Resource({}), clock=lambda: NOW)
    b.on_sample(sample(gpus=[gpu(0, **PROFILED), gpu(1)]))
    samples = [s for f in text_string_to_metric_families(generate_latest(registry(b)).decode()) for s in f.samples]

    def values(name: str, *labels: str) -> dict[Any, float]:
        return {tuple(s.labels[k] for k in labels): s.value for s in samples if s.name == name}

    assert values("gpuwarden_gpu_nvlink_errors_total", "gpu", "link", "error_type") == {
        ("0", "0", "crc_flit"): 5, ("0", "0", "crc_data"): 1, ("0", "0", "replay"): 0, ("0", "0", "recovery"): 3,
        ("0", "1", "crc_flit"): 2, ("0", "1", "replay"): 1}  # fmt: skip
    assert values("gpuwarden_gpu_nvlink_active", "gpu", "link") == {("0", "0"): 1, ("0", "1"): 0}
    assert values("gpuwarden_gpu_tensor_activity_ratio", "gpu") == {("0",): pytest.approx(0.42)}
    assert values("gpuwarden_gpu_sm_occupancy_ratio", "gpu") == {("0",): 0.25}
    assert values("gpuwarden_gpu_pcie_transmit_bytes_per_second", "gpu") == {("0",): 1_024_000}
    assert values("gpuwarden_gpu_errors_total", "gpu", "error_type")[("0", "nvlink_crc_flit")] == 7
    assert values("gpuwarden_gpu_ecc_errors_lifetime_total", "gpu", "error_type") == {
        ("0", "corrected"): 11, ("0", "uncorrected"): 2}  # fmt: skip
    assert values("gpuwarden_gpu_retired_pages", "gpu", "cause") == {("0", "multiple_sbe"): 4, ("0", "dbe"): 1}
    assert values("gpuwarden_gpu_remapped_rows", "gpu", "cause") == {("0", "correctable"): 6,
                                                                    ("0", "uncorrectable"): 0}  # fmt: skip
    d = OtlpBridge(resource=Resource({}), naming="dcgm", clock=lambda: NOW)
    d.on_sample(sample(gpus=[gpu(0, **PROFILED), gpu(1)]))
    d.on_event(xid())
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry(d)).decode())}
    assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples} == {
        "0": pytest.approx(0.42)}  # fmt: skip
    assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples} == {"0": 79}
    assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"].samples} == {
        "0": 7}  # fmt: skip


def test_requests_are_split_under_the_size_limit() -> None:
    store = LatestStore(clock=lambda: NOW)
    for n in range(20):
        store.update_sample(sample(f"n{n}", gpus=[gpu(i) for i in range(8)], jobs=[]))
    one = MetricEncoder(Resource({"service.name": "t"}), "s", "1").encode(store.views())
    enc = MetricEncoder(Resource({"service.name": "t"}), "s", "1", max_request_bytes=20_000)
    requests, n = enc.encode(store.views())
    assert len(one[0]) == 1 and len(requests) > 5
    assert all(len(req.SerializeToString()) <= 20_000 for req, _ in requests)
    assert sum(k for _, k in requests) == n == one[1]
    assert decode(requests) == decode(one[0])
    with pytest.raises(ValueError, match="max_request_bytes"):
        MetricEncoder(Resource({}), "s", "1", max_request_bytes=100)


def test_series_over_the_cardinality_limit_are_reported(
    sdk_bridge: tuple[OtlpBridge, InMemoryMetricReader, Any],
) -> None:
    store = LatestStore(clock=lambda: NOW)
    store.update_sample(sample(gpus=[gpu(i) for i in range(6)], jobs=[]))
    enc = MetricEncoder(Resource({}), "s", "1", cardinality_limit=4)
    requests, _ = enc.encode(store.views())
    assert enc.series_over_limit["hw.power"] == 2
    assert enc.series_over_limit["hw.temperature"] == 8  # 6 GPUs x 2 sensors
    assert len(decode(requests)["hw.power"]["points"]) == 4
    # the SDK path: points beyond limit - 1 are left out (not folded into overflow) and reported
    reader = InMemoryMetricReader()
    b = OtlpBridge(resource=Resource({}), metric_readers=[reader], cardinality_limit=4, clock=lambda: NOW)
    b.start()
    try:
        b.on_sample(sample(gpus=[gpu(i) for i in range(6)], jobs=[]))
        pts = sdk_points(b, reader)
        assert len(pts["hw.power"]["points"]) == 3
        assert not any(("otel.metric.overflow", True) in a for a in pts["hw.power"]["points"])
        assert b.series_over_limit["hw.power"] == 3
        reg = CollectorRegistry()
        reg.register(b.collector)
        assert 'gpuwarden_otlp_series_over_limit{metric="hw.power"} 3.0' in generate_latest(reg).decode()
    finally:
        b.stop()


def test_mapping_of_errors_status_events_and_node_states() -> None:
    g = gpu(0)
    assert error_counts(GpuView(g, {"xid_79": 2, "sxid_12": 1})) == [
        ("corrected", 3), ("uncorrected", 0), ("pcie_replay", 7), ("sxid_12", 1), ("xid_79", 2)]  # fmt: skip
    assert error_counts(GpuView(GpuSample(index=0))) == []
    assert gpu_state(GpuView(g)) == "ok"
    assert gpu_state(GpuView(g, worst_open=Severity.WARNING)) == "degraded"
    assert gpu_state(GpuView(gpu(0, remapped_rows_pending=True))) == "degraded"
    assert gpu_state(GpuView(gpu(0, ecc_dbe_volatile=1))) == "degraded"
    assert gpu_state(GpuView(gpu(0, remapped_rows_failure=True))) == "failed"
    assert gpu_state(GpuView(g, worst_open=Severity.FATAL)) == "failed"
    rec = event_log(xid())
    assert (rec.event_name, rec.severity_text, rec.timestamp_ns) == (
        "gpuwarden.gpu.xid",
        "WARN",
        round((NOW - 1) * 1e9),
    )
    assert rec.body.startswith("NVRM: Xid")
    assert rec.attributes["gpu.xid"] == 79 and rec.attributes["slurm.job.id"] == "42"
    assert rec.attributes["process.pid"] == 123 and rec.attributes["hw.id"] == "GPU-0"
    lost = event_log(xid(kind=EventKind.GPU_LOST, code=None))  # type: ignore[arg-type]
    assert (lost.event_name, lost.severity_text) == ("gpuwarden.gpu.gpu_lost", "ERROR")
    assert "gpu.xid" not in lost.attributes
    ns = node_state_log(NodeState(node="n1", ts=NOW, state="mixed", flags=["drain"], reason="xid 79",
                                  partitions=["gpu"]))  # fmt: skip
    assert (ns.body, ns.severity_text, ns.event_name) == ("n1: MIXED+DRAIN (xid 79)", "WARN", "gpuwarden.node.state")
    assert ns.attributes["slurm.node.partitions"] == ["gpu"]
    assert node_state_log(NodeState(node="n1", ts=NOW, state="IDLE")).severity_text == "INFO"


def test_xid_events_count_once_and_go_with_their_gpu(
    sdk_bridge: tuple[OtlpBridge, Any, InMemoryLogRecordExporter],
) -> None:
    b, _, logs = sdk_bridge
    b.on_sample(sample())
    b.on_event(xid("e1"))
    b.on_event(xid("e1"))  # duplicate: neither counted nor logged
    b.on_event(xid("e2", code=48))
    b.on_event(xid("e3", kind=EventKind.NVLINK, code=None))  # type: ignore[arg-type]  # logged, not counted
    b.on_event(xid("e4", gpu_index=None))  # no GPU: logged, not counted
    assert len(logs.get_finished_logs()) == 4
    [(_, view0)] = [(e, v) for e, v in b.store.views() if e.index == 0]
    assert dict(view0.event_errors) == {"xid_79": 1, "xid_48": 1}
    b.store.staleness_s = 60
    b.store.update_sample(sample(ts=NOW + 100, gpus=[gpu(1)]))  # GPU 0 goes stale: its counts go too
    assert [e.index for e, _ in b.store.views()] == [1]
    assert b.store._event_errors == {}


def test_node_state_changes_only_are_logged(sdk_bridge: tuple[OtlpBridge, Any, InMemoryLogRecordExporter]) -> None:
    b, _, logs = sdk_bridge
    assert b.on_node_state(NodeState(node="n1", ts=NOW - 30, state="IDLE", snapshot=True))
    assert not b.on_node_state(NodeState(node="n1", ts=NOW - 20, state="IDLE", snapshot=True))
    assert b.on_node_state(NodeState(node="n1", ts=NOW - 10, state="IDLE", flags=["DRAIN"], reason="bad"))
    assert not b.on_node_state(NodeState(node="n1", ts=NOW - 15, state="IDLE"))  # older: ignored
    assert [r.log_record.body for r in logs.get_finished_logs()] == ["n1: IDLE", "n1: IDLE+DRAIN (bad)"]


def test_memory_bounds() -> None:
    store = LatestStore(clock=lambda: NOW, max_gpus=3, max_nodes=2)
    assert store.update_sample(sample(gpus=[gpu(0), gpu(1)], jobs=[])) == 2
    assert store.update_sample(sample("n2", gpus=[gpu(0), gpu(1)], jobs=[])) == 1
    assert store.gpus_refused == 1 and len(store) == 3
    for node in ("a", "b", "c"):
        store.update_node_state(NodeState(node=node, ts=NOW, state="IDLE"))
    assert store.nodes_forgotten == 1


def test_gpu_status_follows_open_failures(sdk_bridge: tuple[OtlpBridge, InMemoryMetricReader, Any]) -> None:
    b, reader, _ = sdk_bridge
    b.on_sample(sample())
    b.on_failure(failure(Severity.WARNING))
    status = sdk_points(b, reader)["hw.status"]["points"]
    got = {(dict(a)["hw.id"], dict(a)["hw.state"]): v for a, v in status.items() if v == 1}
    assert got == {("GPU-0", "degraded"): 1, ("GPU-1", "ok"): 1}


# -- export: drop accounting, the exporter packages' retry ----------------------------------


class FakeTransport:
    """Scripted outcomes: an int = delivered with that many points rejected, None = not
    delivered; ``tries`` = attempts the exporter package would have made for it."""

    def __init__(self, script: list[tuple[int | None, int]]) -> None:
        self.script = script
        self.sent: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.attempts = 0

    def send(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> int | None:
        self.sent.append(request)
        rejected, tries = self.script.pop(0) if self.script else (0, 1)
        self.attempts += tries
        return rejected

    def close(self) -> None:
        pass


def exporter(script: list[tuple[int | None, int]]) -> DirectMetricExporter:
    store = LatestStore(clock=lambda: NOW)
    store.update_sample(sample(jobs=[]))
    return DirectMetricExporter(store, MetricEncoder(Resource({}), "s", "1"), FakeTransport(script))


def test_delivered_dropped_and_rejected_points_are_counted() -> None:
    exp = exporter([(0, 5)])  # delivered after 4 retries
    assert exp.export_once()
    assert exp.stats.retries == 4 and exp.stats.points_dropped == 0
    assert exp.stats.points_exported == exp.stats.last_export_points > 0
    exp = exporter([(None, 3)])  # given up after the exporter's retries
    assert not exp.export_once()
    assert exp.stats.points_dropped == exp.stats.last_export_points > 0
    assert (exp.stats.points_exported, exp.stats.requests_failed, exp.stats.retries) == (0, 1, 2)
    exp = exporter([(5, 1)])  # partial success: 5 rejected
    assert not exp.export_once()
    assert exp.stats.points_dropped == 5
    assert exp.stats.points_exported == exp.stats.last_export_points - 5


class FlakyMetrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    """UNAVAILABLE for the first ``failures`` calls, then accepts, rejecting ``rejected`` points."""

    def __init__(self, failures: int, rejected: int = 0) -> None:
        self.failures, self.rejected, self.calls = failures, rejected, 0

    def Export(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "down for a moment")
        resp = metrics_service_pb2.ExportMetricsServiceResponse()
        resp.partial_success.rejected_data_points = self.rejected
        return resp


@pytest.fixture
def flaky() -> Iterator[tuple[FlakyMetrics, str]]:
    servicer = FlakyMetrics(failures=1, rejected=2)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_grpc_transport_retries_with_the_exporter_package_and_reads_partial_success(
    flaky: tuple[FlakyMetrics, str],
) -> None:
    servicer, endpoint = flaky
    b = OtlpBridge(resource=Resource({}), clock=lambda: NOW, export_interval_s=3600,
                   metric_transports=[GrpcMetricTransport(endpoint=endpoint, insecure=True, timeout=10)])  # fmt: skip
    b.start()
    try:
        b.on_sample(sample(jobs=[]))
        assert not b.force_flush()  # delivered after one retry (backoff ~1 s), 2 points rejected
        stats = b.export_stats()
        assert servicer.calls == 2 and stats["export_retries"] == 1
        [exp] = b.direct_exporters
        assert stats["points_dropped"] == 2
        assert stats["points_exported"] == exp.stats.last_export_points - 2 > 0
    finally:
        b.stop(1)


def test_a_down_receiver_is_retryable_and_counted_on_the_bridge() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    grpc_t = GrpcMetricTransport(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=0.5)
    http_t = HttpMetricTransport(endpoint=f"http://127.0.0.1:{port}/v1/metrics", timeout=0.5)
    assert grpc_t.send(req) is None and grpc_t.attempts >= 1
    assert http_t.send(req) is None and http_t.attempts >= 1
    http_t.close()
    b = OtlpBridge(resource=Resource({}), metric_transports=[grpc_t], export_interval_s=3600, clock=lambda: NOW)
    b.start()
    try:
        b.on_sample(sample(jobs=[]))
        assert not b.force_flush()
        stats = b.export_stats()
        assert stats["points_dropped"] > 0 and stats["points_exported"] == 0
        reg = CollectorRegistry()
        reg.register(b.collector)
        text = generate_latest(reg).decode()
        assert f"gpuwarden_otlp_points_dropped_total {stats['points_dropped']}" in text
    finally:
        b.stop(1)


def test_grpc_transport_sends_headers_and_compresses() -> None:
    with OtlpReceiver() as r:
        transport = GrpcMetricTransport(endpoint=r.endpoint, insecure=True, headers={"X-Tenant": "hpc"},
                                        compression=grpc.Compression.Gzip)  # fmt: skip
        b = OtlpBridge(resource=Resource({"service.name": "t"}), clock=lambda: NOW, export_interval_s=3600,
                       metric_transports=[transport])  # fmt: skip
        b.start()
        try:
            b.on_sample(sample())
            assert b.force_flush()
        finally:
            b.stop(5)
        assert r.metadata[0]["x-tenant"] == "hpc"
        pts = r.metric_points()
        assert pts["hw.gpu.utilization"]["points"][0][1] == 0.5
        assert b.export_stats()["points_exported"] > 0


def test_http_transport_reads_partial_success() -> None:
    """A 200 answer whose ExportMetricsServiceResponse rejects points: send returns how many."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    answer = ExportMetricsServiceResponse()
    answer.partial_success.rejected_data_points = 3
    answer.partial_success.error_message = "3 points out of range"
    body = answer.SerializeToString()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t = HttpMetricTransport(endpoint=f"http://127.0.0.1:{server.server_port}/v1/metrics", timeout=5)
        store = LatestStore(clock=lambda: NOW)
        store.update_sample(sample(jobs=[]))
        [(req, _n)], _ = MetricEncoder(Resource({}), "s", "1").encode(store.views())
        assert t.send(req) == 3 and t.attempts == 1
        assert t.send(req) == 3 and t.rejected == 6
        t.close()
    finally:
        server.shutdown()
        server.server_close()


def test_http_transport_posts_gzip_protobuf() -> None:
    got: list[tuple[Any, bytes]] = []  # headers: case-insensitive (the exporter sends them lower-case)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.headers, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t = HttpMetricTransport(endpoint=f"http://127.0.0.1:{server.server_port}/v1/metrics",
                                headers={"Authorization": "Bearer x"}, compression=HttpCompression.Gzip)  # fmt: skip
        store = LatestStore(clock=lambda: NOW)
        store.update_sample(sample(jobs=[]))
        [(req, n)], _ = MetricEncoder(Resource({}), "s", "1").encode(store.views())
        assert t.send(req) == 0 and t.attempts == 1 and n > 0
        t.close()
    finally:
        server.shutdown()
        server.server_close()
    headers, body = got[0]
    assert headers["Content-Encoding"] == "gzip" and headers["Authorization"] == "Bearer x"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert gzip.decompress(body) == req.SerializeToString()


class FailingLogs(LogRecordExporter):
    def export(self, batch: Any) -> LogRecordExportResult:
        return LogRecordExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_failed_log_exports_are_counted() -> None:
    b = OtlpBridge(resource=Resource({}), log_exporters=[FailingLogs()], log_processor="simple", clock=lambda: NOW)
    b.start()
    try:
        b.on_failure(failure())
        assert b.export_stats()["logs_dropped"] == 1
    finally:
        b.stop()


# -- dcgm-exporter naming ---------------------------------------------------------------


def test_dcgm_naming_on_prometheus_and_otlp() -> None:
    b = OtlpBridge(resource=Resource({}), naming="dcgm", clock=lambda: NOW)
    b.on_sample(sample())
    reg = CollectorRegistry()
    reg.register(b.collector)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert "gpuwarden_gpu_utilization_ratio" not in fams
    [s0] = [s for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples if s.labels["gpu"] == "0"]
    assert s0.value == 50.0
    assert s0.labels == {"gpu": "0", "UUID": "GPU-0", "device": "nvidia0", "modelName": "NVIDIA H100",
                         "Hostname": "n1", "pci_bus_id": "0000:00:00.0", "DCGM_FI_DRIVER_VERSION": "550.54.15",
                         "hpc_job": "42"}  # fmt: skip
    fb_free = [s.value for s in fams["DCGM_FI_DEV_FB_FREE"].samples if s.labels["gpu"] == "0"]
    assert fb_free == [80896.0]
    energy = [s.value for s in fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples if s.labels["gpu"] == "0"]
    assert energy == [1_000_000.0]  # mJ
    assert [s.labels["hpc_job"] for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples if s.labels["gpu"] == "1"] == [""]
    requests, _ = MetricEncoder(Resource({}), "s", "1", naming="dcgm").encode(b.store.views())
    otlp = decode(requests)
    assert "hw.gpu.utilization" not in otlp
    pts = otlp["DCGM_FI_DEV_GPU_UTIL"]["points"]
    assert pts[frozenset(zip(DCGM_LABELS, dcgm_labels(b.store.views()[0][0].attributes), strict=True))] == 50.0
    assert otlp["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["monotonic"] is True


async def test_service_routes_events_and_node_states() -> None:
    logs = InMemoryLogRecordExporter()
    svc = OtlpBridgeService(OtlpBridgeSettings(), metric_readers=[InMemoryMetricReader()], log_exporters=[logs],
                            log_processor="simple", clock=lambda: NOW)  # fmt: skip
    svc.bridge.start()
    try:
        await svc.handle("gpu.events.attributed", xid())
        await svc.handle("slurm.nodes", NodeState(node="n1", ts=NOW, state="DOWN"))
        assert [r.log_record.event_name for r in logs.get_finished_logs()] == ["gpuwarden.gpu.xid",
                                                                            "gpuwarden.node.state"]  # fmt: skip
    finally:
        svc.bridge.stop()


def test_sdk_path_in_dcgm_naming_keeps_the_dcgm_spelling() -> None:
    s = OtlpBridgeSettings(
        otlp_bridge_endpoint="127.0.0.1:1", otlp_bridge_export_interval_s=3600, otlp_bridge_timeout_s=0.1,
        otlp_bridge_metrics_path="sdk", otlp_bridge_naming="dcgm",
    )  # fmt: skip
    readers, exporters, _ = build_otlp_exporters(s)
    try:
        exporter = readers[0]._exporter  # type: ignore[attr-defined]
        assert isinstance(exporter, MetricNameCaseExporter)
        assert exporter.names["dcgm_fi_dev_xid_errors"] == "DCGM_FI_DEV_XID_ERRORS"
    finally:
        for r in readers:
            r.shutdown()
        for e in exporters:
            e.shutdown()


class BlockingLogs(LogRecordExporter):
    """Accepts batches, but only once ``release`` is set (a slow receiver)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.received = 0

    def export(self, batch: Any) -> LogRecordExportResult:
        self.release.wait(10)
        self.received += len(batch)
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_log_records_refused_by_a_full_queue_are_counted() -> None:
    slow = BlockingLogs()
    b = OtlpBridge(resource=Resource({}), log_exporters=[slow], log_processor="batch", log_queue_size=4,
                   clock=lambda: NOW)  # fmt: skip
    b.start()
    try:
        for i in range(20):  # 20 new nodes: 20 log records while the receiver blocks the first batch
            assert b.on_node_state(NodeState(node=f"n{i}", ts=NOW, state="IDLE"))
        assert b.export_stats()["logs_queue_full"] == 16
        slow.release.set()
        assert b.force_flush(5)
        stats = b.export_stats()
        assert (slow.received, stats["logs_exported"], stats["logs_queue_full"]) == (4, 4, 16)
        text = generate_latest(registry(b)).decode()
        assert "gpuwarden_otlp_log_records_queue_full_total 16.0" in text
    finally:
        b.stop()
