"""Derive the XID table (``xids.csv``, see :mod:`gpuwarden.shared.nvidia.xids`) from the reference XID catalog.

Usage: python services/detector/tools/derive_xids.py ../shared/reference/xid_catalog.csv \
           > shared/src/gpuwarden/shared/nvidia/xids.csv

The reference gives, per XID, a name, meaning, category and recommended action in prose
(compiled from NVIDIA's catalog, DCGM, NVSentinel, EKS and Azure NHC). This script turns
that prose into the detector's vocabulary: a canonical pattern (docs/architecture.md#canonical-patterns), an
action, a severity, whether the code is "sticky" (longer episode) and how a node health
check counts it (``health``). The rules below are
the whole derivation; the generated CSV is committed and reviewed as data.
"""

from __future__ import annotations

import csv
import sys

# Codes with a pattern of their own (gpuwarden.shared.models.PATTERNS).
PATTERN = {
    79: "gpu-fallen-off-bus",
    48: "uncorrectable-ecc",
    171: "uncorrectable-ecc",
    172: "uncorrectable-ecc",
    63: "row-remap-pending",
    64: "row-remap-failure",
    92: "correctable-ecc-storm",
    94: "contained-memory-error",
    95: "uncontained-memory-error",
    140: "uncontained-memory-error",
    119: "gsp-firmware-error",
    120: "gsp-firmware-error",
    74: "nvlink-error",
    144: "nvlink-error",
    145: "nvlink-error",
    146: "nvlink-error",
    147: "nvlink-error",
    148: "nvlink-error",
    150: "nvlink-error",
    136: "nvlink-link-down",
    149: "nvlink-link-down",
    155: "nvlink-link-down",
    156: "retired-pages",
    157: "retired-pages",
    54: "clocks-low",
    167: "pcie-link-degraded",
}
# Codes whose action the prose leaves open or conditional, decided here.
ACTION = {
    63: "alert",  # remap pending: reset the GPU when it is idle
    64: "drain",
    92: "alert",
    54: "drain",
    144: "alert",
    145: "alert",
    146: "alert",
    147: "alert",
    148: "alert",
    149: "drain",
    150: "alert",
    154: "alert",  # follow the recovery action printed in the message
    159: "alert",
    167: "reboot",
    171: "reset-gpu",
    172: "reset-gpu",
}
# Sticky codes: the condition lasts until a reset, so repeats within an hour are one episode.
STICKY = {74, 79, 95, 109, 119}
# How a node health check counts a code (the ``xid`` check of gpuwarden-health-check); any
# other code is "node" (the node is suspect).
HEALTH = {
    **dict.fromkeys((13, 31, 43, 45, 68, 69), "application"),  # usually the job's own code
    **dict.fromkeys((63, 92), "repair"),  # memory repair / correctable-error notices
    154: "recovery-action",  # judged by the recovery action the message names
}
SEVERITY = {
    "reboot": "critical",
    "drain": "critical",
    "rma": "critical",
    "reset-gpu": "critical",
    "restart-job": "warning",
    "alert": "warning",
    "none": "info",
}


def pattern_of(xid: int, category: str) -> str:
    c = category.lower()
    if xid in PATTERN:
        return PATTERN[xid]
    if c.startswith("application"):
        return "xid-application-fault"
    if c.startswith(("driver", "software")):
        return "driver-fault"
    return "xid-other"


def action_of(xid: int, category: str, action: str) -> str:
    if xid in ACTION:
        return ACTION[xid]
    a, c = action.lower().strip(), category.lower()
    if c.startswith(("unused", "informational")):
        return "none"
    for prefix, act in (
        ("reboot", "reboot"),
        ("drain", "drain"),
        ("reset_gpu", "reset-gpu"),
        ("restart_app", "restart-job"),
        ("rma", "rma"),
        ("follow xid 48", "reset-gpu"),
    ):
        if a.startswith(prefix):
            return act
    if "treat as reset_gpu" in a or "reset_gpu)" in a:
        return "reset-gpu"
    if c.startswith("hardware") or c.startswith("unknown"):
        return "alert"  # hardware signal with no action in the catalog: tell a person
    return "none"


def main(path: str) -> None:
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["xid", "name", "pattern", "severity", "action", "sticky", "category", "meaning", "health"])
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        xid = int(r["xid"])
        act = action_of(xid, r["category"], r["action"])
        sev = "fatal" if xid == 79 else SEVERITY[act]
        meaning = r["meaning"].split(" Applies to:")[0].split(" || ")[0].strip().rstrip(".")
        pattern = pattern_of(xid, r["category"])
        health = HEALTH.get(xid, "node")
        w.writerow([xid, r["name"], pattern, sev, act, int(xid in STICKY), r["category"], meaning, health])


if __name__ == "__main__":
    main(sys.argv[1])
