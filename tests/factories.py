"""Test data builders shared by unit and integration tests (importable as ``factories``:
pytest puts this folder on ``sys.path`` because it holds the root ``conftest.py``)."""

from __future__ import annotations

import re
from typing import Any

from gpuwarden.shared.models import Action, Category, CostEstimate, Failure, GpuSample, NodeState, Severity


def make_failure(**overrides: Any) -> Failure:
    """A drain-worthy ``gpu-fallen-off-bus`` Failure; every field can be overridden.

    ``affected_gpus``/``usd_per_hour``/``gpu_hours_lost`` override the cost's fields.
    """
    cost = {k: overrides.pop(k) for k in ("affected_gpus", "usd_per_hour", "gpu_hours_lost") if k in overrides}
    base: dict[str, Any] = dict(
        failure_id="f1",
        pattern="gpu-fallen-off-bus",
        rule_id="xid-79",
        category=Category.HARDWARE,
        severity=Severity.CRITICAL,
        node="gpu-node-002",
        gpu_index=3,
        first_seen=10.0,
        last_seen=10.0,
        verdict="GPU 3 fell off the bus",
        recommended_action=Action.DRAIN,
        cost=CostEstimate(**{"affected_gpus": 8, "usd_per_hour": 26.08, "gpu_hours_lost": 0.0, **cost}),
    )
    base.update(overrides)
    return Failure.model_validate(base)


def node_states(n: int, ts: float, drained: dict[str, str] | None = None) -> list[NodeState]:
    """``gpu-node-001..n`` IDLE; those in ``drained`` (node -> reason) carry DRAIN, set by root."""
    drained = drained or {}
    return [
        NodeState(
            node=name,
            ts=ts,
            state="IDLE",
            flags=["DRAIN"] if name in drained else [],
            reason=drained.get(name),
            reason_user="root" if name in drained else None,
        )
        for name in (f"gpu-node-{i:03d}" for i in range(1, n + 1))
    ]


def healthy_gpu(index: int, **kw: Any) -> GpuSample:
    """A busy, healthy H100 reading of GPU ``index`` with every health field (18 NVLinks, one
    compute process); ``kw`` overrides fields."""
    base: dict[str, Any] = dict(
        index=index,
        uuid=f"GPU-{index}",
        pci_bus_id=f"0000:{0x18 + index:02x}:00.0",
        name="NVIDIA H100 80GB HBM3",
        utilization_gpu_pct=96.0,
        memory_used_mib=70_000.0,
        memory_total_mib=81_559.0,
        temperature_c=66.0,
        power_w=640.0,
        power_limit_w=700.0,
        sm_clock_mhz=1980.0,
        max_sm_clock_mhz=1980.0,
        throttle_reasons=[],
        ecc_sbe_volatile=0,
        ecc_dbe_volatile=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        retired_pages_pending=False,
        pcie_replay_count=0,
        pcie_link_gen=5,
        pcie_link_gen_max=5,
        pcie_link_width=16,
        pcie_link_width_max=16,
        processes=[{"pid": 4242, "used_memory_mib": 69_000.0}],
        nvlinks=[{"link": i, "active": True, "crc_flit_errors": 0, "replay_errors": 0} for i in range(18)],
    )
    base.update(kw)
    return GpuSample(**base)


def version_report(stdout: str) -> dict[str, str]:
    """``gpuwarden --version``'s output as ``{distribution: version}``, one entry per gpuwarden
    package it names (``gpuwarden-detector 0.9.0`` -> ``{"gpuwarden-detector": "0.9.0"}``)."""
    return dict(re.findall(r"(gpuwarden(?:-[a-z-]+)?) (\S+)", stdout))
