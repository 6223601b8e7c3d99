"""gpuwarden.recordings: telemetry recordings people already have, read offline, and
``gpuwarden analyze``.

Readers of recorded series into :class:`Recording` (pure apart from reading the given files):

* ``nvidia-smi --query-gpu=... --format=csv`` logs (and custom loggers of the same values),
* ``nvidia-smi dmon`` logs,
* dcgm-exporter ``/metrics`` scrapes,
* the plain ``nvidia-smi`` table, ``nvidia-smi -q -x`` and ``nvidia-smi -q`` series,
* kernel logs (dmesg in every time format, journalctl -k, /dev/kmsg) for XID events,

in any text encoding they end up in (UTF-8 or UTF-16, with or without BOM, CRLF, gzipped:
:func:`open_text`, the one place files are opened), and :func:`gpu_spec`, spec-sheet numbers
to fill what a recording lacks. The parsers of each tool's output are the NVIDIA readers of
:mod:`gpuwarden.shared.nvidia`, the same code the collector and the health check run.

:mod:`.analyze` / :mod:`.analyze_cli` are ``gpuwarden analyze``: a recording through the
correlator and detector code of the services, in event time (in memory, or with ``--kafka``
through the real services: :mod:`.analyze_kafka`; imported where used).
"""

from __future__ import annotations

from ._core import attach_gpu_ids, detect_encoding, open_text, pci_key, read_text
from .csvlog import infer_gpu_count, read_smi_csv_log
from .dcgm import read_dcgm_scrapes
from .dmon import read_dmon
from .kernel import read_kernel_log
from .loader import FORMATS, Recording, detect_format, load_recording
from .specs import GPU_SPECS, GpuSpec, gpu_spec
from .table import read_smi_tables

__all__ = [
    "FORMATS",
    "GPU_SPECS",
    "GpuSpec",
    "Recording",
    "attach_gpu_ids",
    "detect_encoding",
    "detect_format",
    "gpu_spec",
    "infer_gpu_count",
    "load_recording",
    "open_text",
    "pci_key",
    "read_dcgm_scrapes",
    "read_dmon",
    "read_kernel_log",
    "read_smi_csv_log",
    "read_smi_tables",
    "read_text",
]
