"""NVML as gpuwarden reads it: the narrow :class:`Nvml` protocol, its helpers and constants.

The binding is nvidia-ml-py (``import pynvml``; >= 12.535, 13.615 tested). Every ``NVML_*`` number
here is pynvml's own (re-exported, never copied); the few gpuwarden-specific values built on
them (:data:`THROTTLE_BITS`, :data:`NVML_DEAD_ERRORS`, :data:`NVLINK_PROBE_LINKS`) say so.
Callers pass the ``pynvml`` module itself, or a fake with the same names, wherever an
:class:`Nvml` is asked for.
"""

from __future__ import annotations

from typing import Any, Protocol

import pynvml
from pynvml import (
    NVML_AGGREGATE_ECC,
    NVML_CLOCK_GRAPHICS,
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    NVML_FEATURE_ENABLED,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_SM_OCCUPANCY,
    NVML_GPM_METRICS_GET_VERSION,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_NVLINK_ERROR_DL_CRC_DATA,
    NVML_NVLINK_ERROR_DL_CRC_FLIT,
    NVML_NVLINK_ERROR_DL_RECOVERY,
    NVML_NVLINK_ERROR_DL_REPLAY,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    NVML_VOLATILE_ECC,
)

__all__ = [
    "CLOCK_REASON_GPU_IDLE",
    "CLOCK_REASON_HW_POWER_BRAKE",
    "CLOCK_REASON_HW_SLOWDOWN",
    "CLOCK_REASON_HW_THERMAL",
    "CLOCK_REASON_SW_THERMAL",
    "EVENT_DOUBLE_BIT_ECC",
    "EVENT_SINGLE_BIT_ECC",
    "EVENT_XID",
    "NVLINK_PROBE_LINKS",
    "NVML_AGGREGATE_ECC",
    "NVML_CLOCK_GRAPHICS",
    "NVML_CLOCK_MEM",
    "NVML_CLOCK_SM",
    "NVML_DEAD_ERRORS",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_TIMEOUT",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_UNKNOWN",
    "NVML_FEATURE_ENABLED",
    "NVML_GPM_METRICS_GET_VERSION",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "NVML_GPM_METRIC_SM_OCCUPANCY",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_REPLAY",
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
    "NVML_PCIE_UTIL_RX_BYTES",
    "NVML_PCIE_UTIL_TX_BYTES",
    "NVML_SUCCESS",
    "NVML_TEMPERATURE_GPU",
    "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    "NVML_VOLATILE_ECC",
    "THROTTLE_BITS",
    "Nvml",
    "nvml_str",
]


class Nvml(Protocol):
    """The NVML calls gpuwarden uses, named as in nvidia-ml-py (``import pynvml``).

    Units as NVML returns them: power mW, memory bytes, clocks MHz, temperature C, energy mJ.
    Errors are raised as ``NVMLError`` whose ``value`` is the NVML return code.
    """

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...

    # Optional calls: a module without one of these (older nvidia-ml-py) leaves the field absent.
    # nvmlDeviceGetSerial, nvmlDeviceGetVbiosVersion, nvmlDeviceGetTemperatureThreshold,
    # nvmlDeviceGetPowerManagementLimit, nvmlDeviceGetPerformanceState, nvmlDeviceGetRetiredPages,
    # nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetMaxPcieLinkGeneration,
    # nvmlDeviceGetMaxPcieLinkWidth, nvmlDeviceGetPcieThroughput, nvmlDeviceGetNvLinkState,
    # nvmlDeviceGetNvLinkErrorCounter, nvmlDeviceGetFanSpeed, nvmlDeviceGetComputeRunningProcesses,
    # nvmlDeviceGetMigMode, nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex,
    # nvmlDeviceGetMinorNumber, nvmlDeviceGetGpuFabricInfo.


def nvml_str(v: Any) -> str:
    """An NVML string: ``str`` in nvidia-ml-py >= 11.5, ``bytes`` before (decoded, bad bytes replaced)."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


NVLINK_PROBE_LINKS = 18
"""NVLink indices probed per GPU (0..17: Hopper and Blackwell have 18 links). Not
``pynvml.NVML_NVLINK_MAX_LINKS``: that is 18 up to nvidia-ml-py 12.x and 36 from 13.x, and
which links are probed must not change with the installed binding."""

NVML_DEAD_ERRORS = frozenset(
    {NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH}
)
"""Return codes after which the whole NVML is unusable until it is initialised again."""

# NVML event types (nvmlDeviceRegisterEvents masks, nvmlEventData_t.eventType)
EVENT_XID: int = pynvml.nvmlEventTypeXidCriticalError
EVENT_SINGLE_BIT_ECC: int = pynvml.nvmlEventTypeSingleBitEccError
EVENT_DOUBLE_BIT_ECC: int = pynvml.nvmlEventTypeDoubleBitEccError

# Clock event reason bits (nvmlDeviceGetCurrentClocksEventReasons; the same bits as the older
# nvmlDeviceGetCurrentClocksThrottleReasons)
CLOCK_REASON_GPU_IDLE: int = pynvml.nvmlClocksEventReasonGpuIdle
CLOCK_REASON_HW_SLOWDOWN: int = pynvml.nvmlClocksEventReasonHwSlowdown
CLOCK_REASON_SW_THERMAL: int = pynvml.nvmlClocksEventReasonSwThermalSlowdown
CLOCK_REASON_HW_THERMAL: int = pynvml.nvmlClocksEventReasonHwThermalSlowdown
CLOCK_REASON_HW_POWER_BRAKE: int = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown

THROTTLE_BITS: dict[int, str] = {
    CLOCK_REASON_GPU_IDLE: "gpu_idle",
    pynvml.nvmlClocksEventReasonApplicationsClocksSetting: "applications_clocks_setting",
    pynvml.nvmlClocksEventReasonSwPowerCap: "sw_power_cap",
    CLOCK_REASON_HW_SLOWDOWN: "hw_slowdown",
    pynvml.nvmlClocksEventReasonSyncBoost: "sync_boost",
    CLOCK_REASON_SW_THERMAL: "sw_thermal_slowdown",
    CLOCK_REASON_HW_THERMAL: "hw_thermal_slowdown",
    CLOCK_REASON_HW_POWER_BRAKE: "hw_power_brake_slowdown",
    pynvml.nvmlClocksEventReasonDisplayClockSetting: "display_clocks_setting",
}
"""Clock event reason bit -> the name gpuwarden reports (``GpuSample.throttle_reasons``), in bit
order; the names are nvidia-smi's ``clocks_event_reason_*`` XML tags without the prefix."""
