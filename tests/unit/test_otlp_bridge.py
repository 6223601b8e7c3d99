"""The otlp-bridge driven by the SDK's in-memory reader and exporter (no broker, no network)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import pytest
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpuwarden.otlp_bridge import OtlpBridge, OtlpBridgeService, OtlpBridgeSettings, build_otlp_exporters
from gpuwarden.otlp_bridge.cli import app
from gpuwarden.otlp_bridge.store import LatestStore
from gpuwarden.shared.models import (
    Action,
    AttributedSample,
    Category,
    CostEstimate,
    Failure,
    FailureState,
    GpuAttribution,
    GpuSample,
    HealthCheckResult,
    NodeSample,
    Remediation,
    RemediationDecision,
    Severity,
)

NOW = 10_000.0


def gpu(index: int, **kw: Any) -> GpuSample:
    base: dict[str, Any] = dict(
        index=index, uuid=f"GPU-{index}", pci_bus_id=f"0000:{index:02x}:00.0", name="NVIDIA H100",
        utilization_gpu_pct=50.0, memory_used_mib=1024, memory_total_mib=81920, temperature_c=60.0,
        power_w=300.0, sm_clock_mhz=1980,
    )  # fmt: skip
    base.update(kw)
    return GpuSample(**base)


def sample(node: str, ts: float, gpus: list[GpuSample], jobs: list[GpuAttribution] | None = None) -> AttributedSample:
    return AttributedSample(
        sample=NodeSample(node=node, ts=ts, collector_id="c", source="simulated", gpus=gpus), jobs=jobs or []
    )


def failure(fid: str = "f1", **kw: Any) -> Failure:
    base: dict[str, Any] = dict(
        failure_id=fid, pattern="gpu-fallen-off-bus", rule_id="xid-79", category=Category.HARDWARE,
        severity=Severity.CRITICAL, node="n1", gpu_index=0, gpu_uuid="GPU-0", job_id="42", user="alice",
        partition="gpu", first_seen=NOW - 10, last_seen=NOW - 2, verdict="GPU 0 fell off the bus",
        recommended_action=Action.DRAIN, cost=CostEstimate(affected_gpus=1, usd_per_hour=2.5, gpu_hours_lost=0.01),
    )  # fmt: skip
    base.update(kw)
    return Failure(**base)


JOB = GpuAttribution(gpu_index=0, job_id="42", user="alice", partition="gpu")


class Harness:
    def __init__(self, staleness_s: float = 60.0, prom_job_labels: Literal["info", "series"] = "info") -> None:
        self.reader = InMemoryMetricReader()
        self.logs = InMemoryLogRecordExporter()
        self.bridge = OtlpBridge(
            resource=Resource({"service.name": "test-bridge"}), metric_readers=[self.reader],
            log_exporters=[self.logs], log_processor="simple", staleness_s=staleness_s, clock=lambda: NOW,
            prom_job_labels=prom_job_labels,
        )  # fmt: skip
        self.registry = CollectorRegistry()
        self.registry.register(self.bridge.collector)

    def points(self) -> dict[str, list[tuple[dict[str, Any], float]]]:
        """{metric name: [(attributes, value)]} of one collection."""
        out: dict[str, list[tuple[dict[str, Any], float]]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else []:
            assert rm.resource.attributes["service.name"] == "test-bridge"
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = [(dict(p.attributes), p.value) for p in m.data.data_points]
        return out

    def prom(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        text = generate_latest(self.registry).decode()
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.bridge.start()
    yield harness
    harness.bridge.stop()


def test_sample_with_attribution_becomes_otel_gauges(h: Harness) -> None:
    h.bridge.on_sample(sample("n1", NOW, [gpu(0), gpu(1, utilization_gpu_pct=None)], [JOB]))
    pts = h.points()
    util = pts["hw.gpu.utilization"]
    assert len(util) == 1  # GPU 1 reported no utilisation: no point, not zero
    attrs, value = util[0]
    assert value == pytest.approx(0.5)
    assert attrs["host.name"] == "n1"
    assert attrs["hw.id"] == "GPU-0"
    assert attrs["gpu.index"] == 0
    assert attrs["gpu.pci_bus_id"] == "0000:00:00.0"
    assert attrs["hw.gpu.task"] == "general"
    assert (attrs["slurm.job.id"], attrs["slurm.user"], attrs["slurm.partition"]) == ("42", "alice", "gpu")
    mem = {a["hw.id"]: (a, v) for a, v in pts["hw.gpu.memory.usage"]}
    assert mem["GPU-0"][1] == 1024 * 1024 * 1024
    assert "slurm.job.id" not in mem["GPU-1"][0]  # GPU 1 is not held by a job
    assert {a["hw.id"]: v for a, v in pts["hw.gpu.memory.limit"]}["GPU-0"] == 81920 * 1024 * 1024
    temps = {a["hw.id"]: (a["hw.parent"], v) for a, v in pts["hw.temperature"]}
    assert temps["GPU-0/temperature/gpu"] == ("GPU-0", 60.0)
    assert {a["hw.id"]: v for a, v in pts["hw.power"]} == {"GPU-0": 300.0, "GPU-1": 300.0}
    assert {a["hw.id"]: v for a, v in pts["gpuwarden.gpu.clock.sm"]}["GPU-1"] == pytest.approx(1.98e9)


def test_latest_value_per_gpu_wins_in_event_time(h: Harness) -> None:
    h.bridge.on_sample(sample("n1", NOW - 5, [gpu(0, power_w=100.0)]))
    h.bridge.on_sample(sample("n1", NOW, [gpu(0, power_w=200.0)]))
    h.bridge.on_sample(sample("n1", NOW - 3, [gpu(0, power_w=150.0)]))  # late: older than what we have
    assert [v for _, v in h.points()["hw.power"]] == [200.0]
    assert [v for _, v in h.prom()["gpuwarden_gpu_power_watts"]] == [200.0]


def test_job_change_replaces_the_series(h: Harness) -> None:
    h.bridge.on_sample(sample("n1", NOW - 5, [gpu(0)], [JOB]))
    h.bridge.on_sample(sample("n1", NOW, [gpu(0)], [GpuAttribution(gpu_index=0, job_id="43", user="bob")]))
    assert [a["slurm.job.id"] for a, _ in h.points()["hw.power"]] == ["43"]
    prom = h.prom()
    assert [lab["gpu"] for lab, _ in prom["gpuwarden_gpu_power_watts"]] == ["0"]  # same series: no job labels
    assert "job_id" not in prom["gpuwarden_gpu_power_watts"][0][0]
    assert [(lab["job_id"], lab["user"]) for lab, _ in prom["gpuwarden_gpu_job_info"]] == [("43", "bob")]


def test_job_change_replaces_the_series_with_job_labels_on_every_series() -> None:
    harness = Harness(prom_job_labels="series")
    harness.bridge.on_sample(sample("n1", NOW - 5, [gpu(0)], [JOB]))
    harness.bridge.on_sample(sample("n1", NOW, [gpu(0)], [GpuAttribution(gpu_index=0, job_id="43", user="bob")]))
    prom = harness.prom()
    assert [lab["job_id"] for lab, _ in prom["gpuwarden_gpu_power_watts"]] == ["43"]
    assert "gpuwarden_gpu_job_info" not in prom


def test_stale_series_are_dropped(h: Harness) -> None:
    h.bridge.on_sample(sample("old", NOW - 100, [gpu(0)]))
    h.bridge.on_sample(sample("n1", NOW - 50, [gpu(0)]))
    assert {a["host.name"] for a, _ in h.points()["hw.power"]} == {"old", "n1"}
    h.bridge.on_sample(sample("n2", NOW, [gpu(0)]))  # watermark NOW: "old" is 100 s behind, staleness 60 s
    assert {a["host.name"] for a, _ in h.points()["hw.power"]} == {"n1", "n2"}
    assert {lab["node"] for lab, _ in h.prom()["gpuwarden_gpu_power_watts"]} == {"n1", "n2"}
    assert len(h.bridge.store) == 2


def test_a_timestamp_far_in_the_future_does_not_age_out_the_cluster() -> None:
    store = LatestStore(staleness_s=60, clock=lambda: NOW)
    store.update_sample(sample("n1", NOW, [gpu(0)]))
    store.update_sample(sample("broken-clock", NOW + 86400, [gpu(0)]))
    assert store.watermark == NOW
    assert {e.node for e in store.gpus()} == {"n1", "broken-clock"}


def test_failure_becomes_a_log_record(h: Harness) -> None:
    h.bridge.on_failure(failure())
    (rec,) = h.logs.get_finished_logs()
    lr = rec.log_record
    assert lr.severity_number == SeverityNumber.ERROR and lr.severity_text == "ERROR"
    assert lr.body == "GPU 0 fell off the bus"
    assert lr.timestamp == int((NOW - 2) * 1e9)  # last_seen, event time
    assert lr.observed_timestamp is not None and lr.observed_timestamp > lr.timestamp
    assert lr.event_name == "gpuwarden.failure"
    attrs = dict(lr.attributes or {})
    assert attrs["gpuwarden.failure.id"] == "f1"
    assert attrs["gpuwarden.failure.pattern"] == "gpu-fallen-off-bus"
    assert attrs["host.name"] == "n1" and attrs["slurm.job.id"] == "42"
    assert attrs["gpuwarden.failure.recommended_action"] == "drain"
    assert rec.resource.attributes["service.name"] == "test-bridge"


def test_remediation_becomes_a_log_record(h: Harness) -> None:
    h.bridge.on_remediation(Remediation(
        remediation_id="r1", ts=NOW - 1, decided_at=NOW, node="n1", action=Action.DRAIN, dry_run=False,
        decision=RemediationDecision.REFUSED, reason="too many nodes drained", failure_ids=["f1"],
    ))  # fmt: skip
    (rec,) = h.logs.get_finished_logs()
    assert rec.log_record.severity_text == "WARN"
    assert rec.log_record.body == "too many nodes drained"
    assert rec.log_record.timestamp == int((NOW - 1) * 1e9)
    assert dict(rec.log_record.attributes or {})["gpuwarden.remediation.decision"] == "refused"


def test_failure_counter_and_open_gauge(h: Harness) -> None:
    h.bridge.on_failure(failure("f1"))
    h.bridge.on_failure(failure("f1", occurrences=3, last_seen=NOW - 1))  # same episode, updated
    h.bridge.on_failure(failure("f2", node="n2", severity=Severity.WARNING, pattern="thermal", gpu_index=None,
                                gpu_uuid=None, job_id=None, user=None))  # fmt: skip
    pts = h.points()
    counts = {(a["gpuwarden.failure.pattern"], a["host.name"]): v for a, v in pts["gpuwarden.failures"]}
    assert counts == {("gpu-fallen-off-bus", "n1"): 1, ("thermal", "n2"): 1}
    assert {a["host.name"]: v for a, v in pts["gpuwarden.failure.open"]} == {"n1": 1, "n2": 1}
    prom = h.prom()
    assert ({"pattern": "gpu-fallen-off-bus", "severity": "critical", "node": "n1"}, 1.0) in prom[
        "gpuwarden_failures_total"
    ]
    open_n1 = [lab for lab, v in prom["gpuwarden_failure_open"] if lab["node"] == "n1" and v == 1]
    assert open_n1 == [{"node": "n1", "gpu": "0", "uuid": "GPU-0", "job_id": "42", "user": "alice",
                        "pattern": "gpu-fallen-off-bus", "severity": "critical", "category": "hardware"}]  # fmt: skip
    h.bridge.on_failure(failure("f1", state=FailureState.RESOLVED, last_seen=NOW))
    h.bridge.on_failure(failure("f1", last_seen=NOW - 1))  # a late, older "open" does not reopen it
    assert {a["host.name"] for a, _ in h.points()["gpuwarden.failure.open"]} == {"n2"}
    assert {lab["node"] for lab, _ in h.prom().get("gpuwarden_failure_open", [])} == {"n2"}
    assert len(h.logs.get_finished_logs()) == 5


def test_metrics_text_has_the_expected_series(h: Harness) -> None:
    h.bridge.on_sample(sample("n1", NOW, [gpu(0, energy_j=5.0)], [JOB]))
    h.bridge.on_failure(failure())
    text = generate_latest(h.registry).decode()
    names = (
        "gpuwarden_gpu_utilization_ratio", "gpuwarden_gpu_memory_used_bytes", "gpuwarden_gpu_temperature_celsius",
        "gpuwarden_gpu_power_watts", "gpuwarden_gpu_sm_clock_hertz", "gpuwarden_gpu_energy_joules_total",
        "gpuwarden_failures_total", "gpuwarden_failure_open",
    )  # fmt: skip
    for name in names:
        assert f"\n{name}{{" in text, name
    assert "# TYPE gpuwarden_failures_total counter" in text
    prom = h.prom()
    ((labels, value),) = prom["gpuwarden_gpu_utilization_ratio"]
    assert value == 0.5
    assert labels == {"node": "n1", "gpu": "0", "uuid": "GPU-0", "pci_bus_id": "0000:00:00.0", "model": "NVIDIA H100"}
    assert prom["gpuwarden_gpu_job_info"] == [
        ({"node": "n1", "gpu": "0", "job_id": "42", "user": "alice", "partition": "gpu"}, 1.0)
    ]
    # a failure keeps its job labels: one series per open failure, readable after the job left job_info
    ((flabels, _),) = prom["gpuwarden_failure_open"]
    assert (flabels["job_id"], flabels["user"]) == ("42", "alice")
    assert prom["gpuwarden_gpu_memory_used_bytes"][0][1] == 1024**3
    assert prom["gpuwarden_gpu_sm_clock_hertz"][0][1] == 1.98e9
    assert prom["gpuwarden_gpu_last_sample_timestamp_seconds"][0][1] == NOW


def test_prometheus_works_before_start_and_lifecycle_is_idempotent() -> None:
    harness = Harness()
    harness.bridge.stop()  # before start
    harness.bridge.on_sample(sample("n1", NOW, [gpu(0)]))
    harness.bridge.on_failure(failure())  # no logger yet: nothing emitted, still counted
    assert harness.prom()["gpuwarden_gpu_power_watts"][0][1] == 300.0
    assert harness.bridge.logs_emitted == 0
    harness.bridge.start()
    harness.bridge.start()
    assert harness.bridge.force_flush()
    harness.bridge.stop()
    harness.bridge.stop()


async def test_service_routes_messages_and_registers_the_collector() -> None:
    reader, logs = InMemoryMetricReader(), InMemoryLogRecordExporter()
    svc = OtlpBridgeService(OtlpBridgeSettings(), metric_readers=[reader], log_exporters=[logs],
                            log_processor="simple", clock=lambda: NOW)  # fmt: skip
    svc.bridge.start()
    try:
        await svc.handle("gpu.attributed", sample("n1", NOW, [gpu(0)], [JOB]))
        await svc.handle("failures", failure())
        with pytest.raises(TypeError):
            await svc.handle("health", HealthCheckResult(node="n1", ts=NOW, phase="prolog", check="x", passed=True))
        text = generate_latest(svc.metrics.registry).decode()
        assert 'gpuwarden_gpu_power_watts{gpu="0",model="NVIDIA H100",node="n1"' in text
        assert 'gpuwarden_gpu_job_info{gpu="0",job_id="42",node="n1",partition="gpu",user="alice"} 1.0' in text
        assert "gpuwarden_messages_in" in text  # the service's own metrics stay there
        assert len(logs.get_finished_logs()) == 1
    finally:
        svc.bridge.stop()
        await svc.stop()  # never started: a no-op


def test_otlp_exporters_from_settings() -> None:
    assert build_otlp_exporters(OtlpBridgeSettings(otlp_bridge_endpoint=None)) == ([], [], [])
    for protocol in ("grpc", "http/protobuf"):
        direct = build_otlp_exporters(OtlpBridgeSettings(otlp_bridge_endpoint="127.0.0.1:1",
                                                         otlp_bridge_protocol=protocol))  # fmt: skip
        assert (len(direct.metric_readers), len(direct.log_exporters), len(direct.metric_transports)) == (0, 1, 1)
        direct.log_exporters[0].shutdown()
        direct.metric_transports[0].close()
        s = OtlpBridgeSettings(otlp_bridge_endpoint="127.0.0.1:1", otlp_bridge_protocol=protocol,
                               otlp_bridge_export_interval_s=3600, otlp_bridge_timeout_s=0.1,
                               otlp_bridge_metrics_path="sdk", otlp_bridge_compression="gzip")  # fmt: skip
        readers, exporters, transports = build_otlp_exporters(s)
        assert transports == []
        try:
            assert len(readers) == 1 and isinstance(readers[0], PeriodicExportingMetricReader)
            assert len(exporters) == 1
        finally:
            for r in readers:
                r.shutdown()
            for e in exporters:
                e.shutdown()
    http = build_otlp_exporters(
        OtlpBridgeSettings(otlp_bridge_endpoint="http://otel:4318/", otlp_bridge_protocol="http/protobuf")
    )
    assert http.metric_transports[0].url == "http://otel:4318/v1/metrics"  # type: ignore[attr-defined]
    http_logs = http.log_exporters[0]
    assert http_logs._endpoint == "http://otel:4318/v1/logs"  # type: ignore[attr-defined]
    http_logs.shutdown()


def test_cli_help() -> None:
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0
    assert "OTLP" in res.output


def test_driver_version_sent_on_change_stays_on_the_series() -> None:
    """The collector sends driver_version only on change; the bridge keeps the last one per node."""
    from gpuwarden.otlp_bridge.store import LatestStore
    from gpuwarden.shared.models import AttributedSample, GpuSample, NodeSample

    store = LatestStore()
    first = NodeSample(
        node="n1", ts=1.0, collector_id="c", source="t", gpus=[GpuSample(index=0)], driver_version="535.183.01"
    )
    store.update_sample(AttributedSample(sample=first))
    later = first.model_copy(update={"ts": 2.0, "driver_version": None})
    store.update_sample(AttributedSample(sample=later))
    [entry] = store._gpus.values()
    assert entry.ts == 2.0 and entry.attributes["hw.driver_version"] == "535.183.01"
