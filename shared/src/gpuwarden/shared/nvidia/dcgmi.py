"""Parsers of DCGM's command-line tool ``dcgmi``: text in, plain data out, no I/O.

Reads the output of:

* ``dcgmi diag -r 1|2|3|4`` (the table; DCGM 1.7-2.0, 2.x, 3.x and 4.x): :func:`parse_dcgmi_diag`
  -> :class:`DcgmDiag` of :class:`DcgmTest`;
* ``dcgmi discovery -l`` (``--list``, with or without ``--all``; DCGM 2.x-4.x):
  :func:`parse_dcgmi_discovery` -> :class:`DcgmDiscovery` of :class:`DcgmGpu`.

A cut-off table is returned with ``complete`` False and ``error`` set, never read as the whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DcgmDiag",
    "DcgmDiscovery",
    "DcgmGpu",
    "DcgmTest",
    "DiagResult",
    "parse_dcgmi_diag",
    "parse_dcgmi_discovery",
]

# -- dcgmi diag ---------------------------------------------------------------------

DiagResult = Literal["pass", "fail", "warn", "skip", "unknown"]


@dataclass(frozen=True)
class DcgmTest:
    """One test of ``dcgmi diag``: ``section`` (``Deployment``, ``Integration``, ``Hardware``,
    ``Stress``, older ``Performance``), test ``name``, ``result`` (pass/fail/warn/skip,
    ``unknown`` for other text such as ``Not Run``) and ``detail`` (every row of the test as
    printed, joined; ``Warning``/``Error``/``Info`` rows as ``"Warning: <text>"``).

    A test prints one or more result lines: DCGM 2.x/3.x ``Pass - All``, ``Fail - GPU: 0`` or
    ``Pass - GPUs: 1, 2`` plus ``Fail - GPU: 0`` on the next row; DCGM 4.x a summary (``Fail``)
    then one ``GPU<n>: <result>`` row per GPU. ``result`` is the worst of them (fail > warn >
    skip > unknown > pass: for DCGM 4 the summary). ``gpus``: the GPUs that have that result
    (``Fail - GPU: 0`` -> ``[0]``; empty when no GPU is named - ``Fail - All``, or a DCGM 4 summary
    ``Fail`` whose GPU rows all pass, i.e. a failure of the test itself, not of a GPU).
    ``gpu_results``: every printed per-GPU result. ``all_gpus``: the result was printed as
    ``<Result> - All`` (every GPU of the run, ids not printed). ``warnings``: the text of the
    ``Warning`` and ``Error`` rows under the test (DCGM's error messages; they do not change the
    printed result), ``info``: the ``Info`` rows, each re-joined from DCGM's 45-column wrap."""

    section: str | None
    name: str
    result: DiagResult
    gpus: list[int]
    detail: str
    gpu_results: dict[int, DiagResult] = field(default_factory=dict)
    all_gpus: bool = False
    warnings: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DcgmDiag:
    """A parsed ``dcgmi diag`` run. ``complete`` is False when the table is cut off (no closing
    ``+---+`` border after the last row, or a last row without its right ``|``): a cut-off run
    proves nothing about the rows it lost. ``group``: the ``-g N`` of an echoed ``dcgmi diag``
    command line (results belong to that GPU group), None when not recorded. ``dcgm_version``,
    ``driver_version``, ``device_ids``: the Metadata rows (None/empty
    where the table has none: DCGM 2.x and 3.0.x)."""

    dcgm_version: str | None
    driver_version: str | None
    device_ids: list[str]
    tests: list[DcgmTest] = field(default_factory=list)
    complete: bool = False
    group: int | None = None
    overall: DiagResult = "unknown"
    """The run's verdict from its rows: ``fail`` if any test failed (whatever ``Successfully ran
    diagnostic`` says), else ``unknown`` when cut off or no test ran, else ``warn`` (a Warn),
    ``skip`` (only skips) or ``pass``."""
    error: str | None = None
    """Why the run proves nothing (cut off), None for a complete table."""

    def by_result(self, result: DiagResult) -> list[DcgmTest]:
        return [t for t in self.tests if t.result == result]


def _diag_overall(tests: list[DcgmTest], complete: bool) -> DiagResult:
    results = {t.result for t in tests}
    if "fail" in results:
        return "fail"
    if not complete or not tests:
        return "unknown"
    if "warn" in results:
        return "warn"
    if "pass" not in results:
        return "skip" if "skip" in results else "unknown"
    return "pass"


_RESULT_WORD = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip", "skipped": "skip"}
_RESULT_RANK = {"pass": 0, "unknown": 1, "skip": 2, "warn": 3, "fail": 4}
# "Pass - All", "Fail - GPU: 0", "Pass - GPUs: 1, 2, 3" (DCGM 2.x/3.x result lines)
_DIAG_RESULT_LINE = re.compile(r"(Pass|Fail|Warn|Skip)(?:\s+-\s+(?:(All)|GPUs?:\s*(\d+(?:\s*,\s*\d+)*)))?\s*")
# "GPU0: Pass" (DCGM 4.x per-entity result lines; CPU entities of the CPU EUD test too)
_DIAG_ENTITY_LINE = re.compile(r"(GPU|CPU)(\d+):\s*(Pass|Fail|Warn|Skip)\s*")
_DIAG_MESSAGE_ROWS = {"Warning": "warnings", "Error": "warnings", "Info": "info"}
_DIAG_HEADER_RE = re.compile(r"^\|\s*Diagnostic\s*\|\s*Result\s*\|")
_DIAG_SECTION_RE = re.compile(r"^[|+]-+\s+(?:Metadata|Deployment|Integration|Hardware|Stress|Performance)\s+-+[+|]")
_DIAG_WRAP = 45  # dcgmi prints Warning/Error/Info text in 45-character slices, one per row


def _diag_result(text: str) -> tuple[DiagResult, list[int]]:
    m = re.match(r"^\s*([A-Za-z]+)", text)
    word = _RESULT_WORD.get(m.group(1).lower(), "unknown") if m else "unknown"
    gm = re.search(r"GPUs?\s*:\s*([\d,\s]+)", text)
    gpus = [int(x) for x in re.findall(r"\d+", gm.group(1))] if gm else []
    return word, gpus  # type: ignore[return-value]


def _diag_result_line(text: str) -> tuple[DiagResult, list[int], bool] | None:
    """(result, GPUs, all) of a result line, None when ``text`` is no result line."""
    m = _DIAG_RESULT_LINE.fullmatch(text)
    if m:
        gpus = [int(x) for x in re.findall(r"\d+", m.group(3) or "")]
        return m.group(1).lower(), gpus, m.group(2) is not None  # type: ignore[return-value]
    m = _DIAG_ENTITY_LINE.fullmatch(text)
    if m:
        return m.group(3).lower(), [int(m.group(2))] if m.group(1) == "GPU" else [], False  # type: ignore[return-value]
    return None


def _diag_chunk(cell: str) -> str:
    """One row's slice of a wrapped message: the right cell minus its one leading space and the
    column padding (a full 45-character slice keeps its own trailing space)."""
    body = cell[1:] if cell.startswith(" ") else cell
    if len(body) > _DIAG_WRAP and not body[_DIAG_WRAP:].strip():
        return body[:_DIAG_WRAP]
    return body.rstrip()


class _DiagTestRows:
    """The rows of one test while the table is read."""

    def __init__(self, section: str | None, name: str, text: str) -> None:
        self.section, self.name = section, name
        first = _diag_result_line(text)
        if first is None:
            word, gpus = _diag_result(text)
            first = (word, gpus, False)
        self.lines: list[tuple[DiagResult, list[int], bool]] = [first]
        self.parts: list[str] = [text] if text else []
        self.messages: dict[str, list[str]] = {"warnings": [], "info": []}
        self.open: tuple[str, list[str]] | None = None
        self.continues_name = True  # until a row of its own follows: a named row without a result

    def close_message(self) -> None:
        if self.open is not None:
            kind, chunks = self.open
            msg = "".join(chunks).strip()
            self.messages[_DIAG_MESSAGE_ROWS[kind]].append(msg)
            self.parts.append(f"{kind}: {msg}")
            self.open = None

    def add_row(self, name: str, cell: str) -> None:
        self.continues_name = False
        text = cell.strip()
        if name in _DIAG_MESSAGE_ROWS:
            self.close_message()
            self.open = (name, [_diag_chunk(cell)])
            return
        line = _diag_result_line(text)
        if line is None and self.open is None and self.parts and self.parts[-1].rstrip().endswith(","):
            joined = f"{self.parts[-1].rstrip()} {text}"  # a GPU list wrapped onto the next row
            if (line := _diag_result_line(joined)) is not None:
                self.lines[-1] = line
                self.parts[-1] = joined
                return
        if line is not None:
            self.close_message()
            self.lines.append(line)
            self.parts.append(text)
        elif self.open is not None:
            self.open[1].append(_diag_chunk(cell))
        elif text:
            self.parts.append(text)

    def build(self) -> DcgmTest:
        self.close_message()
        result = max((w for w, _, _ in self.lines), key=_RESULT_RANK.__getitem__)
        gpu_results: dict[int, DiagResult] = {}
        gpus: list[int] = []
        for word, ids, _ in self.lines:
            for g in ids:
                if g not in gpu_results or _RESULT_RANK[word] > _RESULT_RANK[gpu_results[g]]:
                    gpu_results[g] = word
                if word == result and g not in gpus:
                    gpus.append(g)
        return DcgmTest(
            section=self.section,
            name=self.name,
            result=result,
            gpus=gpus,
            detail=" ".join(self.parts),
            gpu_results=gpu_results,
            all_gpus=any(a for w, _, a in self.lines if w == result),
            warnings=self.messages["warnings"],
            info=self.messages["info"],
        )


def parse_dcgmi_diag(text: str) -> DcgmDiag:
    """Parse the table ``dcgmi diag -r N`` prints: DCGM 1.7-2.0 (no ``| Diagnostic | Result |``
    header: the table starts at its first section row), 2.x (no Metadata section, ``Blacklist``),
    3.x (Metadata rows) and 4.x (lower-case plugin names, one ``GPU<n>: <result>`` row per GPU).

    Section headers are ``|-----  Deployment  ---+---|`` or ``+-----  Hardware  ---+---+``
    (dcgmi prints both forms in one table). Metadata rows give ``DCGM Version``, ``Driver Version
    Detected``, ``GPU Device IDs Detected``. Every other named row is a test whose result rows are
    read as :class:`DcgmTest` describes; rows named ``Warning``, ``Error`` or ``Info`` are
    messages of the test above them (not tests), and rows with an empty left cell continue the
    message or test above. Wrapped cells are joined: a named row with an empty result right
    under a test's first row continues its name (``Page Retirement/Row`` + ``Remap``), a result
    row whose GPU list ends in ``,`` continues on the next row. A leading prompt/command line and
    ``Successfully ran diagnostic`` are ignored: ``overall`` is read from the rows (a Fail row is a
    failed run whatever the tool printed); a cut-off table has ``complete`` False, ``overall``
    ``unknown`` (unless a row failed) and ``error`` set.

    Raises:
        ValueError: neither a ``| Diagnostic | Result |`` header nor a section row (not dcgmi
            diag table output).
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if _DIAG_HEADER_RE.match(ln.strip())), None)
    if start is None:  # DCGM 1.x/2.0 tables start at the first section row, without the header
        start = next((i - 1 for i, ln in enumerate(lines) if _DIAG_SECTION_RE.match(ln.strip())), None)
    if start is None:
        raise ValueError("not dcgmi diag output: no '| Diagnostic | Result |' header and no section row")
    section: str | None = None
    meta: dict[str, str] = {}
    rows: list[_DiagTestRows] = []
    complete = False
    last_open = False
    for raw in lines[start + 1 :]:
        ln = raw.strip()
        if not ln:
            continue
        m = re.match(r"^[|+]-+\s+([A-Za-z][^|+]*?)\s+-+\+", ln)
        if m:
            section = m.group(1)
            complete = last_open = False
            if rows:
                rows[-1].close_message()
            continue
        if ln.startswith("+") and set(ln) <= {"+", "-", "="}:
            complete = bool(rows) or bool(meta)
            if rows:
                rows[-1].close_message()
            continue
        if not ln.startswith("|"):
            continue
        last_open = not ln.endswith("|") or len(ln) == 1
        body = ln[1:-1] if not last_open else ln[1:]
        left, _, cell = body.partition("|")
        complete = False
        name = left.strip()
        if section == "Metadata":
            if name:
                meta[name] = cell.strip()
        elif name and name not in _DIAG_MESSAGE_ROWS and not cell.strip() and rows and rows[-1].continues_name:
            rows[-1].name = f"{rows[-1].name} {name}"  # a test name wrapped onto the next row
        elif name and name not in _DIAG_MESSAGE_ROWS:
            rows.append(_DiagTestRows(section, name, cell.strip()))
        elif rows:
            rows[-1].add_row(name, cell)
    if last_open:
        complete = False
    ids = meta.get("GPU Device IDs Detected", "")
    gm = re.search(r"dcgmi diag\b.*?\s(?:-g|--group)[ =](\d+)", "\n".join(lines[: max(start, 0)]))
    tests = [r.build() for r in rows]
    return DcgmDiag(
        dcgm_version=meta.get("DCGM Version"),
        driver_version=meta.get("Driver Version Detected"),
        device_ids=[x for x in re.split(r"[,\s]+", ids) if x],
        tests=tests,
        complete=complete,
        group=int(gm.group(1)) if gm else None,
        overall=_diag_overall(tests, complete),
        error=None if complete else f"dcgmi diag output cut off after {len(tests)} test row(s)",
    )


# -- dcgmi discovery -l ----------------------------------------------------------------


@dataclass(frozen=True)
class DcgmGpu:
    """One GPU row of ``dcgmi discovery -l``: DCGM ``gpu_id`` (not necessarily the NVML index),
    ``name`` (None when DCGM printed ``<<<NULL>>>`` or nothing), ``pci_bus_id`` as printed
    (``00000000:4C:00.0``), ``uuid`` (``GPU-...``), ``status`` (``--all`` only: the state of an
    inactive GPU, e.g. ``Detached``) and ``last_known`` (its name/bus id are cached values)."""

    gpu_id: int
    name: str | None
    pci_bus_id: str | None
    uuid: str | None
    status: str | None = None
    last_known: bool = False


@dataclass(frozen=True)
class DcgmDiscovery:
    """A parsed ``dcgmi discovery -l``. ``gpus_found``: the count in the ``N GPUs found.`` line
    (may differ from ``len(gpus)`` when the table is cut off); ``active_only``: the header said
    ``(Active)`` (DCGM 4 omits inactive GPUs unless ``--all``); ``nvswitches``: NvSwitch entity
    ids (``[]`` when ``0 NvSwitches found.``, None when the section is absent); ``others``: the
    counts of any other ``N <entities> found`` sections (ConnectX devices, CPUs ...)."""

    gpus: list[DcgmGpu]
    gpus_found: int
    active_only: bool = False
    nvswitches: list[int] | None = None
    others: dict[str, int] = field(default_factory=dict)
    complete: bool = True
    """False when the GPU table is cut off: fewer GPU rows than ``gpus_found``, or the last GPU
    block without its closing ``+---+`` border (its fields may be missing)."""
    error: str | None = None
    """Why the list is incomplete; None when complete."""

    def by_uuid(self) -> dict[str, DcgmGpu]:
        return {g.uuid.lower(): g for g in self.gpus if g.uuid}


_FOUND_RE = re.compile(r"^(\d+)\s+(.+?)\s+found(?:\s*\(([^)]*)\))?\.?\s*$")
_LAST_KNOWN = "(last known)"


def _strip_last_known(value: str) -> tuple[str, bool]:
    v = value.strip()
    if v.endswith(_LAST_KNOWN):
        return v[: -len(_LAST_KNOWN)].strip(), True
    return v, False


def parse_dcgmi_discovery(text: str) -> DcgmDiscovery:
    """Parse ``dcgmi discovery -l`` (DCGM 2.x-4.x): the ``N GPU(s) found[ (Active)].`` line and
    its ``| GPU ID | Device Information |`` table, where a row with an id starts a GPU and the
    rows under it add ``Name:``, ``PCI Bus ID:``, ``Device UUID:`` and (``--all``) ``Status:``;
    then ``N NvSwitches found.`` with its ``| Switch ID |`` table, and any other
    ``N <entities> found`` section (counted). ``Name: <<<NULL>>>`` -> ``name`` None; a value
    suffixed ``(last known)`` -> ``last_known`` True. A leading prompt/command line is ignored.
    A cut-off table (fewer GPU rows than the count, or the last GPU block unclosed) is returned
    with ``complete`` False and ``error`` set: never a shorter list read as the whole.

    Raises:
        ValueError: no ``N GPU(s) found`` line (not dcgmi discovery output, e.g. the host-engine
            connection error), or a GPU row whose id is not a number.
    """
    gpus: list[DcgmGpu] = []
    cur: dict[str, object] | None = None
    section: str | None = None
    gpus_found: int | None = None
    active_only = False
    nvswitches: list[int] | None = None
    others: dict[str, int] = {}

    def close() -> None:
        nonlocal cur
        if cur is not None:
            gpus.append(DcgmGpu(**cur))  # type: ignore[arg-type]
        cur = None

    gpu_open = False  # a GPU block not closed by a +---+ border yet
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("+") and set(line) <= {"+", "-", "="}:
            gpu_open = False
            continue
        m = _FOUND_RE.match(line)
        if m:
            close()
            n, what = int(m.group(1)), m.group(2).lower()
            if what in ("gpu", "gpus"):
                section, gpus_found = "gpu", n
                active_only = (m.group(3) or "").lower() == "active"
            elif what.startswith("nvswitch"):
                section, nvswitches = "nvswitch", []
            else:
                section, others[what] = "other", n
            continue
        if not line.startswith("|") or section is None:
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if section == "nvswitch":
            if len(cells) == 1 and cells[0].isdigit() and nvswitches is not None:
                nvswitches.append(int(cells[0]))
            continue
        if section != "gpu" or len(cells) < 2 or cells[0] == "GPU ID":
            continue
        ident, info = cells[0], cells[1]
        if ident:
            if not ident.isdigit():
                raise ValueError(f"dcgmi discovery: GPU id {ident!r} is not a number")
            close()
            cur = {"gpu_id": int(ident), "name": None, "pci_bus_id": None, "uuid": None}
            gpu_open = True
        if cur is None or ":" not in info:
            continue
        key, value = (x.strip() for x in info.split(":", 1))
        value, cached = _strip_last_known(value)
        if cached:
            cur["last_known"] = True
        if key == "Name":
            cur["name"] = None if value in ("", "<<<NULL>>>") else value
        elif key == "PCI Bus ID":
            cur["pci_bus_id"] = value or None
        elif key == "Device UUID":
            cur["uuid"] = value or None
        elif key == "Status":
            cur["status"] = value or None
    close()
    if gpus_found is None:
        raise ValueError("not dcgmi discovery -l output: no 'N GPUs found' line")
    error = None
    if len(gpus) < gpus_found:
        error = f"dcgmi discovery output cut off: {len(gpus)} of {gpus_found} GPUs listed"
    elif gpu_open and section == "gpu":
        error = f"dcgmi discovery output cut off inside the block of GPU {gpus[-1].gpu_id}"
    return DcgmDiscovery(
        gpus=gpus,
        gpus_found=gpus_found,
        active_only=active_only,
        nvswitches=nvswitches,
        others=others,
        complete=error is None,
        error=error,
    )
