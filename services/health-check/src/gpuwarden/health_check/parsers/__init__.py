"""Pure parsers of the tools the health checks read: text in, plain data out, no I/O.

Each ``parse_*`` takes the whole text a tool printed and raises ``ValueError`` when the text is
not that tool's output. They are also ``gpuwarden parse NAME FILE`` (entry points
``gpuwarden.parsers``, which name them through this package), which prints the result as JSON.

One module per tool family; every public name is re-exported here (the NVIDIA tools' parsers
live with the other NVIDIA readers in :mod:`gpuwarden.shared.nvidia`):

* :mod:`.infiniband` - :func:`read_ibstat` / :func:`parse_ibstat` (``ibstat``,
  infiniband-diags 1.6+/rdma-core 28+; a run that died part-way, ``ibpanic``, is reported, never
  read as the full port list), :func:`parse_ibstatus` (``ibstatus``, infiniband-diags script,
  and the same ``N: NAME`` values of ``/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,
  rate,link_layer}``), :func:`parse_ibv_devinfo` (``ibv_devinfo [-v]``, libibverbs utilities of
  rdma-core and MLNX_OFED 4.x/5.x).
* :mod:`gpuwarden.shared.nvidia.dcgmi` - :func:`parse_dcgmi_diag` (``dcgmi diag -r 1|2|3|4`` table output, DCGM
  1.7-4.x) and :func:`parse_dcgmi_discovery` (``dcgmi discovery -l``, ``--list`` with or
  without ``--all``; DCGM 2.x-4.x).
* :mod:`gpuwarden.shared.nvidia.smi_nvlink` - :func:`parse_nvidia_smi_nvlink` (``nvidia-smi nvlink --status``; tested on
  one 8x A100 recording without a driver version, so r450 or later).
"""

from __future__ import annotations

from gpuwarden.shared.nvidia.dcgmi import (
    DcgmDiag,
    DcgmDiscovery,
    DcgmGpu,
    DcgmTest,
    DiagResult,
    parse_dcgmi_diag,
    parse_dcgmi_discovery,
)
from gpuwarden.shared.nvidia.smi_nvlink import NvlinkGpu, NvlinkLink, parse_nvidia_smi_nvlink

from .infiniband import (
    IbPort,
    IbstatReport,
    parse_ib_rate,
    parse_ib_state,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
    read_ibstat,
)

__all__ = [
    "DcgmDiag",
    "DcgmDiscovery",
    "DcgmGpu",
    "DcgmTest",
    "DiagResult",
    "IbPort",
    "IbstatReport",
    "NvlinkGpu",
    "NvlinkLink",
    "parse_dcgmi_diag",
    "parse_dcgmi_discovery",
    "parse_ib_rate",
    "parse_ib_state",
    "parse_ibstat",
    "parse_ibstatus",
    "parse_ibv_devinfo",
    "parse_nvidia_smi_nvlink",
    "read_ibstat",
]
