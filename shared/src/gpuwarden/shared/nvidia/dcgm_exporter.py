"""dcgm-exporter ``/metrics`` scrapes (Prometheus text exposition; dcgm-exporter 2.x .. 4.x,
DCGM 2.x .. 4.x field names, and the 1.x ``dcgm_*`` names of NVIDIA/gpu-monitoring-tools'
``dcgm-exporter`` script as node_exporter's textfile collector serves them). Parsed with
``prometheus_client.parser``. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.shared.fields import FIELDS, FieldSpec, by_field, dcgm_read_map
from gpuwarden.shared.models import EventKind, GpuEvent, stable_id
from gpuwarden.shared.nvidia.nvml import THROTTLE_BITS
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id

from .values import OnDrop, kept

__all__ = [
    "DCGM_1X_NAMES",
    "DCGM_FIELDS",
    "DcgmSeries",
    "parse_dcgm_exporter_scrape",
    "parse_scrape",
    "xid_event",
]

#: DCGM field -> (GpuSample field, factor to the model's unit), from the field registry
#: (``gpuwarden/shared/fields.csv``, rows with ``dcgm_dir`` read/both). Bitmasks, XIDs and NVLink
#: totals are handled apart (below).
DCGM_FIELDS: dict[str, tuple[str, float]] = dcgm_read_map()
#: dcgm-exporter 1.x (gpu-monitoring-tools ``exporters/prometheus-dcgm/dcgm-exporter``, a
#: ``dcgmi dmon`` wrapper writing ``/run/prometheus/dcgm.prom``; labels ``gpu``, ``uuid``) metric
#: name -> the DCGM field of 2.x+. Same units (MHz, C, W, mJ, MiB, %; ``fi_prof_*`` ratios 0-1).
DCGM_1X_NAMES: dict[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_tx_throughput": "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "dcgm_pcie_rx_throughput": "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL",
    "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL",
    "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS",
    "dcgm_power_violation": "DCGM_FI_DEV_POWER_VIOLATION",
    "dcgm_thermal_violation": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "dcgm_sync_boost_violation": "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "dcgm_board_limit_violation": "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "dcgm_low_util_violation": "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "dcgm_reliability_violation": "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "dcgm_fb_total": "DCGM_FI_DEV_FB_TOTAL",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_ecc_sbe_volatile_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dcgm_ecc_dbe_volatile_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "dcgm_ecc_sbe_aggregate_total": "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "dcgm_ecc_dbe_aggregate_total": "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "dcgm_retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE",
    "dcgm_retired_pages_dbe": "DCGM_FI_DEV_RETIRED_DBE",
    "dcgm_retired_pages_pending": "DCGM_FI_DEV_RETIRED_PENDING",
    "dcgm_nvlink_flit_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_data_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_replay_error_count_total": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_recovery_error_count_total": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_bandwidth_total": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "dcgm_fi_prof_gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "dcgm_fi_prof_sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "dcgm_fi_prof_sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "dcgm_fi_prof_pipe_tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dcgm_fi_prof_dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
}
_TYPES: dict[str, str] = {f.field: f.type for f in FIELDS}
_THROTTLE = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
_GR_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_XID = "DCGM_FI_DEV_XID_ERRORS"
_NVLINK_RE = re.compile(r"^DCGM_FI_DEV_NVLINK_(?P<kind>CRC_FLIT|CRC_DATA|REPLAY|RECOVERY)_ERROR_COUNT_TOTAL$")
_NVLINK_KEY = {"CRC_FLIT": "crc_flit_errors", "CRC_DATA": "crc_data_errors", "REPLAY": "replay_errors"}


def throttle_names(mask: int) -> list[str]:
    """Clock event reason names (:data:`~gpuwarden.shared.nvidia.nvml.THROTTLE_BITS`) of a bitmask."""
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


@dataclass(frozen=True)
class DcgmSeries:
    """One series of a scrape: metric ``name``, ``labels``, ``value``, ``timestamp`` (epoch s or
    None), and the GPU key it belongs to: ``gpu`` (the ``gpu`` label), ``pci_bus_id``
    (normalised, domain kept), ``uuid``, ``gpu_instance`` (MIG ``GPU_I_ID``, None for a whole GPU)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None
    gpu: int | None
    pci_bus_id: str | None
    uuid: str | None
    gpu_instance: int | None


def _printed_name(family_type: str, sample: str) -> str:
    """The series name as the scrape printed it. ``prometheus_client`` (0.x) appends ``_total`` to
    every sample of a ``# TYPE X counter`` family whose name lacks it, so dcgm-exporter's counters
    (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``, ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``,
    ``dcgm_total_energy_consumption``, ...) come back as ``..._total``; DCGM field names are upper
    case, so a lower-case ``_total`` on one (or on a 1.x name that is unknown with it) is undone."""
    if family_type == "counter" and sample.endswith("_total") and sample not in DCGM_1X_NAMES:
        base = sample[: -len("_total")]
        if base.startswith("DCGM_FI_") or base in DCGM_1X_NAMES:
            return base
    return sample


def parse_scrape(text: str) -> list[DcgmSeries]:
    """Every ``DCGM_FI_*`` series of one scrape (other metrics are ignored). A dcgm-exporter 1.x
    series (:data:`DCGM_1X_NAMES`, e.g. ``dcgm_gpu_temp{gpu="0",uuid="GPU-..."}``) comes out under
    its DCGM field name (``DCGM_FI_DEV_GPU_TEMP``), labels as printed; ``dcgm_gpu_info`` and other
    names are ignored.

    Raises:
        ValueError: text that is not Prometheus text exposition.
    """
    out = []
    try:
        fams = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"not Prometheus text exposition: {exc}") from exc
    for fam in fams:
        for s in fam.samples:
            name = _printed_name(fam.type, s.name)
            name = DCGM_1X_NAMES.get(name, name)
            if not name.startswith("DCGM_FI_"):
                continue
            lab = dict(s.labels)
            gpu = lab.get("gpu")
            pci = lab.get("pci_bus_id") or lab.get("PCI_BUS_ID")
            gi = lab.get("GPU_I_ID")
            out.append(
                DcgmSeries(
                    name=name,
                    labels=lab,
                    value=float(s.value),
                    timestamp=float(s.timestamp) if s.timestamp is not None else None,
                    gpu=int(gpu) if gpu is not None and gpu.isdigit() else None,
                    pci_bus_id=normalize_pci_bus_id(pci) if pci else None,
                    uuid=lab.get("UUID") or lab.get("uuid"),
                    gpu_instance=int(gi) if gi is not None and gi.isdigit() else None,
                )
            )
    return out


def _types(fields: tuple[FieldSpec, ...]) -> dict[str, str]:
    return {k: f.type for k, f in by_field(fields).items()}


def gpu_records(
    series: Sequence[DcgmSeries],
    where: str = "scrape",
    fields: tuple[FieldSpec, ...] | None = None,
    on_drop: OnDrop | None = None,
) -> dict[tuple[str, int | None], dict[str, Any]]:
    """Per-GPU mapped values of one scrape: key (GPU identity, index label) -> GpuSample fields.

    A GPU is identified by its UUID, else its PCI bus id (so GPUs of different PCI domains stay
    apart), else its ``gpu`` label. Device-level metrics repeated on each MIG instance's series
    are taken once; ``memory_used_mib`` is summed over the instances; ``mig_instances`` counts
    them. ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio) gives ``utilization_gpu_pct`` only when
    ``DCGM_FI_DEV_GPU_UTIL`` is absent. NVLink ``*_ERROR_COUNT_TOTAL`` counters become one
    ``nvlinks`` entry ``{"all_links": True, ...}``. ``_xid`` holds the XID_ERRORS value.
    The scalar fields come from :data:`DCGM_FIELDS`, or from the registry ``fields``
    (:func:`gpuwarden.shared.fields.load_fields`) when given; an ``int``/``bool`` row's value is
    converted to that type.

    A value out of its field's range (a sentinel) is left out and named through ``on_drop``
    (default: a rate-limited warning, :func:`~gpuwarden.shared.nvidia.values.kept`).
    """
    dmap, types = (DCGM_FIELDS, _TYPES) if fields is None else (dcgm_read_map(fields), _types(fields))
    recs: dict[tuple[str, int | None], dict[str, Any]] = {}
    instances: dict[tuple[str, int | None], set[int]] = {}
    fb: dict[tuple[str, int | None], dict[int, float]] = {}
    for s in series:
        ident = s.uuid or s.pci_bus_id or f"gpu{s.gpu}"
        key = (ident, s.gpu)
        r = recs.setdefault(key, {})
        if s.pci_bus_id:
            r["pci_bus_id"] = s.pci_bus_id
        if s.uuid:
            r["uuid"] = s.uuid
        if name := s.labels.get("modelName"):
            r["name"] = name
        if s.labels.get("DCGM_FI_DRIVER_VERSION"):
            r["driver_version"] = s.labels["DCGM_FI_DRIVER_VERSION"]
        if s.gpu_instance is not None:
            instances.setdefault(key, set()).add(s.gpu_instance)
        v = s.value
        if s.name in dmap:
            fname, factor = dmap[s.name]
            if fname == "memory_used_mib" and s.gpu_instance is not None:
                fb.setdefault(key, {})[s.gpu_instance] = v
                continue
            x: Any = v * factor
            if types[fname] == "int":
                x = int(x)
            elif types[fname] == "bool":
                x = bool(x)
            x = kept(fname, x, f"{where}: {s.name}", on_drop)  # a sentinel is dropped and named, not the scrape
            if x is not None:
                r[fname] = x
        elif s.name in _THROTTLE:
            r["throttle_reasons"] = throttle_names(int(v))
        elif s.name == _GR_ACTIVE:
            r.setdefault("_gr_active", v * 100.0)
        elif s.name == _XID:
            r["_xid"] = int(v)
        elif m := _NVLINK_RE.match(s.name):
            nv = r.setdefault("_nvlink", {"all_links": True})
            nv[_NVLINK_KEY.get(m["kind"], "recovery_errors")] = int(v)
    for key, r in recs.items():
        gr = r.pop("_gr_active", None)
        if gr is not None and "utilization_gpu_pct" not in r:
            gr = kept("utilization_gpu_pct", gr, f"{where}: {_GR_ACTIVE}", on_drop)
            if gr is not None:
                r["utilization_gpu_pct"] = gr
        if key in fb:
            r["memory_used_mib"] = sum(fb[key].values())
        if key in instances:
            r["mig_mode"] = True
            r["mig_instances"] = len(instances[key])
        if "_nvlink" in r:
            r["nvlinks"] = [r.pop("_nvlink")]
    return recs


def parse_dcgm_exporter_scrape(text: str) -> dict[str, Any]:
    """One dcgm-exporter ``/metrics`` scrape (dcgm-exporter 2.x-4.x ``DCGM_FI_*`` names, 1.x ``dcgm_*``).

    ``gpuwarden parse dcgm-exporter``: the scrape -> ``{"series":
    [{name, labels, value, timestamp, gpu, pci_bus_id, uuid, gpu_instance}], "gpus": [per-GPU
    mapped record]}`` (MIG instances stay distinct series; see :func:`gpu_records`).

    Raises:
        ValueError: not Prometheus text, or no ``DCGM_FI_*`` (or 1.x ``dcgm_*``) series in it.
    """
    series = parse_scrape(text)
    if not series:
        raise ValueError("not dcgm-exporter output: no DCGM_FI_* (or dcgm-exporter 1.x dcgm_*) series")
    recs = gpu_records(series)
    gpus = []
    for i, ((_, gpu), r) in enumerate(recs.items()):
        rec = {"index": gpu if gpu is not None else i, **r}
        if "_xid" in rec:
            rec["xid_last"] = rec.pop("_xid")
        gpus.append(rec)
    return {"series": [vars(s) for s in series], "gpus": gpus}


def xid_event(
    node: str, ts: float, gpu: int, xid: int, pci_bus_id: str | None, uuid: str | None, why: str = ""
) -> GpuEvent:
    """The XID event a change of ``DCGM_FI_DEV_XID_ERRORS`` to ``xid`` stands for (DCGM keeps the
    GPU's last XID code, no time and no text: ``ts`` is the scrape's)."""
    raw = f'DCGM_FI_DEV_XID_ERRORS{{gpu="{gpu}"}} {xid}'
    return GpuEvent(
        event_id=stable_id(node, ts, "xid", xid, raw),
        node=node,
        ts=ts,
        kind=EventKind.XID,
        code=xid,
        gpu_index=gpu,
        pci_bus_id=pci_bus_id,
        gpu_uuid=uuid,
        message=f"DCGM_FI_DEV_XID_ERRORS changed (last XID of the GPU{why})",
        raw=raw,
        source="dcgm-exporter",
    )
