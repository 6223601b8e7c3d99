"""Kernel-log lines of a simulated node: XID / SXID lines in the driver's real format
(``dmesg --time-format iso``), read back through the real parser
(:func:`~gpuwarden.shared.nvidia.kernel_log.parse_kernel_log_line`) like a real node's."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from gpuwarden.shared.scenario import Scenario, ScenarioClock

from .gpu_model import NVSWITCH_PCI, pci_of

__all__ = ["KernelLogGenerator", "sxid_line", "xid_line"]

# Driver texts per XID (from real kernel logs, see tests/fixtures/xid-logs and NVIDIA's XID catalog).
# code -> (printed with pid/name?, text); "{link}" is the fault's NVLink (default 4).
_XID_TEXT: dict[int, tuple[bool, str]] = {
    8: (True, "Ch 00000010"),
    13: (True, "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Out Of Range Address"),
    31: (
        True,
        "channel 0x00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ "
        "0x7f1e_2a000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    ),
    32: (True, "Channel ID 00000010 intr0 00040000"),
    38: (True, "Ch 00000010"),
    43: (True, "Ch 00000008"),
    44: (True, "Ch 00000010, engmask 00000101, intr 10000000"),
    45: (True, "Ch 00000008"),
    48: (
        True,
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
        "0x12bac1c3e0 partition 2, subpartition 1.",
    ),
    61: (False, "0cec(3098) 00000000 00000000"),
    62: (False, "0ce4(2d10) 00000000 00000000"),
    63: (True, "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate."),
    64: (True, "Row Remapper: Failed to remap row (0x00000012bac1c3e0), reset gpu to activate."),
    68: (True, "NVDEC0 Exception: Invalid MMU fault"),
    69: (True, "Class Error: ChId 0010, Class 0000c7c0, Offset 00000000, Data 00000000, ErrorCode 0000000d"),
    74: (False, "NVLink: fatal error detected on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    79: (False, "GPU has fallen off the bus."),
    92: (True, "High single-bit ECC error rate detected."),
    94: (True, "Contained: SM (0x1). RST: No, D-RST: No"),
    95: (True, "Uncontained: FBHUB. RST: Yes, D-RST: No"),
    109: (True, "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c040"),
    119: (
        True,
        "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20801813 0x4c).",
    ),
    120: (True, "GSP task exception: (0x0) timeout."),
    122: (False, "SPI PMU RPC read fail"),
    123: (False, "SPI PMU RPC write fail"),
    136: (False, "Link Training failed: link {link}"),
    140: (True, "An uncorrectable ECC error detected (possible firmware handling failure) DRAM:-1, LTC:0, MMU:0, RM:0"),
    143: (False, "GPU Initialization Failure"),
    145: (False, "NVLink: RLW Error on link {link}"),
    149: (
        False,
        "NETIR_LINK_EVT Fatal XC0 i0 Link {link} (0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    ),
    154: (False, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
}
_UNKNOWN_PID = "pid='<unknown>', name=<unknown>, "


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")


def xid_line(ts: float, pci: str, code: int, pid: int | None, name: str = "python3", link: int | None = None) -> str:
    """A kernel-log XID line as ``dmesg --time-format iso`` prints it, in the driver's real format
    (text per code from real logs; an unlisted code gets the generic ``Ch 00000008`` form)."""
    with_pid, text = _XID_TEXT.get(code, (True, "Ch 00000008"))
    text = text.replace("{link}", str(link if link is not None else 4))
    bus = pci.rsplit(".", 1)[0]
    who = ""
    if with_pid:
        who = f"pid={pid}, name={name}, " if pid is not None else _UNKNOWN_PID
    return f"{_iso(ts)} NVRM: Xid (PCI:{bus}): {code}, {who}{text}"


def sxid_line(ts: float, switch: int, code: int, link: int | None) -> str:
    """An NVSwitch SXID line (``nvidia-nvswitchN: SXid (PCI:...): CODE, ...``)."""
    lk = link if link is not None else 0
    text = (
        f"Fatal, Link {lk:02d} LTSSM Fault Up"
        if code >= 20000
        else f"Non-fatal, Link {lk:02d} egress non-posted PRIV error (First)"
    )
    pci = NVSWITCH_PCI[switch % len(NVSWITCH_PCI)]
    return f"{_iso(ts)} nvidia-nvswitch{switch}: SXid (PCI:{pci}): {code}, {text}"


class KernelLogGenerator:
    """Kernel-log lines a simulated node prints for its faults, in the driver's real format.

    ``lines(t0, t1)`` returns the lines of faults starting in scenario seconds ``(t0, t1]``,
    each stamped with its event time (``clock.event_ts(at_s)``) in ``dmesg --time-format iso``
    form: ``xid`` (any code, the driver's text for that code; without ``gpu`` one line per GPU),
    ``sxid`` (an ``nvidia-nvswitchN: SXid`` line, ``Fatal`` for codes >= 20000), ``ecc-dbe``
    (XID 48), ``row-remap-pending`` (XID 63), ``row-remap-failed`` (XID 64). Every other fault
    kind shows in telemetry only, as on real hardware: no line.
    """

    _KIND_XID = {"ecc-dbe": 48, "row-remap-pending": 63, "row-remap-failed": 64}

    def __init__(self, scenario: Scenario, clock: ScenarioClock, node: str) -> None:
        self.scenario = scenario
        self.clock = clock
        self.node = node
        self._faults = sorted((f for f in scenario.faults if f.node == node), key=lambda f: f.at_s)

    def lines(self, t0: float, t1: float) -> list[str]:
        out = []
        for f in self._faults:
            if not t0 < f.at_s <= t1:
                continue
            ts = self.clock.event_ts(f.at_s)
            rng = random.Random(f"{self.scenario.seed}/{self.node}/{f.at_s}/{f.kind}")
            gpus = [f.gpu] if f.gpu is not None else list(range(self.scenario.cluster.gpus_per_node))
            if f.kind == "sxid" and f.sxid is not None:
                out.append(sxid_line(ts, rng.randrange(len(NVSWITCH_PCI)), f.sxid, f.link))
                continue
            code = f.xid if f.kind == "xid" else self._KIND_XID.get(f.kind)
            if code is None:
                continue
            for g in gpus:
                pid = rng.randrange(10_000, 4_000_000) if code not in {48, 63, 64} else None
                out.append(xid_line(ts, pci_of(g), code, pid, link=f.link))
        return out
