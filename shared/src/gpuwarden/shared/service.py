"""One lifecycle for every long-lived component, and the process runner of a service.

``start()`` returns once the component is ready; ``stop()`` is safe before ``start()``
and twice. :class:`Service` adds a producer, consumers with dead-lettering, background
tasks and an HTTP endpoint with ``/healthz`` and Prometheus ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from aiohttp import web
from aiokafka.errors import KafkaConnectionError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from .bus import Consumer, Handler, Producer, ProducerLike
from .metrics import ServiceMetrics
from .settings import ServiceSettings

__all__ = ["HttpEndpoint", "Lifecycle", "Service", "kafka_start_hint", "run_service", "tune_gc"]

log = logging.getLogger(__name__)


class Lifecycle(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


#: Methods that read only; every other method is a control request (:class:`HttpEndpoint`).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class HttpEndpoint:
    """aiohttp server with ``/healthz`` (JSON) and ``/metrics`` (Prometheus text), and the
    service's ``extra_routes``.

    **Control requests** (any method but GET/HEAD/OPTIONS: the breaker reset, the report
    trigger) need ``Authorization: Bearer <GPUWARDEN_HTTP_CONTROL_TOKEN>``; with no token
    configured every control request is refused. A wrong or missing token gets 401; an
    ``Origin`` header that is not this server's own origin gets 403 (a page in a browser
    cannot post to it). Reads stay open, so ``/metrics`` can be scraped from a bound
    ``0.0.0.0`` while nothing can be changed without the token.
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: ServiceMetrics,
        health: Callable[[], dict[str, Any]],
        control_token: str | None = None,
    ) -> None:
        self.host, self.port = host, port
        self._metrics = metrics
        self._health = health
        self._runner: web.AppRunner | None = None
        self.extra_routes: list[web.RouteDef] = []
        self.control_token = control_token
        self.refused = 0

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method in READ_METHODS:
            return await handler(request)
        origin = request.headers.get("Origin")
        if origin is not None and origin.rstrip("/") != f"{request.scheme}://{request.host}":
            self.refused += 1
            return web.json_response({"error": f"cross-origin {request.method} refused (Origin {origin[:100]})"},
                                     status=403)  # fmt: skip
        given = request.headers.get("Authorization", "")
        given = given[7:] if given.startswith("Bearer ") else ""
        token = self.control_token
        if not token or not given or not hmac.compare_digest(given.encode(), token.encode()):
            self.refused += 1
            why = (
                "a wrong or missing bearer token" if token else "no GPUWARDEN_HTTP_CONTROL_TOKEN is set on the service"
            )
            return web.json_response(
                {"error": f"{request.method} {request.path} refused: {why}"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="gpuwarden"'},
            )
        return await handler(request)

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(middlewares=[self._guard])
        app.add_routes(
            [web.get("/healthz", self._healthz), web.get("/metrics", self._metrics_view), *self.extra_routes]
        )
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        server = getattr(site, "_server", None)
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        self._runner = runner

    async def stop(self) -> None:
        r, self._runner = self._runner, None
        if r is not None:
            await r.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        body = self._health()
        return web.json_response(body, status=200 if body.get("status") == "ok" else 503)

    async def _metrics_view(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


class Service:
    """Base of the six services. Subclasses set ``name``, call ``consume()``/``spawn()``
    in ``on_start()`` and publish with ``self.publish()``."""

    name = "service"
    #: How long a graceful stop waits for the record in hand, s.
    stop_grace_s = 10.0
    #: True: ``start()`` returns without a broker and connects in the background (the collector,
    #: which buffers what it collects meanwhile); False: it waits ``kafka_start_wait_s`` at most.
    starts_without_broker = False

    def __init__(self, settings: ServiceSettings, producer: ProducerLike | None = None) -> None:
        self.settings = settings
        self.metrics = ServiceMetrics(self.name)
        self.producer: ProducerLike = producer or Producer(settings, self.metrics)
        token = settings.http_control_token
        self.http = HttpEndpoint(settings.http_host, settings.http_port, self.metrics, self.health,
                                 token.get_secret_value() if token is not None else None)  # fmt: skip
        self._consumers: list[Consumer] = []
        #: this instance among the service's workers: every consumer it builds sends it to its
        #: group's assignor, so its lanes get the same partition numbers (gpuwarden.shared.bus.assignor)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._tasks: list[asyncio.Task[Any]] = []
        self._consumer_tasks: dict[int, asyncio.Task[Any]] = {}
        self._started = False
        self.started_at: float | None = None
        self.failed: BaseException | None = None
        self.topic_problems: list[str] = []
        self.broker_wait: str | None = None
        """Why the service is still waiting for Kafka at start (None once connected)."""

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Connect, start consumers and tasks; returns when ready. Raises on broker errors."""
        if self._started:
            return
        self._started = True
        self.started_at = time.time()
        await self.http.start()
        if self.starts_without_broker:
            try:
                await self.producer.start()
            except (KafkaConnectionError, TimeoutError) as exc:
                self.broker_wait = f"no broker answers at {self.settings.bootstrap_servers}: {exc}"
                log.warning("%s: %s; running without it and connecting in the background", self.name, self.broker_wait)
                self.spawn(self._connect(None), "connect")
            else:
                await self._check_topics()
        else:
            await self._connect(self.settings.kafka_start_wait_s)
        await self.on_start()
        for c in self._consumers:
            await c.start()
            self._consumer_tasks[id(c)] = self.spawn(c.run(), f"consume:{','.join(c.topics)}")
        self.metrics.up.set(1)
        log.info("%s started (pid %s), http://%s:%s/healthz", self.name, os.getpid(), self.http.host, self.http.port)

    async def _connect(self, wait_s: float | None) -> None:
        """Start the producer, retrying while no broker answers (``KafkaConnectionError`` or a
        timeout; refused authentication or TLS is not retried) with exponential backoff from 1 to 30 s,
        for ``wait_s`` s in all (None: until it works); then check the topics.

        Raises:
            aiokafka.errors.KafkaConnectionError: still no broker after ``wait_s``.
        """
        import tenacity

        def waiting(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            self.broker_wait = f"no broker answers at {self.settings.bootstrap_servers}: {exc}"
            nxt = state.next_action.sleep if state.next_action is not None else 0.0
            log.warning("%s: %s; retrying in %.0f s", self.name, self.broker_wait, nxt, extra={"rate_limited": True})

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type((KafkaConnectionError, TimeoutError)),
            wait=tenacity.wait_exponential(multiplier=1, min=1, max=30),
            stop=tenacity.stop_never if wait_s is None else tenacity.stop_after_delay(wait_s),
            before_sleep=waiting,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self.producer.start()
        if self.broker_wait is not None:
            log.info("%s: connected to Kafka at %s", self.name, self.settings.bootstrap_servers)
        self.broker_wait = None
        await self._check_topics()

    async def stop(self) -> None:
        """Graceful: each consumer finishes the record in hand and commits only what was
        handled (the rest of its batch is handed back), then the other tasks are cancelled and
        the producer flushed. Safe before start and twice."""
        if not self._started:
            return
        self._started = False
        ctasks, self._consumer_tasks = self._consumer_tasks, {}
        for c in self._consumers:
            await c.stop_gracefully(ctasks.get(id(c)), self.stop_grace_s)
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.on_stop()
        await self.producer.stop()
        await self.http.stop()
        self.metrics.up.set(0)
        log.info("%s stopped", self.name)

    async def _check_topics(self) -> None:
        """Validate the topics against the cluster at start (missing, under-replicated, a low
        ``min.insync.replicas``): each problem is logged as an error and listed in ``/healthz``
        (``topic_problems``); the service still starts (the topics are the operator's to fix
        with ``gpuwarden topics create``), unless not one topic exists on the prefix
        (:class:`~gpuwarden.shared.topics.TopicsMissing`, raised: a wrong prefix)."""
        if not isinstance(self.producer, Producer) or not self.settings.bootstrap_servers:
            return
        from aiokafka.errors import TopicAuthorizationFailedError

        from .topics import TopicsMissing, check_topics

        try:
            problems = await check_topics(
                self.settings.bootstrap_servers,
                self.settings.topic_prefix,
                client_kwargs=self.settings.kafka_kwargs(),
                none_is_fatal=True,
            )
        except (TopicsMissing, TopicAuthorizationFailedError):
            raise  # a wrong prefix or no ACLs: say so now, not 40 s later as an unknown-topic error
        except Exception as exc:
            log.warning("%s: cannot check the topics on the cluster: %s", self.name, exc)
            return
        self.topic_problems = problems
        for p in problems:
            log.error("%s: topic check: %s", self.name, p)

    async def on_start(self) -> None:
        """Hook: register consumers and tasks."""

    async def on_stop(self) -> None:
        """Hook: release resources (called before the producer is flushed)."""

    def health(self) -> dict[str, Any]:
        """``status``: ``ok``; ``degraded`` while the broker does not confirm deliveries
        (``broker: unreachable``; HTTP 503); ``failed`` after a task crashed; ``stopped``."""
        status = "ok" if self._started and self.failed is None else "failed" if self.failed else "stopped"
        state = getattr(self.producer, "broker_state", None)
        broker = state() if callable(state) else "ok"
        error = getattr(self.producer, "last_error", None) if broker != "ok" else None
        if self.broker_wait is not None:
            broker, error = "unreachable", self.broker_wait
        if status == "ok" and broker != "ok":
            status = "degraded"
        return {
            "service": self.name,
            "status": status,
            "broker": broker,
            "broker_error": error,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "error": repr(self.failed) if self.failed else None,
            "topic_problems": self.topic_problems,
        }

    # -- helpers -----------------------------------------------------------------
    def consume(
        self,
        topics: list[str],
        handler: Handler,
        group: str | None = None,
        *,
        listener: Any = None,
        commit_interval_s: float = 0.0,
        checkpoint: Any = None,
        fetch_min_bytes: int = 1,
    ) -> Consumer:
        """A :class:`~gpuwarden.shared.bus.Consumer` of ``topics`` in ``group`` (default the
        settings' group, else ``gpuwarden-<service>``), run and stopped with the service.

        ``listener`` (an aiokafka ``ConsumerRebalanceListener``), ``commit_interval_s`` and
        ``checkpoint`` are the consumer's (see there): a stateful stage passes all three.
        ``fetch_min_bytes`` > 1 batches a high-volume lane (the broker waits up to 100 ms for
        that much); leave it at 1 where latency matters (XIDs).
        """
        c = Consumer(
            self.settings,
            self.name,
            topics,
            group or self.settings.consumer_group or f"gpuwarden-{self.name}",
            handler,
            self.producer,
            self.metrics,
            self.settings.auto_offset_reset,
            listener=listener,
            commit_interval_s=commit_interval_s,
            fetch_min_bytes=fetch_min_bytes,
            worker_id=self.worker_id,
        )
        c.checkpoint = checkpoint
        self._consumers.append(c)
        return c

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(self._guard(coro, name), name=f"{self.name}:{name}")
        self._tasks.append(task)
        return task

    async def _guard(self, coro: Awaitable[Any], name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s: task %s crashed", self.name, name)
            self.failed = exc
            self.metrics.errors.labels("task").inc()
            raise

    async def publish(self, topic: str, key: str | None, value: BaseModel) -> None:
        await self.producer.publish(topic, key, value)

    async def wait_failed(self) -> BaseException:
        """Wait until a background task has crashed; returns its exception."""
        while True:
            for t in list(self._tasks):
                if t.done() and not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    assert exc is not None
                    return exc
            await asyncio.sleep(0.5)


async def _serve(factory: Callable[[], Lifecycle], ready: Callable[[], None] | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    service = factory()
    settings = getattr(service, "settings", None)
    if settings is not None:
        from .settings import unknown_settings

        for bad in unknown_settings(settings):  # a typo must not pass silently as "the default"
            log.warning("unknown setting %s: ignored", bad)
    try:
        await service.start()
        tune_gc(getattr(service, "settings", None))
        if ready:
            ready()
        waiters: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait())]
        wait_failed = getattr(service, "wait_failed", None)
        if wait_failed is not None:
            waiters.append(asyncio.create_task(wait_failed()))
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        rc = 0
        for d in done:
            if not d.cancelled() and isinstance(d.result(), BaseException):
                log.error("stopping after a crash: %r", d.result())
                rc = 1
        return rc
    finally:
        await service.stop()


def tune_gc(settings: Any) -> None:
    """Freeze what start-up allocated (modules, catalogs, settings: never garbage, never scanned
    again) and space the young-generation collections out to ``gc_young_threshold``
    allocations (``GPUWARDEN_GC_YOUNG_THRESHOLD``; 0 keeps Python's). A stage that keeps
    per-node state for a large fleet otherwise re-scans it in every older-generation pass."""
    import gc

    young = getattr(settings, "gc_young_threshold", 0)
    gc.freeze()
    if young:
        _, g1, g2 = gc.get_threshold()
        gc.set_threshold(young, g1, g2)


def kafka_start_hint(exc: BaseException, env: Mapping[str, str]) -> str:
    """The one line a service prints when Kafka refused its start: what failed and what to do.

    A broker that does not answer names the address and ``GPUWARDEN_KAFKA_START_WAIT_S``; a
    refused login or TLS handshake names the security settings; ``gpuwarden broker`` (the demo
    broker of the umbrella package, absent from a production install) is offered only when no
    address was set and that command exists."""
    servers = env.get("GPUWARDEN_BOOTSTRAP_SERVERS")
    where = servers or "127.0.0.1:9092 (the default: GPUWARDEN_BOOTSTRAP_SERVERS is not set)"
    if "Authorization" in type(exc).__name__:
        return (
            f"Kafka at {where} refused this principal: {type(exc).__name__}: {exc}; grant it the ACLs that "
            "`gpuwarden topics plan` prints for this service"
        )
    if not isinstance(exc, KafkaConnectionError):
        return (
            f"Kafka at {where} refused this client: {type(exc).__name__}: {exc}; check GPUWARDEN_SECURITY_PROTOCOL, "
            "the SASL user/password and the TLS files (GPUWARDEN_SASL_*, GPUWARDEN_SSL_*), and this principal's ACLs"
        )
    hint = (
        f"no Kafka broker answers at {where} ({exc}); check the address, the network and the listener's protocol; "
        "GPUWARDEN_KAFKA_START_WAIT_S=<s> makes the service wait for it at start"
    )
    if servers is None:
        from importlib.util import find_spec

        if find_spec("gpuwarden.sim") is not None:
            hint += "; for a local try: gpuwarden broker"
    return hint


def run_service(factory: Callable[[], Lifecycle], log_level: str | None = None) -> int:
    """Run a service until SIGTERM/SIGINT (graceful: commit offsets, flush producers).

    ``factory`` builds the settings and the service (so bad settings are reported here).
    Returns the process exit code: 0 after a signal, 1 after a task crashed, 2 when the
    settings are invalid or the service cannot start (Kafka unreachable, bad file): then a
    one-line ``error: ...`` goes to stderr instead of a traceback.
    """
    from aiokafka.errors import KafkaError
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from .settings import SETTINGS_JSON_HINT, describe_settings_error

    level = (log_level or os.environ.get("GPUWARDEN_LOG_LEVEL", "INFO")).upper()
    fmt = f"%(asctime)s %(levelname)s [{socket.gethostname()}:%(process)d] %(name)s: %(message)s"
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format=fmt)
    from .logfilter import limit_kafka_logging
    from .text import SafeFormatter

    for h in logging.getLogger().handlers:  # one record = one line, whatever names it carries
        h.setFormatter(SafeFormatter(fmt))

    limit_kafka_logging()
    try:
        return asyncio.run(_serve(factory))
    except ValidationError as exc:
        print(f"error: {describe_settings_error(exc)}", file=sys.stderr)
    except KafkaError as exc:
        print(f"error: {kafka_start_hint(exc, os.environ)}", file=sys.stderr)
    except SettingsError as exc:  # a value pydantic-settings could not decode (before validation)
        print(f"error: invalid settings: {exc} ({SETTINGS_JSON_HINT})", file=sys.stderr)
    except (ValueError, OSError) as exc:
        print(f"error: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 2
