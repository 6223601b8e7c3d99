"""The otlp-bridge against real collectors: rotel (OTLP, gRPC and HTTP in) forwarding to an
in-process OTLP receiver, and Debian's Prometheus scraping ``/metrics``. When ``tests/servers.py``
chooses containers, the OpenTelemetry Collector (contrib) image stands in for rotel and the
``prom/prometheus`` image of Debian's version for the package."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.otlp_bridge import OtlpBridge, OtlpBridgeSettings, build_otlp_exporters, build_resource
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
from prerequisites import give_up

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "otlp"))
from receiver import OtlpReceiver

import server_containers
from servers import ServerChoice, choose_server

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
TS = time.time() - 5  # event time close to now (the store ignores far-future stamps)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rotel_binary() -> str:
    import rotel

    path = Path(rotel.__file__).parent / "rotel-agent"
    if not path.exists():  # pragma: no cover - the pinned wheel ships it
        pytest.fail(f"rotel==0.0.1a15 is pinned in requirements-dev.txt but {path} is missing")
    return str(path)


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture
def collector_choice(docker_engine: bool) -> ServerChoice:
    """The OTLP collector: the OpenTelemetry Collector in a container, or rotel (a pinned wheel)."""
    return choose_server("the OTLP collector", os.environ, docker_engine, local=True)


@pytest.fixture
def receiver(collector_choice: ServerChoice) -> Iterator[OtlpReceiver]:
    """The in-process OTLP receiver: on loopback, or every interface for a collector in a container."""
    with OtlpReceiver(server_containers.BIND_FOR_CONTAINERS if collector_choice == "container" else "127.0.0.1") as r:
        yield r


@pytest.fixture
def rotel(receiver: OtlpReceiver, collector_choice: ServerChoice, tmp_path: Path) -> Iterator[dict[str, int]]:
    """The OTLP collector, batching off: OTLP in on gRPC and HTTP, OTLP/gRPC out to ``receiver``;
    yields its ports on 127.0.0.1. rotel-agent, or the OpenTelemetry Collector in a container."""
    if collector_choice == "container":
        with server_containers.otel_collector(receiver.port) as ports:
            yield ports
        return
    grpc_port, http_port = free_port(), free_port()
    argv = [
        rotel_binary(), "start",
        "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
        "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
        "--disable-batching",
        "--exporter", "otlp",
        "--otlp-exporter-endpoint", f"http://{receiver.endpoint}",
        "--otlp-exporter-protocol", "grpc",
        "--pid-file", str(tmp_path / "rotel.pid"),
        "--log-file", str(tmp_path / "rotel.log"),
    ]  # fmt: skip
    log = (tmp_path / "rotel.out").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(grpc_port)
        wait_port(http_port)
        yield {"grpc": grpc_port, "http": http_port}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


#: NVLink and profiling readings that only GPU 0 reports
PROFILED: dict[str, Any] = dict(
    nvlinks=[{"link": 0, "active": True, "crc_flit_errors": 5, "crc_data_errors": 1, "replay_errors": 0,
              "recovery_errors": 3}, {"link": 1, "active": False, "crc_flit_errors": 2}],
    tensor_activity_pct=42.0, sm_occupancy_pct=25.0, pcie_tx_kbps=1000.0, pcie_rx_kbps=2000.0,
)  # fmt: skip


def gpu(index: int) -> GpuSample:
    return GpuSample(
        **(PROFILED if index == 0 else {}),
        index=index, uuid=f"GPU-{index}", pci_bus_id=f"0000:{index + 1:02x}:00.0", name="NVIDIA H100",
        utilization_gpu_pct=50.0, memory_used_mib=1024, memory_total_mib=81920, temperature_c=60.0,
        power_w=300.0, energy_j=1000.0, ecc_sbe_volatile=3, ecc_dbe_volatile=0, pcie_replay_count=7,
        pcie_link_gen=5, pcie_link_width=16, throttle_reasons=["sw_power_cap"],
    )  # fmt: skip


JOB = GpuAttribution(gpu_index=0, job_id="42", user="alice", partition="gpu", account="proj")


def attributed() -> AttributedSample:
    return AttributedSample(
        sample=NodeSample(node="n1", ts=TS, collector_id="c", source="simulated", gpus=[gpu(0), gpu(1)],
                          driver_version="550.54.15"),
        jobs=[JOB],
    )  # fmt: skip


def a_failure() -> Failure:
    return Failure(
        failure_id="f1", pattern="gpu-fallen-off-bus", rule_id="xid-79", category=Category.HARDWARE,
        severity=Severity.CRITICAL, node="n1", gpu_index=0, gpu_uuid="GPU-0", job_id="42", user="alice",
        partition="gpu", first_seen=TS - 10, last_seen=TS - 2, verdict="GPU 0 fell off the bus",
        recommended_action=Action.DRAIN, cost=CostEstimate(affected_gpus=1, usd_per_hour=2.5, gpu_hours_lost=0.01),
    )  # fmt: skip


def an_xid() -> AttributedEvent:
    raw = "NVRM: Xid (PCI:0000:01:00): 79, pid=123, GPU has fallen off the bus."
    return AttributedEvent(
        event=GpuEvent(event_id="e1", node="n1", ts=TS - 3, kind=EventKind.XID, code=79, gpu_index=0,
                       pci_bus_id="0000:01:00.0", gpu_uuid="GPU-0", message="GPU has fallen off the bus.",
                       raw=raw, source="kmsg"),
        job=JOB,
    )  # fmt: skip


def run_bridge(protocol: str, endpoint: str, path: str, naming: str = "otel") -> OtlpBridge:
    settings = OtlpBridgeSettings(
        otlp_bridge_endpoint=endpoint, otlp_bridge_protocol=protocol, otlp_bridge_insecure=True,
        otlp_bridge_export_interval_s=3600, otlp_bridge_headers="x-tenant=hpc", otlp_bridge_metrics_path=path,
        otlp_bridge_naming=naming,
    )  # fmt: skip
    readers, exporters, transports = build_otlp_exporters(settings)
    bridge = OtlpBridge(
        resource=build_resource("bridge-test", {"slurm.cluster.name": "c1"}), metric_readers=readers,
        log_exporters=exporters, metric_transports=transports, log_processor="simple", export_interval_s=3600,
        naming=settings.otlp_bridge_naming,
    )  # fmt: skip
    bridge.start()
    bridge.on_sample(attributed())
    bridge.on_event(an_xid())
    bridge.on_failure(a_failure())
    bridge.on_node_state(NodeState(node="n1", ts=TS - 1, state="DOWN", flags=["DRAIN"], reason="xid 79"))
    assert bridge.force_flush(20)
    return bridge


def points_by(metric: dict[str, Any], **match: Any) -> list[tuple[dict[str, Any], Any]]:
    return [(a, v) for a, v, _ in metric["points"] if all(a.get(k) == x for k, x in match.items())]


@pytest.mark.parametrize("path", ["direct", "sdk"])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_rotel_forwards_exact_names_units_attributes_and_values(
    protocol: str, path: str, rotel: dict[str, int], receiver: OtlpReceiver
) -> None:
    port = rotel["grpc"] if protocol == "grpc" else rotel["http"]
    bridge = run_bridge(protocol, f"http://127.0.0.1:{port}", path)
    try:
        assert receiver.wait(lambda r: "hw.gpu.utilization" in r.metric_points() and len(r.log_records()) >= 3)
    finally:
        bridge.stop(10)
    m = receiver.metric_points()

    util = m["hw.gpu.utilization"]
    assert (util["unit"], util["kind"]) == ("1", "gauge")
    assert util["resource"]["service.name"] == "bridge-test"
    assert util["resource"]["slurm.cluster.name"] == "c1"
    assert "host.name" not in util["resource"] and "hw.id" not in util["resource"]
    [(attrs0, v0)] = points_by(util, **{"hw.id": "GPU-0"})
    assert v0 == pytest.approx(0.5)
    assert attrs0 == {
        "host.name": "n1", "hw.id": "GPU-0", "hw.type": "gpu", "hw.name": "nvidia0", "gpu.index": 0,
        "gpu.uuid": "GPU-0", "gpu.pci_bus_id": "0000:01:00.0", "hw.model": "NVIDIA H100",
        "hw.driver_version": "550.54.15", "hw.gpu.task": "general",
        "slurm.job.id": "42", "slurm.user": "alice", "slurm.partition": "gpu", "slurm.account": "proj",
    }  # fmt: skip
    [(attrs1, _)] = points_by(util, **{"hw.id": "GPU-1"})
    assert "slurm.job.id" not in attrs1

    usage = m["hw.gpu.memory.usage"]
    assert (usage["unit"], usage["kind"], usage["monotonic"]) == ("By", "sum", False)
    assert [v for _, v in points_by(usage, **{"hw.id": "GPU-0"})] == [1024 * MIB]
    limit = m["hw.gpu.memory.limit"]
    assert [v for _, v in points_by(limit, **{"hw.id": "GPU-0"})] == [81920 * MIB]
    temp = m["hw.temperature"]
    assert temp["unit"] == "Cel"
    [(tattrs, tv)] = points_by(temp, **{"hw.parent": "GPU-0"})
    assert (tattrs["hw.id"], tattrs["hw.type"], tv) == ("GPU-0/temperature/gpu", "temperature", 60.0)
    assert [v for _, v in points_by(m["hw.power"], **{"hw.id": "GPU-0"})] == [300.0]
    assert m["hw.power"]["unit"] == "W"
    energy = m["hw.energy"]
    assert (energy["unit"], energy["kind"], energy["monotonic"]) == ("J", "sum", True)
    assert [v for _, v in points_by(energy, **{"hw.id": "GPU-0"})] == [1000.0]

    errors = m["hw.errors"]
    assert (errors["unit"], errors["kind"], errors["monotonic"]) == ("{error}", "sum", True)
    by_type = {a["error.type"]: v for a, v in points_by(errors, **{"hw.id": "GPU-0"})}
    assert by_type == {"corrected": 3, "uncorrected": 0, "pcie_replay": 7, "xid_79": 1, "nvlink_crc_flit": 7,
                       "nvlink_crc_data": 1, "nvlink_replay": 0, "nvlink_recovery": 3}  # fmt: skip
    nvl = m["gpuwarden.gpu.nvlink.errors"]
    assert (nvl["unit"], nvl["kind"], nvl["monotonic"]) == ("{error}", "sum", True)
    assert {(a["gpuwarden.nvlink.link"], a["error.type"]): v for a, v in points_by(nvl, **{"hw.id": "GPU-0"})} == {
        (0, "crc_flit"): 5, (0, "crc_data"): 1, (0, "replay"): 0, (0, "recovery"): 3, (1, "crc_flit"): 2}  # fmt: skip
    [(nvl_attrs, _)] = points_by(nvl, **{"hw.id": "GPU-0", "gpuwarden.nvlink.link": 1})
    assert nvl_attrs["slurm.job.id"] == "42"
    active = m["gpuwarden.gpu.nvlink.active"]
    assert {a["gpuwarden.nvlink.link"]: v for a, v in points_by(active, **{"hw.id": "GPU-0"})} == {0: 1, 1: 0}
    tensor = m["gpuwarden.gpu.tensor.activity"]
    assert (tensor["unit"], tensor["kind"]) == ("1", "gauge")
    assert [v for _, v in points_by(tensor, **{"hw.id": "GPU-0"})] == [pytest.approx(0.42)]
    assert [v for _, v in points_by(m["gpuwarden.gpu.sm.occupancy"], **{"hw.id": "GPU-0"})] == [0.25]
    pcie = m["gpuwarden.gpu.pcie.throughput"]
    assert pcie["unit"] == "By/s"
    assert {a["network.io.direction"]: v for a, v in points_by(pcie, **{"hw.id": "GPU-0"})} == {
        "transmit": 1_024_000, "receive": 2_048_000}  # fmt: skip
    for name in ("gpuwarden.gpu.nvlink.errors", "gpuwarden.gpu.nvlink.active", "gpuwarden.gpu.tensor.activity",
                 "gpuwarden.gpu.sm.occupancy", "gpuwarden.gpu.pcie.throughput"):  # fmt: skip
        assert points_by(m[name], **{"hw.id": "GPU-1"}) == [], name  # not reported: absent, never 0
    assert "gpuwarden.gpu.fan.speed" not in m  # no GPU reports it
    status = m["hw.status"]
    assert (status["unit"], status["kind"], status["monotonic"]) == ("1", "sum", False)
    states = {a["hw.state"]: v for a, v in points_by(status, **{"hw.id": "GPU-0"})}
    assert states == {"ok": 0, "degraded": 0, "failed": 1, "predicted_failure": 0}  # open critical failure
    states1 = {a["hw.state"]: v for a, v in points_by(status, **{"hw.id": "GPU-1"})}
    assert states1 == {"ok": 1, "degraded": 0, "failed": 0, "predicted_failure": 0}
    throttle = points_by(m["gpuwarden.gpu.throttle.active"], **{"hw.id": "GPU-0"})
    assert [(a["gpuwarden.throttle.reason"], v) for a, v in throttle] == [("sw_power_cap", 1)]
    assert [v for _, v in points_by(m["gpuwarden.gpu.pcie.link.width"], **{"hw.id": "GPU-0"})] == [16]
    fails = m["gpuwarden.failures"]
    assert [(a["gpuwarden.failure.pattern"], v) for a, v in points_by(fails)] == [("gpu-fallen-off-bus", 1)]

    logs = {r["event_name"] or r["attributes"].get("event.name"): r for r in receiver.log_records()}
    f = logs["gpuwarden.failure"]
    assert f["body"] == "GPU 0 fell off the bus"
    assert (f["severity_number"], f["severity_text"]) == (17, "ERROR")
    assert f["time_ns"] == round((TS - 2) * 1e9)
    assert f["attributes"]["gpuwarden.failure.pattern"] == "gpu-fallen-off-bus"
    assert f["attributes"]["slurm.job.id"] == "42"
    assert f["attributes"]["hw.id"] == "GPU-0"
    assert json.loads(f["attributes"]["gpuwarden.failure.evidence"]) == []
    assert f["resource"]["service.name"] == "bridge-test"
    x = logs["gpuwarden.gpu.xid"]
    assert x["body"] == an_xid().event.raw
    assert x["attributes"]["gpu.xid"] == 79
    assert x["attributes"]["slurm.job.id"] == "42"
    assert x["time_ns"] == round((TS - 3) * 1e9)
    n = logs["gpuwarden.node.state"]
    assert n["body"] == "n1: DOWN+DRAIN (xid 79)"
    assert n["attributes"]["slurm.node.state"] == "DOWN"
    assert n["attributes"]["slurm.node.flags"] == ["DRAIN"]


@pytest.mark.parametrize("path", ["direct", "sdk"])
def test_rotel_forwards_dcgm_names_on_both_metric_paths(
    path: str, rotel: dict[str, int], receiver: OtlpReceiver
) -> None:
    bridge = run_bridge("grpc", f"http://127.0.0.1:{rotel['grpc']}", path, naming="dcgm")
    try:
        assert receiver.wait(lambda r: "DCGM_FI_DEV_XID_ERRORS" in r.metric_points())
    finally:
        bridge.stop(10)
    m = receiver.metric_points()
    gpu_names = {n for n in m if not n.startswith("gpuwarden.failure")}  # failure metrics keep their names
    assert gpu_names and all(n.startswith("DCGM_FI_") for n in gpu_names), gpu_names  # exact case, no OTel names
    labels0 = {"gpu": "0", "UUID": "GPU-0", "device": "nvidia0", "modelName": "NVIDIA H100", "Hostname": "n1",
               "pci_bus_id": "0000:01:00.0", "DCGM_FI_DRIVER_VERSION": "550.54.15", "hpc_job": "42"}  # fmt: skip
    want = {"DCGM_FI_DEV_GPU_UTIL": 50.0, "DCGM_FI_DEV_XID_ERRORS": 79, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.42,
            "DCGM_FI_PROF_SM_OCCUPANCY": 0.25, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 7,
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 3, "DCGM_FI_PROF_PCIE_TX_BYTES": 1_024_000}  # fmt: skip
    for name, value in want.items():
        assert [(a, v) for a, v in points_by(m[name], UUID="GPU-0")] == [(labels0, pytest.approx(value))], name
    assert points_by(m["DCGM_FI_DEV_XID_ERRORS"], UUID="GPU-1") == []
    assert points_by(m["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"], UUID="GPU-1") == []
    assert (m["DCGM_FI_DEV_XID_ERRORS"]["kind"], m["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]["monotonic"]) == (
        "gauge", True)  # fmt: skip


# -- Prometheus ------------------------------------------------------------------------


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


@pytest.fixture
def prometheus_choice(docker_engine: bool) -> ServerChoice:
    """Prometheus in a container, the Debian package's, or missing (see tests/servers.py)."""
    return choose_server("Prometheus", os.environ, docker_engine, prometheus_binary() is not None)


@pytest.fixture
def bridge_metrics_port(prometheus_choice: ServerChoice) -> Iterator[tuple[OtlpBridge, int]]:
    """A bridge (no OTLP) with its collector served on ``/metrics`` on a free port: on loopback,
    or every interface when Prometheus runs in a container (it scrapes through the docker bridge)."""
    from prometheus_client import CollectorRegistry, start_http_server

    bridge = OtlpBridge(resource=build_resource("bridge-test"))
    registry = CollectorRegistry()
    registry.register(bridge.collector)
    port = free_port()
    addr = server_containers.BIND_FOR_CONTAINERS if prometheus_choice == "container" else "127.0.0.1"
    server, thread = start_http_server(port, addr=addr, registry=registry)
    try:
        yield bridge, port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def prometheus(
    bridge_metrics_port: tuple[OtlpBridge, int], prometheus_choice: ServerChoice, tmp_path: Path
) -> Iterator[int]:
    """Prometheus (Debian's, or its image) scraping the bridge every second; yields its HTTP port."""
    if prometheus_choice == "missing":
        give_up("Debian package prometheus not installed (listed in deploy/debian-packages.txt)")
    _, target = bridge_metrics_port
    if prometheus_choice == "container":
        scrape = f"{server_containers.HOST_FROM_CONTAINER}:{target}"
        with server_containers.prometheus(server_containers.prometheus_config(scrape, "gpuwarden-otlp-bridge")) as port:
            yield port
        return
    binary = prometheus_binary()
    assert binary is not None  # prometheus_choice said "local"
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(server_containers.prometheus_config(f"127.0.0.1:{target}", "gpuwarden-otlp-bridge"))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_port(port, 30)
        deadline = time.monotonic() + 60  # the port opens before the TSDB is ready (503 until then)
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_prometheus_scrapes_the_gpu_series_and_joins_the_job(
    prometheus: int, bridge_metrics_port: tuple[OtlpBridge, int]
) -> None:
    """GPU series without job labels (GPUWARDEN_OTLP_BRIDGE_PROM_JOB_LABELS=info), the job on
    gpuwarden_gpu_job_info, joined by a real Prometheus as the rules and the dashboard do."""
    bridge, _ = bridge_metrics_port
    bridge.on_sample(attributed())
    bridge.on_event(an_xid())
    join = " * on(node, gpu) group_left(job_id, user, partition) gpuwarden_gpu_job_info"

    def query(expr: str) -> list[Any]:
        url = f"http://127.0.0.1:{prometheus}/api/v1/query?query={urllib.parse.quote(expr)}"
        return http_json(url)["data"]["result"]

    deadline = time.monotonic() + 30
    result: list[Any] = []
    while time.monotonic() < deadline and not result:
        result = query("gpuwarden_gpu_utilization_ratio" + join + '{job_id="42"}')
        time.sleep(0.3)
    assert len(result) == 1
    labels = result[0]["metric"]
    assert labels == {
        "instance": labels["instance"], "job": "gpuwarden-otlp-bridge", "node": "n1", "gpu": "0", "uuid": "GPU-0",
        "pci_bus_id": "0000:01:00.0", "model": "NVIDIA H100", "job_id": "42", "user": "alice", "partition": "gpu",
    }  # fmt: skip
    assert float(result[0]["value"][1]) == 0.5
    [raw] = query('gpuwarden_gpu_utilization_ratio{gpu="0"}')
    assert "job_id" not in raw["metric"]
    info = query("gpuwarden_gpu_job_info")
    assert [(r["metric"]["gpu"], r["metric"]["job_id"]) for r in info] == [("0", "42")]  # GPU 1 is idle: none
    errors = query('sum by (gpu, error_type) (gpuwarden_gpu_errors_total{node="n1"})')
    got = {(r["metric"]["gpu"], r["metric"]["error_type"]): float(r["value"][1]) for r in errors}
    assert got == {("0", "corrected"): 3, ("0", "uncorrected"): 0, ("0", "pcie_replay"): 7, ("0", "xid_79"): 1,
                   ("0", "nvlink_crc_flit"): 7, ("0", "nvlink_crc_data"): 1, ("0", "nvlink_replay"): 0,
                   ("0", "nvlink_recovery"): 3,
                   ("1", "corrected"): 3, ("1", "uncorrected"): 0, ("1", "pcie_replay"): 7}  # fmt: skip
    nvl = query('gpuwarden_gpu_nvlink_errors_total{node="n1",error_type="crc_flit"}' + join)
    assert {(r["metric"]["job_id"], r["metric"]["link"]): float(r["value"][1]) for r in nvl} == {
        ("42", "0"): 5, ("42", "1"): 2}  # fmt: skip
