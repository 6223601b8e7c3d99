"""Event schemas of gpuwarden, version 1 (the public contract on Kafka).

Every value on a gpuwarden topic is one of these models serialised as JSON (orjson)
with a ``schema_version`` field. Conventions, for every model:

* times are UTC epoch seconds (float) in *event time*: when the observation was made,
  not when it was processed;
* units are in the field name or its description: W, J, MiB, C (Celsius), MHz, %, s;
* ``None`` means "not reported by the source" (nvidia-smi prints ``N/A``), never zero.

Models are frozen; ``extra="forbid"`` rejects unknown fields so that a producer typo
is caught at the edge and sent to the dead-letter topic instead of silently dropped.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "PATTERNS",
    "SCHEMA_VERSION",
    "Action",
    "AttributedEvent",
    "AttributedSample",
    "Category",
    "CostEstimate",
    "DeadLetter",
    "EventKind",
    "Evidence",
    "Failure",
    "FailureState",
    "GpuAttribution",
    "GpuEvent",
    "GpuSample",
    "HealthCheckResult",
    "JobState",
    "JobWindow",
    "Model",
    "NodeSample",
    "NodeState",
    "Remediation",
    "RemediationDecision",
    "Severity",
    "dumps",
    "stable_id",
]

SCHEMA_VERSION: Literal[1] = 1

#: The canonical failure patterns (DESIGN section 5): the values of ``Failure.pattern``.
PATTERNS = frozenset(
    """gpu-fallen-off-bus gpu-missing uncorrectable-ecc row-remap-pending row-remap-failure
    contained-memory-error uncontained-memory-error gsp-firmware-error nvlink-error nvlink-link-down
    pcie-link-degraded pcie-replay-storm correctable-ecc-storm retired-pages thermal-throttle power-brake
    power-cap-throttle clocks-low driver-fault xid-application-fault repeat-offender-gpu nvswitch-fatal
    xid-other straggler-gpu straggler-node idle-allocation partial-idle-allocation input-starvation
    checkpoint-stall collective-hang gpu-memory-leak low-tensor-activity zombie-process telemetry-silent
    health-check-failed""".split()
)


class Model(BaseModel):
    """Base of every gpuwarden message: frozen, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    def to_json(self) -> bytes:
        """Serialise to compact JSON bytes (orjson), dropping nothing."""
        return dumps(self)


def dumps(model: BaseModel) -> bytes:
    """JSON bytes of a model via orjson (enums as their values, floats as given).

    Fields that are ``None`` (not reported by the source) are left out: the schema's
    default for every optional field is ``None``, so nothing is lost, and a sample of an
    8-GPU node shrinks to a third.
    """
    return orjson.dumps(model.model_dump(mode="json", exclude_none=True))


def stable_id(*parts: Any) -> str:
    """A deterministic 16-hex-digit id from ``parts`` (sha256), used for idempotency."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode())
    return h.hexdigest()[:16]


Ts = Annotated[float, Field(description="UTC epoch seconds, event time", ge=0)]
Pct = Annotated[float | None, Field(ge=0, le=100)]


class GpuSample(Model):
    """One GPU's readings at one tick (NVML or ``nvidia-smi -q -x``)."""

    index: int = Field(ge=0, description="GPU index as NVML/nvidia-smi number it (minor order)")
    uuid: str | None = Field(None, description="GPU UUID, e.g. GPU-xxxxxxxx-...")
    pci_bus_id: str | None = Field(
        None, description="PCI bus id, normalised to DDDD:BB:DD.F lower-case, e.g. 0000:44:00.0"
    )
    name: str | None = Field(None, description="Product name, e.g. NVIDIA H100 80GB HBM3")
    utilization_gpu_pct: Pct = Field(None, description="GPU (SM) utilisation over the last sample period, %")
    utilization_memory_pct: Pct = Field(None, description="Memory controller utilisation, %")
    memory_used_mib: float | None = Field(None, ge=0, description="Framebuffer memory used, MiB")
    memory_total_mib: float | None = Field(None, ge=0, description="Framebuffer memory total, MiB")
    temperature_c: float | None = Field(None, description="GPU core temperature, C")
    memory_temperature_c: float | None = Field(None, description="HBM temperature, C")
    power_w: float | None = Field(None, ge=0, description="Power draw, W")
    power_limit_w: float | None = Field(None, ge=0, description="Enforced power limit, W")
    sm_clock_mhz: float | None = Field(None, ge=0, description="SM clock, MHz")
    memory_clock_mhz: float | None = Field(None, ge=0, description="Memory clock, MHz")
    max_sm_clock_mhz: float | None = Field(None, ge=0, description="Maximum SM clock, MHz")
    throttle_reasons: list[str] = Field(
        default_factory=list,
        description="Active clock event (throttle) reasons, NVML names without prefix, "
        "e.g. sw_thermal_slowdown, hw_power_brake_slowdown, sw_power_cap; idle is reported as gpu_idle",
    )
    ecc_sbe_volatile: int | None = Field(None, ge=0, description="Correctable ECC errors since driver load, count")
    ecc_dbe_volatile: int | None = Field(None, ge=0, description="Uncorrectable ECC errors since driver load, count")
    retired_pages: int | None = Field(None, ge=0, description="Retired pages (SBE+DBE), count")
    remapped_rows_pending: bool | None = Field(None, description="A row remap is pending a GPU reset")
    remapped_rows_failure: bool | None = Field(None, description="A row remap failed")
    pcie_replay_count: int | None = Field(None, ge=0, description="PCIe replay counter, monotonic")
    pcie_link_gen: int | None = Field(None, ge=0, description="Current PCIe link generation")
    pcie_link_width: int | None = Field(None, ge=0, description="Current PCIe link width, lanes")
    energy_j: float | None = Field(None, ge=0, description="Energy since driver load, J")
    serial: str | None = Field(None, description="Board serial number")
    vbios_version: str | None = None
    memory_free_mib: float | None = Field(None, ge=0, description="Framebuffer memory free, MiB")
    memory_reserved_mib: float | None = Field(None, ge=0, description="Framebuffer memory reserved by the driver, MiB")
    temperature_slowdown_c: float | None = Field(None, description="Slowdown temperature threshold, C")
    temperature_shutdown_c: float | None = Field(None, description="Shutdown temperature threshold, C")
    power_management_limit_w: float | None = Field(None, ge=0, description="Power management limit, W")
    graphics_clock_mhz: float | None = Field(None, ge=0, description="Graphics clock, MHz")
    max_memory_clock_mhz: float | None = Field(None, ge=0, description="Maximum memory clock, MHz")
    max_graphics_clock_mhz: float | None = Field(None, ge=0, description="Maximum graphics clock, MHz")
    performance_state: int | None = Field(None, ge=0, le=32, description="Performance state N of PN (0 = P0)")
    ecc_sbe_aggregate: int | None = Field(None, ge=0, description="Correctable ECC errors, lifetime, count")
    ecc_dbe_aggregate: int | None = Field(None, ge=0, description="Uncorrectable ECC errors, lifetime, count")
    retired_pages_sbe: int | None = Field(None, ge=0, description="Pages retired for multiple single-bit errors")
    retired_pages_dbe: int | None = Field(None, ge=0, description="Pages retired for double-bit errors")
    retired_pages_pending: bool | None = Field(None, description="A page retirement waits for a reboot")
    remapped_rows_correctable: int | None = Field(None, ge=0, description="Rows remapped for correctable errors")
    remapped_rows_uncorrectable: int | None = Field(None, ge=0, description="Rows remapped for uncorrectable errors")
    pcie_link_gen_max: int | None = Field(None, ge=0, description="Maximum PCIe link generation")
    pcie_link_width_max: int | None = Field(None, ge=0, description="Maximum PCIe link width, lanes")
    pcie_tx_kbps: float | None = Field(None, ge=0, description="PCIe transmit throughput, KB/s")
    pcie_rx_kbps: float | None = Field(None, ge=0, description="PCIe receive throughput, KB/s")
    fan_speed_pct: Pct = Field(None, description="Fan speed, % of maximum")
    nvlinks: list[dict[str, Any]] | None = Field(
        None,
        description="Per NVLink: link (int), active (bool), crc_flit_errors, crc_data_errors, replay_errors, "
        "recovery_errors (counts; a counter the GPU does not report is absent)",
    )
    processes: list[dict[str, Any]] | None = Field(
        None, description="Compute processes: pid (int), used_memory_mib (float or absent)"
    )
    mig_mode: bool | None = Field(None, description="MIG mode currently enabled")
    mig_instances: int | None = Field(None, ge=0, description="MIG GPU instances present")
    sm_occupancy_pct: Pct = Field(None, description="GPM SM occupancy (Hopper+), %")
    tensor_activity_pct: Pct = Field(None, description="GPM tensor pipe activity (Hopper+), %")


class NodeSample(Model):
    """All GPUs of one node at one tick; one message per node per tick on ``gpu.samples``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    node: str = Field(min_length=1, description="Slurm node name")
    ts: Ts
    collector_id: str = Field(description="Which collector instance produced it (host:pid or name)")
    source: str = Field(description="Telemetry source: nvml, nvidia-smi-xml, simulated")
    gpus: list[GpuSample] = Field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None


class EventKind(StrEnum):
    """Kinds of discrete GPU events on ``gpu.events``."""

    XID = "xid"
    SXID = "sxid"
    NVLINK = "nvlink"
    ECC = "ecc"
    GPU_LOST = "gpu-lost"


class GpuEvent(Model):
    """A discrete event (never sampled): an XID/SXID kernel-log line, an NVLink or ECC event."""

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: str = Field(description="Deterministic id (node, ts, kind, code, raw line): duplicates collapse")
    node: str = Field(min_length=1)
    ts: Ts
    kind: EventKind
    code: int | None = Field(None, description="XID or SXID number")
    gpu_index: int | None = Field(None, ge=0, description="Resolved GPU index, None if unknown")
    pci_bus_id: str | None = Field(None, description="PCI bus id DDDD:BB:DD.F lower-case")
    gpu_uuid: str | None = None
    pid: int | None = Field(None, description="Process id printed with the XID, if any")
    process_name: str | None = None
    message: str = Field("", description="The driver's text after the code")
    raw: str = Field(description="The original log line, unchanged")
    source: str = Field(description="kmsg, nvml-event, replay, simulated")
    channel: int | None = Field(None, description="GPU channel printed with the XID (``Ch 0000000c``/``channel 0x0c``)")
    fatal: bool | None = Field(
        None, description="True for a Fatal, False for a Non-fatal/Nonfatal token; None if absent"
    )
    caused_by_xid: int | None = Field(None, description="The XID a secondary XID names as its cause, if printed")


class JobState(Model):
    """A Slurm job's state (``slurm.jobs``, keyed by job id): on change and in periodic snapshots."""

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: str = Field(min_length=1, description="Slurm job id (array tasks as 123_4)")
    ts: Ts = Field(description="When the watcher observed this state")
    state: str = Field(description="Slurm job state, e.g. PENDING, RUNNING, COMPLETED, FAILED")
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    nodes: list[str] = Field(default_factory=list, description="Expanded node names")
    gpus: dict[str, list[int]] = Field(
        default_factory=dict, description="GPU indices allocated on each node (from scontrol -d IDX)"
    )
    start_ts: float | None = Field(None, description="Job start, epoch s")
    end_ts: float | None = Field(None, description="Job end (or time limit end while running), epoch s")
    exit_code: int | None = None
    snapshot: bool = Field(False, description="True when part of a periodic full snapshot")
    submit_ts: float | None = Field(None, description="Job submission, epoch s")
    reason: str | None = Field(None, description="Slurm's state reason (pending reason, NonZeroExitCode...)")
    confirmed: bool | None = Field(
        None, description="End state confirmed from accounting (sacct) when True; None when not checked"
    )


class NodeState(Model):
    """A Slurm node's state (``slurm.nodes``, keyed by node)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    node: str = Field(min_length=1)
    ts: Ts
    state: str = Field(description="Base state, e.g. IDLE, ALLOCATED, MIXED, DOWN")
    flags: list[str] = Field(default_factory=list, description="State flags, e.g. DRAIN, NOT_RESPONDING")
    reason: str | None = Field(None, description="Reason set with the DRAIN/DOWN")
    reason_user: str | None = None
    reason_ts: float | None = Field(None, description="When the reason was set, epoch s")
    gres: str | None = Field(None, description="Configured GRES, e.g. gpu:8")
    gres_used: str | None = Field(None, description="GRES in use, e.g. gpu:4(IDX:0-3)")
    partitions: list[str] = Field(default_factory=list)
    snapshot: bool = False

    @property
    def drained(self) -> bool:
        """True if the node carries DRAIN (draining or drained)."""
        return "DRAIN" in self.flags or self.state.startswith("DRAIN")


class GpuAttribution(Model):
    """Which Slurm job held one GPU at the time of a sample or event."""

    gpu_index: int = Field(ge=0)
    job_id: str
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    job_start_ts: float | None = None
    job_gpus: int | None = Field(None, description="Total GPUs of the job across its nodes")


class AttributedSample(Model):
    """A ``NodeSample`` joined with the jobs holding its GPUs (``gpu.attributed``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    sample: NodeSample
    jobs: list[GpuAttribution] = Field(default_factory=list, description="One entry per GPU held by a job")


class AttributedEvent(Model):
    """A ``GpuEvent`` joined with the job holding its GPU (``gpu.events.attributed``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    event: GpuEvent
    job: GpuAttribution | None = None
    node_jobs: list[GpuAttribution] = Field(
        default_factory=list, description="All jobs on the node (for node-wide events without a GPU)"
    )


class JobWindow(Model):
    """Summary of one GPU of one job over one tumbling window (``job.windows``, keyed by job id).

    Built by the correlator as it attributes each sample, in event time; the detector compares
    the GPUs of the same job (stragglers, idle GPUs, hangs) from these.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: str
    node: str
    gpu_index: int = Field(ge=0)
    gpu_uuid: str | None = None
    user: str | None = None
    partition: str | None = None
    job_gpus: int | None = Field(None, description="Total GPUs of the job across its nodes")
    window_start: float = Field(description="Window start, epoch s (event time, inclusive)")
    window_end: float = Field(description="Window end, epoch s (event time, exclusive)")
    samples: int = Field(ge=0, description="Samples of this GPU in the window, count")
    utilization_gpu_pct_mean: float | None = Field(None, description="Mean GPU utilisation, %")
    utilization_gpu_pct_min: float | None = Field(None, description="Minimum GPU utilisation, %")
    utilization_gpu_pct_max: float | None = Field(None, description="Maximum GPU utilisation, %")
    power_w_mean: float | None = Field(None, description="Mean power draw, W")
    power_limit_w: float | None = Field(None, description="Enforced power limit (last), W")
    sm_clock_mhz_mean: float | None = Field(None, description="Mean SM clock, MHz")
    max_sm_clock_mhz: float | None = Field(None, description="Maximum SM clock (last reported), MHz")
    memory_used_mib_first: float | None = Field(None, description="Memory used at the first sample, MiB")
    memory_used_mib_last: float | None = Field(None, description="Memory used at the last sample, MiB")
    memory_used_mib_max: float | None = Field(None, description="Maximum memory used, MiB")
    memory_total_mib: float | None = Field(None, description="Memory total, MiB")
    temperature_c_max: float | None = Field(None, description="Maximum GPU temperature, C")
    throttle_s: float = Field(0.0, ge=0, description="Seconds with a non-idle throttle reason active, s")
    throttle_reasons: list[str] = Field(default_factory=list, description="Throttle reasons seen in the window")
    tensor_activity_pct_mean: float | None = Field(None, description="Mean tensor pipe activity, %")
    sm_occupancy_pct_mean: float | None = Field(None, description="Mean SM occupancy, %")
    processes_max: int | None = Field(None, ge=0, description="Most compute processes seen at once, count")


class Category(StrEnum):
    HARDWARE = "hardware"
    DRIVER = "driver"
    APPLICATION = "application"
    INFRASTRUCTURE = "infrastructure"
    EFFICIENCY = "efficiency"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"
    FATAL = "fatal"


class Action(StrEnum):
    NONE = "none"
    ALERT = "alert"
    RESTART_JOB = "restart-job"
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"
    DRAIN = "drain"
    RMA = "rma"
    RESUME = "resume"  # remediator only: return a node gpuwarden drained to service


class FailureState(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


class Evidence(Model):
    """One observation supporting a failure."""

    signal: str = Field(description="What was observed, e.g. xid, temperature_c")
    value: int | float | str = Field(description="The observed value, in ``unit``")
    unit: str | None = Field(None, description="Unit of value: W, C, MHz, MiB, %, count, s")
    threshold: int | float | str | None = Field(None, description="The limit the value was compared with, in ``unit``")
    ts: Ts
    source: str = Field(description="Where it came from: the raw log line, topic or tool")


class CostEstimate(Model):
    """What the failure costs, at the configured price per GPU-hour."""

    affected_gpus: int = Field(ge=0, description="GPUs whose work is lost or stalled")
    usd_per_hour: float = Field(ge=0, description="affected_gpus x price per GPU-hour, USD/h")
    gpu_hours_lost: float = Field(ge=0, description="GPU-hours lost so far (affected GPUs x episode length)")


class Failure(Model):
    """A named failure with evidence (``failures``, keyed by node): the product's main output."""

    schema_version: Literal[1] = SCHEMA_VERSION
    failure_id: str = Field(description="Deterministic: rule + node + gpu + episode start")
    pattern: str = Field(description="Canonical pattern, e.g. gpu-fallen-off-bus")
    rule_id: str
    category: Category
    severity: Severity
    node: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    job_id: str | None = None
    user: str | None = None
    partition: str | None = None
    first_seen: Ts
    last_seen: Ts
    state: FailureState = FailureState.OPEN
    occurrences: int = Field(1, ge=1, description="Matching signals folded into this episode")
    evidence: list[Evidence] = Field(default_factory=list)
    verdict: str = Field(description="One sentence")
    cannot_determine: list[str] = Field(default_factory=list, description="What the data cannot tell")
    recommended_action: Action
    cost: CostEstimate


class RemediationDecision(StrEnum):
    EXECUTED = "executed"
    DRY_RUN = "dry-run"
    SKIPPED = "skipped"
    REFUSED = "refused"
    FAILED = "failed"


class Remediation(Model):
    """One remediation decision, taken or refused (``remediations``): the audit trail."""

    schema_version: Literal[1] = SCHEMA_VERSION
    remediation_id: str = Field(description="Deterministic: action + node + failure ids")
    ts: Ts = Field(description="Event time of the failure that triggered it")
    decided_at: float = Field(description="Wall-clock time of the decision, epoch s")
    node: str
    action: Action
    argv: list[str] = Field(default_factory=list, description="The command, as an argv list")
    dry_run: bool
    decision: RemediationDecision
    reason: str = Field(description="Why this decision was taken")
    failure_ids: list[str] = Field(default_factory=list)
    exit_code: int | None = None
    output: str | None = Field(None, description="stdout+stderr of the command, truncated")


class HealthCheckResult(Model):
    """Result of a prolog/epilog health check on a node (``health``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    node: str
    ts: Ts
    phase: Literal["prolog", "epilog", "periodic"]
    check: str
    passed: bool
    job_id: str | None = None
    gpu_index: int | None = None
    detail: str = ""
    duration_s: float | None = Field(None, ge=0)


class DeadLetter(Model):
    """A message a service could not process (``deadletter``): nothing is silently dropped."""

    schema_version: Literal[1] = SCHEMA_VERSION
    service: str
    source_topic: str
    partition: int
    offset: int
    key: str | None = None
    value_b64: str = Field(description="The original value bytes, base64")
    error: str = Field(description="Why it was rejected")
    ts: float = Field(description="Wall-clock time of the rejection, epoch s")
