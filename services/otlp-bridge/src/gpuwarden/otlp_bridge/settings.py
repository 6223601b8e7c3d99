"""Settings of the otlp-bridge, from ``GPUWARDEN_OTLP_BRIDGE_*`` (and standard ``OTEL_*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from gpuwarden.shared.settings import ServiceSettings

__all__ = ["OtlpBridgeSettings", "parse_key_values"]


def parse_key_values(text: str | None) -> dict[str, str]:
    """``k1=v1,k2=v2`` (the ``OTEL_RESOURCE_ATTRIBUTES`` format) to a dict; blanks ignored.

    Raises:
        ValueError: an item without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


class OtlpBridgeSettings(ServiceSettings):
    """Where to export OTLP, how often, and how long series live.

    ``otlp_bridge_endpoint`` unset and no ``OTEL_EXPORTER_OTLP_ENDPOINT`` in the
    environment: no OTLP export, only Prometheus ``/metrics``.
    """

    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_", extra="ignore", populate_by_name=True)

    otlp_bridge_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("GPUWARDEN_OTLP_BRIDGE_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        description="OTLP endpoint: grpc host:port or http(s)://host:port; for http/protobuf the base URL "
        "(/v1/metrics and /v1/logs are appended). Falls back to OTEL_EXPORTER_OTLP_ENDPOINT. "
        "Unset: no OTLP export",
    )
    otlp_bridge_protocol: Literal["grpc", "http/protobuf"] = Field(
        "grpc",
        validation_alias=AliasChoices("GPUWARDEN_OTLP_BRIDGE_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
        description="OTLP protocol: grpc or http/protobuf (http accepted; falls back to OTEL_EXPORTER_OTLP_PROTOCOL)",
    )
    otlp_bridge_headers: SecretStr | None = Field(
        None,
        description="Extra OTLP headers k=v,k2=v2 (e.g. auth); unset: OTEL_EXPORTER_OTLP_HEADERS if any",
    )  # fmt: skip
    otlp_bridge_insecure: bool | None = Field(
        None,
        description="gRPC without TLS; unset: decided from the endpoint scheme / OTEL_EXPORTER_OTLP_INSECURE",
    )  # fmt: skip
    otlp_bridge_timeout_s: float = Field(10.0, gt=0,
                                         description="OTLP export timeout, s")  # fmt: skip
    otlp_bridge_export_interval_s: float = Field(10.0, gt=0, description="Metric export interval, s")
    otlp_bridge_service_name: str | None = Field(
        None,
        description="Resource service.name; unset: OTEL_SERVICE_NAME or gpuwarden-otlp-bridge",
    )  # fmt: skip
    otlp_bridge_resource_attributes: str = Field(
        "",
        description="Extra resource attributes k=v,k2=v2 (added to OTEL_RESOURCE_ATTRIBUTES); keys used on "
        "data points (host.name, hw.id, ...) are dropped from the resource",
    )  # fmt: skip
    otlp_bridge_staleness_s: float = Field(
        300.0, gt=0,
        description="Drop a GPU's series when its latest sample is this much older than the newest event, s",
    )  # fmt: skip
    otlp_bridge_failure_ttl_s: float = Field(
        86400.0, gt=0,
        description="Forget an open failure whose last_seen is this much older than the newest event, s",
    )  # fmt: skip
    otlp_bridge_cardinality_limit: int = Field(
        100_000, ge=1,
        description="OTel SDK attribute sets per instrument (SDK default 2000 folds the rest into overflow)",
    )  # fmt: skip

    otlp_bridge_log_queue_size: int = Field(
        2048, ge=1,
        description="Log records queued for OTLP export at most (batch processor); beyond it records are "
        "dropped and counted (gpuwarden_otlp_log_records_queue_full_total)",
    )  # fmt: skip

    otlp_bridge_metrics_path: Literal["direct", "sdk"] = Field(
        "direct",
        description="OTLP metric export: direct (the store encoded straight to OTLP protobuf messages, sent by the "
        "OTLP exporter packages' transports; ~10x cheaper) or sdk (OpenTelemetry SDK MeterProvider + OTLP exporter)",
    )  # fmt: skip
    otlp_bridge_compression: Literal["none", "gzip", "deflate"] = Field(
        "none",
        validation_alias=AliasChoices("GPUWARDEN_OTLP_BRIDGE_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"),
        description="OTLP compression: none, gzip or deflate (falls back to OTEL_EXPORTER_OTLP_COMPRESSION)",
    )
    otlp_bridge_certificate_file: str | None = Field(
        None,
        validation_alias=AliasChoices("GPUWARDEN_OTLP_BRIDGE_CERTIFICATE_FILE", "OTEL_EXPORTER_OTLP_CERTIFICATE"),
        description="CA bundle (PEM) to verify the OTLP receiver's TLS certificate",
    )
    otlp_bridge_client_certificate_file: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "GPUWARDEN_OTLP_BRIDGE_CLIENT_CERTIFICATE_FILE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
        ),
        description="Client certificate (PEM) for mutual TLS",
    )
    otlp_bridge_client_key_file: str | None = Field(
        None,
        validation_alias=AliasChoices("GPUWARDEN_OTLP_BRIDGE_CLIENT_KEY_FILE", "OTEL_EXPORTER_OTLP_CLIENT_KEY"),
        description="Client private key (PEM) for mutual TLS",
    )
    otlp_bridge_max_request_bytes: int = Field(
        4_000_000, ge=10_000,
        description="Direct path: split metric exports into requests of at most this many bytes "
        "(collectors' gRPC receive limit is often 4 MiB)",
    )  # fmt: skip
    otlp_bridge_retry_s: float | None = Field(
        None, gt=0,
        description="Direct path: time one metric request may take, the OTLP exporter's retries (backoff 1 s "
        "doubling, +-20 %) included, then its points are dropped and counted; unset: the larger of the export "
        "timeout and interval",
    )  # fmt: skip
    otlp_bridge_naming: Literal["otel", "dcgm"] = Field(
        "otel",
        description="Metric names: otel (semantic conventions + gpuwarden.*) or dcgm (dcgm-exporter DCGM_FI_* "
        "names and labels incl. hpc_job, for existing dashboards; OTLP and /metrics)",
    )  # fmt: skip
    otlp_bridge_prom_job_labels: Literal["info", "series"] = Field(
        "info",
        description="Prometheus /metrics, otel naming: info (GPU series carry node, gpu, uuid, pci_bus_id, model; "
        "the job is on gpuwarden_gpu_job_info{node,gpu,job_id,user,partition} 1, join with "
        "* on(node, gpu) group_left(job_id, user, partition) gpuwarden_gpu_job_info: no new series per job) "
        "or series (job_id, user, partition on every GPU series, as before)",
    )  # fmt: skip

    @field_validator("otlp_bridge_compression", mode="before")
    @classmethod
    def _compression(cls, v: object) -> object:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("otlp_bridge_protocol", mode="before")
    @classmethod
    def _protocol(cls, v: object) -> object:
        return "http/protobuf" if isinstance(v, str) and v.strip().lower() in {"http", "http/protobuf"} else v

    @field_validator("otlp_bridge_endpoint", mode="before")
    @classmethod
    def _blank_is_none(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("otlp_bridge_resource_attributes")
    @classmethod
    def _kv(cls, v: str) -> str:
        parse_key_values(v)
        return v
