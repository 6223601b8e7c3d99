"""How many Prometheus series the otlp-bridge's /metrics has per GPU, and whether a new Slurm
job makes new ones (churn): 8 simulated GPUs of one node through 3 successive jobs.

With ``GPUWARDEN_OTLP_BRIDGE_PROM_JOB_LABELS=info`` (default) a GPU has :data:`SERIES_PER_GPU`
series whatever job holds it, the job on one ``gpuwarden_gpu_job_info`` series among them; with
``series`` (job_id, user, partition on every GPU series) each job makes a new set and Prometheus
keeps the old ones in its head block until they go stale: the number of series ever seen grows
by the GPU's whole set per job. The figures are in services/otlp-bridge/README.md."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.otlp_bridge import OtlpBridge
from gpuwarden.shared.models import AttributedSample, GpuAttribution
from gpuwarden.shared.scenario import Scenario, ScenarioClock
from gpuwarden.sim.collector import SimulatedSource

START = 1_750_000_000.0
GPUS = 8
#: /metrics series of one simulated H100 (NVLink read every tick), gpuwarden_gpu_job_info included
SERIES_PER_GPU = 124


def scenario(nodes: int) -> Scenario:
    return Scenario.model_validate({
        "name": "prom-series", "seed": 1, "duration_s": 600, "tick_s": 1,
        "cluster": {"nodes": nodes, "gpus_per_node": GPUS},
        "jobs": [{"id": 7, "nodes": f"gpu-node-[001-{nodes:03d}]", "start_s": 0, "profile": "training"}],
    })  # fmt: skip


def bridge(mode: Literal["info", "series"]) -> tuple[OtlpBridge, CollectorRegistry]:
    b = OtlpBridge(resource=Resource({}), clock=lambda: START + 30, prom_job_labels=mode)
    reg = CollectorRegistry()
    reg.register(b.collector)
    return b, reg


def feed(src: SimulatedSource, b: OtlpBridge, job_id: str) -> None:
    """Two ticks of every node (rates need two readings), each GPU held by ``job_id``."""
    for _ in range(2):
        for s in src.collect_sync():
            jobs = [GpuAttribution(gpu_index=g.index, job_id=job_id, user=f"u{job_id}", partition="gpu")
                    for g in s.gpus]  # fmt: skip
            b.on_sample(AttributedSample(sample=s, jobs=jobs))


def gpu_series(reg: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(name, labels) of every series about one GPU (a ``gpu`` label; open failures excepted)."""
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(generate_latest(reg).decode())
        for s in f.samples
        if "gpu" in s.labels and s.name != "gpuwarden_failure_open"
    }


def run_jobs(mode: Literal["info", "series"]) -> tuple[list[int], list[int], set[tuple[str, tuple]]]:
    """Series on /metrics after each of 3 jobs, series ever seen after each, the last set."""
    src = SimulatedSource(scenario(1), ScenarioClock(START), nvlink_every=1)
    b, reg = bridge(mode)
    now: list[int] = []
    ever: list[int] = []
    seen: set[tuple[str, tuple]] = set()
    last: set[tuple[str, tuple]] = set()
    for job in ("101", "102", "103"):
        feed(src, b, job)
        last = gpu_series(reg)
        seen |= last
        now.append(len(last))
        ever.append(len(seen))
    return now, ever, last


def test_info_mode_series_per_gpu_do_not_change_with_the_job() -> None:
    now, ever, last = run_jobs("info")
    assert now == [GPUS * SERIES_PER_GPU] * 3
    # only the 8 gpuwarden_gpu_job_info series are new per job: the GPU series stay the same
    assert ever == [GPUS * SERIES_PER_GPU + GPUS * k for k in range(3)]
    per_gpu = Counter(dict(labels)["gpu"] for _, labels in last)
    assert per_gpu == {str(i): SERIES_PER_GPU for i in range(GPUS)}
    assert all("job_id" not in dict(labels) for name, labels in last if name != "gpuwarden_gpu_job_info")
    info = sorted(dict(labels)["gpu"] for name, labels in last if name == "gpuwarden_gpu_job_info")
    assert info == [str(i) for i in range(GPUS)]


def test_series_mode_makes_new_series_per_job() -> None:
    now, ever, last = run_jobs("series")
    per_job = GPUS * (SERIES_PER_GPU - 1)  # no gpuwarden_gpu_job_info: the job is on every series
    assert now == [per_job] * 3
    assert ever == [per_job, 2 * per_job, 3 * per_job]  # each job: a whole new set (churn)
    assert {dict(labels)["job_id"] for _, labels in last} == {"103"}


def test_an_idle_gpu_has_no_job_info() -> None:
    src = SimulatedSource(scenario(1), ScenarioClock(START), nvlink_every=1)
    b, reg = bridge("info")
    for _ in range(2):
        for s in src.collect_sync():
            b.on_sample(AttributedSample(sample=s, jobs=[GpuAttribution(gpu_index=0, job_id="9", user="a")]))
    series = gpu_series(reg)
    assert [dict(labels)["gpu"] for name, labels in series if name == "gpuwarden_gpu_job_info"] == ["0"]
    assert len(series) == GPUS * (SERIES_PER_GPU - 1) + 1


def body_bytes(mode: Literal["info", "series"], nodes: int = 8) -> int:
    src = SimulatedSource(scenario(nodes), ScenarioClock(START), nvlink_every=1)
    b, reg = bridge(mode)
    feed(src, b, "101")
    return len(generate_latest(reg))


def test_body_size_for_64_gpus() -> None:
    """The README's figures (8 nodes x 8 GPUs): within 5 %."""
    info, series = body_bytes("info"), body_bytes("series")
    assert abs(info - INFO_BYTES_64) < 0.05 * INFO_BYTES_64, info
    assert abs(series - SERIES_BYTES_64) < 0.05 * SERIES_BYTES_64, series
    assert info < series


INFO_BYTES_64 = 1_530_000
SERIES_BYTES_64 = 1_846_000
