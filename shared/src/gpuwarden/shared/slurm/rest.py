""":class:`SlurmClient` on slurmrestd (aiohttp), over a unix socket or TCP.

Paths are versioned: ``/slurm/{version}/jobs``, ``/slurm/{version}/nodes``,
``/slurm/{version}/node/{name}``, ``/slurmdb/{version}/job/{id}`` (``version`` ``v0.0.38`` for
Slurm 22.05 ... ``v0.0.42`` for 24.11, ``v0.0.43`` for 25.05, ``v0.0.44`` for 25.11; the
setting ``slurm_watcher_rest_version``). ``v0.0.40`` / ``v0.0.41`` still work but are deprecated
by SchedMD: a warning is logged. The documents are parsed by the same pure parsers as
the CLI output (``parse_squeue_json``, ``parse_sinfo_json``, ``parse_sacct_json``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import aiohttp
import orjson

from ..models import JobState, NodeState
from ..retry import retry_async
from .client import CommandResult, SlurmError, check_reason
from .jsonparse import SinfoJsonParser, SqueueJsonParser, parse_sacct_json, parse_sinfo_json
from .names import validate_node_name

__all__ = ["DEPRECATED_VERSIONS", "AiohttpTransport", "HttpTransport", "RestSlurm"]

log = logging.getLogger(__name__)

_NODE_UPDATE_MIN = (0, 0, 39)  # POST /slurm/vX/node/{name} exists from v0.0.39 (Slurm 23.02)
_NEWEST_TESTED = (0, 0, 44)  # Slurm 25.11
DEPRECATED_VERSIONS = frozenset({"v0.0.40", "v0.0.41"})
"""slurmrestd plugin versions SchedMD marks deprecated (dropped by later releases)."""


class HttpTransport(Protocol):
    """One HTTP request to slurmrestd. Returns ``(status, body)``; raises ``OSError`` /
    ``TimeoutError`` when the server cannot be reached."""

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]: ...


class AiohttpTransport:
    """:class:`HttpTransport` on aiohttp.

    Args:
        url: ``unix:/path/to/slurmrestd.sock`` or ``http://host:port``.
        token: sent as ``X-SLURM-USER-TOKEN`` (auth/jwt); ``None`` = no token header (rest_auth/local).
        user: sent as ``X-SLURM-USER-NAME`` with a token.
        timeout_s: per request, s.
    """

    def __init__(self, url: str, token: str | None = None, user: str | None = None, timeout_s: float = 10.0) -> None:
        if url.startswith("unix:"):
            self.socket: str | None = url[len("unix:") :]
            self.base = "http://localhost"
        elif url.startswith(("http://", "https://")):
            self.socket = None
            self.base = url.rstrip("/")
        else:
            raise ValueError(f"slurmrestd url {url!r}: unix:/path or http(s)://host:port")
        self.headers = {"Accept": "application/json"}
        if token:
            self.headers["X-SLURM-USER-TOKEN"] = token
            if user:
                self.headers["X-SLURM-USER-NAME"] = user
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = aiohttp.UnixConnector(path=self.socket) if self.socket else aiohttp.TCPConnector()
            self._session = aiohttp.ClientSession(connector=conn, timeout=self.timeout, headers=self.headers)
        return self._session

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            async with self._sess().request(method, self.base + path, data=body, headers=headers) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            raise OSError(f"slurmrestd {method} {path}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _ver_tuple(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in v.lstrip("v").split("."))
    except ValueError as exc:
        raise ValueError(f"bad slurmrestd API version {v!r}: like v0.0.38") from exc


class RestSlurm:
    """:class:`SlurmClient` (and ``SlurmAccounting``) on slurmrestd.

    Args:
        transport: HTTP transport (tests pass a fake serving recorded documents).
        version: OpenAPI version of the paths, ``v0.0.38`` (Slurm 22.05) ... ``v0.0.44`` (25.11);
            ``v0.0.40`` / ``v0.0.41`` log a deprecation warning, a version newer than v0.0.44
            logs that it is untested (its documents are read with the known shapes).
        retries: extra attempts of a read after a transport error or HTTP 5xx.
        backoff_s: sleep before retry ``k`` is ``backoff_s * k``, s.
        now: clock of observations, epoch s.
    """

    def __init__(
        self,
        transport: HttpTransport,
        *,
        version: str = "v0.0.38",
        retries: int = 2,
        backoff_s: float = 0.5,
        now: Callable[[], float] = time.time,
    ) -> None:
        vt = _ver_tuple(version)
        if version in DEPRECATED_VERSIONS:
            log.warning(
                "slurmrestd API %s is deprecated by SchedMD and removed in later Slurm releases; "
                "use v0.0.42 (Slurm 24.11+), v0.0.43 (25.05+) or v0.0.44 (25.11+)",
                version,
            )
        elif vt > _NEWEST_TESTED:
            log.warning("slurmrestd API %s is newer than the tested v0.0.44; reading it with the known shapes", version)
        self.ver = version
        self.transport = transport
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.now = now
        self._squeue = SqueueJsonParser()  # reuses unchanged job records between polls
        self._sinfo = SinfoJsonParser()

    async def close(self) -> None:
        """Close the transport's connections (if it has any)."""
        close = getattr(self.transport, "close", None)
        if close is not None:
            await close()

    async def _get(self, path: str, *, ok_404: bool = False) -> tuple[int, bytes]:
        """GET with retries. ``ok_404``: a 404, or an error document saying the object does
        not exist (22.05 answers an unknown node with HTTP 500 + "Invalid node name"), is
        returned instead of raised/retried."""

        async def attempt() -> tuple[int, bytes]:
            try:
                status, body = await self.transport.request("GET", path)
            except (OSError, TimeoutError) as exc:
                log.warning("slurmrestd GET %s: %s", path, str(exc) or type(exc).__name__)
                raise
            if ok_404 and _not_found(body):
                return 404, body
            if 400 <= status < 500 and not (ok_404 and status == 404):
                raise SlurmError(f"slurmrestd GET {path}: HTTP {status}: {body[:300]!r}")
            return status, body

        try:
            status, body = await retry_async(
                attempt,
                retries=self.retries,
                first_delay_s=self.backoff_s,
                growth="linear",
                retry_on=(OSError, TimeoutError),
                retry_if=lambda sb: sb[0] >= 500,
            )
        except (OSError, TimeoutError) as exc:
            raise SlurmError(f"slurmrestd GET {path} failed: {str(exc) or type(exc).__name__}") from exc
        if status >= 500:
            raise SlurmError(f"slurmrestd GET {path} failed: HTTP {status}: {body[:200]!r}")
        return status, body

    async def jobs(self) -> list[JobState]:
        """``GET /slurm/{v}/jobs``. GPU indices come from ``gres_detail``; running GPU jobs whose
        detail cannot be matched to nodes are logged and keep ``gpus={}``."""
        ts = self.now()
        _, body = await self._get(f"/slurm/{self.ver}/jobs")
        jobs, need = self._squeue.parse(body, ts)
        if need:
            log.info("slurmrestd: no per-node GPU indices for jobs %s", ",".join(need[:10]))
        return jobs

    async def nodes(self) -> list[NodeState]:
        """``GET /slurm/{v}/nodes``."""
        ts = self.now()
        _, body = await self._get(f"/slurm/{self.ver}/nodes")
        return self._sinfo.parse(body, ts)

    async def node(self, name: str) -> NodeState | None:
        """``GET /slurm/{v}/node/{name}``; ``None`` when slurmrestd answers "Invalid node name"."""
        validate_node_name(name)
        ts = self.now()
        status, body = await self._get(f"/slurm/{self.ver}/node/{name}", ok_404=True)
        doc = _doc(body)
        if status == 404 or (not doc.get("nodes") and doc.get("errors")):
            return None
        found = [n for n in parse_sinfo_json(body, ts) if n.node == name]
        return found[0] if found else None

    async def accounting(self, job_ids: Sequence[str]) -> list[JobState]:
        """``GET /slurmdb/{v}/job/{id}`` per id ("Nothing found" -> absent)."""
        out: list[JobState] = []
        for jid in job_ids:
            if not jid.replace("_", "").isdigit():
                raise ValueError(f"invalid job id {jid!r}")
            ts = self.now()
            status, body = await self._get(f"/slurmdb/{self.ver}/job/{jid}", ok_404=True)
            doc = _doc(body)
            if status == 404 or not doc.get("jobs"):
                continue
            out.extend(parse_sacct_json(body, ts))
        return out

    async def update_node(self, name: str, state: Literal["DRAIN", "RESUME"], reason: str | None) -> CommandResult:
        """``POST /slurm/{v}/node/{name}`` with ``{"state": [STATE], "reason": ...}`` (v0.0.39+).

        v0.0.38 (Slurm 22.05) has no node update: the result has exit code 2 and says so (use
        the ``cli`` backend to drain on 22.05). HTTP errors give exit code 1 and the body.

        Raises:
            ValueError: bad node name, unknown state, DRAIN without a valid reason.
        """
        validate_node_name(name)
        if state not in ("DRAIN", "RESUME"):
            raise ValueError(f"unsupported node state {state!r}: DRAIN or RESUME")
        body: dict[str, Any] = {"state": [state]}
        if state == "DRAIN":
            body["reason"] = check_reason(reason)
        path = f"/slurm/{self.ver}/node/{name}"
        argv = ["POST", path, orjson.dumps(body).decode()]
        t0 = time.monotonic()
        if _ver_tuple(self.ver) < _NODE_UPDATE_MIN:
            msg = f"slurmrestd {self.ver} has no node update (POST {path} needs v0.0.39+, Slurm 23.02+)"
            return CommandResult(argv, 2, "", msg, 0.0)
        try:
            status, resp = await self.transport.request("POST", path, orjson.dumps(body))
        except (OSError, TimeoutError) as exc:
            return CommandResult(argv, 124, "", f"slurmrestd unreachable: {exc}", time.monotonic() - t0)
        doc = _doc(resp)
        errs = doc.get("errors") or []
        rc = 0 if status < 300 and not errs else 1
        err = "" if rc == 0 else f"HTTP {status}: {orjson.dumps(errs).decode()[:500]}"
        return CommandResult(argv, rc, resp.decode(errors="replace")[:2000], err, time.monotonic() - t0)


_NOT_FOUND = ("Invalid node name", "Nothing found", "Invalid job id", "Unable to find")


def _not_found(body: bytes) -> bool:
    errs = _doc(body).get("errors") or []
    text = orjson.dumps(errs).decode() if isinstance(errs, list) else ""
    return any(m in text for m in _NOT_FOUND)


def _doc(body: bytes) -> dict[str, Any]:
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return d if isinstance(d, dict) else {}
