"""Read recorded GPU telemetry into :class:`Recording` for ``gpuwarden analyze``: pure parsers of

* ``nvidia-smi --query-gpu=... --format=csv`` logs (and custom loggers of the same values),
* ``nvidia-smi dmon`` logs,
* dcgm-exporter ``/metrics`` scrapes,
* the plain ``nvidia-smi`` table, ``nvidia-smi -q -x`` and ``nvidia-smi -q`` series,
* kernel logs (dmesg in every time format, journalctl -k, /dev/kmsg) for XID events,

in any text encoding they end up in (UTF-8 or UTF-16, with or without BOM, CRLF, gzipped:
:func:`open_text`, the one place files are opened),

and :func:`gpu_spec`, spec-sheet numbers to fill what a recording lacks.
"""

from __future__ import annotations

from ._core import attach_gpu_ids, detect_encoding, open_text, pci_key, read_text
from .csvlog import infer_gpu_count, read_smi_csv_log
from .dcgm import DCGM_FIELDS, DcgmSeries, parse_dcgm_exporter_scrape, parse_scrape
from .dmon import read_dmon
from .kernel import read_kernel_log
from .loader import FORMATS, Recording, detect_format, load_recording
from .specs import GPU_SPECS, GpuSpec, gpu_spec
from .table import SmiTable, parse_nvidia_smi_table, parse_nvidia_smi_table_report

__all__ = [
    "DCGM_FIELDS",
    "FORMATS",
    "GPU_SPECS",
    "DcgmSeries",
    "GpuSpec",
    "Recording",
    "SmiTable",
    "attach_gpu_ids",
    "detect_encoding",
    "detect_format",
    "gpu_spec",
    "infer_gpu_count",
    "load_recording",
    "open_text",
    "parse_dcgm_exporter_scrape",
    "parse_nvidia_smi_table",
    "parse_nvidia_smi_table_report",
    "parse_scrape",
    "pci_key",
    "read_dmon",
    "read_kernel_log",
    "read_smi_csv_log",
    "read_text",
]
