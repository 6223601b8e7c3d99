"""dcgm-exporter naming (``GPUWARDEN_OTLP_BRIDGE_NAMING=dcgm``, pure): dcgm-exporter's labels
and the value of each ``dcgm`` catalog entry (``metrics.csv``) in dcgm-exporter's unit, read
from a :class:`GpuView`. The catalog and :data:`_DCGM_VALUES` are checked at import to map
the same names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpuwarden.shared.fields import FieldSpec, dcgm_write_fields

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


def _registry_value(f: FieldSpec) -> Callable[[GpuView], float | None]:
    """A registry row's value in DCGM's unit: the model's value / ``dcgm_scale``, a bool as 0/1."""
    name, k = f.field, 1.0 / (f.dcgm_scale or 1.0)
    if f.type == "bool":
        return lambda v: _flag(getattr(v.gpu, name))
    if k == 1.0:
        return lambda v: getattr(v.gpu, name)
    return lambda v: _scale(getattr(v.gpu, name), k)


#: Values computed in code, not one GpuSample field each: FB_FREE from total - used (the
#: collector reads FB_FREE into ``memory_free_mib``), NVLink totals over the links, the last XID.
_DCGM_COMPUTED: dict[str, Callable[[GpuView], float | None]] = {
    "DCGM_FI_DEV_FB_FREE": _fb_free,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "crc_flit"),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "crc_data"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "replay"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": lambda v: _nvl(v, "recovery"),
    "DCGM_FI_DEV_XID_ERRORS": lambda v: None if v.last_xid is None else float(v.last_xid),
}


def _dcgm_values() -> dict[str, Callable[[GpuView], float | None]]:
    out = {f.dcgm_field[0]: _registry_value(f) for f in dcgm_write_fields()}
    if both := out.keys() & _DCGM_COMPUTED.keys():
        raise ValueError(f"fields.csv: {sorted(both)} are computed in otlp_bridge/dcgm.py, not written from a field")
    return out | _DCGM_COMPUTED


#: dcgm-exporter field name -> its value in dcgm-exporter's unit (None: not reported): the
#: registry's written fields (``gpuwarden/shared/fields.csv``, ``dcgm_dir`` write/both) and
#: :data:`_DCGM_COMPUTED`.
_DCGM_VALUES: dict[str, Callable[[GpuView], float | None]] = _dcgm_values()


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
