"""A lost GPU's series are dropped at once (not 300 s later at the staleness cut): the issue's
case, GPU 5 of an 8-GPU node falls off the bus at t=60 s and must not be exported at its last
reading (98 %, 608 W, 65 C) at t=61 or t=290."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.otlp_bridge.prom import BridgeCollector
from gpuwarden.otlp_bridge.store import LatestStore
from gpuwarden.shared.models import AttributedEvent, AttributedSample, EventKind, GpuEvent, GpuSample, NodeSample

T0 = 1_800_000_000.0


def gpu(i: int) -> GpuSample:
    return GpuSample(index=i, uuid=f"GPU-{i}", utilization_gpu_pct=98.0, power_w=608.0, temperature_c=65.0)


def sample(t: float, gpus: list[int], node: str = "gpu-node-003") -> AttributedSample:
    return AttributedSample(
        sample=NodeSample(node=node, ts=T0 + t, collector_id="c", source="nvml", gpus=[gpu(i) for i in gpus])
    )


def lost(t: float, index: int | None, node: str = "gpu-node-003") -> AttributedEvent:
    return AttributedEvent(
        event=GpuEvent(event_id=f"lost-{t}-{index}", node=node, ts=T0 + t, kind=EventKind.GPU_LOST,
                       gpu_index=index, raw="NVML_ERROR_GPU_IS_LOST", source="nvml")
    )  # fmt: skip


def scrape(store: LatestStore) -> dict[str, set[tuple[str, str]]]:
    reg = CollectorRegistry()
    reg.register(BridgeCollector(store))
    out: dict[str, set[tuple[str, str]]] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if "gpu" in s.labels:
                out.setdefault(s.name, set()).add((s.labels["node"], s.labels["gpu"]))
    return out


def gpus_of(store: LatestStore, metric: str = "gpuwarden_gpu_power_watts") -> set[str]:
    return {g for _, g in scrape(store).get(metric, set())}


def test_gpu_left_out_of_a_newer_sample_is_dropped_at_once() -> None:
    store = LatestStore(staleness_s=300, clock=lambda: T0 + 1000)
    for t in range(0, 61, 10):
        store.update_sample(sample(t, list(range(8))))
    assert gpus_of(store) == {str(i) for i in range(8)}
    store.update_sample(sample(61, [0, 1, 2, 3, 4, 6, 7]))  # GPU 5 fell off the bus at t=60
    for metric in ("gpuwarden_gpu_power_watts", "gpuwarden_gpu_utilization_ratio",
                   "gpuwarden_gpu_temperature_celsius", "gpuwarden_gpu_last_sample_timestamp_seconds"):  # fmt: skip
        assert "5" not in gpus_of(store, metric), metric
    assert len(gpus_of(store)) == 7 and store.gpus_lost == 1
    store.update_sample(sample(290, [0, 1, 2, 3, 4, 6, 7]))
    assert "5" not in gpus_of(store)
    store.update_sample(sample(300, list(range(8))))  # back after a reset: exported again
    assert "5" in gpus_of(store)


def test_an_older_sample_arriving_late_does_not_drop_newer_gpus() -> None:
    store = LatestStore(staleness_s=300, clock=lambda: T0 + 1000)
    store.update_sample(sample(10, [0, 1]))
    store.update_sample(sample(5, [0]))  # late, older: GPU 1's newer reading stays
    assert gpus_of(store) == {"0", "1"} and store.gpus_lost == 0


def test_gpu_lost_event_drops_the_gpu_before_the_next_sample() -> None:
    store = LatestStore(staleness_s=300, clock=lambda: T0 + 1000)
    store.update_sample(sample(60, list(range(8))))
    store.update_sample(sample(60, [0, 1], node="gpu-node-004"))
    store.update_event(lost(60.5, 5))
    assert gpus_of(store) == {str(i) for i in range(8)} - {"5"} | {"0", "1"}
    store.update_event(lost(61, None))  # NVML itself failed on the node: every GPU of it
    assert scrape(store)["gpuwarden_gpu_power_watts"] == {("gpu-node-004", "0"), ("gpu-node-004", "1")}
    store.update_event(lost(59, 0, node="gpu-node-004"))  # older than the GPU's latest sample: kept
    assert gpus_of(store) == {"0", "1"}


def test_lost_counter_is_exported() -> None:
    from gpuwarden.otlp_bridge import OtlpBridge

    b: Any = OtlpBridge(clock=lambda: T0 + 1000)
    b.on_sample(sample(0, [0, 1]))
    b.on_sample(sample(1, [0]))
    reg = CollectorRegistry()
    reg.register(b.collector)
    text = generate_latest(reg).decode()
    assert "gpuwarden_gpus_lost_total 1.0" in text


def test_hand_over_forgets_the_nodes_gpus_or_open_failures_and_keeps_counts() -> None:
    """A rebalance moved the nodes' partitions to another bridge (issue 26: no GPU on two
    bridges' /metrics): their GPUs and job info go, or their open failures go; counters stay."""
    from gpuwarden.shared.models import Action, Category, CostEstimate, Failure, Severity

    store = LatestStore(clock=lambda: T0 + 100)
    for node in ("gpu-node-003", "gpu-node-004"):
        store.update_sample(sample(0, [0, 1], node=node))
        store.update_failure(
            Failure(failure_id=f"f-{node}", pattern="thermal-throttle", rule_id="thermal-throttle",
                    category=Category.HARDWARE, severity=Severity.WARNING, node=node, gpu_index=0,
                    first_seen=T0, last_seen=T0, verdict="hot", recommended_action=Action.ALERT,
                    cost=CostEstimate(affected_gpus=1, usd_per_hour=1.0, gpu_hours_lost=0.0))
        )  # fmt: skip
    assert store.hand_over(["gpu-node-003", "unknown-node"], gpus=True) == 2
    assert {(e.node, e.index) for e in store.gpus()} == {("gpu-node-004", 0), ("gpu-node-004", 1)}
    assert {f.node for f in store._open.values()} == {"gpu-node-003", "gpu-node-004"}
    assert store.hand_over(["gpu-node-003"], failures=True) == 1
    assert {f.node for f in store._open.values()} == {"gpu-node-004"}
    assert sum(store.failure_counts().values()) == 2  # counted failures stay counted
    assert {n for n, _ in scrape(store)["gpuwarden_gpu_power_watts"]} == {"gpu-node-004"}
