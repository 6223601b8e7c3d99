"""The ``infiniband`` check: RDMA ports from sysfs, else ibstat, ibstatus, ibv_devinfo -v."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..io import ToolMissing, ToolTimeout, read_sysfs_ib
from ..parsers import IbPort, parse_ibstat, parse_ibstatus, parse_ibv_devinfo
from .base import CheckResult, Context, Inputs, Status, _last_line, _result

__all__ = ["check_infiniband", "evaluate_infiniband", "read_ib_ports"]


def evaluate_infiniband(
    ports: Sequence[IbPort],
    rate_gbps: float | None = None,
    min_ports: int | None = None,
    source: str | None = None,
    ignore: frozenset[str] = frozenset(),
) -> CheckResult:
    """InfiniBand verdict over parsed ports. Only ``link_layer`` InfiniBand ports (or unknown
    layer) count, minus those named in ``ignore`` (``mlx5_3`` or ``mlx4_0/2``).

    ``min_ports`` None: every IB port must be ``ACTIVE``/``LinkUp``. ``min_ports`` N: the node
    needs N ACTIVE IB ports (CRITICAL below, naming the down ones); ports down beyond that are
    not required (the uncabled second port of a dual-port HCA) and only mentioned. Active ports
    must run at ``rate_gbps`` (default: the fastest IB port's rate) Gb/s; a port whose rate the
    source does not print (plain ``ibv_devinfo``) is a WARNING only when a rate is required.
    ``source`` (``sysfs``, ``ibstat`` ...) is named in the reason."""
    ib = [
        p
        for p in ports
        if (p.link_layer or "InfiniBand").lower() == "infiniband"
        and p.device not in ignore
        and f"{p.device}/{p.port}" not in ignore
    ]
    probs: list[tuple[Status, str, int | None]] = []
    up = [p for p in ib if p.state == "ACTIVE" and (p.phys_state is None or p.phys_state == "LinkUp")]
    down = [p for p in ib if p not in up]
    down_txt = [f"{p.device}/{p.port} {p.state}/{p.phys_state or '?'}" for p in down]
    if min_ports is None:
        probs += [(Status.CRITICAL, t, None) for t in down_txt]
    elif len(up) < min_ports:
        probs.append((Status.CRITICAL, f"{len(up)}/{min_ports} InfiniBand ports ACTIVE", None))
        probs += [(Status.CRITICAL, t, None) for t in down_txt]
    want = rate_gbps if rate_gbps is not None else max((p.rate_gbps or 0 for p in up), default=0)
    for p in up:
        name = f"{p.device}/{p.port}"
        if want and p.rate_gbps is None:
            probs.append((Status.WARNING, f"{name} rate not reported (expected {want:g} Gb/s)", None))
        elif want and (p.rate_gbps or 0) < want:
            probs.append((Status.CRITICAL, f"{name} at {p.rate_gbps:g} Gb/s, expected {want:g}", None))
    via = f" ({source})" if source else ""
    if not ib and not probs:
        return CheckResult("infiniband", Status.OK, f"no InfiniBand ports{via}")
    at = f" at {want:g} Gb/s" if want else ""
    spare = f"; not required: {', '.join(down_txt)}" if min_ports is not None and down and len(up) >= min_ports else ""
    return _result("infiniband", probs, f"{len(up)} InfiniBand port(s) ACTIVE{at}{via}{spare}")


# (argv, parser) tried in order when sysfs has no RDMA devices (a container without /sys/class/infiniband)
_IB_TOOLS: tuple[tuple[list[str], Callable[[str], list[IbPort]]], ...] = (
    (["ibstat"], parse_ibstat),
    (["ibstatus"], parse_ibstatus),
    (["ibv_devinfo", "-v"], parse_ibv_devinfo),
)


def read_ib_ports(inp: Inputs, ctx: Context) -> tuple[list[IbPort], str | None, list[str]]:
    """The node's RDMA ports, where they were read, and what went wrong on the way: sysfs first
    (no tool to run), then the first of ``ibstat``, ``ibstatus``, ``ibv_devinfo -v`` that is
    installed and parses. A tool that prints nothing ("No IB devices found" on stderr) counts as
    no devices; one that exits non-zero after printing part of its output (``ibpanic``, exit
    255) or whose output its parser marks incomplete, one that hangs past ``tool_timeout_s`` or
    prints what its parser cannot read is a problem, and the next source is tried."""
    ports = read_sysfs_ib(inp.sysfs_root)
    if ports:
        return ports, "sysfs", []
    problems: list[str] = []
    for argv, parse in _IB_TOOLS:
        try:
            out = inp.runner.run(argv, ctx.tool_timeout_s)
        except ToolMissing:
            continue
        except ToolTimeout as exc:
            problems.append(str(exc))
            continue
        if not out.stdout.strip():
            continue  # nothing printed (exit 0, or "No IB devices found" on stderr): no devices here
        if out.returncode != 0:  # died part-way (ibstat's ibpanic, exit 255): what it printed is partial
            problems.append(f"{argv[0]} exited {out.returncode} after partial output: {_last_line(out)}"[:120])
            continue
        try:
            return parse(out.stdout), argv[0], []
        except ValueError as exc:
            problems.append(f"{argv[0]} output unreadable ({exc})"[:100])
    return [], None, problems


def check_infiniband(inp: Inputs, ctx: Context) -> CheckResult:
    ports, source, problems = read_ib_ports(inp, ctx)
    if source is None and problems:  # cannot tell "no ports" from "could not read them"
        return CheckResult("infiniband", Status.UNKNOWN, "InfiniBand ports unreadable: " + "; ".join(problems))
    return evaluate_infiniband(ports, ctx.ib_rate_gbps, ctx.ib_ports, source, ctx.ib_ignore)
