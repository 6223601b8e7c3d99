"""gpuwarden otlp-bridge: gpuwarden topics -> OpenTelemetry (OTLP metrics + logs) and Prometheus."""

from .bridge import OtlpBridge, build_otlp_exporters, build_resource
from .mapping import GPU_METRICS, MetricSpec, failure_log, gpu_attributes, remediation_log, severity_of
from .prom import BridgeCollector
from .service import CONSUMED_TOPICS, OtlpBridgeService, create_service
from .settings import OtlpBridgeSettings
from .store import LatestStore

__all__ = [
    "CONSUMED_TOPICS",
    "GPU_METRICS",
    "BridgeCollector",
    "LatestStore",
    "MetricSpec",
    "OtlpBridge",
    "OtlpBridgeService",
    "OtlpBridgeSettings",
    "build_otlp_exporters",
    "build_resource",
    "create_service",
    "failure_log",
    "gpu_attributes",
    "remediation_log",
    "severity_of",
]
