"""The console service: reads the topics, serves the page, its JSON views and live updates.

Read-only: it publishes nothing and takes no action. It reads ``slurm.nodes``, ``slurm.jobs``,
``failures``, ``remediations``, ``job.reports`` and ``job.windows`` from the beginning of
their retention without a consumer group (every console sees everything and commits nothing)
and serves, on ``GPUWARDEN_HTTP_HOST:GPUWARDEN_HTTP_PORT`` (127.0.0.1 by default):

* ``/`` the page (plain JS and SVG, no CDN) and ``/static/*``;
* ``/api/state`` everything at once; ``/api/fleet``, ``/api/failures``, ``/api/remediations``,
  ``/api/jobs``, ``/api/jobs/{id}`` (the JobReport), ``/api/jobs/{id}/gpus?series=util``,
  ``/api/failures/{id}/evidence``;
* ``/api/events`` server-sent events: ``update`` with the state version on each change
  (at most every ``GPUWARDEN_CONSOLE_PUSH_INTERVAL_S``);
* ``/healthz`` and ``/metrics`` as every service.

With ``GPUWARDEN_CONSOLE_TOKEN`` set, the API (``/api/*``, all the data) wants
``Authorization: Bearer TOKEN`` (or ``?token=TOKEN``: open the page as ``/?token=TOKEN`` and it
passes the token on); the page's own HTML/JS/CSS, ``/healthz`` and ``/metrics`` stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from importlib.resources import files
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from gpuwarden.shared.bus import MemoryPublisher, decode, kafka_consumer
from gpuwarden.shared.service import Service
from gpuwarden.shared.text import one_line

from .settings import ConsoleSettings
from .state import ConsoleState

__all__ = ["TOPICS", "ConsoleService", "ConsoleSettings"]

log = logging.getLogger(__name__)
TOPICS = ["slurm.nodes", "slurm.jobs", "failures", "remediations", "job.reports", "job.windows"]
_STATIC = {"console.js": "application/javascript", "console.css": "text/css", "index.html": "text/html"}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConsoleService(Service):
    name = "console"

    def __init__(self, settings: ConsoleSettings) -> None:
        super().__init__(settings, MemoryPublisher())  # read-only: nothing is ever published
        self.cs = settings
        self.state = ConsoleState(series_points=settings.console_series_points)
        self._changed = asyncio.Condition()
        self._reader: Any = None
        self.unreadable = 0
        g = self._guard_token
        self.http.extra_routes += [
            web.get("/", self._index),  # the page and its assets hold no data: open
            web.get("/static/{name}", self._static),
            web.get("/api/state", g(self._api(lambda r: self.state.snapshot()))),
            web.get("/api/fleet", g(self._api(lambda r: self.state.fleet()))),
            web.get("/api/failures", g(self._api(lambda r: {"failures": self.state.failure_rows()}))),
            web.get(
                "/api/remediations",
                g(
                    self._api(
                        lambda r: {"remediations": self.state.remediation_rows(), "breaker": self.state.breaker()}
                    )
                ),
            ),
            web.get("/api/jobs", g(self._api(lambda r: {"jobs": self.state.report_rows()}))),
            web.get("/api/jobs/{job_id}", g(self._job)),
            web.get("/api/jobs/{job_id}/gpus", g(self._job_gpus)),
            web.get("/api/failures/{failure_id}/evidence", g(self._evidence)),
            web.get("/api/events", g(self._events)),
        ]

    # -- reading the topics ----------------------------------------------------------------
    async def on_start(self) -> None:
        full = {self.settings.topic(t): t for t in TOPICS}
        self._reader = kafka_consumer(
            self.settings,  # bootstrap servers and the services' SASL/TLS settings
            *full,
            client_id=f"{self.settings.client_id}-console",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=200,
        )
        try:
            await self._reader.start()
        except BaseException:
            await self._reader.stop()
            raise
        self.spawn(self._read(full), "read")

    async def _read(self, full: dict[str, str]) -> None:
        while True:
            batches = await self._reader.getmany(timeout_ms=500, max_records=2000)
            changed = False
            for tp, recs in batches.items():
                short = full.get(tp.topic, tp.topic)
                self.metrics.messages_in.labels(short).inc(len(recs))
                for r in recs:
                    try:
                        v = decode(short, r.value)
                    except (ValueError, ValidationError):
                        self.unreadable += 1  # the services' own consumers dead-letter it
                        continue
                    changed = self.state.apply(short, v) or changed
            if changed:
                async with self._changed:
                    self._changed.notify_all()

    async def on_stop(self) -> None:
        r, self._reader = self._reader, None
        if r is not None:
            with contextlib.suppress(Exception):
                await r.stop()

    # -- HTTP ------------------------------------------------------------------------------
    def _guard_token(self, handler: Handler) -> Handler:
        token = self.cs.console_token

        async def guarded(request: web.Request) -> web.StreamResponse:
            if token:
                auth = request.headers.get("Authorization", "")
                given = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
                given = given or request.query.get("token")
                if not given or not hmac.compare_digest(given.encode(), token.encode()):
                    return web.json_response(
                        {"error": "unauthorized: send Authorization: Bearer TOKEN"},
                        status=401,
                        headers={"WWW-Authenticate": "Bearer"},
                    )
            resp = await handler(request)
            resp.headers.setdefault("Cache-Control", "no-store")
            resp.headers.setdefault("X-Content-Type-Options", "nosniff")
            return resp

        return guarded

    @staticmethod
    def _json(body: Any, status: int = 200) -> web.Response:
        """JSON of ``body`` with every string made one safe line (control and bidirectional
        characters escaped, :func:`gpuwarden.shared.text.one_line`); the page puts text in
        ``textContent`` only, so HTML in a name stays text."""
        return web.Response(body=orjson.dumps(_safe(body)), status=status, content_type="application/json")

    def _api(self, view: Callable[[web.Request], Any]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return self._json(view(request))

        return handler

    async def _index(self, _: web.Request) -> web.StreamResponse:
        return await self._static_file("index.html")

    async def _static(self, request: web.Request) -> web.StreamResponse:
        return await self._static_file(request.match_info["name"])

    async def _static_file(self, name: str) -> web.StreamResponse:
        if name not in _STATIC:
            return self._json({"error": f"no such file: {name}"}, 404)
        body = files(__package__).joinpath("static", name).read_bytes()
        return web.Response(
            body=body,
            content_type=_STATIC[name],
            headers={"Content-Security-Policy": "default-src 'self'; style-src 'self'; img-src 'self' data:"},
        )

    async def _job(self, request: web.Request) -> web.StreamResponse:
        rep = self.state.reports.get(request.match_info["job_id"])
        if rep is None:
            return self._json({"error": "no report of this job yet"}, 404)
        return self._json(rep.model_dump(mode="json"))

    async def _job_gpus(self, request: web.Request) -> web.StreamResponse:
        try:
            body = self.state.job_gpus(request.match_info["job_id"], request.query.get("series", "util"))
        except ValueError as exc:
            return self._json({"error": str(exc)}, 400)
        return self._json(body) if body is not None else self._json({"error": "unknown job"}, 404)

    async def _evidence(self, request: web.Request) -> web.StreamResponse:
        body = self.state.evidence(request.match_info["failure_id"])
        return self._json(body) if body is not None else self._json({"error": "unknown failure"}, 404)

    async def _wait_change(self, seen: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.state.version != seen)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: ``update`` (data: the state version) on change, a comment every 15 s."""
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )
        await resp.prepare(request)
        sent = -1
        quiet = 0.0
        try:
            while request.transport is not None and not request.transport.is_closing():
                if self.state.version != sent:
                    sent = self.state.version
                    quiet = 0.0
                    await resp.write(f"event: update\ndata: {sent}\n\n".encode())
                    await asyncio.sleep(self.cs.console_push_interval_s)
                    continue
                try:  # wake on a change; look at the connection every second
                    await asyncio.wait_for(self._wait_change(sent), 1.0)
                except TimeoutError:
                    quiet += 1.0
                    if quiet >= 15:
                        quiet = 0.0
                        await resp.write(b": keep-alive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp


def _safe(v: Any) -> Any:
    """``v`` with every string (keys too) passed through :func:`one_line` (no length cut)."""
    if isinstance(v, str):
        return one_line(v, 1 << 30)
    if isinstance(v, dict):
        return {(one_line(k, 1 << 30) if isinstance(k, str) else k): _safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_safe(x) for x in v]
    return v
