"""Alerts for on-call: Alertmanager v2, Slack-compatible webhook, generic JSON webhook.

:class:`Alerter` groups and de-duplicates per (node, alert name, pattern): a firing alert is
sent once per group while it stays firing (Alertmanager also gets a periodic re-send so it
does not time the alert out), and a *resolved* notification is sent when it ends. Sinks are
behind the narrow :class:`AlertSink` protocol; :class:`MemoryAlertSink` is the test fake.
Webhook URLs and tokens are :class:`~pydantic.SecretStr` and are never logged.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import aiohttp
from pydantic import SecretStr

__all__ = [
    "Alert",
    "AlertSink",
    "Alerter",
    "AlertmanagerSink",
    "JsonWebhookSink",
    "MemoryAlertSink",
    "SlackSink",
    "alertmanager_payload",
    "rfc3339",
]

log = logging.getLogger(__name__)


def rfc3339(ts: float) -> str:
    """Epoch seconds as RFC 3339 UTC with milliseconds, e.g. ``2026-01-01T00:00:00.000Z``."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ts * 1000) % 1000:03d}Z"


@dataclass(frozen=True)
class Alert:
    """One alert. ``labels`` identify it (``alertname``, ``node``, ``pattern``, ``severity``,
    ``cluster``); ``annotations`` describe it (``summary``, ``description``)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None = None
    status: Literal["firing", "resolved"] = "firing"

    @property
    def key(self) -> tuple[str, str, str]:
        """The group/de-dup key: (node, alertname, pattern)."""
        return (self.labels.get("node", ""), self.labels.get("alertname", ""), self.labels.get("pattern", ""))


def alertmanager_payload(alerts: list[Alert], generator_url: str | None = None) -> list[dict[str, Any]]:
    """The body of ``POST /api/v2/alerts`` (a list of postable alerts)."""
    out: list[dict[str, Any]] = []
    for a in alerts:
        d: dict[str, Any] = {
            "labels": dict(a.labels),
            "annotations": dict(a.annotations),
            "startsAt": rfc3339(a.starts_at),
        }
        if a.ends_at is not None:
            d["endsAt"] = rfc3339(a.ends_at)
        if generator_url:
            d["generatorURL"] = generator_url
        out.append(d)
    return out


class AlertSink(Protocol):
    """Where alerts go. ``refresh``: wants active alerts re-sent periodically."""

    name: str
    refresh: bool

    async def send(self, alerts: list[Alert]) -> None:
        """Deliver ``alerts``; raise on failure (the :class:`Alerter` retries)."""
        ...


class MemoryAlertSink:
    """In-memory sink for tests: ``sent`` is every batch delivered."""

    name = "memory"

    def __init__(self, refresh: bool = False) -> None:
        self.refresh = refresh
        self.sent: list[list[Alert]] = []
        self.fail_times = 0

    async def send(self, alerts: list[Alert]) -> None:
        """Record the batch (or fail ``fail_times`` times first)."""
        if self.fail_times > 0:
            self.fail_times -= 1
            raise OSError("simulated delivery failure")
        self.sent.append(list(alerts))


class _HttpSink:
    def __init__(self, url: SecretStr, timeout_s: float, token: SecretStr | None = None) -> None:
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._token = token

    async def _post(self, body: Any) -> None:
        async with aiohttp.ClientSession(timeout=self._timeout) as s:
            headers = {"Authorization": f"Bearer {self._token.get_secret_value()}"} if self._token else {}
            async with s.post(self._url.get_secret_value(), json=body, headers=headers) as resp:
                if resp.status >= 300:
                    text = (await resp.text())[:300]
                    # the URL (it may carry a token) is deliberately not in the message
                    raise OSError(f"{self.name} answered HTTP {resp.status}: {text}")

    name = "http"


class AlertmanagerSink(_HttpSink):
    """Alertmanager v2: ``POST <base>/api/v2/alerts``.

    Args:
        base_url: e.g. ``http://alertmanager:9093`` (may carry basic auth, hence secret).
        generator_url: link put into ``generatorURL`` (e.g. the remediator's /status).
    """

    name = "alertmanager"
    refresh = True

    def __init__(self, base_url: SecretStr, generator_url: str | None = None, timeout_s: float = 5.0) -> None:
        url = base_url.get_secret_value().rstrip("/") + "/api/v2/alerts"
        super().__init__(SecretStr(url), timeout_s)
        self.generator_url = generator_url

    async def send(self, alerts: list[Alert]) -> None:
        """POST the alerts as Alertmanager's postable-alerts list."""
        await self._post(alertmanager_payload(alerts, self.generator_url))


class SlackSink(_HttpSink):
    """A Slack-compatible incoming webhook (``{"text": ...}``; also Mattermost, Rocket.Chat)."""

    name = "slack"
    refresh = False

    def __init__(self, url: SecretStr, timeout_s: float = 5.0) -> None:
        super().__init__(url, timeout_s)

    async def send(self, alerts: list[Alert]) -> None:
        """POST one message listing the alerts."""
        lines = []
        for a in alerts:
            icon = ":red_circle:" if a.status == "firing" else ":white_check_mark:"
            lines.append(
                f"{icon} *{a.status.upper()}* {a.labels.get('alertname', '')} on {a.labels.get('node', '-')}"
                f" ({a.labels.get('pattern', '-')}): {a.annotations.get('summary', '')}"
            )
        await self._post({"text": "\n".join(lines)})


class JsonWebhookSink(_HttpSink):
    """A generic JSON webhook (Alertmanager-webhook-like body: ``version``, ``status``,
    ``alerts`` with ``status``/``labels``/``annotations``/``startsAt``/``endsAt``);
    ``token`` is sent as ``Authorization: Bearer``."""

    name = "webhook"
    refresh = False

    def __init__(self, url: SecretStr, token: SecretStr | None = None, timeout_s: float = 5.0) -> None:
        super().__init__(url, timeout_s, token)

    async def send(self, alerts: list[Alert]) -> None:
        """POST the batch."""
        body = {
            "version": "1",
            "source": "gpuwarden-remediator",
            "status": "firing" if any(a.status == "firing" for a in alerts) else "resolved",
            "alerts": [{**p, "status": a.status} for a, p in zip(alerts, alertmanager_payload(alerts), strict=True)],
        }
        await self._post(body)


@dataclass
class Alerter:
    """Groups, de-duplicates and delivers alerts to every sink, with retries and backoff.

    Args:
        sinks: where to deliver (none: alerts are only logged).
        labels: labels added to every alert (e.g. ``cluster``).
        retries: retries per delivery after a failure; backoff_s doubles each time.
        repeat_s: re-send interval of firing alerts to sinks with ``refresh``.
        now: clock, epoch s.
    """

    sinks: list[AlertSink] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    retries: int = 2
    backoff_s: float = 0.2
    repeat_s: float = 60.0
    now: Callable[[], float] = time.time
    active: dict[tuple[str, str, str], Alert] = field(default_factory=dict)
    delivered: int = 0
    failed: int = 0
    _last_refresh: float = 0.0

    async def fire(
        self, alertname: str, node: str, pattern: str, severity: str, summary: str, description: str = ""
    ) -> bool:
        """Fire an alert; a group already firing is not sent again. Returns True if sent."""
        labels = {**self.labels, "alertname": alertname, "node": node, "pattern": pattern, "severity": severity}
        a = Alert(
            labels=labels, annotations={"summary": summary, "description": description or summary}, starts_at=self.now()
        )
        if a.key in self.active:
            return False
        self.active[a.key] = a
        await self._deliver([a], all_sinks=True)
        return True

    async def resolve(self, node: str, alertname: str | None = None, pattern: str | None = None) -> int:
        """Resolve the firing alerts of ``node`` (optionally only one name/pattern); returns how many."""
        keys = [
            k
            for k in self.active
            if k[0] == node and (alertname is None or k[1] == alertname) and (pattern is None or k[2] == pattern)
        ]
        if not keys:
            return 0
        now = self.now()
        done = [replace(self.active.pop(k), status="resolved", ends_at=now) for k in keys]
        await self._deliver(done, all_sinks=True)
        return len(done)

    async def tick(self) -> None:
        """Re-send firing alerts to refreshing sinks (Alertmanager) every ``repeat_s``."""
        now = self.now()
        if self.active and now - self._last_refresh >= self.repeat_s:
            self._last_refresh = now
            await self._deliver(list(self.active.values()), all_sinks=False)

    async def _deliver(self, alerts: list[Alert], all_sinks: bool) -> None:
        for sink in self.sinks:
            if not all_sinks and not sink.refresh:
                continue
            for attempt in range(self.retries + 1):
                try:
                    await sink.send(alerts)
                except (TimeoutError, OSError, aiohttp.ClientError) as exc:
                    if attempt == self.retries:
                        self.failed += 1
                        log.error("alert delivery to %s failed after %d tries: %s", sink.name, attempt + 1, exc)
                        break
                    await asyncio.sleep(self.backoff_s * 2**attempt)
                else:
                    self.delivered += 1
                    break
        for a in alerts:
            log.warning(
                "alert %s %s on %s (%s): %s",
                a.status,
                a.labels.get("alertname"),
                a.labels.get("node"),
                a.labels.get("pattern"),
                a.annotations.get("summary"),
            )
