"""gpuwarden otlp-bridge: gpuwarden topics -> OpenTelemetry (OTLP metrics + logs) and Prometheus."""

from .bridge import OtlpBridge, build_resource
from .exporters import build_otlp_exporters
from .logs import failure_log, remediation_log, severity_of
from .metrics import GPU_METRICS, MetricSpec, gpu_attributes
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
