"""The plain ``nvidia-smi`` table (the default output), drivers 4xx .. 5xx. Pure."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from gpuwarden.shared.fieldgen import gpu_sample_model
from gpuwarden.shared.fields import FIELDS, FieldSpec, smi_table_fields
from gpuwarden.shared.models import GpuSample

from .smi_text import TEXT_READERS
from .values import gpu_sample, kept

__all__ = ["TABLE_CELLS", "SmiTable", "parse_nvidia_smi_table", "parse_nvidia_smi_table_report"]

#: The cells of a GPU's rows in the default table, by their header caption (the registry's
#: ``smi_table`` column names them): ``GPU Name Persistence-M | Bus-Id Disp.A | Volatile Uncorr.
#: ECC`` / ``Fan Temp Perf Pwr:Usage/Cap | Memory-Usage | GPU-Util Compute M.`` / ``MIG M.``
#: (drivers 450+). The GPU number and the Processes section are read in code.
TABLE_CELLS = (
    "Name", "Bus-Id", "Volatile Uncorr. ECC", "Fan", "Temp", "Perf", "Pwr:Usage", "Pwr:Cap",
    "Memory-Usage:Used", "Memory-Usage:Total", "GPU-Util", "MIG M.",
)  # fmt: skip


@functools.cache
def _table_readers(fields: tuple[FieldSpec, ...]) -> tuple[tuple[str, str, Callable[[str | None], Any]], ...]:
    """(field, cell, reader) of each registry row with a ``smi_table`` cell."""
    return tuple((f, cell, TEXT_READERS[kind]) for f, cell, kind in smi_table_fields(fields))


_VERSION_RE = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+Driver Version:\s*(?P<drv>\S+)(?:\s+CUDA Version:\s*(?P<cuda>\S+))?"
)
_ROW1_C0 = re.compile(r"^\s*(?P<idx>\d+)\s+(?P<name>.*?)\s+(?P<pm>On|Off)\s*$")
_ROW1_C1 = re.compile(r"^\s*(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+(?P<disp>\S+)\s*$")
_ROW2_C0 = re.compile(
    r"^\s*(?P<fan>\d+%|N/A|ERR!)\s+(?P<temp>\d+C|N/A|ERR!)\s+(?P<perf>P\d+|N/A|ERR!)\s+"
    r"(?P<pwr>\d+(?:\.\d+)?W|N/A|ERR!)\s*/\s*(?P<cap>\d+(?:\.\d+)?W|N/A|ERR!)\s*$"
)
_ROW2_C1 = re.compile(r"^\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*$")
_ROW2_C2 = re.compile(r"^\s*(?P<util>\d+%|N/A|ERR!)\s+(?P<mode>\S+)\s*$")
_PROC_RE = re.compile(
    r"^\|\s+(?P<gpu>\d+)\s+(?P<gi>\S+)\s+(?P<ci>\S+)\s+(?P<pid>\d+)\s+(?P<type>[CGM+]+)\s+(?P<name>.*?)\s+"
    r"(?P<mem>\d+MiB|N/A)\s*\|$"
)
_DATE_RE = re.compile(r"^\w{3} \w{3} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}$")


class SmiTable:
    """One parsed table: ``timestamp`` (the date line above it, or None), ``driver_version``,
    ``cuda_version``, ``gpus`` (:class:`GpuSample` each, processes attached)."""

    def __init__(
        self, timestamp: str | None, driver_version: str | None, cuda_version: str | None, gpus: list[GpuSample]
    ) -> None:
        self.timestamp = timestamp
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.gpus = gpus


def _cells(line: str) -> list[str]:
    return [c for c in line.strip().strip("|").split("|")]


def parse_nvidia_smi_table(text: str, fields: Sequence[FieldSpec] = FIELDS) -> list[SmiTable]:
    """Every table of ``text`` (one or several ``nvidia-smi`` outputs, each optionally preceded
    by its date line ``Tue Dec  1 13:21:04 2026``), drivers 418 .. 570 (the ``Perf
    Pwr:Usage/Cap`` layout of 4xx and the wider 555+ columns both read).

    Per GPU: index, name (truncated names end in ``...``), persistence mode, PCI bus id, fan %,
    temperature C, performance state, power W and cap W, memory used/total MiB, utilisation %,
    and the processes of the Processes section (pid, used_memory_mib). ``N/A`` and ``ERR!`` are
    absent. MIG devices sections are skipped (``mig_mode`` True when one lists the GPU). The
    values are read from the cells the field registry ``fields`` names (``smi_table``; another
    registry builds its own model: :func:`~gpuwarden.shared.fieldgen.gpu_sample_model`).

    Raises:
        ValueError: no ``NVIDIA-SMI ... Driver Version`` banner, or a GPU row that cannot be read.
    """
    tables: list[SmiTable] = []
    lines = text.splitlines()
    i = 0
    pending_date: str | None = None
    cur: SmiTable | None = None
    gpus: dict[int, dict[str, Any]] = {}
    raw: list[dict[int, dict[str, Any]]] = []
    section = ""
    while i < len(lines):
        ln = lines[i]
        s = ln.strip()
        if _DATE_RE.match(s):
            pending_date = s
        elif m := _VERSION_RE.search(ln):
            gpus = {}
            cur = SmiTable(pending_date, m["drv"], m["cuda"], [])
            tables.append(cur)
            raw.append(gpus)
            pending_date = None
            section = "gpus"
        elif cur is not None and "MIG devices" in ln:
            section = "mig"
        elif cur is not None and "Processes:" in ln:
            section = "proc"
        elif cur is not None and section == "gpus" and s.startswith("|") and i + 1 < len(lines):
            c = _cells(ln)
            m0 = _ROW1_C0.match(c[0]) if c else None
            if m0 and len(c) >= 3:
                c2 = _cells(lines[i + 1])
                r2 = [
                    _ROW2_C0.match(c2[0]) if len(c2) > 0 else None,
                    _ROW2_C1.match(c2[1]) if len(c2) > 1 else None,
                    _ROW2_C2.match(c2[2]) if len(c2) > 2 else None,
                ]
                m1 = _ROW1_C1.match(c[1])
                if m1 is None or r2[0] is None or r2[1] is None or r2[2] is None:
                    raise ValueError(f"nvidia-smi table line {i + 1}: cannot read the GPU row: {ln.strip()!r}")
                a, b, cc = r2[0], r2[1], r2[2]
                idx = int(m0["idx"])
                cells: dict[str, str] = {
                    "Name": m0["name"], "Bus-Id": m1["pci"], "Volatile Uncorr. ECC": c[2], "Fan": a["fan"],
                    "Temp": a["temp"], "Perf": a["perf"], "Pwr:Usage": a["pwr"], "Pwr:Cap": a["cap"],
                    "Memory-Usage:Used": b["used"], "Memory-Usage:Total": b["total"], "GPU-Util": cc["util"],
                }  # fmt: skip
                if len(c2) > 2 and i + 2 < len(lines):
                    c3 = _cells(lines[i + 2])
                    if len(c3) > 2 and c3[2].strip() in ("Enabled", "Disabled"):
                        cells["MIG M."] = c3[2]
                g: dict[str, Any] = {"index": idx}
                for name, cell, read in _table_readers(tuple(fields)):
                    if cell in cells:
                        g[name] = read(cells[cell])
                for k, v in g.items():
                    g[k] = kept(k, v, f"nvidia-smi table line {i + 1}")
                gpus[idx] = g
                i += 2
                continue
        elif cur is not None and section == "proc" and (pm := _PROC_RE.match(s)):
            g2 = gpus.get(int(pm["gpu"]))
            if g2 is not None:
                proc: dict[str, Any] = {"pid": int(pm["pid"]), "name": pm["name"]}
                if pm["mem"] != "N/A":
                    proc["used_memory_mib"] = float(pm["mem"][:-3])
                g2.setdefault("processes", []).append(proc)
        i += 1
    model = gpu_sample_model(fields)
    for t, gs in zip(tables, raw, strict=True):
        where = f"nvidia-smi table at {t.timestamp or 'start'}"
        t.gpus = [gpu_sample({k: v for k, v in g.items() if v is not None}, where, model) for g in gs.values()]
    if not tables:
        raise ValueError("not nvidia-smi table output: no 'NVIDIA-SMI ... Driver Version' banner")
    return tables


def parse_nvidia_smi_table_report(text: str) -> list[dict[str, Any]]:
    """Each ``nvidia-smi`` table of a file -> ``{timestamp, driver_version, cuda_version,
    gpus: [GpuSample]}`` (see :func:`parse_nvidia_smi_table`; ``gpuwarden parse nvidia-smi-table``).

    Raises:
        ValueError: as :func:`parse_nvidia_smi_table`.
    """
    return [vars(t) for t in parse_nvidia_smi_table(text)]
