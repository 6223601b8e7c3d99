# Over 500 lines: one versioned wire contract (SCHEMA_VERSION, Model, shared enums; docs/schemas is built from it).
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

import fnmatch
import hashlib
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "NVLINK_ERROR_KEYS",
    "PATTERNS",
    "SCHEMA_VERSION",
    "Action",
    "AttributedEvent",
    "AttributedSample",
    "Attribution",
    "BreakdownItem",
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
    "JobReport",
    "JobState",
    "JobWindow",
    "Model",
    "NodeSample",
    "NodeState",
    "Pattern",
    "PatternGlob",
    "Remediation",
    "RemediationDecision",
    "ReportFinding",
    "ReportGpu",
    "Severity",
    "Side",
    "SlurmWatermark",
    "WasteCategory",
    "dumps",
    "stable_id",
]

SCHEMA_VERSION: Literal[1] = 1

#: The canonical failure patterns (docs/architecture.md#canonical-patterns): the values of ``Failure.pattern``.
PATTERNS = frozenset(
    """gpu-fallen-off-bus gpu-missing uncorrectable-ecc row-remap-pending row-remap-failure
    contained-memory-error uncontained-memory-error gsp-firmware-error nvlink-error nvlink-link-down
    pcie-link-degraded pcie-replay-storm correctable-ecc-storm retired-pages thermal-throttle power-brake
    power-cap-throttle clocks-low driver-fault xid-application-fault repeat-offender-gpu nvswitch-fatal
    xid-other straggler-gpu straggler-node idle-allocation partial-idle-allocation input-starvation
    checkpoint-stall collective-hang gpu-memory-leak low-tensor-activity zombie-process telemetry-silent
    health-check-failed""".split()
)


def _near(v: str) -> list[str]:
    """Canonical patterns sharing a word with ``v`` (a hint for a typo)."""
    words = [w for w in v.replace("*", " ").replace("?", " ").replace("-", " ").split() if len(w) > 2]
    return sorted(p for p in PATTERNS if any(w in p for w in words))


def check_pattern(v: str) -> str:
    """``v`` if it is a canonical failure pattern (:data:`PATTERNS`).

    Raises:
        ValueError: it is not (the message names the canonical patterns that look alike).
    """
    if v not in PATTERNS:
        near = _near(v)
        hint = f"; did you mean one of {near}?" if near else ""
        raise ValueError(f"unknown pattern {v!r} (the canonical patterns: gpuwarden.shared.models.PATTERNS{hint})")
    return v


def check_pattern_glob(v: str) -> str:
    """``v`` if it is a printable one-line glob (``fnmatch``) that matches at least one canonical
    failure pattern: ``ecc-*`` when the patterns are ``uncorrectable-ecc``... is a typo, not a rule.

    Raises:
        ValueError: not printable, or it matches none (the message names look-alikes).
    """
    if not v.isprintable():
        raise ValueError("pattern must be printable, one line")
    if not fnmatch.filter(PATTERNS, v):
        near = _near(v)
        hint = f"; did you mean one of {near}?" if near else ""
        raise ValueError(
            f"pattern {v!r} matches no known failure pattern (gpuwarden.shared.models.PATTERNS, "
            f"docs/architecture.md#canonical-patterns){hint}"
        )
    return v


#: A canonical failure pattern (validated against :data:`PATTERNS`): the one type every model that
#: names a pattern uses (catalog rules, the XID table, scenario expectations and allowances).
Pattern = Annotated[str, AfterValidator(check_pattern)]
#: A glob over the canonical patterns that matches at least one of them (remediation policy rules).
PatternGlob = Annotated[str, AfterValidator(check_pattern_glob)]


class Model(BaseModel):
    """Base of every gpuwarden message: frozen, strict about unknown fields."""

    #: ``allow_inf_nan=False``: no float of any message is ``NaN`` or infinite, also when it is
    #: parsed by pydantic's own JSON parser (:func:`~gpuwarden.shared.bus.decode`), which reads the
    #: non-standard ``NaN``/``Infinity`` literals and turns ``1e999`` into infinity
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, allow_inf_nan=False)

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


#: The input contract (issue 25): bounds every record of an input topic must keep, stated in the
#: models so the JSON Schemas (docs/schemas) say them too and a consumer in another language rejects
#: the same records. The consumer's edge check (:mod:`gpuwarden.shared.contract`) adds the bounds
#: relative to the stream's progress and the wall clock.
#: Latest event time a record may carry: 2100-01-01T00:00:00Z, epoch s (``ts=1e308`` is refused).
MAX_EVENT_TS = 4_102_444_800.0
#: Most GPUs one node may report in a sample (an NVL72 rack is 72 GPUs over 18 nodes; the largest
#: single servers have 16).
MAX_GPUS_PER_NODE = 64
#: Largest GPU index (NVML numbers the GPUs of one node 0..N-1).
MAX_GPU_INDEX = MAX_GPUS_PER_NODE - 1
#: Most NVLinks per GPU (18 on H100/B200) and processes per GPU a sample may list.
MAX_NVLINKS_PER_GPU = 36
MAX_PROCESSES_PER_GPU = 1024
#: Most nodes one job may list (Slurm's largest jobs span a few thousand nodes).
MAX_NODES_PER_JOB = 65_536
#: Longest kernel-log line kept (the kernel's printk line is at most 1,024 bytes) and driver text.
MAX_LINE_CHARS = 4096
#: Slurm node names: a host name (letters, digits, ``.``, ``_``, ``-``; 1-64 characters, no
#: spaces, shell or control characters); the same rule as the remediator's argv check
#: (:func:`gpuwarden.shared.slurm.validate_node_name`).
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: Slurm job ids: ``123``, array tasks ``123_4`` (pending array ``123_[1-5%2]``), het job
#: components ``123+1``; or a name starting with a letter (``recording``: what ``gpuwarden analyze``
#: calls the job a recording is replayed as), never spaces, shell or control characters.
JOB_ID_PATTERN = r"^([0-9]{1,12}(_([0-9]{1,10}|\[[0-9,%-]{1,200}\]))?(\+[0-9]{1,5})?|[A-Za-z][A-Za-z0-9._-]{0,63})$"
#: Identifiers printed by NVML and the tools (GPU/MIG UUIDs, PCI bus ids, serials, collector ids,
#: driver versions, source names): printable ASCII without spaces or quotes, at most 128 characters.
TOKEN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9:./_@+=-]{0,127}$"

Ts = Annotated[
    float,
    Field(description="UTC epoch seconds, event time", ge=0, le=MAX_EVENT_TS, allow_inf_nan=False),
]
OptTs = Annotated[float | None, Field(ge=0, le=MAX_EVENT_TS, allow_inf_nan=False)]
NodeName = Annotated[str, Field(pattern=NODE_NAME_PATTERN, max_length=64, description="Slurm node name")]
JobId = Annotated[str, Field(pattern=JOB_ID_PATTERN, max_length=240, description="Slurm job id (array tasks as 123_4)")]
Token = Annotated[str, Field(pattern=TOKEN_PATTERN, max_length=128)]
GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
#: Every integer of a message: a signed 64-bit one (what orjson, OTLP and most JSON readers
#: hold). Found by the property test of the schemas: a count of 2**70 passed the edge and then
#: failed every service that wrote the record again (orjson: "Integer exceeds 64-bit range").
#: (In a field that has ``Field(...)`` bounds of its own and is not optional, pydantic lets the
#: annotation's bounds override the field's: such a field is ``int`` with ``le=MAX_INT``.)
MAX_INT = 2**63 - 1
Int64 = Annotated[int, Field(ge=-(2**63), le=MAX_INT)]
#: Free text from a tool (product names, check names, Slurm state words): one line, bounded, no
#: control or bidirectional formatting characters.
Text = Annotated[str, Field(max_length=256, pattern=r"^[^\x00-\x1f\x7f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$")]
#: A value of the per-link and per-process records of a GPU (``nvlinks``, ``processes``): a JSON
#: scalar (finite like every number of a message), never an object or list.
JsonScalar = bool | Int64 | float | str | None


#: The NVLink error counters of ``GpuSample.nvlinks`` that :attr:`GpuSample.nvlink_errors` sums.
NVLINK_ERROR_KEYS = ("crc_flit_errors", "crc_data_errors", "replay_errors", "recovery_errors")


class GpuSample(Model):
    """One GPU's readings at one tick (NVML or ``nvidia-smi -q -x``)."""

    # The fields are the rows of the field registry gpuwarden/shared/fields.csv, in its order:
    # python -m gpuwarden.shared.fieldgen writes the scalar ones from the rows (type, bounds,
    # description with its unit); the list fields (nested values) are written here by hand.
    # generated: fields.csv (python -m gpuwarden.shared.fieldgen), list fields by hand
    index: int = Field(ge=0, le=MAX_GPU_INDEX, description="GPU index as NVML/nvidia-smi number it (minor order)")
    uuid: Token | None = Field(None, description="GPU UUID, e.g. GPU-xxxxxxxx-...")
    pci_bus_id: Token | None = Field(
        None, description="PCI bus id, normalised to DDDD:BB:DD.F lower-case, e.g. 0000:44:00.0"
    )
    name: Text | None = Field(None, description="Product name, e.g. NVIDIA H100 80GB HBM3")
    utilization_gpu_pct: float | None = Field(
        None, ge=0, le=100, description="GPU (SM) utilisation over the last sample period, %"
    )
    utilization_memory_pct: float | None = Field(None, ge=0, le=100, description="Memory controller utilisation, %")
    memory_used_mib: float | None = Field(None, ge=0, description="Framebuffer memory used, MiB")
    memory_total_mib: float | None = Field(None, ge=0, description="Framebuffer memory total, MiB")
    temperature_c: float | None = Field(None, description="GPU core temperature, C")
    memory_temperature_c: float | None = Field(None, description="HBM temperature, C")
    power_w: float | None = Field(
        None, ge=0, description="Power draw, W (averaged over the last second where the source splits it)"
    )
    power_instant_w: float | None = Field(
        None, ge=0, description="Instantaneous power draw, W (nvidia-smi XML DTD v13 instant_power_draw)"
    )
    power_limit_w: float | None = Field(None, ge=0, description="Enforced power limit, W")
    sm_clock_mhz: float | None = Field(None, ge=0, description="SM clock, MHz")
    memory_clock_mhz: float | None = Field(None, ge=0, description="Memory clock, MHz")
    max_sm_clock_mhz: float | None = Field(None, ge=0, description="Maximum SM clock, MHz")
    throttle_reasons: list[Token] = Field(
        default_factory=list,
        max_length=64,
        description="Active clock event (throttle) reasons, NVML names without prefix, "
        "e.g. sw_thermal_slowdown, hw_power_brake_slowdown, sw_power_cap; idle is reported as gpu_idle",
    )
    ecc_sbe_volatile: Int64 | None = Field(None, ge=0, description="Correctable ECC errors since driver load, count")
    ecc_dbe_volatile: Int64 | None = Field(None, ge=0, description="Uncorrectable ECC errors since driver load, count")
    retired_pages: Int64 | None = Field(None, ge=0, description="Retired pages (SBE+DBE), count")
    remapped_rows_pending: bool | None = Field(None, description="A row remap is pending a GPU reset")
    remapped_rows_failure: bool | None = Field(None, description="A row remap failed")
    pcie_replay_count: Int64 | None = Field(None, ge=0, description="PCIe replay counter (monotonic), count")
    pcie_link_gen: Int64 | None = Field(None, ge=0, description="Current PCIe link generation")
    pcie_link_width: Int64 | None = Field(None, ge=0, description="Current PCIe link width, lanes")
    energy_j: float | None = Field(None, ge=0, description="Energy since driver load, J")
    serial: Token | None = Field(None, description="Board serial number")
    vbios_version: str | None = None
    memory_free_mib: float | None = Field(None, ge=0, description="Framebuffer memory free, MiB")
    memory_reserved_mib: float | None = Field(None, ge=0, description="Framebuffer memory reserved by the driver, MiB")
    temperature_slowdown_c: float | None = Field(None, description="Slowdown temperature threshold, C")
    temperature_shutdown_c: float | None = Field(None, description="Shutdown temperature threshold, C")
    power_management_limit_w: float | None = Field(None, ge=0, description="Power management limit, W")
    graphics_clock_mhz: float | None = Field(None, ge=0, description="Graphics clock, MHz")
    max_memory_clock_mhz: float | None = Field(None, ge=0, description="Maximum memory clock, MHz")
    max_graphics_clock_mhz: float | None = Field(None, ge=0, description="Maximum graphics clock, MHz")
    performance_state: Int64 | None = Field(None, ge=0, le=32, description="Performance state N of PN (0 = P0)")
    ecc_sbe_aggregate: Int64 | None = Field(None, ge=0, description="Correctable ECC errors, lifetime, count")
    ecc_dbe_aggregate: Int64 | None = Field(None, ge=0, description="Uncorrectable ECC errors, lifetime, count")
    retired_pages_sbe: Int64 | None = Field(
        None, ge=0, description="Pages retired for multiple single-bit errors, count"
    )
    retired_pages_dbe: Int64 | None = Field(None, ge=0, description="Pages retired for double-bit errors, count")
    retired_pages_pending: bool | None = Field(None, description="A page retirement waits for a reboot")
    remapped_rows_correctable: Int64 | None = Field(
        None, ge=0, description="Rows remapped for correctable errors, count"
    )
    remapped_rows_uncorrectable: Int64 | None = Field(
        None, ge=0, description="Rows remapped for uncorrectable errors, count"
    )
    pcie_link_gen_max: Int64 | None = Field(None, ge=0, description="Maximum PCIe link generation")
    pcie_link_width_max: Int64 | None = Field(None, ge=0, description="Maximum PCIe link width, lanes")
    pcie_tx_kbps: float | None = Field(None, ge=0, description="PCIe transmit throughput, KB/s")
    pcie_rx_kbps: float | None = Field(None, ge=0, description="PCIe receive throughput, KB/s")
    fan_speed_pct: float | None = Field(None, ge=0, description="Fan speed, % of maximum (NVML: may exceed 100)")
    nvlinks: list[dict[str, JsonScalar]] | None = Field(
        None,
        max_length=MAX_NVLINKS_PER_GPU,
        description="Per NVLink: link (int), active (bool), crc_flit_errors, crc_data_errors, replay_errors, "
        "recovery_errors (counts; a counter the GPU does not report is absent)",
    )
    processes: list[dict[str, JsonScalar]] | None = Field(
        None,
        max_length=MAX_PROCESSES_PER_GPU,
        description="GPU processes: pid (int), used_memory_mib (float or absent); from nvidia-smi also type "
        "(C compute, G graphics, C+G, M MPS, as printed) and process_name; NVML lists compute processes only",
    )
    mig_mode: bool | None = Field(None, description="MIG mode currently enabled")
    mig_instances: Int64 | None = Field(None, ge=0, description="MIG GPU instances present, count")
    sm_occupancy_pct: float | None = Field(None, ge=0, le=100, description="GPM SM occupancy (Hopper+), %")
    tensor_activity_pct: float | None = Field(None, ge=0, le=100, description="GPM tensor pipe activity (Hopper+), %")
    # end generated: fields.csv

    @cached_property
    def nvlink_errors(self) -> float | None:
        """CRC flit and data, replay and recovery errors summed over every NVLink of this reading,
        count (a sum of counters; None without NVLink readings). Computed once per reading: the
        detector's error rate compares it with the GPU's previous reading, which has it already
        (with 18 links, summing twice per rule was most of the detector's per-sample cost)."""
        links = self.nvlinks
        if not links:
            return None
        total = 0
        for link in links:
            for key in NVLINK_ERROR_KEYS:
                v = link.get(key)
                if v:
                    total += int(v)
        return float(total)


class NodeSample(Model):
    """All GPUs of one node at one tick; one message per node per tick on ``gpu.samples``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    node: NodeName
    ts: Ts
    collector_id: Token = Field(description="Which collector instance produced it (host:pid or name)")
    source: Token = Field(description="Telemetry source: nvml, nvidia-smi-xml, simulated")
    gpus: list[GpuSample] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    driver_version: Token | None = None
    cuda_version: Token | None = None


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
    event_id: Token = Field(description="Deterministic id (node, ts, kind, code, raw line): duplicates collapse")
    node: NodeName
    ts: Ts
    kind: EventKind
    code: Int64 | None = Field(None, description="XID or SXID number")
    gpu_index: Int64 | None = Field(None, ge=0, description="Resolved GPU index, None if unknown")
    pci_bus_id: Token | None = Field(None, description="PCI bus id DDDD:BB:DD.F lower-case")
    gpu_uuid: Token | None = None
    pid: Int64 | None = Field(None, description="Process id printed with the XID, if any")
    process_name: str | None = None
    message: str = Field("", max_length=MAX_LINE_CHARS, description="The driver's text after the code")
    raw: str = Field(max_length=MAX_LINE_CHARS, description="The original log line, unchanged")
    source: Token = Field(description="kmsg, nvml-event, replay, simulated")
    channel: Int64 | None = Field(
        None, description="GPU channel printed with the XID (``Ch 0000000c``/``channel 0x0c``)"
    )
    fatal: bool | None = Field(
        None, description="True for a Fatal, False for a Non-fatal/Nonfatal token; None if absent"
    )
    caused_by_xid: Int64 | None = Field(None, description="The XID a secondary XID names as its cause, if printed")
    severity: Severity | None = Field(
        None, description="Severity of the code in the XID table (gpuwarden.shared.nvidia.xids); None if not looked up"
    )
    nvswitch_index: Int64 | None = Field(
        None, ge=0, description="N of the nvidia-nvswitchN device that printed an SXID"
    )
    sub_code: Int64 | None = Field(
        None, ge=0, description="NVLink XID 144-150: sub-code, bits 20-25 of the first register word (intrinfo)"
    )
    link: Int64 | None = Field(None, ge=0, description="NVLink/NVSwitch link number printed with the event")


class JobState(Model):
    """A Slurm job's state (``slurm.jobs``, keyed by job id): on change and in periodic snapshots."""

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: JobId
    ts: Ts = Field(description="When the watcher observed this state")
    state: str = Field(description="Slurm job state, e.g. PENDING, RUNNING, COMPLETED, FAILED")
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    nodes: list[NodeName] = Field(default_factory=list, max_length=MAX_NODES_PER_JOB, description="Expanded node names")
    gpus: dict[NodeName, list[GpuIndex]] = Field(
        default_factory=dict,
        description="GPU indices allocated on each node (from scontrol -d IDX)",
        # pydantic's schema constrains only the keys that match the pattern: say the model's rule
        json_schema_extra={"propertyNames": {"pattern": NODE_NAME_PATTERN, "maxLength": 64}},
    )
    start_ts: OptTs = Field(None, description="Job start, epoch s")
    end_ts: OptTs = Field(None, description="Job end (or time limit end while running), epoch s")
    exit_code: Int64 | None = None
    snapshot: bool = Field(False, description="True when part of a periodic full snapshot")
    submit_ts: OptTs = Field(None, description="Job submission, epoch s")
    reason: str | None = Field(None, description="Slurm's state reason (pending reason, NonZeroExitCode...)")
    confirmed: bool | None = Field(
        None, description="End state confirmed from accounting (sacct) when True; None when not checked"
    )


class SlurmWatermark(Model):
    """How far slurm-watcher's view of Slurm is complete (``slurm.watermarks``, keyed by cluster).

    Published after every poll whose job read succeeded, also when nothing changed (a heartbeat).
    A reader of ``slurm.jobs`` has Slurm's view up to event time ``ts`` once its position in
    every partition listed in ``jobs_offsets`` has reached the offset given there: every job
    that held a GPU at any time before ``ts`` is then in what it has read. Before that, "no job
    holds this GPU" cannot be told from "Slurm has not told me yet" (a join waits, then says
    ``unknown``).
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    cluster: str = Field(pattern=r"^[A-Za-z0-9._-]{1,100}$", description="slurm-watcher cluster name")
    ts: Ts = Field(description="Event time up to which the view is complete: the poll's observation time, epoch s")
    jobs_offsets: dict[Annotated[int, Field(ge=0, le=999_999_999)], Int64] = Field(
        default_factory=dict,
        json_schema_extra={"propertyNames": {"pattern": r"^[0-9]{1,9}$"}},  # JSON keys: the partition number
        description="slurm.jobs partition -> offset after the last record of this view written there "
        "(partitions the watcher never wrote to are absent)",
    )
    polls: int = Field(0, ge=0, le=MAX_INT, description="Polls of the watcher that published it (since its start)")


class NodeState(Model):
    """A Slurm node's state (``slurm.nodes``, keyed by node)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    node: NodeName
    ts: Ts
    state: str = Field(description="Base state, e.g. IDLE, ALLOCATED, MIXED, DOWN")
    flags: list[Text] = Field(
        default_factory=list, max_length=64, description="State flags, e.g. DRAIN, NOT_RESPONDING"
    )
    reason: str | None = Field(None, max_length=MAX_LINE_CHARS, description="Reason set with the DRAIN/DOWN")
    reason_user: str | None = None
    reason_ts: OptTs = Field(None, description="When the reason was set, epoch s")
    gres: str | None = Field(None, description="Configured GRES, e.g. gpu:8")
    gres_used: str | None = Field(None, description="GRES in use, e.g. gpu:4(IDX:0-3)")
    partitions: list[str] = Field(default_factory=list)
    cpus: Int64 | None = Field(None, ge=0, description="Configured CPUs of the node (CPUTot / cpus), count")
    alloc_cpus: Int64 | None = Field(None, ge=0, description="CPUs allocated to jobs (CPUAlloc / alloc_cpus), count")
    gpus_used_idx: list[GpuIndex] | None = Field(
        None,
        max_length=MAX_GPUS_PER_NODE,
        description="GPU indices in use, from the IDX list of gres_used (gpu:h100:4(IDX:0-1,4,6) -> 0,1,4,6)",
    )
    snapshot: bool = False

    @property
    def drained(self) -> bool:
        """True if the node carries DRAIN (draining or drained)."""
        return "DRAIN" in self.flags or self.state.startswith("DRAIN")


#: Whether a join with Slurm's view was complete at the record's event time (the Slurm watermark
#: had passed it) or gave up waiting (``unknown``: "no job" cannot be told from "not known yet").
Attribution = Literal["known", "unknown"]


class GpuAttribution(Model):
    """Which Slurm job held one GPU at the time of a sample or event."""

    gpu_index: int = Field(ge=0, le=MAX_GPU_INDEX)
    job_id: str
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    job_start_ts: float | None = None
    job_gpus: Int64 | None = Field(None, description="Total GPUs of the job across its nodes")


class AttributedSample(Model):
    """A ``NodeSample`` joined with the jobs holding its GPUs (``gpu.attributed``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    sample: NodeSample
    jobs: list[GpuAttribution] = Field(default_factory=list, description="One entry per GPU held by a job")
    attribution: Attribution = Field(
        "known",
        description="known: Slurm's view covered sample.ts when it was joined (a GPU without an entry "
        "in jobs was held by no job); unknown: the Slurm watermark did not reach sample.ts within the "
        "correlator's hold, so jobs is empty and says nothing about who held the GPUs",
    )


class AttributedEvent(Model):
    """A ``GpuEvent`` joined with the job holding its GPU (``gpu.events.attributed``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    event: GpuEvent
    job: GpuAttribution | None = None
    node_jobs: list[GpuAttribution] = Field(
        default_factory=list, description="All jobs on the node (for node-wide events without a GPU)"
    )
    attribution: Attribution = Field(
        "known",
        description="known, or unknown: Slurm's view did not reach event.ts within the hold (see AttributedSample)",
    )


class JobWindow(Model):
    """Summary of one GPU of one job over one tumbling window (``job.windows``, keyed by job id).

    Built by the correlator as it attributes each sample, in event time; the detector compares
    the GPUs of the same job (stragglers, idle GPUs, hangs) from these.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: str
    node: str
    gpu_index: int = Field(ge=0, le=MAX_GPU_INDEX)
    gpu_uuid: str | None = None
    user: str | None = None
    partition: str | None = None
    job_gpus: Int64 | None = Field(None, description="Total GPUs of the job across its nodes")
    window_start: float = Field(description="Window start, epoch s (event time, inclusive)")
    window_end: float = Field(description="Window end, epoch s (event time, exclusive)")
    samples: int = Field(ge=0, le=MAX_INT, description="Samples of this GPU in the window, count")
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
    processes_max: Int64 | None = Field(None, ge=0, description="Most compute processes seen at once, count")
    stream_partition: Int64 | None = Field(
        None, ge=0, description="The gpu.samples partition of the node's samples (the correlator's input)"
    )
    stream_ts: float | None = Field(
        None,
        description="Event time the correlator had reached on that partition when it closed this window "
        "(its newest sample ts there), epoch s: how far the node's peers on the partition are, so a "
        "reader tells a node gone silent from a partition that is behind",
    )


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
    value: Int64 | float | str = Field(description="The observed value, in ``unit``")
    unit: str | None = Field(None, description="Unit of value: W, C, MHz, MiB, %, count, s")
    threshold: Int64 | float | str | None = Field(
        None, description="The limit the value was compared with, in ``unit``"
    )
    ts: Ts
    source: str = Field(description="Where it came from: the raw log line, topic or tool")


class CostEstimate(Model):
    """What the failure costs, at the configured price per GPU-hour."""

    affected_gpus: int = Field(ge=0, le=MAX_INT, description="GPUs whose work is lost or stalled")
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
    gpu_index: Int64 | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    job_id: str | None = None
    user: str | None = None
    partition: str | None = None
    first_seen: Ts
    last_seen: Ts
    state: FailureState = FailureState.OPEN
    occurrences: int = Field(1, ge=1, le=MAX_INT, description="Matching signals folded into this episode")
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
    #: written to ``remediations`` (and confirmed by the broker) before a drain command runs;
    #: the outcome that follows carries the same ``intent_id``. An intent without an outcome
    #: (the remediator died in between) is reconciled against Slurm at the next start.
    INTENT = "intent"


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
    exit_code: Int64 | None = None
    output: str | None = Field(None, description="stdout+stderr of the command, truncated")
    intent_id: str | None = Field(
        None, description="Links an intent and its outcome: the remediation_id of the intent (decision 'intent')"
    )


class HealthCheckResult(Model):
    """Result of a prolog/epilog health check on a node (``health``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    node: NodeName
    ts: Ts
    phase: Literal["prolog", "epilog", "periodic"]
    check: Text
    passed: bool
    job_id: JobId | None = None
    gpu_index: GpuIndex | None = None
    detail: str = Field("", max_length=MAX_LINE_CHARS)
    duration_s: float | None = Field(None, ge=0)


class DeadLetter(Model):
    """A message a service could not process (``deadletter``): nothing is silently dropped."""

    schema_version: Literal[1] = SCHEMA_VERSION
    service: str
    source_topic: str
    partition: Int64
    offset: Int64
    key: str | None = None
    value_b64: str = Field(description="The original value bytes, base64 (only a prefix when truncated)")
    error: str = Field(description="Why it was rejected")
    value_size: Int64 | None = Field(None, ge=0, description="Size of the original value, bytes")
    truncated: bool = Field(
        False, description="True: the value was too large to carry; value_b64 is its first bytes only (by reference)"
    )
    ts: float = Field(description="Wall-clock time of the rejection, epoch s")


class WasteCategory(StrEnum):
    """Where a job's allocated GPU-time went (``JobReport.breakdown``)."""

    BUSY = "busy"
    IDLE = "idle"
    PARTIALLY_IDLE = "partially-idle"
    STRAGGLER_WAIT = "straggler-wait"
    CHECKPOINT_STALL = "checkpoint-stall"
    INPUT_WAIT = "input-wait"
    HUNG = "hung"
    LOST_TO_FAILURE = "lost-to-failure"
    NO_TELEMETRY = "no-telemetry"


Side = Literal["job", "cluster"]


class BreakdownItem(Model):
    """One share of a job's allocated GPU-time."""

    category: WasteCategory
    gpu_hours: float = Field(ge=0, description="GPU-hours in this category")
    usd: float = Field(ge=0, description="gpu_hours x price per GPU-hour, USD (rounded to cents, adding up)")
    share_pct: float = Field(ge=0, le=100, description="Share of the job's allocated GPU-hours, %")
    side: Side | None = Field(
        None, description="Whose it is: job (the code, the job script) or cluster (hardware, driver); None: neither"
    )
    failure_ids: list[str] = Field(default_factory=list, description="Findings this share is attributed to")


class ReportGpu(Model):
    """One GPU of a job over the report's span (from ``job.windows``)."""

    node: str
    gpu_index: int = Field(ge=0, le=MAX_GPU_INDEX)
    gpu_uuid: str | None = None
    windows: int = Field(ge=0, le=MAX_INT, description="Job windows seen for this GPU, count")
    observed_s: float = Field(ge=0, description="Seconds of the allocation covered by windows, s")
    busy_pct: float | None = Field(None, ge=0, le=100, description="Busy share of this GPU's allocated time, %")
    utilization_gpu_pct_mean: float | None = Field(None, description="Mean GPU utilisation, %")
    utilization_gpu_pct_min: float | None = Field(None, description="Lowest window mean, %")
    utilization_gpu_pct_max: float | None = Field(None, description="Highest reading, %")
    memory_used_mib_max: float | None = Field(None, description="Most memory used, MiB")
    memory_total_mib: float | None = Field(None, description="Memory total, MiB")
    power_w_mean: float | None = Field(None, description="Mean power draw, W")
    power_limit_w: float | None = Field(None, description="Enforced power limit (last), W")
    sm_clock_mhz_mean: float | None = Field(None, description="Mean SM clock, MHz")
    temperature_c_max: float | None = Field(None, description="Hottest reading, C")
    tensor_activity_pct_mean: float | None = Field(
        None, description="Mean tensor pipe activity (GPM / DCGM profiling), %; None: the GPU did not report it"
    )


class ReportFinding(Model):
    """A failure of the job as the report lists it: the failure's own fields plus its cost share."""

    failure_id: str
    pattern: str
    rule_id: str
    category: Category
    severity: Severity
    side: Side = Field(description="hardware/driver/infrastructure: cluster; application/efficiency: job")
    node: str
    gpu_index: Int64 | None = None
    state: FailureState
    onset_ts: Ts = Field(description="Start of the episode: the earliest evidence, else first_seen")
    first_seen: Ts
    last_seen: Ts
    verdict: str
    evidence: list[Evidence] = Field(default_factory=list)
    cannot_determine: list[str] = Field(default_factory=list)
    recommended_action: Action
    gpu_hours: float = Field(ge=0, description="GPU-hours of the breakdown attributed to this finding")
    usd: float = Field(ge=0, description="gpu_hours x price, USD")


class JobReport(Model):
    """A job's verdict (``job.reports``, keyed by job id): where its GPU-hours went, why, what it cost.

    Published by the detector when the job ends (``final``) or is requeued, periodically while it
    runs, and on demand. The breakdown covers every GPU of the job from ``start_ts`` to ``end_ts``
    (``as_of`` while it runs) and adds up to ``gpu_hours``.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    report_id: str = Field(description="Deterministic: job + start + as_of + final")
    job_id: str = Field(min_length=1)
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    state: str = Field(description="Slurm state when the report was built (UNKNOWN: no slurm.jobs record seen)")
    final: bool = Field(description="True when the job (or this run of a requeued job) has ended")
    nodes: list[str] = Field(default_factory=list)
    gpus: dict[str, list[Int64]] = Field(default_factory=dict, description="GPU indices per node")
    gpu_count: int = Field(ge=0, le=MAX_INT)
    start_ts: Ts = Field(description="Start of the span: the job's start, else its first window")
    end_ts: float | None = Field(None, description="End of the job (or requeue), epoch s; None while it runs")
    as_of: Ts = Field(description="End of the span covered: end_ts, else the last window's end")
    duration_s: float = Field(ge=0, description="as_of - start_ts, s")
    price_usd_per_gpu_hour: float = Field(ge=0, description="Price of one GPU-hour, USD")
    gpu_hours: float = Field(ge=0, description="Allocated: gpu_count x duration, GPU-hours")
    usd: float = Field(ge=0, description="gpu_hours x price, USD")
    busy_pct: float = Field(ge=0, le=100, description="Share of the GPU-hours that did work, %")
    waste_gpu_hours: float = Field(ge=0, description="Every category but busy and no-telemetry, GPU-hours")
    waste_usd: float = Field(ge=0, description="waste_gpu_hours at the price, USD")
    breakdown: list[BreakdownItem] = Field(description="Every category, in a fixed order; adds up to gpu_hours")
    utilization_gpu_pct_mean: float | None = Field(None, description="Mean over the job's windows, %")
    tensor_activity_pct_mean: float | None = Field(
        None, description="The MFU proxy: mean tensor pipe activity over the GPUs reporting it, %; None: none did"
    )
    tensor_activity_gpus: int = Field(0, ge=0, le=MAX_INT, description="GPUs that reported tensor activity, count")
    per_gpu: list[ReportGpu] = Field(default_factory=list)
    findings: list[ReportFinding] = Field(default_factory=list)
    side: Literal["job", "cluster", "both", "none"] = Field(description="Whose the waste is, from the findings")
    verdict: str = Field(description="Plain words: what happened, whose it is and what it cost")
    cannot_determine: list[str] = Field(default_factory=list, description="What the data cannot tell")
    recommendations: list[str] = Field(default_factory=list, description="What to do")
    summary: str = Field(description="One line (the Slurm AdminComment form), at most 250 characters")

    @model_validator(mode="after")
    def _adds_up(self) -> JobReport:
        total = sum(b.gpu_hours for b in self.breakdown)
        if abs(total - self.gpu_hours) > 1e-6 * max(1, len(self.breakdown)):
            raise ValueError(f"breakdown adds up to {total} GPU-hours, not {self.gpu_hours}")
        usd = sum(b.usd for b in self.breakdown)
        if abs(usd - self.usd) > 0.005:
            raise ValueError(f"breakdown adds up to {usd} USD, not {self.usd}")
        return self
