"""Pure parsers of the tools the health checks read: text in, plain data out, no I/O.

Each ``parse_*`` takes the whole text a tool printed and raises ``ValueError`` when the text is
not that tool's output. They are also ``gpuwarden parse NAME FILE`` (entry points
``gpuwarden.parsers``), which prints the result as JSON.

* :func:`parse_ibstat` - ``ibstat`` (infiniband-diags, rdma-core 28+).
* :func:`parse_ibstatus` - ``ibstatus`` (infiniband-diags script) and the same ``N: NAME``
  values of ``/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}``.
* :func:`parse_dcgmi_diag` - ``dcgmi diag -r 1|2|3`` table output (DCGM 2.x/3.x).
* :func:`parse_nvidia_smi_nvlink` - ``nvidia-smi nvlink --status`` (drivers r450+).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DcgmDiag",
    "DcgmTest",
    "IbPort",
    "NvlinkGpu",
    "NvlinkLink",
    "parse_dcgmi_diag",
    "parse_ib_rate",
    "parse_ib_state",
    "parse_ibstat",
    "parse_ibstatus",
    "parse_nvidia_smi_nvlink",
]


@dataclass(frozen=True)
class IbPort:
    """One port of an RDMA device as ``ibstat``/``ibstatus``/sysfs show it.

    ``state``: ``ACTIVE``, ``INIT``, ``ARMED``, ``DOWN`` (upper case, without the number);
    ``phys_state``: ``LinkUp``, ``Polling``, ``Disabled`` ...; ``rate_gbps``: link rate in Gb/s
    (None when not printed); ``link_layer``: ``InfiniBand`` or ``Ethernet`` (RoCE), None if absent.
    """

    device: str
    port: int
    state: str
    phys_state: str | None
    rate_gbps: float | None
    link_layer: str | None
    base_lid: int | None = None
    sm_lid: int | None = None
    width: str | None = None
    speed: str | None = None
    ca_type: str | None = None
    firmware: str | None = None
    port_guid: str | None = None


_KV_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_ ]*?)\s*:\s*(.*?)\s*$")


def parse_ib_state(value: str) -> str:
    """``"4: ACTIVE"`` (sysfs/ibstatus) or ``"Active"`` (ibstat) -> ``"ACTIVE"``.

    Raises ValueError on an empty value."""
    v = value.strip()
    if not v:
        raise ValueError("empty port state")
    if ":" in v:
        v = v.split(":", 1)[1].strip()
    return v.upper()


def _phys(value: str) -> str:
    v = value.strip()
    return v.split(":", 1)[1].strip() if re.match(r"^\d+\s*:", v) else v


def parse_ib_rate(value: str) -> tuple[float | None, str | None, str | None]:
    """``"200 Gb/sec (4X HDR)"`` -> ``(200.0, "4X", "HDR")``; ``"400"`` (ibstat) -> ``(400.0, None, None)``.

    Returns ``(None, None, None)`` for a value without a number."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(?:Gb/sec)?\s*(?:\((\d+X)\s*([A-Z0-9]+)?\))?", value)
    if m is None:
        return None, None, None
    return float(m.group(1)), m.group(2), m.group(3)


def _int_lid(value: str) -> int | None:
    v = value.strip()
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return None


def parse_ibstat(text: str) -> list[IbPort]:
    """Parse ``ibstat`` output (all CAs) into one :class:`IbPort` per port.

    Reads ``CA 'name'`` blocks with ``CA type``/``Firmware version`` and ``Port N:`` sub-blocks
    (``State: Active``, ``Physical state: LinkUp``, ``Rate: 400`` in Gb/s, ``Base lid``,
    ``SM lid``, ``Port GUID``, ``Link layer``). Any indentation (tabs or spaces) is accepted.

    Raises:
        ValueError: no ``CA '...'`` block, or a port without a ``State`` line.
    """
    ports: list[IbPort] = []
    ca: dict[str, str] = {}
    port: dict[str, str] | None = None
    ca_name: str | None = None

    def close_port() -> None:
        nonlocal port
        if port is None or ca_name is None:
            return
        if "State" not in port:
            raise ValueError(f"ibstat: port {port['_n']} of {ca_name} has no State line")
        rate, width, speed = parse_ib_rate(port.get("Rate", ""))
        ports.append(
            IbPort(
                device=ca_name,
                port=int(port["_n"]),
                state=parse_ib_state(port["State"]),
                phys_state=_phys(port["Physical state"]) if "Physical state" in port else None,
                rate_gbps=rate,
                link_layer=port.get("Link layer"),
                base_lid=_int_lid(port["Base lid"]) if "Base lid" in port else None,
                sm_lid=_int_lid(port["SM lid"]) if "SM lid" in port else None,
                width=width,
                speed=speed,
                ca_type=ca.get("CA type"),
                firmware=ca.get("Firmware version"),
                port_guid=port.get("Port GUID"),
            )
        )
        port = None

    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        m = re.match(r"^CA '([^']+)'\s*$", line)
        if m:
            close_port()
            ca_name, ca = m.group(1), {}
            continue
        if ca_name is None:
            continue  # a prompt or command line before the first CA
        m = re.match(r"^\s+Port (\d+):\s*$", line)
        if m:
            close_port()
            port = {"_n": m.group(1)}
            continue
        kv = _KV_RE.match(line)
        if kv is None:
            continue
        (port if port is not None else ca)[kv.group(1)] = kv.group(2)
    close_port()
    if ca_name is None:
        raise ValueError("not ibstat output: no \"CA '<name>'\" line")
    return ports


def parse_ibstatus(text: str) -> list[IbPort]:
    """Parse ``ibstatus`` output into one :class:`IbPort` per ``Infiniband device 'X' port N status:`` block.

    Values as the script prints them from sysfs: ``state: 4: ACTIVE``, ``phys state: 5: LinkUp``,
    ``rate: 200 Gb/sec (4X HDR)``, ``base lid: 0x33bf`` (hex), ``link_layer: InfiniBand``.

    Raises:
        ValueError: no device block, or a block without ``state``.
    """
    ports: list[IbPort] = []
    cur: dict[str, str] | None = None
    head: tuple[str, int] | None = None

    def close() -> None:
        if cur is None or head is None:
            return
        if "state" not in cur:
            raise ValueError(f"ibstatus: {head[0]} port {head[1]} has no state line")
        rate, width, speed = parse_ib_rate(cur.get("rate", ""))
        ports.append(
            IbPort(
                device=head[0],
                port=head[1],
                state=parse_ib_state(cur["state"]),
                phys_state=_phys(cur["phys state"]) if "phys state" in cur else None,
                rate_gbps=rate,
                link_layer=cur.get("link_layer"),
                base_lid=_int_lid(cur["base lid"]) if "base lid" in cur else None,
                sm_lid=_int_lid(cur["sm lid"]) if "sm lid" in cur else None,
                width=width,
                speed=speed,
            )
        )

    for raw in text.splitlines():
        m = re.match(r"^Infiniband device '([^']+)' port (\d+) status:\s*$", raw.strip())
        if m:
            close()
            head, cur = (m.group(1), int(m.group(2))), {}
            continue
        if cur is None:
            continue
        kv = _KV_RE.match(raw)
        if kv:
            cur[kv.group(1)] = kv.group(2)
    close()
    if not ports:
        raise ValueError("not ibstatus output: no \"Infiniband device '<name>' port N status:\" block")
    return ports


# -- dcgmi diag ---------------------------------------------------------------------

DiagResult = Literal["pass", "fail", "warn", "skip", "unknown"]


@dataclass(frozen=True)
class DcgmTest:
    """One row of ``dcgmi diag``: ``section`` (``Deployment``, ``Integration``, ``Hardware``,
    ``Stress``), test ``name``, ``result`` (pass/fail/warn/skip, ``unknown`` for other text such
    as ``Not Run``), the GPU indices the result names (``Fail - GPU: 0`` -> ``[0]``, empty when
    not printed) and ``detail`` (the result text plus continuation rows)."""

    section: str | None
    name: str
    result: DiagResult
    gpus: list[int]
    detail: str


@dataclass(frozen=True)
class DcgmDiag:
    """A parsed ``dcgmi diag`` run. ``complete`` is False when the table is cut off (no closing
    ``+---+`` border after the last row, or a last row without its right ``|``): a cut-off run
    proves nothing about the rows it lost. ``group``: the ``-g N`` of an echoed ``dcgmi diag``
    command line (results belong to that GPU group), None when not recorded."""

    dcgm_version: str | None
    driver_version: str | None
    device_ids: list[str]
    tests: list[DcgmTest] = field(default_factory=list)
    complete: bool = False
    group: int | None = None

    def by_result(self, result: DiagResult) -> list[DcgmTest]:
        return [t for t in self.tests if t.result == result]


_RESULT_WORD = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip", "skipped": "skip"}


def _diag_result(text: str) -> tuple[DiagResult, list[int]]:
    m = re.match(r"^\s*([A-Za-z]+)", text)
    word = _RESULT_WORD.get(m.group(1).lower(), "unknown") if m else "unknown"
    gm = re.search(r"GPUs?\s*:\s*([\d,\s]+)", text)
    gpus = [int(x) for x in re.findall(r"\d+", gm.group(1))] if gm else []
    return word, gpus  # type: ignore[return-value]


def parse_dcgmi_diag(text: str) -> DcgmDiag:
    """Parse the table ``dcgmi diag -r N`` prints (DCGM 2.x and 3.x).

    ``|-----  Metadata  ---|`` rows start a section; Metadata rows give ``DCGM Version``,
    ``Driver Version Detected``, ``GPU Device IDs Detected``; every other row is a test whose
    result is the first word of its right cell (``Pass``, ``Fail``, ``Warn``, ``Skip``; other
    words -> ``unknown``). Rows with an empty left cell continue the previous test's detail.
    A leading prompt/command line and ``Successfully ran diagnostic`` are ignored.

    Raises:
        ValueError: no ``| Diagnostic | Result |`` header (not dcgmi diag table output).
    """
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if re.match(r"^\|\s*Diagnostic\s*\|\s*Result\s*\|", ln.strip()))
    except StopIteration:
        raise ValueError("not dcgmi diag output: no '| Diagnostic | Result |' header") from None
    section: str | None = None
    meta: dict[str, str] = {}
    rows: list[dict[str, object]] = []
    complete = False
    last_open = False
    for raw in lines[start + 1 :]:
        ln = raw.strip()
        if not ln:
            continue
        if ln.startswith("+") and set(ln) <= {"+", "-", "="}:
            complete = bool(rows) or bool(meta)
            continue
        m = re.match(r"^\|-+\s+(.+?)\s+-+\+", ln)
        if m:
            section = m.group(1)
            complete = False
            continue
        if not ln.startswith("|"):
            continue
        cells = ln.strip("|").split("|", 1)
        last_open = not ln.endswith("|")
        complete = False
        name = cells[0].strip()
        value = cells[1].strip() if len(cells) > 1 else ""
        if section == "Metadata" and name:
            meta[name] = value
        elif not name:
            if rows and value:
                rows[-1]["detail"] = f"{rows[-1]['detail']} {value}".strip()
        else:
            rows.append({"section": section, "name": name, "detail": value})
    if last_open:
        complete = False
    tests = []
    for r in rows:
        detail = str(r["detail"])
        res, gpus = _diag_result(detail)
        tests.append(DcgmTest(section=r["section"], name=str(r["name"]), result=res, gpus=gpus, detail=detail))  # type: ignore[arg-type]
    ids = meta.get("GPU Device IDs Detected", "")
    gm = re.search(r"dcgmi diag\b.*?\s(?:-g|--group)[ =](\d+)", "\n".join(lines[:start]))
    return DcgmDiag(
        dcgm_version=meta.get("DCGM Version"),
        driver_version=meta.get("Driver Version Detected"),
        device_ids=[x for x in re.split(r"[,\s]+", ids) if x],
        tests=tests,
        complete=complete,
        group=int(gm.group(1)) if gm else None,
    )


# -- nvidia-smi nvlink --status -----------------------------------------------------------


@dataclass(frozen=True)
class NvlinkLink:
    """One NVLink: ``active`` False when printed ``<inactive>``; ``gbps`` in GB/s (bytes) as printed."""

    link: int
    active: bool
    gbps: float | None


@dataclass(frozen=True)
class NvlinkGpu:
    index: int
    name: str
    uuid: str | None
    links: list[NvlinkLink]


def parse_nvidia_smi_nvlink(text: str) -> list[NvlinkGpu]:
    """Parse ``nvidia-smi nvlink --status`` (``-s``): ``GPU N: NAME (UUID: GPU-...)`` then one
    ``Link N: 25 GB/s`` or ``Link N: <inactive>`` line per link (any indentation). A GPU
    without NVLink has no link lines (empty ``links``).

    Raises:
        ValueError: no ``GPU N: ...`` line, or a ``Link`` line that is neither a rate nor inactive.
    """
    gpus: list[NvlinkGpu] = []
    for raw in text.splitlines():
        ln = raw.strip()
        m = re.match(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?$", ln)
        if m:
            gpus.append(NvlinkGpu(index=int(m.group(1)), name=m.group(2), uuid=m.group(3), links=[]))
            continue
        m = re.match(r"^Link (\d+): (.*)$", ln)
        if m and gpus:
            val = m.group(2).strip()
            r = re.match(r"^(\d+(?:\.\d+)?) GB/s$", val)
            if r:
                gpus[-1].links.append(NvlinkLink(link=int(m.group(1)), active=True, gbps=float(r.group(1))))
            elif "inactive" in val.lower():
                gpus[-1].links.append(NvlinkLink(link=int(m.group(1)), active=False, gbps=None))
            else:
                raise ValueError(f"nvidia-smi nvlink: unreadable link line {ln!r}")
    if not gpus:
        raise ValueError("not nvidia-smi nvlink --status output: no 'GPU N: ...' line")
    return gpus
