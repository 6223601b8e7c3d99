"""Telemetry sources of the collector, each behind the tiny :class:`Source` interface.

One module per unit:

* :mod:`.base`: :class:`Source`, :class:`Paced`, :class:`LineReader`, the :data:`SOURCES`
  registry (:func:`register_source`), :func:`resolve_gpu`, :func:`default_collector_id`;
* :mod:`.nvml`: :class:`NvmlSource` - NVML through the narrow
  :class:`~gpuwarden.shared.nvidia.nvml.Nvml` protocol (``pynvml`` in production,
  :class:`~gpuwarden.sim.nvml.FakeNvml` in tests and the demo), plus an optional
  kernel-log :class:`LineReader` for XIDs;
* :mod:`.nvml_events`: :class:`NvmlEventWatcher` (NVML's event stream), :mod:`.dedupe`:
  :class:`EventDeduper` (one XID seen by NVML events and the kernel log is one event);
* :mod:`.dcgm_exporter`: :class:`DcgmExporterSource` - the node's running dcgm-exporter
  ``/metrics`` (one GET a tick, the DCGM field map of the recordings reader), XIDs from the
  kernel log;
* :mod:`.replay`: :class:`ReplaySource` - ``<root>/<node>/*.xml`` (``nvidia-smi -q -x``
  captures) and ``<root>/<node>/kern.log`` followed like ``tail -f``;
* kernel-log readers: :mod:`.file_follower` (:class:`FileFollower`), :mod:`.kmsg`
  (:class:`KmsgReader`), :mod:`.journalctl` (:class:`JournalctlFollower`), and
  :mod:`.kernel_log` (:func:`open_kernel_log`, which picks one);
* ``SimulatedSource`` lives in the simulation layer, :mod:`gpuwarden.sim.collector` (the
  ``simulated`` source, found through the entry point ``gpuwarden.collector_sources``).

Parsing (kernel-log lines) and NVML helpers and constants (``Nvml``, ``nvml_str``,
``THROTTLE_BITS``, ``NVML_*``) are in :mod:`gpuwarden.shared.nvidia`.
"""

from .base import SOURCES, LineReader, Paced, Source, default_collector_id, register_source, resolve_gpu
from .dcgm_exporter import DcgmExporterSource, http_fetcher
from .dedupe import EventDeduper
from .file_follower import FileFollower
from .journalctl import JournalctlFollower, LineStream, PopenLines
from .kernel_log import open_kernel_log
from .kmsg import KmsgReader
from .nvml import GpuLost, NvmlSource
from .nvml_events import NvmlEventWatcher
from .replay import ReplaySource

__all__ = [
    "SOURCES",
    "DcgmExporterSource",
    "EventDeduper",
    "FileFollower",
    "GpuLost",
    "JournalctlFollower",
    "KmsgReader",
    "LineReader",
    "LineStream",
    "NvmlEventWatcher",
    "NvmlSource",
    "Paced",
    "PopenLines",
    "ReplaySource",
    "Source",
    "default_collector_id",
    "http_fetcher",
    "open_kernel_log",
    "register_source",
    "resolve_gpu",
]
