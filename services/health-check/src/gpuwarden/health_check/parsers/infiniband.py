"""Parsers of the InfiniBand/RDMA port tools: text in, :class:`IbPort` records out, no I/O.

Reads the output of:

* ``ibstat`` (infiniband-diags 1.6+, rdma-core 28+; all CAs): :func:`read_ibstat` (a run that
  died part-way, ``ibpanic``, is reported as incomplete) and :func:`parse_ibstat` (complete
  runs only);
* ``ibstatus`` (the infiniband-diags script of rdma-core 28+), and the same ``N: NAME`` values of
  ``/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}``:
  :func:`parse_ibstatus`, :func:`parse_ib_state`, :func:`parse_ib_rate`;
* ``ibv_devinfo`` and ``ibv_devinfo -v`` (libibverbs utilities of rdma-core 28+ and MLNX_OFED
  4.x/5.x): :func:`parse_ibv_devinfo`.

Rates are in Gb/s (bits), MTUs in bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "IbPort",
    "IbstatReport",
    "parse_ib_rate",
    "parse_ib_state",
    "parse_ibstat",
    "parse_ibstatus",
    "parse_ibv_devinfo",
    "read_ibstat",
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
    active_mtu: int | None = None
    """Active MTU in bytes (``ibv_devinfo``: ``active_mtu: 4096 (5)``); None where not printed."""


@dataclass(frozen=True)
class IbstatReport:
    """What one ``ibstat`` run printed: its ``ports``; ``complete`` False and ``error`` the
    message when the tool died part-way (``ibpanic: ...``, exit 255): the ports printed
    before it are kept, the ones after it are unknown (not absent)."""

    ports: list[IbPort]
    complete: bool = True
    error: str | None = None


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


_IBPANIC_RE = re.compile(r"\b(?:ibpanic|iberror):\s.*$")


def read_ibstat(text: str) -> IbstatReport:
    """Parse ``ibstat`` output (infiniband-diags 1.6+/rdma-core 28+, all CAs) into one
    :class:`IbPort` per port, and whether the run finished (:class:`IbstatReport`).

    Reads ``CA 'name'`` blocks with ``CA type``/``Firmware version`` and ``Port N:`` sub-blocks
    (``State: Active``, ``Physical state: LinkUp``, ``Rate: 400`` in Gb/s, ``Base lid``,
    ``SM lid``, ``Port GUID``, ``Link layer``). Any indentation (tabs or spaces) is accepted.

    A line ``ibpanic: ...`` (``ibstat: iberror: ...`` too), printed when ibstat dies part-way
    (exit 255), ends the report: ``complete`` False, ``error`` its text, ports before it kept
    (a port cut before its ``State`` line is dropped, not guessed).

    Raises:
        ValueError: no ``CA '...'`` block and no ``ibpanic`` line, or a port without a
            ``State`` line in a complete run.
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

    error: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        pm = _IBPANIC_RE.search(line)
        if pm:
            error = pm.group(0).strip()
            break
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
    if error is not None:
        if port is not None and "State" not in port:
            port = None  # cut before its State line: unknown, not guessed
        close_port()
        return IbstatReport(ports=ports, complete=False, error=error)
    close_port()
    if ca_name is None:
        raise ValueError("not ibstat output: no \"CA '<name>'\" line")
    return IbstatReport(ports=ports)


def parse_ibstat(text: str) -> list[IbPort]:
    """The ports of a complete ``ibstat`` run (:func:`read_ibstat`).

    Raises:
        ValueError: not ibstat output, or ibstat died part-way (``ibpanic``): a partial port
            list must not be read as the node's ports.
    """
    rep = read_ibstat(text)
    if not rep.complete:
        raise ValueError(f"ibstat died after {len(rep.ports)} port(s): {rep.error}")
    return rep.ports


def parse_ibstatus(text: str) -> list[IbPort]:
    """Parse ``ibstatus`` (infiniband-diags script, rdma-core 28+) into one :class:`IbPort` per
    ``Infiniband device 'X' port N status:`` block.

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


# -- ibv_devinfo -------------------------------------------------------------------

# enum ibv_port_state / ibv_port_attr.phys_state codes -> the names sysfs and ibstat print
_IBV_STATE = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_IBV_PHYS = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}
# ibv_port_attr.active_speed codes -> InfiniBand speed names (FDR10 and QDR both print 10.0 Gbps)
_IBV_SPEED = {1: "SDR", 2: "DDR", 4: "QDR", 8: "FDR10", 16: "FDR", 32: "EDR", 64: "HDR", 128: "NDR", 256: "XDR"}
_CODE_RE = re.compile(r"^(.*?)\s*\((\d+)\)\s*$")


def _named_code(value: str) -> tuple[str, int | None]:
    """``"PORT_ACTIVE (4)"`` -> ``("PORT_ACTIVE", 4)``; ``"Ethernet"`` -> ``("Ethernet", None)``."""
    m = _CODE_RE.match(value.strip())
    return (m.group(1), int(m.group(2))) if m else (value.strip(), None)


def _ibv_port(device: str, dev: dict[str, str], port: int, kv: dict[str, str]) -> IbPort:
    if "state" not in kv:
        raise ValueError(f"ibv_devinfo: {device} port {port} has no state line")
    name, code = _named_code(kv["state"])
    state = _IBV_STATE.get(code, name) if code is not None else name
    state = state.upper().removeprefix("PORT_")
    phys = None
    if "phys_state" in kv:
        pname, pcode = _named_code(kv["phys_state"])
        phys = _IBV_PHYS.get(pcode, pname) if pcode is not None else pname
    rate = width = speed = None
    if "active_width" in kv and "active_speed" in kv:
        wname, _ = _named_code(kv["active_width"])
        sname, scode = _named_code(kv["active_speed"])
        wm = re.match(r"^(\d+)X$", wname)
        sm = re.match(r"^(\d+(?:\.\d+)?)\s*Gbps$", sname)
        width = wname if wm else None
        speed = _IBV_SPEED.get(scode) if scode is not None else None
        # a port that is not ACTIVE reports its reset defaults (e.g. 4X at 2.5 Gbps), not a rate
        if wm and sm and state == "ACTIVE":
            rate = round(int(wm.group(1)) * float(sm.group(1)), 3)
    return IbPort(
        device=device,
        port=port,
        state=state,
        phys_state=phys,
        rate_gbps=rate,
        link_layer=kv.get("link_layer"),
        base_lid=_int_lid(kv["port_lid"]) if "port_lid" in kv else None,
        sm_lid=_int_lid(kv["sm_lid"]) if "sm_lid" in kv else None,
        width=width,
        speed=speed,
        ca_type=(f"MT{dev['vendor_part_id']}" if "vendor_part_id" in dev else None),  # as ibstat prints it
        firmware=dev.get("fw_ver"),
        port_guid=None,
        active_mtu=_mtu(kv.get("active_mtu")),
    )


def _mtu(value: str | None) -> int | None:
    """``"4096 (5)"`` -> 4096 (bytes); None when absent or unreadable."""
    if not value:
        return None
    m = re.match(r"^(\d+)", value.strip())
    return int(m.group(1)) if m else None


def parse_ibv_devinfo(text: str) -> list[IbPort]:
    """Parse ``ibv_devinfo [-v]`` (libibverbs, rdma-core 28+ and MLNX_OFED 4.x/5.x) into one
    :class:`IbPort` per ``port: N`` of each ``hca_id: NAME`` block.

    Reads ``state: PORT_ACTIVE (4)`` (the number wins over the name: ``ACTIVE``, ``DOWN``,
    ``INIT``, ``ARMED``), ``link_layer``, ``sm_lid``/``port_lid`` and, with ``-v``,
    ``phys_state: LINK_UP (5)`` (-> sysfs names ``LinkUp``, ``Polling``, ``Disabled`` ...) and
    ``active_width: 4X (2)`` x ``active_speed: 25.0 Gbps (32)`` -> ``rate_gbps`` 100.0 (only for an
    ACTIVE port: a port that is down reports its reset defaults). The non-verbose form prints no
    rate or physical state (None). ``active_mtu: 4096 (5)`` -> ``active_mtu`` 4096 (bytes) and
    ``link_layer`` (``InfiniBand``/``Ethernet``) are read per port. Tabs or spaces, the MLNX_OFED
    ``Device ports:`` line, verbose capability-flag lists and ``GID[ n]`` lines are accepted and ignored.

    Raises:
        ValueError: no ``hca_id:`` line (not ibv_devinfo output; ``No IB devices found`` is
            printed on stderr), or a port without a ``state`` line.
    """
    ports: list[IbPort] = []
    device: str | None = None
    dev: dict[str, str] = {}
    port: int | None = None
    kv: dict[str, str] = {}

    def close_port() -> None:
        if device is not None and port is not None:
            ports.append(_ibv_port(device, dev, port, kv))

    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^hca_id:\s*(\S+)$", line)
        if m:
            close_port()
            device, dev, port, kv = m.group(1), {}, None, {}
            continue
        if device is None:
            continue
        m = re.match(r"^port:\s*(\d+)$", line)
        if m:
            close_port()
            port, kv = int(m.group(1)), {}
            continue
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):\s*(.*)$", line)
        if not m:
            continue  # capability flag lists, "key = value", "GID[  0]:", free text
        (kv if port is not None else dev)[m.group(1)] = m.group(2).strip()
    close_port()
    if device is None:
        raise ValueError("not ibv_devinfo output: no 'hca_id: <name>' line")
    return ports
