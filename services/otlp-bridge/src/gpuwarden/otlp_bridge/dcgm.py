"""dcgm-exporter naming (``GPUWARDEN_OTLP_BRIDGE_NAMING=dcgm``, pure): dcgm-exporter's labels
and the value of each ``dcgm`` catalog entry (``metrics.csv``) in dcgm-exporter's unit, read
from a :class:`GpuView`. The catalog and :data:`_DCGM_VALUES` are checked at import to map
the same names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from .catalog import catalog_entries
from .metrics import AttrValue, GpuView, _check_keys, nvlink_error_totals

__all__ = ["DCGM_LABELS", "DCGM_METRICS", "DcgmSpec", "dcgm_attributes", "dcgm_labels"]


def _scale(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


def _flag(b: bool | None) -> float | None:
    return None if b is None else float(b)


DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION", "hpc_job")


def dcgm_labels(attrs: Mapping[str, AttrValue]) -> tuple[str, ...]:
    """dcgm-exporter label values (:data:`DCGM_LABELS` order, '' when absent) from a GPU's
    OTel attributes: ``gpu.index``->gpu, ``gpu.uuid``->UUID, ``hw.name``->device,
    ``hw.model``->modelName, ``host.name``->Hostname, ``hw.driver_version``->
    DCGM_FI_DRIVER_VERSION, ``slurm.job.id``->hpc_job."""
    keys = ("gpu.index", "gpu.uuid", "hw.name", "hw.model", "host.name", "gpu.pci_bus_id", "hw.driver_version",
            "slurm.job.id")  # fmt: skip
    return tuple(str(attrs.get(k, "")) for k in keys)


def dcgm_attributes(attrs: Mapping[str, AttrValue]) -> dict[str, AttrValue]:
    """dcgm-exporter labels of a GPU as OTLP data-point attributes: :func:`dcgm_labels`
    without the empty ones (an attribute is left out, never empty)."""
    return {k: v for k, v in zip(DCGM_LABELS, dcgm_labels(attrs), strict=True) if v}


@dataclass(frozen=True)
class DcgmSpec:
    """One dcgm-exporter field: name, kind, help and the value in dcgm-exporter's unit."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    value: Callable[[GpuView], float | None]


def _fb_free(v: GpuView) -> float | None:
    g = v.gpu
    if g.memory_used_mib is None or g.memory_total_mib is None:
        return None
    return max(g.memory_total_mib - g.memory_used_mib, 0.0)


def _nvl(v: GpuView, etype: str) -> float | None:
    n = nvlink_error_totals(v.gpu).get(etype)
    return None if n is None else float(n)


#: dcgm-exporter field name -> its value in dcgm-exporter's unit (None: not reported)
_DCGM_VALUES: dict[str, Callable[[GpuView], float | None]] = {
    "DCGM_FI_DEV_GPU_UTIL": lambda v: v.gpu.utilization_gpu_pct,
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda v: v.gpu.utilization_memory_pct,
    "DCGM_FI_DEV_FB_USED": lambda v: v.gpu.memory_used_mib,
    "DCGM_FI_DEV_FB_FREE": _fb_free,
    "DCGM_FI_DEV_GPU_TEMP": lambda v: v.gpu.temperature_c,
    "DCGM_FI_DEV_MEMORY_TEMP": lambda v: v.gpu.memory_temperature_c,
    "DCGM_FI_DEV_POWER_USAGE": lambda v: v.gpu.power_w,
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": lambda v: v.gpu.power_limit_w,
    "DCGM_FI_DEV_SM_CLOCK": lambda v: v.gpu.sm_clock_mhz,
    "DCGM_FI_DEV_MEM_CLOCK": lambda v: v.gpu.memory_clock_mhz,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda v: _scale(v.gpu.energy_j, 1000.0),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": lambda v: v.gpu.ecc_sbe_volatile,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": lambda v: v.gpu.ecc_dbe_volatile,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda v: v.gpu.pcie_replay_count,
    "DCGM_FI_DEV_PCIE_LINK_GEN": lambda v: v.gpu.pcie_link_gen,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": lambda v: v.gpu.pcie_link_width,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda v: _flag(v.gpu.remapped_rows_failure),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": lambda v: _flag(v.gpu.remapped_rows_pending),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda v: v.gpu.remapped_rows_correctable,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda v: v.gpu.remapped_rows_uncorrectable,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": lambda v: v.gpu.ecc_sbe_aggregate,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": lambda v: v.gpu.ecc_dbe_aggregate,
    "DCGM_FI_DEV_RETIRED_SBE": lambda v: v.gpu.retired_pages_sbe,
    "DCGM_FI_DEV_RETIRED_DBE": lambda v: v.gpu.retired_pages_dbe,
    "DCGM_FI_DEV_RETIRED_PENDING": lambda v: _flag(v.gpu.retired_pages_pending),
    "DCGM_FI_DEV_FAN_SPEED": lambda v: v.gpu.fan_speed_pct,
    "DCGM_FI_DEV_PSTATE": lambda v: v.gpu.performance_state,
    "DCGM_FI_PROF_PCIE_TX_BYTES": lambda v: _scale(v.gpu.pcie_tx_kbps, 1024.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": lambda v: _scale(v.gpu.pcie_rx_kbps, 1024.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda v: _scale(v.gpu.tensor_activity_pct, 0.01),
    "DCGM_FI_PROF_SM_OCCUPANCY": lambda v: _scale(v.gpu.sm_occupancy_pct, 0.01),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "crc_flit"),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "crc_data"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "replay"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "recovery"),
    "DCGM_FI_DEV_XID_ERRORS": lambda v: None if v.last_xid is None else float(v.last_xid),
}  # fmt: skip


def _dcgm_metrics() -> tuple[DcgmSpec, ...]:
    rows = catalog_entries("dcgm")
    _check_keys("dcgm", rows, _DCGM_VALUES)
    out = []
    for e in rows:
        if e.instrument == "updown":
            raise ValueError(f"metrics.csv: dcgm metric {e.name} must be a gauge or a counter")
        out.append(DcgmSpec(e.name, "counter" if e.instrument == "counter" else "gauge", e.description,
                            _DCGM_VALUES[e.key]))  # fmt: skip
    return tuple(out)


#: The dcgm-exporter metrics, in catalog order.
DCGM_METRICS: tuple[DcgmSpec, ...] = _dcgm_metrics()
