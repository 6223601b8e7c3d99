"""The otlp-bridge service: ``gpu.attributed``, ``failures`` and ``remediations`` from
Kafka into OTLP metrics and logs, and Prometheus ``/metrics``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Literal

from aiokafka import ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricReader
from pydantic import BaseModel

from gpuwarden.shared.bus import Producer
from gpuwarden.shared.models import AttributedEvent, AttributedSample, Failure, NodeState, Remediation
from gpuwarden.shared.service import Service

from .bridge import OtlpBridge, build_resource
from .exporters import build_otlp_exporters
from .settings import OtlpBridgeSettings, parse_key_values

__all__ = ["CONSUMED_TOPICS", "OtlpBridgeService", "create_service"]

log = logging.getLogger(__name__)

CONSUMED_TOPICS = ("gpu.attributed", "gpu.events.attributed", "slurm.nodes", "failures", "remediations")
#: ``fetch_min_bytes`` of the bridge's consumer: about ten 8-GPU attributed samples with NVLinks
#: (25 KB each); the broker answers when this much is there or after 100 ms
FETCH_MIN_BYTES = 256 * 1024
#: Topics whose records give series of their node that another bridge takes over at a rebalance.
HANDED_OVER = ("gpu.attributed", "failures")


class _HandOver(ConsumerRebalanceListener):  # type: ignore[misc]
    """After each assignment, the bridge forgets the nodes whose partitions it no longer reads."""

    def __init__(self, service: OtlpBridgeService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        """Nothing: aiokafka revokes every partition before each rebalance (eager protocol), and
        most come back; what moved is known at the assignment."""

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        self.service.hand_over(assigned)


class OtlpBridgeService(Service):
    """Consumes :data:`CONSUMED_TOPICS` (``gpu.attributed``: GPU metrics; ``gpu.events.attributed``:
    XID log records + ``hw.errors``; ``slurm.nodes``: node-state-change log records;
    ``failures``, ``remediations``: log records); exports through the injected readers/exporters.

    With neither ``metric_readers`` nor ``log_exporters`` given, OTLP exporters are
    built from the settings (none without an endpoint: Prometheus only).
    """

    name = "otlp-bridge"

    def __init__(
        self,
        settings: OtlpBridgeSettings,
        *,
        metric_readers: Sequence[MetricReader] | None = None,
        log_exporters: Sequence[LogRecordExporter] | None = None,
        log_processor: Literal["batch", "simple"] = "batch",
        producer: Producer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(settings, producer)
        self.bridge_settings = settings
        # OTLP exporters from the settings are built in on_start: a periodic reader starts a thread.
        self._from_settings = metric_readers is None and log_exporters is None
        readers, exporters = list(metric_readers or ()), list(log_exporters or ())
        self.otlp_enabled = bool(readers or exporters) or (
            self._from_settings and settings.otlp_bridge_endpoint is not None
        )
        self.bridge = OtlpBridge(
            resource=build_resource(
                settings.otlp_bridge_service_name, parse_key_values(settings.otlp_bridge_resource_attributes)
            ),
            metric_readers=readers,
            log_exporters=exporters,
            log_processor=log_processor,
            staleness_s=settings.otlp_bridge_staleness_s,
            failure_ttl_s=settings.otlp_bridge_failure_ttl_s,
            cardinality_limit=settings.otlp_bridge_cardinality_limit,
            clock=clock,
            export_interval_s=settings.otlp_bridge_export_interval_s,
            max_request_bytes=settings.otlp_bridge_max_request_bytes,
            naming=settings.otlp_bridge_naming,
            prom_job_labels=settings.otlp_bridge_prom_job_labels,
            log_queue_size=settings.otlp_bridge_log_queue_size,
        )
        self.metrics.registry.register(self.bridge.collector)
        #: short topic of :data:`HANDED_OVER` -> node -> the partition its last record came from
        self._read_from: dict[str, dict[str, int]] = {t: {} for t in HANDED_OVER}
        self.nodes_handed_over = 0

    async def on_start(self) -> None:
        if self._from_settings and self.bridge.meter_provider is None:
            self.bridge.add_exporters(*build_otlp_exporters(self.bridge_settings))
            self._from_settings = False
        self.bridge.start()
        if self.otlp_enabled:
            log.info("otlp-bridge: exporting OTLP (%s) to %s", self.bridge_settings.otlp_bridge_protocol,
                     self.bridge_settings.otlp_bridge_endpoint or "injected exporters")  # fmt: skip
        else:
            log.info("otlp-bridge: no OTLP endpoint, Prometheus /metrics only")
        # batched fetches (the broker answers at 256 KB or after 100 ms): a large fleet's samples
        # come in batches of hundreds, each batch one commit; 100 ms is nothing to a metric
        # exported every export interval, and XID -> drain does not pass through here
        self.consume(list(CONSUMED_TOPICS), self.handle, listener=_HandOver(self), fetch_min_bytes=FETCH_MIN_BYTES)

    def hand_over(self, assigned: Collection[TopicPartition]) -> int:
        """Forget the GPUs and open failures of the nodes whose ``gpu.attributed`` or ``failures``
        partition is not in ``assigned`` (this member's new assignment): another bridge exports
        them now (:meth:`LatestStore.hand_over`). Returns how many nodes were handed over."""
        kept: dict[str, set[int]] = {}
        for tp in assigned:
            kept.setdefault(tp.topic, set()).add(tp.partition)
        moved = 0
        for short, nodes in self._read_from.items():
            own = kept.get(self.settings.topic(short), set())
            gone = [n for n, p in nodes.items() if p not in own]
            if not gone:
                continue
            for n in gone:
                del nodes[n]
            self.bridge.store.hand_over(gone, gpus=short == "gpu.attributed", failures=short == "failures")
            moved += len(gone)
        if moved:
            self.nodes_handed_over += moved
            log.info("otlp-bridge: %d node(s) handed over to another bridge (rebalance)", moved)
        return moved

    async def on_stop(self) -> None:
        await asyncio.to_thread(self.bridge.stop, self.bridge_settings.otlp_bridge_timeout_s)

    async def handle(self, topic: str, value: BaseModel, record: ConsumerRecord | None = None) -> None:
        """Route one decoded message to the bridge.

        Raises:
            TypeError: a value of a model the bridge does not handle (dead-lettered).
        """
        if isinstance(value, AttributedSample):
            self.bridge.on_sample(value)
            if record is not None:
                self._read_from["gpu.attributed"][value.sample.node] = record.partition
        elif isinstance(value, Failure):
            self.bridge.on_failure(value)
            if record is not None:
                self._read_from["failures"][value.node] = record.partition
        elif isinstance(value, Remediation):
            self.bridge.on_remediation(value)
        elif isinstance(value, AttributedEvent):
            self.bridge.on_event(value)
        elif isinstance(value, NodeState):
            self.bridge.on_node_state(value)
        else:
            raise TypeError(f"otlp-bridge does not handle {type(value).__name__} from {topic}")


def create_service(settings: OtlpBridgeSettings | None = None) -> OtlpBridgeService:
    """Build the service from settings (the environment when not given)."""
    return OtlpBridgeService(settings or OtlpBridgeSettings())
