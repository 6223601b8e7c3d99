"""Settings of the collector, from ``GPUWARDEN_*`` environment variables."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gpuwarden.shared.settings import ServiceSettings

__all__ = ["CollectorSettings"]


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


class CollectorSettings(ServiceSettings):
    """Collector settings; every field reads ``GPUWARDEN_<FIELD>`` (e.g. ``GPUWARDEN_COLLECTOR_SOURCE``)."""

    collector_source: Literal["nvml", "dcgm-exporter", "replay", "simulated"] = Field(
        "nvml",
        description="Telemetry source: nvml (this node's GPUs), dcgm-exporter (this node's running dcgm-exporter), "
        "replay (recorded files), simulated",
    )
    collector_node: str = Field(
        default_factory=_short_hostname,
        min_length=1,
        description="Node name in samples and events (nvml mode)",
        json_schema_extra={"doc_default": "short hostname"},
    )
    collector_interval_s: float = Field(
        1.0, gt=0, description="Wall seconds between ticks (nvml, replay); simulated: tick_s / speed"
    )
    collector_replay_dir: Path | None = Field(
        None, description="replay: folder with <node>/*.xml (nvidia-smi -q -x) and <node>/kern.log"
    )
    collector_scenario: Path | None = Field(None, description="simulated: scenario YAML file")
    collector_nodes: str | None = Field(
        None, description="replay/simulated: Slurm hostlist of nodes to read, e.g. gpu-node-[001-004] (default all)"
    )
    collector_kernel_log: str | None = Field(
        "/dev/kmsg",
        description="nvml, dcgm-exporter: kernel log to read XIDs from (/dev/kmsg or a file followed from its end); "
        "empty = none",
    )
    collector_dcgm_exporter_url: str = Field(
        "http://127.0.0.1:9400/metrics",
        pattern=r"^https?://[^\s]+$",
        description="dcgm-exporter: the node's dcgm-exporter /metrics URL (its default port is 9400)",
    )
    collector_dcgm_exporter_timeout_s: float = Field(
        2.0, gt=0, le=60, description="dcgm-exporter: seconds one scrape may take before the tick counts an error"
    )

    collector_kmsg_state: Path | None = Field(
        None, description="nvml: file keeping the last /dev/kmsg sequence number read (resume after restart)"
    )
    collector_nvml_events: bool = Field(
        True, description="nvml: also watch NVML XID/ECC events (deduplicated against the kernel log)"
    )
    collector_sim_resume: bool = Field(
        False,
        description="simulated: start at the scenario's current second (a restarted collector: the ticks while "
        "it was down are not taken), not at second 0 (a replay of every tick so far)",
    )
    collector_nvlink_every: int | None = Field(
        None,
        ge=1,
        description="nvml/simulated: read NVLink state and error counters every Nth tick, nvlinks absent on the "
        "others (default: 1 for nvml, 5 for simulated)",
    )
    collector_buffer_messages: int = Field(
        10_000, ge=1, description="Messages kept while the broker is unreachable (oldest dropped beyond, counted)"
    )
    collector_send_timeout_s: float = Field(
        0.5,
        gt=0,
        description="Longest a tick waits for the producer to take one message (a full batch while the broker "
        "is down); then the message is buffered, counted as a failed delivery, and health is degraded, s",
    )
    collector_stall_s: float = Field(
        10.0,
        gt=0,
        description="Health is degraded when messages in flight have had no confirmation for this long, s",
    )
    collector_stop_timeout_s: float = Field(
        10.0, ge=0, description="On stop, how long to wait for messages in flight to be confirmed, s"
    )
    collector_spool: Path | None = Field(
        None,
        description="Optional file spooling every message until its delivery is confirmed (JSON lines, written "
        "before the send), replayed after a restart or a kill -9",
    )

    @model_validator(mode="after")
    def _needs(self) -> CollectorSettings:
        if self.collector_source == "replay" and self.collector_replay_dir is None:
            raise ValueError("collector_source=replay needs collector_replay_dir (GPUWARDEN_COLLECTOR_REPLAY_DIR)")
        if self.collector_source == "simulated" and self.collector_scenario is None:
            raise ValueError("collector_source=simulated needs collector_scenario (GPUWARDEN_COLLECTOR_SCENARIO)")
        return self
