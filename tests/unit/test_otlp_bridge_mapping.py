"""Pure mapping of the otlp-bridge: names, units, attributes, severities, log fields."""

from __future__ import annotations

import json

import pytest
from opentelemetry._logs import SeverityNumber

from gpuwarden.otlp_bridge.bridge import DEFAULT_SERVICE_NAME, build_resource
from gpuwarden.otlp_bridge.logs import FAILURE_EVENT_NAME, failure_log, remediation_log, severity_of, to_ns
from gpuwarden.otlp_bridge.metrics import (
    DATA_POINT_ATTRIBUTE_KEYS,
    GPU_METRICS,
    MIB,
    PROM_FAILURE_LABELS,
    PROM_GPU_LABELS,
    failure_labels,
    failure_metric_attributes,
    gpu_attributes,
    gpu_id,
    jobs_by_index,
    metric_attributes,
    prom_gpu_labels,
)
from gpuwarden.otlp_bridge.settings import OtlpBridgeSettings, parse_key_values
from gpuwarden.shared.models import (
    Action,
    AttributedSample,
    Category,
    CostEstimate,
    Evidence,
    Failure,
    GpuAttribution,
    GpuSample,
    NodeSample,
    Remediation,
    RemediationDecision,
    Severity,
)

SPECS = {s.key: s for s in GPU_METRICS}

GPU = GpuSample(
    index=3, uuid="GPU-1234", pci_bus_id="0000:44:00.0", name="NVIDIA H100 80GB HBM3",
    utilization_gpu_pct=87.5, memory_used_mib=40960, memory_total_mib=81920, temperature_c=71,
    memory_temperature_c=80, power_w=612.5, power_limit_w=700, sm_clock_mhz=1980, memory_clock_mhz=2619,
    energy_j=123456.0,
)  # fmt: skip
JOB = GpuAttribution(gpu_index=3, job_id="4711", user="alice", partition="gpu", account="ml")


def failure(**kw: object) -> Failure:
    base: dict[str, object] = dict(
        failure_id="f1", pattern="gpu-fallen-off-bus", rule_id="xid-79", category=Category.HARDWARE,
        severity=Severity.FATAL, node="n1", gpu_index=3, gpu_uuid="GPU-1234", pci_bus_id="0000:44:00.0",
        job_id="4711", user="alice", partition="gpu", first_seen=1000.0, last_seen=1012.5,
        evidence=[Evidence(signal="xid", value=79, unit="count", ts=1000.0, source="NVRM: Xid 79")],
        verdict="GPU 3 fell off the bus", recommended_action=Action.DRAIN,
        cost=CostEstimate(affected_gpus=8, usd_per_hour=20.0, gpu_hours_lost=0.5),
    )  # fmt: skip
    base.update(kw)
    return Failure.model_validate(base)


def test_metric_catalog_names_units_and_prometheus_names() -> None:
    otel = {s.otel_name: s.otel_unit for s in GPU_METRICS}
    assert otel["hw.gpu.utilization"] == "1"
    assert otel["hw.gpu.memory.usage"] == "By"
    assert otel["hw.gpu.memory.limit"] == "By"
    assert otel["hw.temperature"] == "Cel"
    assert otel["hw.power"] == "W"
    assert otel["hw.energy"] == "J"
    assert otel["gpuwarden.gpu.clock.sm"] == "Hz"
    for s in GPU_METRICS:
        assert s.otel_name.startswith(("hw.", "gpuwarden.")), s
        assert s.prom_name.startswith("gpuwarden_gpu_"), s
        assert s.prom_name.endswith(
            (
                "_ratio",
                "_bytes",
                "_celsius",
                "_watts",
                "_hertz",
                "_total",
                "_generation",
                "_lanes",
                "_bytes_per_second",
                "_state",
                "_pending",
            )
        ), s
        assert (s.prom_type == "counter") == s.prom_name.endswith("_total")
    prom = {s.prom_name for s in GPU_METRICS}
    assert {"gpuwarden_gpu_utilization_ratio", "gpuwarden_gpu_memory_used_bytes", "gpuwarden_gpu_temperature_celsius",
            "gpuwarden_gpu_power_watts", "gpuwarden_gpu_sm_clock_hertz"} <= prom  # fmt: skip
    assert len(prom) == len(GPU_METRICS) == len(SPECS)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("utilization", 0.875),
        ("memory_used", 40960 * MIB),
        ("memory_total", 81920 * MIB),
        ("memory_utilization", 0.5),
        ("temperature", 71.0),
        ("memory_temperature", 80.0),
        ("power", 612.5),
        ("power_limit", 700.0),
        ("sm_clock", 1.98e9),
        ("memory_clock", 2.619e9),
        ("energy", 123456.0),
    ],
)
def test_values_in_base_units(key: str, expected: float) -> None:
    assert SPECS[key].value(GPU) == pytest.approx(expected)


PROFILED = GpuSample(
    index=0, pcie_tx_kbps=1000.0, pcie_rx_kbps=2000.0, tensor_activity_pct=42.0, sm_occupancy_pct=25.0,
    fan_speed_pct=30.0, performance_state=0, retired_pages_pending=True,
)  # fmt: skip


@pytest.mark.parametrize(
    ("key", "expected"),
    [("pcie_tx", 1_024_000.0), ("pcie_rx", 2_048_000.0), ("tensor_activity", 0.42), ("sm_occupancy", 0.25),
     ("fan_speed", 0.30), ("performance_state", 0.0), ("retired_pages_pending", 1.0)],
)  # fmt: skip
def test_profiling_and_pcie_values_in_base_units(key: str, expected: float) -> None:
    assert SPECS[key].value(PROFILED) == pytest.approx(expected)
    assert SPECS["pcie_tx"].extra_attributes == {"network.io.direction": "transmit"}


def test_missing_readings_stay_missing_never_zero() -> None:
    bare = GpuSample(index=0)
    assert all(s.value(bare) is None for s in GPU_METRICS)
    assert SPECS["memory_utilization"].value(GpuSample(index=0, memory_used_mib=1, memory_total_mib=0)) is None


def test_gpu_attributes_with_job() -> None:
    attrs = gpu_attributes("n1", GPU, JOB, "550.54.15")
    assert attrs == {
        "host.name": "n1", "hw.id": "GPU-1234", "hw.type": "gpu", "hw.name": "nvidia3", "gpu.index": 3,
        "gpu.uuid": "GPU-1234", "gpu.pci_bus_id": "0000:44:00.0", "hw.model": "NVIDIA H100 80GB HBM3",
        "hw.driver_version": "550.54.15", "slurm.job.id": "4711", "slurm.user": "alice",
        "slurm.partition": "gpu", "slurm.account": "ml",
    }  # fmt: skip


def test_gpu_attributes_without_job_or_uuid_leave_out_absent_values() -> None:
    attrs = gpu_attributes("n1", GpuSample(index=2), None)
    assert attrs == {"host.name": "n1", "hw.id": "n1/gpu2", "hw.type": "gpu", "hw.name": "nvidia2", "gpu.index": 2}
    assert gpu_id("n1", GpuSample(index=2)) == "n1/gpu2"


def test_temperature_sensor_attributes_point_to_the_gpu() -> None:
    base = gpu_attributes("n1", GPU, None)
    a = metric_attributes(SPECS["memory_temperature"], base)
    assert a["hw.id"] == "GPU-1234/temperature/memory"
    assert a["hw.parent"] == "GPU-1234"
    assert a["hw.type"] == "temperature"
    assert a["hw.sensor_location"] == "memory"
    assert metric_attributes(SPECS["utilization"], base)["hw.gpu.task"] == "general"
    assert metric_attributes(SPECS["power"], base) == base


def test_every_data_point_key_is_declared() -> None:
    keys = set(gpu_attributes("n", GPU, JOB, "1"))
    for s in GPU_METRICS:
        keys |= set(metric_attributes(s, gpu_attributes("n", GPU, JOB, "1")))
    keys |= set(failure_metric_attributes(failure()))
    assert keys <= DATA_POINT_ATTRIBUTE_KEYS


def test_prometheus_labels() -> None:
    assert dict(zip(PROM_GPU_LABELS, prom_gpu_labels("n1", GPU, JOB), strict=True)) == {
        "node": "n1", "gpu": "3", "uuid": "GPU-1234", "pci_bus_id": "0000:44:00.0",
        "model": "NVIDIA H100 80GB HBM3", "job_id": "4711", "user": "alice", "partition": "gpu",
    }  # fmt: skip
    assert prom_gpu_labels("n1", GpuSample(index=0), None) == ("n1", "0", "", "", "", "", "", "")
    assert dict(zip(PROM_FAILURE_LABELS, failure_labels(failure(gpu_index=None)), strict=True))["gpu"] == ""


def test_jobs_by_index() -> None:
    s = AttributedSample(sample=NodeSample(node="n", ts=1, collector_id="c", source="s", gpus=[GPU]), jobs=[JOB])
    assert jobs_by_index(s) == {3: JOB}


@pytest.mark.parametrize(
    ("severity", "number", "text"),
    [
        (Severity.INFO, SeverityNumber.INFO, "INFO"),
        (Severity.WARNING, SeverityNumber.WARN, "WARN"),
        (Severity.CRITICAL, SeverityNumber.ERROR, "ERROR"),
        (Severity.FATAL, SeverityNumber.FATAL, "FATAL"),
    ],
)
def test_severity_mapping(severity: Severity, number: SeverityNumber, text: str) -> None:
    assert severity_of(severity) == (number, text)
    assert failure_log(failure(severity=severity)).severity_number == number


def test_failure_log_fields() -> None:
    lf = failure_log(failure())
    assert lf.timestamp_ns == 1_012_500_000_000 == to_ns(1012.5)
    assert lf.body == "GPU 3 fell off the bus"
    assert lf.event_name == FAILURE_EVENT_NAME
    a = lf.attributes
    assert a["gpuwarden.failure.id"] == "f1"
    assert a["gpuwarden.failure.pattern"] == "gpu-fallen-off-bus"
    assert a["gpuwarden.failure.rule_id"] == "xid-79"
    assert a["gpuwarden.failure.category"] == "hardware"
    assert a["gpuwarden.failure.recommended_action"] == "drain"
    assert a["gpuwarden.failure.first_seen"] == 1000.0
    assert a["host.name"] == "n1"
    assert a["gpu.index"] == 3
    assert a["gpu.uuid"] == a["hw.id"] == "GPU-1234"
    assert a["gpu.pci_bus_id"] == "0000:44:00.0"
    assert (a["slurm.job.id"], a["slurm.user"], a["slurm.partition"]) == ("4711", "alice", "gpu")
    assert (a["gpuwarden.cost.affected_gpus"], a["gpuwarden.cost.usd_per_hour"]) == (8, 20.0)
    assert a["gpuwarden.cost.gpu_hours_lost"] == 0.5
    ev = json.loads(str(a["gpuwarden.failure.evidence"]))
    assert ev == [{"signal": "xid", "value": 79, "unit": "count", "threshold": None, "ts": 1000.0,
                   "source": "NVRM: Xid 79"}]  # fmt: skip
    assert None not in a.values()


def test_failure_log_without_gpu_or_job() -> None:
    a = failure_log(failure(gpu_index=None, gpu_uuid=None, pci_bus_id=None, job_id=None, user=None,
                            partition=None)).attributes  # fmt: skip
    assert not {"gpu.index", "hw.id", "gpu.pci_bus_id", "slurm.job.id", "slurm.user"} & set(a)
    assert None not in a.values()


def test_remediation_log() -> None:
    r = Remediation(
        remediation_id="r1", ts=1012.5, decided_at=1013.0, node="n1", action=Action.DRAIN,
        argv=["scontrol", "update", "nodename=n1", "state=drain"], dry_run=True,
        decision=RemediationDecision.DRY_RUN, reason="would drain n1: gpu-fallen-off-bus", failure_ids=["f1"],
    )  # fmt: skip
    lf = remediation_log(r)
    assert lf.timestamp_ns == to_ns(1012.5)
    assert lf.severity_text == "INFO" and lf.body == r.reason
    assert lf.attributes["gpuwarden.remediation.action"] == "drain"
    assert lf.attributes["gpuwarden.remediation.argv"] == r.argv
    assert lf.attributes["gpuwarden.remediation.failure_ids"] == ["f1"]
    assert lf.attributes["host.name"] == "n1"
    failed = remediation_log(r.model_copy(update={"decision": RemediationDecision.FAILED, "exit_code": 1}))
    assert failed.severity_number == SeverityNumber.ERROR
    assert failed.attributes["gpuwarden.remediation.exit_code"] == 1


def test_parse_key_values() -> None:
    assert parse_key_values("a=1, b = x=y ,,") == {"a": "1", "b": "x=y"}
    assert parse_key_values(None) == {}
    with pytest.raises(ValueError):
        parse_key_values("novalue")


def test_settings_env_and_otel_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("GPUWARDEN_OTLP_BRIDGE_ENDPOINT", "GPUWARDEN_OTLP_BRIDGE_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    s = OtlpBridgeSettings()
    assert s.otlp_bridge_endpoint is None and s.otlp_bridge_protocol == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("GPUWARDEN_OTLP_BRIDGE_STALENESS_S", "30")
    s = OtlpBridgeSettings()
    assert (s.otlp_bridge_endpoint, s.otlp_bridge_protocol, s.otlp_bridge_staleness_s) == (
        "http://otel:4318", "http/protobuf", 30.0)  # fmt: skip
    monkeypatch.setenv("GPUWARDEN_OTLP_BRIDGE_ENDPOINT", "collector:4317")
    monkeypatch.setenv("GPUWARDEN_OTLP_BRIDGE_PROTOCOL", "grpc")
    s = OtlpBridgeSettings()
    assert (s.otlp_bridge_endpoint, s.otlp_bridge_protocol) == ("collector:4317", "grpc")
    with pytest.raises(ValueError):
        OtlpBridgeSettings(otlp_bridge_resource_attributes="oops")


def test_resource_has_service_name_and_never_data_point_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,host.name=bridge-host")
    res = build_resource(None, {"slurm.cluster.name": "c1", "hw.id": "x"})
    assert res.attributes["service.name"] == DEFAULT_SERVICE_NAME
    assert res.attributes["slurm.cluster.name"] == "c1"
    assert res.attributes["deployment.environment"] == "test"
    assert not DATA_POINT_ATTRIBUTE_KEYS & set(res.attributes)
    assert build_resource("my-bridge").attributes["service.name"] == "my-bridge"
