"""Samples are attributed in one place, the correlator: the detector takes a GPU's job from
``AttributedSample.jobs`` only, and a sample whose attribution is ``unknown`` gives no reading
to the rules that depend on the GPU's job (``zombie-process``), while the others still fire."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from prometheus_client import generate_latest

from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.conditions import JOB_DEPENDENT, MemoryWithoutJob
from gpuwarden.detector.service import DetectorService, DetectorSettings
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import (
    AttributedSample,
    Failure,
    FailureState,
    GpuAttribution,
    GpuSample,
    JobState,
    NodeSample,
)

T0 = 1_700_000_000.0
NODE = "gpu-node-001"
CATALOG = load_catalog()
ZOMBIE = next(c for c in CATALOG.conditions if c.id == "zombie-process")
THERMAL = next(c for c in CATALOG.conditions if c.id == "thermal-throttle")


def gpu(**kw: Any) -> GpuSample:
    """GPU 0: idle, 9 GB used by a process (a zombie when no job holds it)."""
    base: dict[str, Any] = dict(
        index=0,
        uuid="GPU-0",
        pci_bus_id="0000:18:00.0",
        utilization_gpu_pct=0.0,
        memory_used_mib=9000.0,
        memory_total_mib=81_559.0,
        temperature_c=40.0,
        power_w=70.0,
        power_limit_w=700.0,
        sm_clock_mhz=1980.0,
        max_sm_clock_mhz=1980.0,
        throttle_reasons=[],
        processes=[{"pid": 4242, "used_memory_mib": 9000.0}],
    )
    base.update(kw)
    return GpuSample(**base)


def sample(
    t: float,
    attribution: Literal["known", "unknown"] = "known",
    jobs: list[GpuAttribution] | None = None,
    **kw: Any,
) -> AttributedSample:
    s = NodeSample(node=NODE, ts=T0 + t, collector_id="t", source="test", gpus=[gpu(**kw)])
    return AttributedSample(sample=s, jobs=jobs or [], attribution=attribution)


def feed(d: Detector, start: int, stop: int, attribution: Literal["known", "unknown"], **kw: Any) -> list[Failure]:
    """1-Hz samples from ``start`` to ``stop - 1`` s."""
    out: list[Failure] = []
    for t in range(start, stop):
        out += d.on_sample(sample(t, attribution, **kw))
    return out


def of(fs: list[Failure], rule_id: str, state: FailureState | None = None) -> list[Failure]:
    return [f for f in fs if f.rule_id == rule_id and (state is None or f.state is state)]


def test_memory_without_job_is_the_job_dependent_gpu_signal() -> None:
    assert frozenset({MemoryWithoutJob}) == JOB_DEPENDENT
    assert isinstance(ZOMBIE.signal, MemoryWithoutJob) and ZOMBIE.for_s > 0


def test_unknown_samples_longer_than_for_s_raise_no_zombie_and_known_ones_count_from_the_first() -> None:
    d = Detector(CATALOG)
    unknown_s = int(3 * ZOMBIE.for_s)
    assert feed(d, 0, unknown_s, "unknown") == []  # far longer than for_s: nothing
    # now known, still no job: for_s counted from the first known reading, not from the unknown ones
    quiet = feed(d, unknown_s, unknown_s + int(ZOMBIE.for_s), "known")
    assert of(quiet, "zombie-process") == []
    [opened] = feed(d, unknown_s + int(ZOMBIE.for_s), unknown_s + int(ZOMBIE.for_s) + 1, "known")
    assert (opened.rule_id, opened.state, opened.gpu_index, opened.job_id) == ("zombie-process", "open", 0, None)
    assert opened.first_seen == T0 + unknown_s + ZOMBIE.for_s
    assert opened.evidence[0].ts == T0 + unknown_s  # the onset: the first known reading


def test_an_unknown_gap_restarts_a_pending_zombie() -> None:
    """Unknown time never counts toward for_s, even in the middle of a pending streak."""
    d = Detector(CATALOG)
    half = int(ZOMBIE.for_s) // 2 + 5
    out = feed(d, 0, half, "known")
    out += feed(d, half, 2 * half, "unknown")
    out += feed(d, 2 * half, 2 * half + int(ZOMBIE.for_s), "known")  # for_s - 1 s of known readings
    assert of(out, "zombie-process") == []
    [opened] = feed(d, 2 * half + int(ZOMBIE.for_s), 2 * half + int(ZOMBIE.for_s) + 1, "known")
    assert opened.first_seen == T0 + 2 * half + ZOMBIE.for_s


def test_unknown_samples_do_not_resolve_an_open_zombie() -> None:
    d = Detector(CATALOG)
    opened = of(feed(d, 0, int(ZOMBIE.for_s) + 1, "known"), "zombie-process", FailureState.OPEN)
    assert opened
    # unknown readings (memory freed or not: nothing is known about the job) for far longer than
    # resolve_after_s resolve nothing
    t = int(ZOMBIE.for_s) + 1
    gap = int(3 * ZOMBIE.resolve_after_s) + 10
    assert of(feed(d, t, t + gap, "unknown", memory_used_mib=0.0, processes=[]), "zombie-process") == []
    assert of(feed(d, t + gap, t + 2 * gap, "unknown"), "zombie-process", FailureState.RESOLVED) == []
    t += 2 * gap
    # known and still a zombie: the same failure (no second one opens; updates keep its id)
    still = of(feed(d, t, t + 40, "known"), "zombie-process")
    assert all(f.failure_id == opened[0].failure_id and f.state is FailureState.OPEN for f in still)


def test_an_unknown_gap_restarts_a_resolving_zombie() -> None:
    """Resolving needs resolve_after_s of known healthy readings after the last unknown one."""
    d = Detector(CATALOG)
    [opened] = of(feed(d, 0, int(ZOMBIE.for_s) + 1, "known"), "zombie-process", FailureState.OPEN)
    t = int(ZOMBIE.for_s) + 1
    clean: dict[str, Any] = {"memory_used_mib": 0.0, "processes": []}
    r = int(ZOMBIE.resolve_after_s)
    out = feed(d, t, t + r - 5, "known", **clean)  # healthy, not yet long enough
    out += feed(d, t + r - 5, t + r + 5, "unknown", **clean)
    out += feed(d, t + r + 5, t + 2 * r + 5, "known", **clean)  # resolve_after_s - 1 s after the gap
    assert of(out, "zombie-process", FailureState.RESOLVED) == []
    [resolved] = of(feed(d, t + 2 * r + 5, t + 2 * r + 6, "known", **clean), "zombie-process")
    assert resolved.state is FailureState.RESOLVED and resolved.failure_id == opened.failure_id


def test_job_independent_rules_fire_on_unknown_samples() -> None:
    d = Detector(CATALOG)
    hot: dict[str, Any] = {"throttle_reasons": ["sw_thermal_slowdown"], "temperature_c": 88.0, "sm_clock_mhz": 1500.0}
    out = feed(d, 0, int(THERMAL.for_s) + 10, "unknown", utilization_gpu_pct=96.0, **hot)
    [thermal] = of(out, "thermal-throttle", FailureState.OPEN)
    assert thermal.gpu_index == 0 and thermal.job_id is None  # unknown: no job to name
    assert thermal.first_seen == T0 + THERMAL.for_s
    assert of(out, "zombie-process") == []


def test_no_fallback_to_the_detectors_allocations_a_known_sample_without_jobs_is_no_job() -> None:
    """The detector knows a job on the GPU from ``slurm.jobs``, but the correlator says no job
    held it: the correlator's word is the attribution (a zombie), not the detector's table."""
    d = Detector(CATALOG)
    job = JobState(
        job_id="42",
        ts=T0 - 100,
        state="RUNNING",
        user="alice",
        partition="gpu",
        nodes=[NODE],
        gpus={NODE: [0]},
        start_ts=T0 - 100,
    )
    d.on_job(job)
    assert d._job_at(NODE, 0, T0) is not None  # the detector's own table has it
    out = feed(d, 0, int(ZOMBIE.for_s) + 1, "known")
    [opened] = of(out, "zombie-process", FailureState.OPEN)
    assert opened.job_id is None


def test_a_known_sample_with_its_job_is_no_zombie_and_names_the_job() -> None:
    d = Detector(CATALOG)
    att = [GpuAttribution(gpu_index=0, job_id="42", user="alice", partition="gpu", job_gpus=1)]
    hot: dict[str, Any] = {"throttle_reasons": ["sw_thermal_slowdown"], "temperature_c": 88.0, "sm_clock_mhz": 1500.0}
    out: list[Failure] = []
    for t in range(int(max(ZOMBIE.for_s, THERMAL.for_s)) + 10):
        out += d.on_sample(sample(t, "known", att, utilization_gpu_pct=96.0, **hot))
    assert of(out, "zombie-process") == []
    assert {f.job_id for f in of(out, "thermal-throttle")} == {"42"}


def test_the_service_counts_unknown_attributed_samples() -> None:
    svc = DetectorService(DetectorSettings(), producer=MemoryPublisher())  # type: ignore[arg-type]
    for t, att in enumerate(["unknown", "known", "unknown", "unknown"]):
        asyncio.run(svc.handle("gpu.attributed", sample(float(t), att)))  # type: ignore[arg-type]
    text = generate_latest(svc.metrics.registry).decode()
    assert "gpuwarden_detector_unknown_samples_total 3.0" in text


def test_an_xid_named_by_bus_only_gets_the_gpu_index_the_samples_gave_that_bus() -> None:
    """A collector restarted after a GPU fell off the bus cannot enumerate that GPU and reads the
    XID from the kernel log by PCI bus id alone (found by the chaos bench once a restarted
    collector stopped replaying from second 0): the failure still names the GPU's index."""
    from gpuwarden.detector.lanes import as_attributed
    from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line

    d = Detector(CATALOG)
    d.on_sample(sample(0, pci_bus_id="0000:44:00.0", uuid="GPU-44"))
    ev = parse_kernel_log_line("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus", NODE, T0 + 5)
    assert ev is not None and ev.gpu_index is None and ev.pci_bus_id
    out = d.on_event(as_attributed(ev), raw=True) + d.flush()
    fell = [f for f in out if f.pattern == "gpu-fallen-off-bus"]
    assert fell and {(f.gpu_index, f.gpu_uuid) for f in fell} == {(0, "GPU-44")}
    # a bus this detector has no sample of stays a bus-only finding (no index is guessed)
    other = parse_kernel_log_line("NVRM: Xid (PCI:0000:c4:00): 79, GPU has fallen off the bus", NODE, T0 + 6)
    assert other is not None
    out = d.on_event(as_attributed(other), raw=True) + d.flush()
    assert {
        f.gpu_index for f in out if f.pattern == "gpu-fallen-off-bus" and f.pci_bus_id and "c4" in f.pci_bus_id
    } == {None}


def test_after_a_restart_without_state_the_bus_is_known_from_the_adopted_failure() -> None:
    """The chaos bench's case: detector and collector restart together; the collector re-reads the
    kernel log (no saved position) and sends the XID by bus only, before any sample reaches the new
    detector. The failure it adopted from ``failures`` names the bus and index: the same failure."""
    from gpuwarden.detector.lanes import as_attributed
    from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line

    line = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
    first = Detector(CATALOG)
    first.on_sample(sample(0, pci_bus_id="0000:44:00.0", uuid="GPU-44"))
    ev = parse_kernel_log_line(line, NODE, T0 + 5)
    assert ev is not None
    opened = [
        f for f in first.on_event(as_attributed(ev), raw=True) + first.flush() if f.pattern == "gpu-fallen-off-bus"
    ]
    assert opened and opened[-1].gpu_index == 0
    again = Detector(CATALOG)  # no state file: it adopts what it published
    assert again.adopt(opened[-1])
    replay = parse_kernel_log_line(line, NODE, T0 + 5)
    assert replay is not None and replay.gpu_index is None
    out = [
        f for f in again.on_event(as_attributed(replay), raw=True) + again.flush() if f.pattern == "gpu-fallen-off-bus"
    ]
    assert {f.failure_id for f in out} <= {opened[-1].failure_id}
