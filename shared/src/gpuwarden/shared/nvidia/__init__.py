"""NVIDIA node primitives shared by the collector, the health-check and the detector.

* :mod:`.nvml`: the :class:`Nvml` protocol, :func:`nvml_str`, NVML constants (re-exported from
  ``pynvml``) and :data:`THROTTLE_BITS`;
* :mod:`.kernel_log`: kernel-log parsing (:func:`parse_kernel_log_line`, :class:`KernelLogParser`,
  :func:`parse_kmsg`);
* :mod:`.pci`: :func:`normalize_pci_bus_id`;
* :mod:`.tokens`: the one "no value" token set of nvidia-smi (:data:`NA_TOKENS`);
* :mod:`.xids`: the XID table (``xids.csv``), the single XID classification.

Everything here is pure (no I/O beyond reading the packaged ``xids.csv``).
"""

from .kernel_log import (
    NVLINK5_XIDS,
    XID79_DEDUPE_S,
    KernelLogParser,
    KmsgRecord,
    parse_kernel_log_line,
    parse_kmsg,
    split_kmsg_record,
)
from .nvml import NVLINK_PROBE_LINKS, NVML_DEAD_ERRORS, THROTTLE_BITS, Nvml, nvml_str
from .pci import normalize_pci_bus_id
from .tokens import NA_TOKENS, is_na, na_to_none
from .xids import XidEntry, XidHealth, load_xid_table, xid_codes, xid_severities, xid_table

__all__ = [
    "NA_TOKENS",
    "NVLINK5_XIDS",
    "NVLINK_PROBE_LINKS",
    "NVML_DEAD_ERRORS",
    "THROTTLE_BITS",
    "XID79_DEDUPE_S",
    "KernelLogParser",
    "KmsgRecord",
    "Nvml",
    "XidEntry",
    "XidHealth",
    "is_na",
    "load_xid_table",
    "na_to_none",
    "normalize_pci_bus_id",
    "nvml_str",
    "parse_kernel_log_line",
    "parse_kmsg",
    "split_kmsg_record",
    "xid_codes",
    "xid_severities",
    "xid_table",
]
