"""The NVIDIA readers: every parser of NVIDIA tool output and the node primitives, one package
used by the collector, the health check, ``gpuwarden parse`` and ``gpuwarden analyze``
(:mod:`gpuwarden.recordings`).

Tool output (each a pure function of the text a tool printed; ``gpuwarden parse NAME FILE``):

* :mod:`.smi_xml`: ``nvidia-smi -q -x`` (:func:`~.smi_xml.parse_nvidia_smi_xml`, DTD v11-v13);
* :mod:`.smi_text`: ``nvidia-smi -q`` text and ``--query-gpu --format=csv``;
* :mod:`.smi_table`: the plain ``nvidia-smi`` table;
* :mod:`.smi_nvlink`: ``nvidia-smi nvlink --status``;
* :mod:`.dcgm_exporter`: dcgm-exporter ``/metrics`` scrapes (also the collector's
  ``dcgm-exporter`` source);
* :mod:`.dcgmi`: ``dcgmi diag`` and ``dcgmi discovery -l`` (the health check);
* :mod:`.kernel_log`: kernel-log lines and ``/dev/kmsg`` records (XID, SXID, NVLink);
* :mod:`.values`: the value ranges every reader checks (from the model).

The field registry these readers map to the model is :mod:`gpuwarden.shared.fields`
(``fields.csv``). Node primitives:

* :mod:`.nvml`: the :class:`Nvml` protocol, :func:`nvml_str`, NVML constants (re-exported from
  ``pynvml``) and :data:`THROTTLE_BITS`;
* :mod:`.pci`: :func:`normalize_pci_bus_id`;
* :mod:`.tokens`: the one "no value" token set of nvidia-smi (:data:`NA_TOKENS`);
* :mod:`.xids`: the XID table (``xids.csv``), the single XID classification.

Everything here is pure (no I/O beyond reading the packaged ``xids.csv``); the tool modules are
imported where they are used (not re-exported here).
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
