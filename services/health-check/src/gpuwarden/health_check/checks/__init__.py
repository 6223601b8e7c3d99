"""The health checks: each a small synchronous function over narrow inputs, returning one result.

A check gets an :class:`Inputs` (NVML through the :class:`~gpuwarden.shared.nvidia.nvml.Nvml`
protocol, a :class:`~gpuwarden.health_check.io.ToolRunner`, a
:class:`~gpuwarden.health_check.io.KernelLog`, a sysfs root, a clock) and a :class:`Context`
(phase, the job's GPUs, thresholds), and returns a :class:`CheckResult` whose :class:`Status` is
a Nagios code. Decisions over already-read data
are pure ``evaluate_*`` functions, tested on recorded tool output. Checks register by name in
:data:`CHECKS` (which phases run them by default).

One module per area: :mod:`.base` (statuses, results, context, inputs), :mod:`.nvml`
(gpu-count, nvml, processes, ecc, clocks), :mod:`.links` (pcie, nvlink, fabric),
:mod:`.kernel_log` (xid), :mod:`.infiniband`, :mod:`.dcgm`; the registry is here.

Status per check (the first reason printed is the worst):

==============  ==========================================================================
gpu-count       CRITICAL fewer GPUs than expected, none (unless 0 expected), or a job GPU
                that NVML does not list (matched by minor number / UUID)
nvml            CRITICAL a GPU that does not answer NVML (lost, unknown error, ...)
processes       CRITICAL compute processes left on a GPU, or used memory above the threshold,
                after the epilog's grace (prolog/epilog only: a busy node is no fault)
ecc             CRITICAL volatile uncorrectable ECC > 0, row remap pending/failed,
                retired pages pending
xid             CRITICAL an XID outside the application {13, 31, 43, 45, 68, 69} and repair
                {63, 92} sets (XID 154 by its recovery action: "None" is OK) or a fatal SXID
                inside the GPU's window; WARNING application/repair XIDs only
pcie            CRITICAL link width below its maximum; WARNING generation below its maximum on
                a busy GPU (idle GPUs lower the generation to save power)
nvlink          CRITICAL an inactive link on a job GPU of a node with NVLink (or fewer active
                links than expected); a node where no GPU has an active link has none
fabric          CRITICAL a job GPU whose NVSwitch fabric registration is not completed or failed
                (HGX H100+: nvidia-fabricmanager down); GPUs without a fabric are OK
clocks          CRITICAL HW slowdown / HW thermal slowdown / HW power brake; WARNING SW thermal
infiniband      CRITICAL an InfiniBand port not ACTIVE/LinkUp (or fewer ACTIVE than required),
                below the expected rate (Ethernet/RoCE and ignored ports left out); ports from
                sysfs, else ibstat, ibstatus, ibv_devinfo -v; WARNING a required rate unknown
dcgm            CRITICAL a Fail; WARNING a Warn or a Skip (skip is not pass); UNKNOWN a cut-off
                table, no dcgmi / host engine, a diag past its time, every test skipped, or a
                job GPU that dcgmi discovery does not list (job GPUs map to DCGM ids by UUID)
==============  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import CheckResult, Context, Inputs, JobGpus, NvmlUnavailable, Phase, Status, worst
from .dcgm import check_dcgm, evaluate_dcgm, map_dcgm_gpus
from .infiniband import check_infiniband, evaluate_infiniband, read_ib_ports
from .kernel_log import APPLICATION_XIDS, REPAIR_XIDS, check_xid
from .links import check_fabric, check_nvlink, check_pcie, evaluate_nvlink
from .nvml import check_clocks, check_ecc, check_gpu_count, check_nvml, check_processes, evaluate_clocks

__all__ = [
    "APPLICATION_XIDS",
    "CHECKS",
    "REPAIR_XIDS",
    "CheckResult",
    "CheckSpec",
    "Context",
    "Inputs",
    "JobGpus",
    "NvmlUnavailable",
    "Phase",
    "Status",
    "check_clocks",
    "check_dcgm",
    "check_ecc",
    "check_fabric",
    "check_gpu_count",
    "check_infiniband",
    "check_nvlink",
    "check_nvml",
    "check_pcie",
    "check_processes",
    "check_xid",
    "evaluate_clocks",
    "evaluate_dcgm",
    "evaluate_infiniband",
    "evaluate_nvlink",
    "map_dcgm_gpus",
    "read_ib_ports",
    "worst",
]


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: ``fn(inputs, context) -> CheckResult`` and the phases running it by default."""

    name: str
    fn: Callable[[Inputs, Context], CheckResult]
    phases: frozenset[str]


_ALL = frozenset({"prolog", "epilog", "periodic"})
CHECKS: dict[str, CheckSpec] = {
    s.name: s
    for s in (
        CheckSpec("gpu-count", check_gpu_count, _ALL),
        CheckSpec("nvml", check_nvml, _ALL),
        CheckSpec("processes", check_processes, frozenset({"prolog", "epilog"})),  # a busy node is not a fault
        CheckSpec("ecc", check_ecc, _ALL),
        CheckSpec("xid", check_xid, _ALL),
        CheckSpec("pcie", check_pcie, _ALL),
        CheckSpec("nvlink", check_nvlink, _ALL),
        CheckSpec("fabric", check_fabric, _ALL),
        CheckSpec("clocks", check_clocks, _ALL),
        CheckSpec("infiniband", check_infiniband, _ALL),
        CheckSpec("dcgm", check_dcgm, frozenset()),  # only by name or with a dcgm level > 0
    )
}
