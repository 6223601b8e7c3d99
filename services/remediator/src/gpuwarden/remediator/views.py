"""The remediator's HTTP views, besides the common ``/healthz`` and ``/metrics``:
``POST /breaker/reset``, ``GET /status`` and ``GET /failures/<failure_id>`` (JSON)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from aiohttp import web

__all__ = ["RemediatorViews", "ViewsTarget"]


class ViewsTarget(Protocol):
    """What the views read and do (the :class:`~gpuwarden.remediator.service.Remediator`)."""

    @property
    def recent(self) -> Iterable[dict[str, Any]]: ...
    def status(self) -> dict[str, Any]: ...
    def reset_breaker(self, by: str) -> str | None: ...


class RemediatorViews:
    """The handlers over ``target``; :meth:`routes` lists them for the service's HTTP endpoint."""

    def __init__(self, target: ViewsTarget) -> None:
        self.target = target

    def routes(self) -> list[web.RouteDef]:
        """The route definitions, in the order they are served."""
        return [
            web.post("/breaker/reset", self.reset),
            web.get("/status", self.status),
            web.get("/failures/{failure_id}", self.failure),
        ]

    async def reset(self, _: web.Request) -> web.Response:
        """``POST /breaker/reset``: close a tripped breaker; ``{"breaker": "closed", "was": reason}``."""
        was = self.target.reset_breaker("HTTP POST /breaker/reset")
        return web.json_response({"breaker": "closed", "was": was})

    async def status(self, _: web.Request) -> web.Response:
        """``GET /status``: the remediator's status (breaker, drained nodes, recent decisions)."""
        return web.json_response(self.target.status())

    async def failure(self, req: web.Request) -> web.Response:
        """``GET /failures/<id>``: this remediator's recent decisions on one failure (an
        alert's generatorURL without a console); 404 when it has none."""
        fid = req.match_info["failure_id"]
        seen = [r for r in self.target.recent if fid in str(r.get("failure", "")).split(",")]
        if not seen:
            return web.json_response({"failure_id": fid, "error": "no recent decision on this failure"}, status=404)
        return web.json_response({"failure_id": fid, "decisions": seen})
