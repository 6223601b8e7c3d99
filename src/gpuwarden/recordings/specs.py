"""Public spec-sheet numbers of common NVIDIA GPUs, to fill what a recording lacks (assumed values)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GPU_SPECS", "GpuSpec", "gpu_spec"]


@dataclass(frozen=True)
class GpuSpec:
    """A GPU model's board power limit (TDP/TGP, W), maximum boost SM clock (MHz) and memory (MiB =
    spec-sheet GB x 1024; nvidia-smi reports a little less)."""

    name: str
    power_limit_w: float
    max_sm_clock_mhz: float
    memory_total_mib: float


def _gb(n: float) -> float:
    return n * 1024.0


#: (tokens that must all appear, spec), most specific first. From NVIDIA's product pages/datasheets.
_TABLE: tuple[tuple[tuple[str, ...], GpuSpec], ...] = (
    (("h100", "pcie"), GpuSpec("H100 PCIe 80GB", 350, 1755, _gb(80))),
    (("h100", "nvl"), GpuSpec("H100 NVL 94GB", 400, 1785, _gb(94))),
    (("h100",), GpuSpec("H100 SXM5 80GB", 700, 1980, _gb(80))),
    (("h200",), GpuSpec("H200 SXM 141GB", 700, 1980, _gb(141))),
    (("b200",), GpuSpec("B200 180GB", 1000, 1965, _gb(180))),
    (("a100", "80gb", "pcie"), GpuSpec("A100 80GB PCIe", 300, 1410, _gb(80))),
    (("a100", "pcie"), GpuSpec("A100 40GB PCIe", 250, 1410, _gb(40))),
    (("a100", "80gb"), GpuSpec("A100 SXM4 80GB", 400, 1410, _gb(80))),
    (("a100",), GpuSpec("A100 SXM4 40GB", 400, 1410, _gb(40))),
    (("a30",), GpuSpec("A30 24GB", 165, 1440, _gb(24))),
    (("a10",), GpuSpec("A10 24GB", 150, 1695, _gb(24))),
    (("v100", "pcie", "32gb"), GpuSpec("V100 PCIe 32GB", 250, 1380, _gb(32))),
    (("v100", "pcie"), GpuSpec("V100 PCIe 16GB", 250, 1380, _gb(16))),
    (("v100", "32gb"), GpuSpec("V100 SXM2 32GB", 300, 1530, _gb(32))),
    (("v100",), GpuSpec("V100 SXM2 16GB", 300, 1530, _gb(16))),
    (("p100",), GpuSpec("P100 PCIe 16GB", 250, 1329, _gb(16))),
    (("l40s",), GpuSpec("L40S 48GB", 350, 2520, _gb(48))),
    (("l40",), GpuSpec("L40 48GB", 300, 2490, _gb(48))),
    (("l4",), GpuSpec("L4 24GB", 72, 2040, _gb(24))),
    (("t4",), GpuSpec("Tesla T4 16GB", 70, 1590, _gb(16))),
    (("a6000",), GpuSpec("RTX A6000 48GB", 300, 1800, _gb(48))),
    (("4090",), GpuSpec("GeForce RTX 4090 24GB", 450, 2520, _gb(24))),
    (("3090",), GpuSpec("GeForce RTX 3090 24GB", 350, 1695, _gb(24))),
    (("titan", "xp"), GpuSpec("TITAN Xp 12GB", 250, 1582, _gb(12))),
    (("titan", "x"), GpuSpec("TITAN X (Pascal) 12GB", 250, 1531, _gb(12))),
)

#: Every known spec by its canonical name.
GPU_SPECS: dict[str, GpuSpec] = {s.name: s for _, s in _TABLE}


def gpu_spec(name: str) -> GpuSpec | None:
    """The spec of a GPU model named loosely (``"H100 80GB HBM3"``, ``"H100-SXM5-80GB"``, ``"NVIDIA
    H100 PCIe"``, ``"A100-SXM4-40GB"``, ``"RTX 4090"``, ``"TITAN X (Pascal)"``, ``"Tesla T4"``,
    ``"V100"``, ``"L40S"``, ``"B200"`` ...); None when unknown. A bare ``"H100"`` is the SXM5
    part, ``"A100"`` the SXM4 40GB, ``"V100"`` the SXM2 16GB, ``"TITAN X"`` the Pascal one."""
    low = name.lower()
    tokens = set(re.findall(r"[a-z0-9]+", low))
    squash = "".join(re.findall(r"[a-z0-9]+", low))
    for keys, spec in _TABLE:
        if all(k in tokens or (len(k) >= 4 and k in squash) for k in keys):
            return spec
    return None
