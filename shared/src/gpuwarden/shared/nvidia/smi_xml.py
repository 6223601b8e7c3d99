"""Pure parser of ``nvidia-smi -q -x`` XML: :func:`parse_nvidia_smi_xml` -> :class:`SmiReport`.

No I/O here: callers read files and hand text to it. DTD ``nvsmi_device_v11`` .. ``v13``, drivers
510 .. 595 seen in tests. A scalar field is read from the ``smi_xml`` paths of its row in the field
registry (``gpuwarden/shared/fields.csv``: value text, unit dropped, N/A -> None) unless it is
in :data:`XML_IN_CODE`. Kernel-log parsing (XID/SXID lines), PCI bus id normalisation and the
"no value" tokens are NVIDIA node primitives of :mod:`gpuwarden.shared.nvidia`.
"""

from __future__ import annotations

import functools
import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.shared.fieldgen import gpu_sample_model
from gpuwarden.shared.fields import FIELDS, FieldSpec, smi_xml_fields
from gpuwarden.shared.models import GpuSample
from gpuwarden.shared.nvidia.pci import normalize_pci_bus_id
from gpuwarden.shared.nvidia.tokens import NA_TOKENS
from gpuwarden.shared.nvidia.values import gpu_sample

__all__ = [
    "KNOWN_DTD_VERSIONS",
    "XML_IN_CODE",
    "MigDevice",
    "SmiReport",
    "parse_nvidia_smi_xml",
]

log = logging.getLogger(__name__)

KNOWN_DTD_VERSIONS = frozenset({"11", "12", "13"})
_warned_dtd: set[str] = set()

# -- nvidia-smi -q -x --------------------------------------------------------------------

_NUM_RE = re.compile(r"^[-+]?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU (``<mig_devices><mig_device>``); memory in MiB."""

    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessor_count: int | None
    memory_used_mib: float | None
    memory_total_mib: float | None


@dataclass(frozen=True)
class SmiReport:
    """What one ``nvidia-smi -q -x`` run reports.

    ``dtd_version`` is the number of ``nvsmi_device_vNN.dtd`` ("11", "13"), None if absent;
    ``gpus`` in ``<gpu>`` order; ``mig`` maps a GPU index to its MIG instances (only GPUs
    with MIG enabled appear).
    """

    dtd_version: str | None
    driver_version: str | None
    cuda_version: str | None
    timestamp: str | None
    gpus: list[GpuSample]
    mig: dict[int, list[MigDevice]] = field(default_factory=dict)


def _text(el: ET.Element | None, path: str) -> str | None:
    """Whitespace-stripped text at ``path`` under ``el``; None when missing or N/A-like."""
    if el is None:
        return None
    node = el.find(path)
    if node is None or node.text is None:
        return None
    t = node.text.strip()
    return None if t.lower() in NA_TOKENS else t


def _num(el: ET.Element | None, path: str) -> float | None:
    """Leading number of the value at ``path`` ("139.62 W" -> 139.62, "16x" -> 16)."""
    t = _text(el, path)
    if t is None:
        return None
    m = _NUM_RE.match(t)
    return float(m.group()) if m else None


def _int(el: ET.Element | None, path: str) -> int | None:
    v = _num(el, path)
    return int(v) if v is not None else None


def _first_num(el: ET.Element | None, *paths: str) -> float | None:
    for p in paths:
        v = _num(el, p)
        if v is not None:
            return v
    return None


def _sum_opt(*vals: float | None) -> int | None:
    present = [v for v in vals if v is not None]
    return int(sum(present)) if present else None


def _yes_no(el: ET.Element | None, path: str) -> bool | None:
    t = _text(el, path)
    if t is None:
        return None
    return t.lower() in {"yes", "true", "1", "active"}


def _throttle(gpu: ET.Element) -> list[str]:
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = gpu.find(block)
        if el is None:
            continue
        out = []
        for child in el:
            state = (child.text or "").strip()
            if state == "Active" and child.tag.startswith(prefix):
                out.append(child.tag[len(prefix) :])
        return out
    return []


def _ecc(gpu: ET.Element) -> tuple[int | None, int | None]:
    vol = gpu.find("ecc_errors/volatile")
    if vol is None:
        return None, None
    if vol.find("single_bit") is not None:  # DTD <= v10 layout
        return _int(vol, "single_bit/total"), _int(vol, "double_bit/total")
    sbe = _sum_opt(_num(vol, "sram_correctable"), _num(vol, "dram_correctable"))
    dbe = _sum_opt(
        _num(vol, "sram_uncorrectable"),
        _num(vol, "sram_uncorrectable_parity"),
        _num(vol, "sram_uncorrectable_secded"),
        _num(vol, "dram_uncorrectable"),
    )
    return sbe, dbe


def _mig(gpu: ET.Element) -> list[MigDevice]:
    out = []
    for d in gpu.findall("mig_devices/mig_device"):
        out.append(
            MigDevice(
                index=_int(d, "index") or 0,
                gpu_instance_id=_int(d, "gpu_instance_id"),
                compute_instance_id=_int(d, "compute_instance_id"),
                multiprocessor_count=_int(d, "device_attributes/shared/multiprocessor_count"),
                memory_used_mib=_num(d, "fb_memory_usage/used"),
                memory_total_mib=_num(d, "fb_memory_usage/total"),
            )
        )
    return out


@dataclass(frozen=True)
class _PowerLayout:
    """Where one ``nvidia-smi -q -x`` DTD version prints the board power (W)."""

    block: str
    average: tuple[str, ...]
    instant: tuple[str, ...]
    limit: tuple[str, ...]


# DTD v11 (drivers 510-525): <power_readings><power_draw>; v12 (530-545): <gpu_power_readings>
# with <power_draw>, later v12 drivers already split it; v13 (550+, 595 seen): <gpu_power_readings>
# with <average_power_draw> and <instant_power_draw> (no <power_draw>).
_POWER_V11 = _PowerLayout(
    "power_readings",
    ("power_draw", "average_power_draw"),
    ("instant_power_draw",),
    ("enforced_power_limit", "current_power_limit", "power_limit"),
)
_POWER_V12 = _PowerLayout(
    "gpu_power_readings",
    ("power_draw", "average_power_draw"),
    ("instant_power_draw",),
    ("current_power_limit", "enforced_power_limit"),
)
_POWER_V13 = _PowerLayout(
    "gpu_power_readings",
    ("average_power_draw", "power_draw"),
    ("instant_power_draw",),
    ("current_power_limit", "enforced_power_limit"),
)
_POWER_BY_DTD = {"11": _POWER_V11, "12": _POWER_V12, "13": _POWER_V13}


def _power(gpu: ET.Element, dtd: str | None) -> tuple[float | None, float | None, float | None]:
    """(average W, instant W, limit W) read with the layout of ``dtd``; an unknown or absent DTD
    version uses the layout whose block is present (``gpu_power_readings`` first)."""
    layout = _POWER_BY_DTD.get(dtd or "")
    if layout is None or gpu.find(layout.block) is None:
        layout = _POWER_V13 if gpu.find("gpu_power_readings") is not None else _POWER_V11
    b = layout.block
    return (
        _first_num(gpu, *(f"{b}/{t}" for t in layout.average)),
        _first_num(gpu, *(f"{b}/{t}" for t in layout.instant)),
        _first_num(gpu, *(f"{b}/{t}" for t in layout.limit)),
    )


def _processes(gpu: ET.Element) -> list[dict[str, Any]] | None:
    """``<processes><process_info>`` -> ``[{"pid", "type", "process_name", "used_memory_mib",
    "gpu_instance_id", "compute_instance_id"}]`` (keys whose value is N/A are absent); None
    when the GPU has no ``<processes>`` element (not reported), ``[]`` when it is empty."""
    el = gpu.find("processes")
    if el is None:
        return None
    out: list[dict[str, Any]] = []
    for p in el.findall("process_info"):
        pid = _int(p, "pid")
        if pid is None:
            continue
        proc: dict[str, Any] = {"pid": pid}
        for key, path in (("type", "type"), ("process_name", "process_name")):
            if (t := _text(p, path)) is not None:
                proc[key] = t
        if (mem := _num(p, "used_memory")) is not None:
            proc["used_memory_mib"] = mem
        for key in ("gpu_instance_id", "compute_instance_id"):
            if (v := _int(p, key)) is not None:
                proc[key] = v
        out.append(proc)
    return out


#: Scalar fields read in code below (a fallback, a DTD-dependent layout, a sum over several
#: elements), not from their registry paths alone; their ``smi_xml`` paths document what is read.
XML_IN_CODE = frozenset(
    {"index", "pci_bus_id", "power_w", "power_instant_w", "power_limit_w", "ecc_sbe_volatile", "ecc_dbe_volatile",
     "retired_pages"}
)  # fmt: skip
#: How the text at a registry path is read, by the field's type: the leading number ("139.62 W"
#: -> 139.62; an int field drops the fraction), yes/no/active as a bool, a string as it is.
_BY_TYPE: dict[str, Callable[[ET.Element | None, str], Any]] = {
    "float": _num,
    "int": _int,
    "bool": _yes_no,
    "str": _text,
}


@functools.cache
def _registry_paths(fields: tuple[FieldSpec, ...]) -> tuple[tuple[str, tuple[str, ...], Callable[..., Any]], ...]:
    """(field, paths, reader) of each registry row the XML is read for generically."""
    return tuple((f, paths, _BY_TYPE[t]) for f, paths, t in smi_xml_fields(fields) if f not in XML_IN_CODE)


def _gpu(gpu: ET.Element, order: int, dtd: str | None = None, fields: Sequence[FieldSpec] = FIELDS) -> GpuSample:
    data: dict[str, Any] = {}
    for name, paths, read in _registry_paths(tuple(fields)):
        for p in paths:
            if (v := read(gpu, p)) is not None:
                data[name] = v
                break
    minor = _int(gpu, "minor_number")
    pci_raw = _text(gpu, "pci/pci_bus_id") or gpu.get("id")
    sbe, dbe = _ecc(gpu)
    power, instant, limit = _power(gpu, dtd)
    data.update(
        index=minor if minor is not None else order,
        pci_bus_id=normalize_pci_bus_id(pci_raw) if pci_raw else None,
        power_w=power,
        power_instant_w=instant,
        power_limit_w=limit,
        throttle_reasons=_throttle(gpu),
        ecc_sbe_volatile=sbe,
        ecc_dbe_volatile=dbe,
        retired_pages=_sum_opt(data.get("retired_pages_sbe"), data.get("retired_pages_dbe")),
        processes=_processes(gpu),
    )
    # a value the model cannot hold (a driver's sentinel) is dropped and named, not the file
    return gpu_sample(data, f"nvidia-smi XML <gpu> {order}", gpu_sample_model(fields))


_DTD_RE = re.compile(r"nvsmi_device_v(\d+)\.dtd")


def parse_nvidia_smi_xml(text: str, fields: Sequence[FieldSpec] = FIELDS) -> SmiReport:
    """Parse ``nvidia-smi -q -x`` output (DTD v11, v12, v13; drivers 510-595 tested).

    ``fields``: the field registry whose ``smi_xml`` paths are read (another registry, e.g. a
    copy with one more row, gives samples of the model it generates, see
    :func:`~gpuwarden.shared.fieldgen.gpu_sample_model`).

    Values are whitespace-stripped; ``N/A``, ``[N/A]``, ``Not Supported``, "deprecated" and the
    other :data:`~gpuwarden.shared.nvidia.tokens.NA_TOKENS` become None, never 0. Units are
    dropped after conversion to the model's units (nvidia-smi already prints W, MiB, C, MHz, %).
    An unknown DTD version is logged once and parsed anyway.

    Raises:
        ValueError: not XML, or the root is not ``<nvidia_smi_log>``.
    """
    m = _DTD_RE.search(text[:500])
    dtd = m.group(1) if m else None
    if dtd is not None and dtd not in KNOWN_DTD_VERSIONS and dtd not in _warned_dtd:
        _warned_dtd.add(dtd)
        log.warning(
            "nvidia-smi XML DTD v%s is not one this parser was tested on (%s); parsing anyway",
            dtd,
            ", ".join(sorted(KNOWN_DTD_VERSIONS)),
        )
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi XML: not well-formed: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"nvidia-smi XML: root is <{root.tag}>, expected <nvidia_smi_log>")
    gpus: list[GpuSample] = []
    mig: dict[int, list[MigDevice]] = {}
    for order, g in enumerate(root.findall("gpu")):
        s = _gpu(g, order, dtd, fields)
        gpus.append(s)
        devs = _mig(g)
        if devs:
            mig[s.index] = devs
    return SmiReport(
        dtd_version=dtd,
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        timestamp=_text(root, "timestamp"),
        gpus=gpus,
        mig=mig,
    )
