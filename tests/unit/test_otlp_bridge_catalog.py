"""The otlp-bridge's metric catalog (``metrics.csv``): every entry is emitted, every emitted
metric is in the catalog (OTLP fast path, SDK path and Prometheus, both namings), and bad
catalog files are refused."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.otlp_bridge import OtlpBridge
from gpuwarden.otlp_bridge.catalog import CATALOG, load_catalog
from gpuwarden.otlp_bridge.encoder import MetricEncoder
from gpuwarden.otlp_bridge.metrics import OTEL_SHARED_DESCRIPTIONS
from gpuwarden.shared.fields import FIELDS
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
    Severity,
)

NOW = 10_000.0
JOB = GpuAttribution(gpu_index=0, job_id="42", user="alice", partition="gpu", account="a")

#: a GPU reporting every field the catalog reads
FULL: dict[str, Any] = dict(
    index=0, uuid="GPU-0", pci_bus_id="0000:01:00.0", name="NVIDIA H100", utilization_gpu_pct=50.0,
    utilization_memory_pct=10.0, memory_used_mib=1024, memory_total_mib=81920, temperature_c=60.0,
    memory_temperature_c=70.0, power_w=300.0, power_limit_w=700.0, sm_clock_mhz=1980, memory_clock_mhz=2619,
    energy_j=1000.0, ecc_sbe_volatile=3, ecc_dbe_volatile=0, pcie_replay_count=7, pcie_link_gen=5,
    pcie_link_width=16, throttle_reasons=["sw_power_cap"],
    nvlinks=[{"link": 0, "active": True, "crc_flit_errors": 5, "crc_data_errors": 1, "replay_errors": 0,
              "recovery_errors": 3}],
    tensor_activity_pct=42.0, sm_occupancy_pct=25.0, pcie_tx_kbps=1000.0, pcie_rx_kbps=2000.0, fan_speed_pct=30.0,
    performance_state=0, ecc_sbe_aggregate=11, ecc_dbe_aggregate=2, retired_pages_sbe=4, retired_pages_dbe=1,
    retired_pages_pending=False, remapped_rows_correctable=6, remapped_rows_uncorrectable=0,
    remapped_rows_failure=False, remapped_rows_pending=False,
)  # fmt: skip
# and every field the registry exports as an OTel metric of its own (a row added to fields.csv
# with otel_name is exported without an edit here)
FULL |= {f.field: {"float": 1.0, "int": 1, "bool": True}[f.type] for f in FIELDS if f.otel_name and f.field not in FULL}


def fed_bridge(naming: str, readers: Any = ()) -> OtlpBridge:
    b = OtlpBridge(resource=Resource({}), metric_readers=list(readers), naming=naming,  # type: ignore[arg-type]
                   clock=lambda: NOW)  # fmt: skip
    b.start()
    b.on_sample(AttributedSample(
        sample=NodeSample(node="n1", ts=NOW, collector_id="c", source="simulated", gpus=[GpuSample(**FULL)],
                          driver_version="550.54.15"),
        jobs=[JOB]))  # fmt: skip
    b.on_event(AttributedEvent(
        event=GpuEvent(event_id="e1", node="n1", ts=NOW - 1, kind=EventKind.XID, code=79, gpu_index=0,
                       gpu_uuid="GPU-0", raw="NVRM: Xid (PCI:0000:01:00): 79", source="kmsg"),
        job=JOB))  # fmt: skip
    b.on_failure(Failure(
        failure_id="f1", pattern="gpu-fallen-off-bus", rule_id="xid-79", category=Category.HARDWARE,
        severity=Severity.CRITICAL, node="n1", gpu_index=0, gpu_uuid="GPU-0", first_seen=NOW - 10, last_seen=NOW - 2,
        verdict="GPU 0 fell off the bus", recommended_action=Action.DRAIN,
        cost=CostEstimate(affected_gpus=1, usd_per_hour=2.5, gpu_hours_lost=0.01)))  # fmt: skip
    return b


def fast_path(b: OtlpBridge, naming: str) -> dict[str, Any]:
    """{metric name: Metric message} of one fast-path export of ``b``'s store."""
    enc = MetricEncoder(b.resource, "s", "1", naming=naming)  # type: ignore[arg-type]
    requests, _ = enc.encode(b.store.views(), b.store.failure_counts(),
                             [(g.attributes, g.count) for g in b.store.open_failures()],
                             descriptions=OTEL_SHARED_DESCRIPTIONS)  # fmt: skip
    out: dict[str, Any] = {}
    for req, _ in requests:
        parsed = metrics_service_pb2.ExportMetricsServiceRequest.FromString(req.SerializeToString())
        for rm in parsed.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = m
    return out


@pytest.mark.parametrize("naming", ["otel", "dcgm"])
def test_every_catalog_entry_is_emitted_and_nothing_else(naming: str) -> None:
    entries = [e for e in CATALOG if e.naming in (naming, "all")]
    assert len(entries) >= 30
    b = fed_bridge(naming)
    try:
        emitted = fast_path(b, naming)
        assert set(emitted) == {e.name for e in entries}
        for e in entries:
            m = emitted[e.name]
            kind = m.WhichOneof("data")
            assert (m.unit, m.description) == (e.unit, OTEL_SHARED_DESCRIPTIONS.get(e.name, e.description)), e.key
            assert kind == ("gauge" if e.instrument == "gauge" else "sum"), e.key
            if kind == "sum":
                assert m.sum.is_monotonic == (e.instrument == "counter"), e.key
            points = [{kv.key for kv in p.attributes} for p in getattr(m, kind).data_points]
            # the entry's own series are there: fixed attributes, sensor, per-point attributes
            if e.naming == "all":  # failure metrics: only the declared attributes (some optional)
                assert points and all(p <= set(e.point_attributes) for p in points), e.key
                continue
            mine = [p for p in points if set(e.attributes) <= p and set(e.point_attributes) <= p]
            if e.sensor:
                mine = [p for p in mine if "hw.sensor_location" in p]
            assert mine, f"{e.key}: no point"
        prom = {f.name for f in text_string_to_metric_families(generate_latest(registry(b)).decode())}
        for e in entries:
            assert e.prom_name.removesuffix("_total") in prom, e.key
    finally:
        b.stop()


@pytest.mark.parametrize("naming", ["otel", "dcgm"])
def test_the_sdk_path_emits_the_catalog_too(naming: str) -> None:
    reader = InMemoryMetricReader()
    b = fed_bridge(naming, [reader])
    try:
        data = reader.get_metrics_data()
        assert data is not None
        names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        # the SDK lower-cases instrument names (the dcgm exporter wrapper restores them)
        assert names == {e.name.lower() if naming == "dcgm" else e.name
                         for e in CATALOG if e.naming in (naming, "all")}  # fmt: skip
    finally:
        b.stop()


def registry(b: OtlpBridge) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(b.collector)
    return reg


HEADER = (
    "naming,key,name,unit,instrument,prom_name,attributes,point_attributes,prom_labels,sensor,otel_description,"
    "description"
)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("otel,k,a.b,1,histogram,p,,,,,,help", "instrument"),
        ("otlp,k,a.b,1,gauge,p,,,,,,help", "naming"),
        ("otel,k,a.b,,gauge,p,,,,,,help", "needs a unit"),
        ("otel,k,a.b,1,gauge,bad-name,,,,,,help", "Prometheus name"),
        ("otel,k,a.b,1,gauge,p,,x;y,z,,,help", "same length"),
        ("otel,k,a.b,1,gauge,p,novalue,,,,,help", "k=v"),
        ("otel,k,a.b,1,gauge,p,,,,,,", "empty description"),
        ("otel,k,a.b,1,gauge,p,,,", "fields"),
    ],
)
def test_bad_catalog_rows_are_refused(row: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_catalog(f"{HEADER}\n{row}\n")


def test_bad_catalogs_are_refused() -> None:
    with pytest.raises(ValueError, match="columns"):
        load_catalog("naming,key\notel,k\n")
    with pytest.raises(ValueError, match="twice"):
        load_catalog(f"{HEADER}\notel,k,a.b,1,gauge,p,,,,,,h\notel,k,a.c,1,gauge,q,,,,,,h\n")
    with pytest.raises(ValueError, match="disagree"):
        load_catalog(f"{HEADER}\notel,k,a.b,1,gauge,p,,,,,,h\notel,k2,a.b,By,gauge,q,,,,,,h\n")
    [e] = load_catalog(f"{HEADER}\notel,k,a.b,1,gauge,p,x=1;y=2,,,,,h\n")
    assert (e.attributes, e.metric_description) == ({"x": "1", "y": "2"}, "h")
