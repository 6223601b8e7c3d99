"""The correlator's faust app and the service that runs it.

Topology (docs/architecture.md#correlation-topology)::

    slurm.jobs  --fan out per node-->  allocations (keyed by node)  --> table node -> allocations
    gpu.samples (keyed by node) --join with table--> gpu.attributed
                                --and fold into table node -> open windows--> job.windows (keyed by job)
    gpu.events  (keyed by node) --join with table--> gpu.events.attributed
    bad input on any of them    -->  deadletter

``allocations``, ``gpu.samples`` and ``gpu.events`` are keyed by node with the same
partition count and the same (murmur2) partitioner, so the table partition holding a
node's allocations is processed by the worker that gets that node's samples.

Both tables (allocations and open windows) are written to their changelogs in batches
(:class:`BatchedTableStore`): a node's value is kept in the table's local store on every write
and sent to the changelog once per commit, when the commit starts (before faust takes the
offsets to commit and flushes the producer), and the flush faust awaits before committing
checks their delivery, so the changelogs always hold at least everything the committed offsets
cover.

Agents only move bytes: every decision is in :class:`~gpuwarden.correlator.core.Correlator`.
Values use faust's ``raw`` serializer and are decoded by the correlator itself, so a
malformed message becomes a dead letter instead of a faust crash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, cast

import faust
import orjson
from aiokafka import AIOKafkaClient
from faust.streams import current_event

from gpuwarden.shared.metrics import ServiceMetrics
from gpuwarden.shared.service import HttpEndpoint
from gpuwarden.shared.topics import TOPICS

from .core import INPUT_TOPICS, OUTPUT_TOPICS, Correlator
from .settings import CorrelatorSettings

__all__ = [
    "LANES",
    "BatchedTableStore",
    "ChangelogNotWritten",
    "CorrelatorApp",
    "CorrelatorService",
    "broker_urls",
    "create_app",
    "discover_partitions",
]

log = logging.getLogger(__name__)

#: Inputs of each ``GPUWARDEN_CORRELATOR_LANE``: the events lane has its own consumer group
#: (``<app id>-events``) and its own copy of the allocations table, so an XID is joined and
#: published however many samples the samples lane has still to read.
LANES: dict[str, tuple[str, ...]] = {
    "all": INPUT_TOPICS,
    "samples": ("slurm.jobs", "allocations", "gpu.samples"),
    "events": ("allocations", "gpu.events"),
}


class BatchedTableStore:
    """:class:`~gpuwarden.correlator.core.AllocationStore` over a faust Table (the allocations
    or the open windows), changelogged in batches instead of on every write.

    ``set`` puts the value in the table's local store only and marks the node dirty, with the
    partition of the event being processed (the node's partition: the table is co-partitioned
    with ``gpu.samples``). :meth:`flush` snapshots one changelog record per dirty node with its
    state at that moment. The app calls it when a commit starts (:class:`_FlushOnCommit`): faust
    takes the offsets to commit right after, then flushes the producer before committing them;
    the app's producer flush first appends the snapshots to the producer (:meth:`send_unsent`)
    and then waits for their delivery (:meth:`check_delivered`: a snapshot that was not
    acknowledged fails the commit), so every sample the committed offsets cover is in the
    changelog; samples processed later are redelivered after a crash and the windows ignore
    readings they already hold. Dirty nodes of revoked partitions are dropped (:meth:`drop`):
    nothing of theirs was committed since the last flush, so the partition's next owner
    reprocesses them.

    The records do not go through faust's ``Table.send_changelog``: its producer buffer's
    ``flush()`` gives up after 0.1 s without progress and returns with records still queued, so
    under load faust could commit offsets whose window state was not yet in the changelog (a
    restarted worker then lost those readings).
    """

    def __init__(self, table: Any) -> None:
        self.table = table
        #: node -> changelog partition, for nodes changed since the last flush.
        self.dirty: dict[str, int] = {}
        #: Changelog records sent (one per dirty node per flush).
        self.flushed = 0
        #: (partition, key bytes, value bytes) snapshotted by :meth:`flush`, not yet appended to
        #: the producer, oldest first.
        self.unsent: list[tuple[int, bytes, bytes]] = []
        #: records handed to the producer whose delivery :meth:`check_delivered` has not yet seen.
        self._in_flight: list[tuple[tuple[int, bytes, bytes], asyncio.Future[Any]]] = []
        self._sending = asyncio.Lock()

    def get(self, node: str) -> dict[str, Any] | None:
        value: dict[str, Any] | None = self.table.data.get(node)
        return value

    def set(self, node: str, value: dict[str, Any]) -> None:
        event = current_event()
        if event is None:
            raise RuntimeError("Cannot modify table outside of agent/stream.")
        self.table.data[node] = value
        self.dirty[node] = event.message.partition

    def flush(self) -> int:
        """Snapshot the state of every dirty node as a changelog record (sent by
        :meth:`send_unsent`); returns how many."""
        dirty, self.dirty = self.dirty, {}
        data = self.table.data
        topic = self.table.changelog_topic
        for node, partition in dirty.items():
            value = data.get(node)
            if value is not None:
                key, _ = topic.prepare_key(node, self.table.key_serializer)
                # Serialised now (a snapshot), as JSON: what the table's json serializer restores.
                self.unsent.append((partition, key, orjson.dumps(value)))
        self.flushed += len(dirty)
        return len(dirty)

    async def send_unsent(self, producer: Any) -> int:
        """Append the snapshotted records to ``producer`` (faust's, for the aiokafka one), in
        order; returns how many. Calls are serialised, so a node's records keep their order.

        Raises:
            aiokafka.errors.KafkaError: the producer cannot take them (the commit then fails,
                and the offsets stay where the changelog is).
        """
        async with self._sending:
            batch, self.unsent = self.unsent, []
            if not batch:
                return 0
            name = self.table.changelog_topic.get_topic_name()
            for i, record in enumerate(batch):
                partition, key, value = record
                try:
                    fut = await producer.send(name, key, value, partition, None, None)
                except BaseException:
                    self.unsent = batch[i:] + self.unsent  # not handed over: first in line next time
                    raise
                if isinstance(fut, asyncio.Future):
                    self._in_flight.append((record, fut))
            return len(batch)

    async def check_delivered(self) -> None:
        """After the producer's flush (before offsets are committed): wait for every snapshot
        handed to the producer to be acknowledged.

        Raises:
            ChangelogNotWritten: one was not delivered; those records go back first in line
                (the next flush sends them again) and the commit fails, so the offsets never
                get ahead of the changelog.
        """
        in_flight, self._in_flight = self._in_flight, []
        if not in_flight:
            return
        await asyncio.gather(*(f for _, f in in_flight), return_exceptions=True)
        failed = [(r, f) for r, f in in_flight if f.cancelled() or f.exception() is not None]
        if failed:
            self.unsent = [r for r, _ in failed] + self.unsent
            _, f = failed[0]
            cause = None if f.cancelled() else f.exception()
            raise ChangelogNotWritten(
                f"{len(failed)} window snapshot(s) not delivered to {self.table.changelog_topic.get_topic_name()}: "
                f"{cause!r}; offsets not committed"
            ) from cause

    def drop(self, partitions: Collection[int]) -> None:
        """Forget dirty nodes of ``partitions`` (revoked: their next owner reprocesses them)."""
        if partitions:
            self.dirty = {n: p for n, p in self.dirty.items() if p not in partitions}


class ChangelogNotWritten(RuntimeError):
    """A window snapshot was not delivered to the changelog: the commit must not go ahead."""


class _FlushOnCommit(faust.Sensor):
    """Flushes the :class:`BatchedTableStore` s when a consumer commit starts (synchronously,
    before faust reads the acked offsets it is about to commit)."""

    def __init__(self, stores: list[BatchedTableStore]) -> None:
        super().__init__()
        self.stores = stores

    def on_commit_initiated(self, consumer: Any) -> Any:
        for store in self.stores:
            store.flush()
        return None


def _send_changelog_on_flush(app: faust.App, stores: list[BatchedTableStore]) -> None:
    """Make the app's producer ``flush()`` (before faust commits offsets, on revocation and on
    stop) append the tables' snapshots first, then wait for delivery of everything, then check
    that every snapshot was acknowledged (else the flush, and so the commit, fails)."""
    producer = app.producer
    flush = producer.flush

    async def flush_with_changelog() -> None:
        for store in stores:
            await store.send_unsent(producer)
        await flush()
        for store in stores:
            await store.check_delivered()

    producer.flush = flush_with_changelog  # type: ignore[method-assign]


class CorrelatorApp(faust.App):
    """The faust app, with the correlator core and its table attached (see :func:`create_app`)."""

    core: Correlator
    allocations_table: Any
    #: The open-windows table and its store; None on the events lane (it windows nothing).
    windows_table: Any
    windows_store: BatchedTableStore | None
    allocations_store: BatchedTableStore
    first_output_at: float | None = None


def broker_urls(bootstrap_servers: str) -> str:
    """``h1:9092,h2:9092`` -> ``kafka://h1:9092;kafka://h2:9092`` (faust's broker syntax)."""
    hosts = [h.strip() for h in bootstrap_servers.split(",") if h.strip()]
    return ";".join(h if "://" in h else f"kafka://{h}" for h in hosts)


def create_app(
    settings: CorrelatorSettings,
    *,
    partitions: int | None = None,
    metrics: ServiceMetrics | None = None,
    clock: Callable[[], float] = time.time,
    datadir: Path | None = None,
) -> CorrelatorApp:
    """Build the faust app: topics, the ``node -> allocations`` table and one agent per input.

    Args:
        settings: bus and correlator settings (topic prefix, broker, app id, timeouts).
        partitions: partitions of the input topics (and so of the table changelog);
            default ``settings.correlator_partitions``, else the topic registry's count.
        metrics: counters to update; a fresh registry if not given.
        clock: wall clock for dead-letter timestamps only.
        datadir: faust's data folder (it writes only empty folders with the memory store);
            default ``settings.correlator_datadir``, else ``<tmp>/<app id>-<pid>``.

    Nothing connects until a worker starts the app.
    """
    parts = partitions or settings.correlator_partitions or TOPICS["gpu.samples"].partitions
    datadir = datadir or settings.correlator_datadir or Path(tempfile.gettempdir()) / f"{settings.app_id}-{os.getpid()}"
    app = CorrelatorApp(
        settings.app_id,
        broker=broker_urls(settings.bootstrap_servers),
        store="memory://",
        datadir=str(datadir),
        autodiscover=False,
        web_enabled=False,
        topic_partitions=parts,
        topic_replication_factor=settings.correlator_replication_factor or 1,
        topic_disable_leader=True,
        table_standby_replicas=0,
        consumer_auto_offset_reset=settings.auto_offset_reset,
        broker_session_timeout=settings.correlator_session_timeout_s,
        broker_heartbeat_interval=settings.correlator_heartbeat_interval_s,
        broker_commit_interval=settings.correlator_commit_interval_s,
        broker_rebalance_timeout=max(10.0, settings.correlator_session_timeout_s * 2),
        broker_request_timeout=30.0,
        broker_client_id=f"{settings.client_id}-correlator",
        broker_credentials=settings.faust_credentials(),
        producer_acks=-1 if settings.producer_acks == "all" else 1,
        producer_linger=settings.correlator_producer_linger_s,
        producer_max_batch_size=settings.correlator_producer_batch_bytes,
        stream_wait_empty=False,
        stream_recovery_delay=0.0,
        key_serializer="raw",
        value_serializer="raw",
    )
    rf = settings.correlator_replication_factor or 1
    changelog_configs = {"min.insync.replicas": "2"} if rf >= 3 else {}
    table = app.Table(
        # The prefix is in the table name so that its changelog topic
        # ("<app id>-<prefix>node-allocations-changelog") is separate per prefix.
        f"{settings.topic_prefix}node-allocations",
        default=None,
        partitions=parts,
        key_type=str,
        help="node -> {job id: allocation}",
        extra_topic_configs=changelog_configs,
    )
    allocations_store = BatchedTableStore(table)
    stores = [allocations_store]
    #: the topics whose messages write each store (co-partitioned: a partition number is the same
    #: node set in all of them), for dropping dirty nodes of revoked partitions
    writers = {allocations_store: {settings.topic(t) for t in ("allocations", "gpu.samples", "gpu.events")}}
    windows_store: BatchedTableStore | None = None
    windows_table: Any = None
    if settings.correlator_lane != "events":
        windows_table = app.Table(
            f"{settings.topic_prefix}node-windows",
            default=None,
            partitions=parts,
            key_type=str,
            help="node -> {watermark, open (job, gpu, window) accumulators}",
            extra_topic_configs=changelog_configs,
        )
        windows_store = BatchedTableStore(windows_table)
        stores.append(windows_store)
        writers[windows_store] = {settings.topic("gpu.samples")}
    app.sensors.add(_FlushOnCommit(stores))
    _send_changelog_on_flush(app, stores)

    def _drop_revoked(sender: Any, *args: Any, signal: Any = None, **_: Any) -> None:
        revoked = args[0] if args else ()  # faust sends the revoked TopicPartitions
        for store, topics in writers.items():
            store.drop({tp.partition for tp in revoked if tp.topic in topics})

    # (mode's stubs type receivers narrower than what it calls them with: (sender, *args, signal=...))
    app.on_partitions_revoked.connect(cast(Any, _drop_revoked))

    core = Correlator(
        allocations_store,
        settings.topic,
        settings.correlator_retention_s,
        metrics or ServiceMetrics("correlator"),
        clock,
        windows=windows_store,
        window_s=settings.correlator_window_s,
        window_grace_s=settings.correlator_window_grace_s,
    )
    app.core = core
    app.allocations_table = table
    app.allocations_store = allocations_store
    app.windows_table = windows_table
    app.windows_store = windows_store
    names = {s: settings.topic(s) for s in OUTPUT_TOPICS}
    assert core.metrics is not None
    errors = core.metrics.errors.labels("produce")

    def _sent(fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            errors.inc()
            log.error("correlator: a message was not published: %r", fut.exception())

    def make_agent(short: str) -> Callable[[Any], Any]:
        async def move(stream: faust.StreamT[bytes]) -> None:
            # Straight to the app's producer (the one faust flushes before it commits offsets),
            # not through faust's Topic.send: its FutureMessage/sensor layer was ~10 % of the CPU
            # per message and adds nothing for raw bytes.
            send = app.producer.send
            async for event in stream.events():
                msg = event.message
                for out in core.handle(short, msg.value, msg.key, msg.partition, msg.offset):
                    key = out.key.encode() if out.key is not None else None
                    fut = cast("asyncio.Future[Any]", await send(names[out.topic], key, out.value, None, None, None))
                    fut.add_done_callback(_sent)
                    if app.first_output_at is None and out.topic == "gpu.attributed":
                        app.first_output_at = time.time()
                        log.info("correlator: first attributed sample published")

        return move

    for short in LANES[settings.correlator_lane]:
        channel = app.topic(settings.topic(short), key_serializer="raw", value_serializer="raw")
        app.agent(channel, name=f"correlate-{short}")(make_agent(short))
    return app


async def discover_partitions(settings: CorrelatorSettings, timeout_s: float = 30.0) -> int:
    """Partition count of the input topics, read from the broker.

    Raises:
        RuntimeError: an input topic is missing (run ``gpuwarden topics create``) or the
            co-partitioned topics have different partition counts.
        aiokafka.errors.KafkaError: the broker cannot be reached.
    """
    client = AIOKafkaClient(**settings.kafka_kwargs(), request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(client.bootstrap(), timeout_s)
    try:
        md = await asyncio.wait_for(client.fetch_all_metadata(), timeout_s)
    finally:
        await client.close()
    counts: dict[str, int] = {}
    for short in (*INPUT_TOPICS, *(t for t in OUTPUT_TOPICS if t not in INPUT_TOPICS)):
        full = settings.topic(short)
        p = md.partitions_for_topic(full)
        if not p:
            raise RuntimeError(f"topic {full} does not exist: create the topics first (gpuwarden topics create)")
        counts[short] = len(p)
    keyed = {counts[s] for s in ("allocations", "gpu.samples", "gpu.events")}
    if len(keyed) != 1:
        raise RuntimeError(f"allocations, gpu.samples and gpu.events must have the same partition count: {counts}")
    return keyed.pop()


async def count_brokers(settings: CorrelatorSettings, timeout_s: float = 30.0) -> int:
    """Brokers in the cluster (from its metadata).

    Raises:
        aiokafka.errors.KafkaError: the broker cannot be reached.
    """
    client = AIOKafkaClient(**settings.kafka_kwargs(), request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(client.bootstrap(), timeout_s)
    try:
        md = await asyncio.wait_for(client.fetch_all_metadata(), timeout_s)
    finally:
        await client.close()
    return max(1, len(md.brokers()))


class _Worker(faust.Worker):
    """A faust worker that leaves signals, logging and the event loop to its owner."""

    def install_signal_handlers(self) -> None:
        pass


class CorrelatorService:
    """Runs the faust app in the current event loop, with ``/healthz`` and ``/metrics``.

    ``start()`` returns once the worker is started (table recovery and stream processing
    continue in the background); ``stop()`` commits offsets, flushes the producer and
    leaves the group. ``stop()`` is safe before ``start()`` and twice.
    """

    name = "correlator"

    def __init__(self, settings: CorrelatorSettings) -> None:
        self.settings = settings
        self.metrics = ServiceMetrics(self.name)
        self.http = HttpEndpoint(settings.http_host, settings.http_port, self.metrics, self.health)
        self.app: CorrelatorApp | None = None
        self.worker: _Worker | None = None
        self.started_at: float | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        """Raises RuntimeError/KafkaError if the topics are missing or the broker is unreachable."""
        if self.worker is not None:
            return
        self.started_at = time.time()
        await self.http.start()
        partitions = self.settings.correlator_partitions or await discover_partitions(self.settings)
        if self.settings.correlator_replication_factor is None:
            # changelogs as durable as the cluster allows (validated: never more than its brokers)
            from gpuwarden.shared.topics import replication_plan

            rf, _ = replication_plan(await count_brokers(self.settings))
            self.settings = self.settings.model_copy(update={"correlator_replication_factor": rf})
        datadir = self.settings.correlator_datadir
        if datadir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{self.settings.app_id}-")
            datadir = Path(self._tmp.name)
        self.app = create_app(self.settings, partitions=partitions, metrics=self.metrics, datadir=datadir)
        worker = _Worker(
            self.app,
            loop=asyncio.get_running_loop(),
            override_logging=False,
            redirect_stdouts=False,
            quiet=True,
            daemon=False,
            loglevel=self.settings.log_level,
        )
        self.worker = worker
        await worker.start()
        self.metrics.up.set(1)
        log.info(
            "correlator started (pid %s, %d partitions, app id %s), http://%s:%s/healthz",
            os.getpid(),
            partitions,
            self.settings.app_id,
            self.http.host,
            self.http.port,
        )

    async def stop(self) -> None:
        w, self.worker = self.worker, None
        if w is not None:
            try:
                await asyncio.wait_for(w.stop(), self.settings.correlator_stop_timeout_s)
            except TimeoutError:
                log.warning("correlator: faust worker did not stop within %ss", self.settings.correlator_stop_timeout_s)
            except asyncio.CancelledError:
                pass
            self.metrics.up.set(0)
            log.info("correlator stopped")
        await self.http.stop()
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            tmp.cleanup()

    def crashed(self) -> BaseException | None:
        """The exception that crashed the faust app, if any."""
        for s in (self.worker, self.app):
            if s is not None and s.crashed:
                return s.crash_reason or RuntimeError("faust app crashed")
        return None

    def health(self) -> dict[str, Any]:
        crash = self.crashed()
        status = "failed" if crash else "ok" if self.worker is not None else "stopped"
        return {
            "service": self.name,
            "status": status,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "first_output_at": self.app.first_output_at if self.app else None,
            "error": repr(crash) if crash else None,
        }

    async def wait_failed(self) -> BaseException:
        """Wait until the faust app has crashed; returns its exception."""
        while True:
            crash = self.crashed()
            if crash is not None:
                return crash
            await asyncio.sleep(0.5)
