"""Prometheus metrics every service exports on its own ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ServiceMetrics"]


class ServiceMetrics:
    """Counters and gauges common to all services, in a registry of their own (no globals)."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.service = service
        ns = "gpuwarden"
        self.messages_in = Counter(
            f"{ns}_messages_in", "Messages consumed, by short topic", ["topic"], registry=self.registry
        )
        self.messages_out = Counter(
            f"{ns}_messages_out", "Messages published, by short topic", ["topic"], registry=self.registry
        )
        self.errors = Counter(f"{ns}_errors", "Errors, by kind", ["kind"], registry=self.registry)
        self.dead_lettered = Counter(
            f"{ns}_dead_lettered",
            "Messages sent to the dead-letter topic, by source topic",
            ["topic"],
            registry=self.registry,
        )
        self.rejected = Counter(
            f"{ns}_rejected_records",
            "Records outside their topic's contract, by topic and rule (schema, oversize, event-time); "
            "dead-lettered by the topic's edge service, dropped by the others",
            ["topic", "rule"],
            registry=self.registry,
        )
        self.consumer_lag = Gauge(
            f"{ns}_consumer_lag_messages",
            "Consumer lag per topic partition, messages",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.up = Gauge(f"{ns}_up", "1 while the service runs", registry=self.registry)
