"""Settings of ``gpuwarden health-check`` from ``GPUWARDEN_*`` environment variables."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticUseDefault
from pydantic_settings import SettingsConfigDict

from gpuwarden.shared.settings import BusSettings

__all__ = ["HealthCheckSettings"]


class HealthCheckSettings(BusSettings):
    """Everything ``gpuwarden health-check`` reads from the environment (prefix ``GPUWARDEN_``)."""

    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_", extra="ignore")

    health_node: str = Field(
        default_factory=lambda: socket.gethostname().split(".")[0],
        description="Node name on results (SLURMD_NODENAME wins when set)",
        json_schema_extra={"doc_default": "short hostname"},
    )
    health_budget_s: float = Field(10.0, gt=0, le=3600, description="Hard time budget of one run, s")
    health_check_timeout_s: float = Field(8.0, gt=0, description="Most seconds one check may take, s")
    health_tool_timeout_s: float = Field(
        3.0, gt=0, description="Most seconds one external tool (ibstat, dmesg, dcgmi discovery) may take, s; "
        "a tool past it is killed and the next source tried (dcgmi diag gets the check's time instead)",
    )  # fmt: skip
    health_timeout_status: Literal["critical", "unknown"] = Field(
        "critical", description="Status of a check that runs past its time"
    )
    health_expected_gpus: int | None = Field(
        None,
        ge=0,
        description="GPUs the node must have, count (unset = at least one; "
        "0 = a CPU node, where a missing driver is OK)",
    )
    health_ib_rate_gbps: float | None = Field(
        None, gt=0, description="Rate every InfiniBand port must reach, Gb/s (unset = the fastest port's)"
    )
    health_ib_ports: int | None = Field(
        None, ge=0, description="ACTIVE InfiniBand ports the node must have; ports down beyond them are not "
        "required (unset = every InfiniBand port must be ACTIVE)",
    )  # fmt: skip
    health_ib_ignore: str = Field(
        "", description="Comma-separated RDMA devices or device/port left out of the infiniband check (mlx5_4,mlx4_0/2)"
    )
    health_nvlinks: int | None = Field(
        None, ge=0, le=18, description="Active NVLinks each GPU must have (unset = all links a GPU reports, "
        "a GPU with none active has no NVLink)",
    )  # fmt: skip
    health_process_grace_s: float = Field(
        5.0, ge=0, description="Epilog: how long leftover GPU processes may take to exit before they count, s"
    )
    health_max_used_mib: float = Field(1024.0, ge=0, description="Used GPU memory above which a GPU is not free, MiB")
    health_dcgm_level: int = Field(0, ge=0, le=4, description="dcgmi diag -r level in prolog/epilog (0 = off)")
    health_state_dir: Path = Field(
        Path("/var/lib/gpuwarden/health"), description="Where prolog/epilog note job start and last epilog times"
    )
    health_xid_lookback_s: float = Field(3600.0, gt=0, description="XID window when no earlier run is recorded, s")
    health_kernel_log: str = Field(
        "dmesg",
        description="'dmesg' (dmesg --time-format iso), a log file path, or '' (none: the xid check is UNKNOWN)",
    )
    health_sysfs_root: Path = Field(Path("/"), description="Root under which /sys/class/infiniband is read")
    health_scenario: Path | None = Field(
        None,
        description="Simulate: read NVML from the simulation layer's FakeNvml (gpuwarden.sim) for this "
        "scenario YAML (demo, tests)",
    )
    health_scenario_s: float = Field(0.0, ge=0, description="Simulate: the scenario second the fake NVML shows")
    health_publish: bool = Field(True, description="Publish each result to the health topic")
    health_publish_timeout_s: float = Field(1.5, gt=0, le=30, description="Total time publishing may take, s")

    @field_validator("health_expected_gpus", "health_ib_rate_gbps", "health_ib_ports", "health_nvlinks", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        """``GPUWARDEN_HEALTH_EXPECTED_GPUS=`` (an empty value in an env file) means unset."""
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator(
        "health_node", "health_budget_s", "health_check_timeout_s", "health_tool_timeout_s",
        "health_timeout_status", "health_process_grace_s", "health_max_used_mib", "health_dcgm_level",
        "health_state_dir", "health_xid_lookback_s", "health_sysfs_root", "health_scenario",
        "health_scenario_s", "health_publish", "health_publish_timeout_s",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _empty_is_default(cls, v: object) -> object:
        """An empty value (``GPUWARDEN_HEALTH_BUDGET_S=``) means the default, not an error that
        would leave every run UNKNOWN (and the node unchecked); ``health_kernel_log`` keeps its
        empty value (= no kernel log)."""
        if isinstance(v, str):
            if not v.strip():
                raise PydanticUseDefault()
            return v.strip()
        return v

    @field_validator("health_timeout_status", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v
