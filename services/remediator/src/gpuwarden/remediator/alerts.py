"""Alerts for on-call: Alertmanager v2, Slack-compatible webhook, generic JSON webhook.

:class:`Alerter` groups and de-duplicates per (node, alert name, pattern): a firing alert is
sent once per group while it stays firing (Alertmanager also gets a periodic re-send so it
does not time the alert out), and a *resolved* notification is sent when it ends. Sinks are
behind the narrow :class:`AlertSink` protocol; :class:`MemoryAlertSink` is the test fake.
Webhook URLs and tokens are :class:`~pydantic.SecretStr` and are never logged.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import aiohttp
from pydantic import SecretStr

from gpuwarden.shared.retry import retry_async
from gpuwarden.shared.text import one_line

__all__ = [
    "RUNBOOK_BASE_URL",
    "SEVERITY_MAP",
    "Alert",
    "AlertSink",
    "Alerter",
    "AlertmanagerSink",
    "JsonWebhookSink",
    "MemoryAlertSink",
    "SlackSink",
    "alertmanager_payload",
    "alertmanager_severity",
    "rfc3339",
    "runbook_url",
    "webhook_payload",
]

log = logging.getLogger(__name__)

#: gpuwarden severities -> the ``severity`` label that sites route on (Alertmanager convention:
#: ``critical`` pages, ``warning`` opens a ticket, ``info`` is informational). ``fatal`` would
#: miss a ``severity="critical"`` route, so it is sent as ``critical`` and kept as
#: ``gpuwarden_severity``.
SEVERITY_MAP: dict[str, str] = {"fatal": "critical", "critical": "critical", "warning": "warning", "info": "info"}

#: Where the per-pattern runbooks live (``docs/runbooks/<pattern>.md`` of the repository).
RUNBOOK_BASE_URL = "https://github.com/gpuwarden/gpuwarden/blob/main/docs/runbooks"


def alertmanager_severity(severity: str) -> str:
    """The routing ``severity`` label for a gpuwarden severity (:data:`SEVERITY_MAP`).

    Raises:
        ValueError: not one of ``fatal``, ``critical``, ``warning``, ``info``.
    """
    try:
        return SEVERITY_MAP[severity]
    except KeyError:
        raise ValueError(f"unknown severity {severity!r}; expected one of {sorted(SEVERITY_MAP)}") from None


def runbook_url(pattern: str, base: str = RUNBOOK_BASE_URL) -> str:
    """The runbook of ``pattern``: ``<base>/<pattern>.md`` (``base`` without a trailing slash)."""
    return f"{base.rstrip('/')}/{pattern}.md"


def rfc3339(ts: float) -> str:
    """Epoch seconds as RFC 3339 UTC with milliseconds, e.g. ``2026-01-01T00:00:00.000Z``."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ts * 1000) % 1000:03d}Z"


@dataclass(frozen=True)
class Alert:
    """One alert. ``labels`` identify it (``alertname``, ``severity`` for routing,
    ``gpuwarden_severity``, ``node``, ``gpu``, ``job_id``, ``pattern``, ``cluster``, ``dry_run``;
    a label whose value is unknown is absent, never empty); ``annotations`` describe it
    (``summary``, ``description``, ``runbook_url``, ``failure_id``). ``starts_at``/``ends_at``:
    epoch s (the failure's episode); ``generator_url``: the page of the failure, if any."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None = None
    status: Literal["firing", "resolved"] = "firing"
    generator_url: str | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        """The group/de-dup key: (node, alertname, pattern, gpu); ``gpu`` is ``""`` for a node-level alert."""
        lb = self.labels
        return (lb.get("node", ""), lb.get("alertname", ""), lb.get("pattern", ""), lb.get("gpu", ""))


def alertmanager_payload(alerts: list[Alert], generator_url: str | None = None) -> list[dict[str, Any]]:
    """The body of ``POST /api/v2/alerts`` (a list of postable alerts). ``generator_url`` is
    the fallback ``generatorURL`` for alerts that carry none of their own."""
    out: list[dict[str, Any]] = []
    for a in alerts:
        d: dict[str, Any] = {
            "labels": dict(a.labels),
            "annotations": dict(a.annotations),
            "startsAt": rfc3339(a.starts_at),
        }
        if a.ends_at is not None:
            d["endsAt"] = rfc3339(max(a.ends_at, a.starts_at))
        if a.generator_url or generator_url:
            d["generatorURL"] = a.generator_url or generator_url
        out.append(d)
    return out


_ZERO_TIME = "0001-01-01T00:00:00Z"  # what Alertmanager's webhook sends as endsAt of a firing alert


def webhook_payload(
    alerts: list[Alert], receiver: str = "gpuwarden", external_url: str = "", generator_url: str | None = None
) -> dict[str, Any]:
    """Alertmanager's webhook body (``version`` 4): ``receiver``, ``status``, ``alerts`` (each
    ``status``, ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``generatorURL``,
    ``fingerprint``), ``groupLabels``, ``commonLabels``, ``commonAnnotations``, ``externalURL``,
    ``truncatedAlerts`` and ``groupKey``, so a receiver written for Alertmanager parses it.
    The group is the batch (grouped by ``alertname``, ``node`` when they are common)."""
    if not alerts:
        raise ValueError("webhook_payload needs at least one alert")
    items: list[dict[str, Any]] = []
    for a, p in zip(alerts, alertmanager_payload(alerts, generator_url), strict=True):
        fp = hashlib.sha256("\x1f".join(f"{k}={v}" for k, v in sorted(a.labels.items())).encode()).hexdigest()[:16]
        items.append(
            {
                "status": a.status,
                "labels": p["labels"],
                "annotations": p["annotations"],
                "startsAt": p["startsAt"],
                "endsAt": p.get("endsAt", _ZERO_TIME),
                "generatorURL": p.get("generatorURL", ""),
                "fingerprint": fp,
            }
        )

    def common(maps: list[dict[str, str]]) -> dict[str, str]:
        first = maps[0]
        return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}

    common_labels = common([a.labels for a in alerts])
    group_labels = {k: common_labels[k] for k in ("alertname", "node") if k in common_labels}
    group_key = "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}"
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": "firing" if any(a.status == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": common_labels,
        "commonAnnotations": common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "alerts": items,
    }


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
    """A generic JSON webhook that gets Alertmanager's webhook format (:func:`webhook_payload`,
    receiver ``gpuwarden``), so receivers written for Alertmanager parse it; ``token`` is sent
    as ``Authorization: Bearer``."""

    name = "webhook"
    refresh = False

    def __init__(
        self, url: SecretStr, token: SecretStr | None = None, timeout_s: float = 5.0, external_url: str = ""
    ) -> None:
        super().__init__(url, timeout_s, token)
        self.external_url = external_url

    async def send(self, alerts: list[Alert]) -> None:
        """POST the batch as one Alertmanager webhook notification."""
        await self._post(webhook_payload(alerts, "gpuwarden", self.external_url))


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
    active: dict[tuple[str, str, str, str], Alert] = field(default_factory=dict)
    delivered: int = 0
    failed: int = 0
    _last_refresh: float = 0.0

    runbook_base: str = RUNBOOK_BASE_URL

    async def fire(
        self,
        alertname: str,
        node: str,
        pattern: str,
        severity: str,
        summary: str,
        description: str = "",
        *,
        gpu: int | None = None,
        job_id: str | None = None,
        dry_run: bool | None = None,
        starts_at: float | None = None,
        failure_id: str | None = None,
        generator_url: str | None = None,
        extra_labels: dict[str, str] | None = None,
    ) -> bool:
        """Fire an alert; a group already firing is not sent again. Returns True if sent.

        ``severity`` is gpuwarden's (``fatal``/``critical``/``warning``/``info``): the alert's
        ``severity`` label is :func:`alertmanager_severity` of it, the original is
        ``gpuwarden_severity``. ``gpu``/``job_id``/``dry_run`` become labels when given;
        ``starts_at`` (epoch s, default now) is the episode start; ``failure_id`` and the
        pattern's runbook (``runbook_url``) become annotations.

        Raises:
            ValueError: an unknown severity.
        """
        labels = {
            **self.labels,
            **(extra_labels or {}),
            "alertname": alertname,
            "node": node,
            "pattern": pattern,
            "severity": alertmanager_severity(severity),
            "gpuwarden_severity": severity,
        }
        if gpu is not None:
            labels["gpu"] = str(gpu)
        if job_id:
            labels["job_id"] = job_id
        if dry_run is not None:
            labels["dry_run"] = "true" if dry_run else "false"
        # what a receiver renders (Slack, e-mail, a pager): one safe line per value, whatever
        # the node name or driver text carried (gpuwarden.shared.text.one_line)
        labels = {k: one_line(v, 200) for k, v in labels.items()}
        ann = {"summary": one_line(summary, 1000), "description": one_line(description or summary, 4000)}
        if pattern:
            ann["runbook_url"] = runbook_url(pattern, self.runbook_base)
        if failure_id:
            ann["failure_id"] = failure_id
        a = Alert(
            labels=labels,
            annotations=ann,
            starts_at=self.now() if starts_at is None else starts_at,
            generator_url=generator_url,
        )
        if a.key in self.active:
            return False
        self.active[a.key] = a
        await self._deliver([a], all_sinks=True)
        return True

    async def resolve(
        self,
        node: str,
        alertname: str | None = None,
        pattern: str | None = None,
        *,
        gpu: int | None = None,
        ends_at: float | None = None,
    ) -> int:
        """Resolve the firing alerts of ``node`` (optionally only one name, pattern or GPU);
        ``ends_at`` (epoch s, default now) is the episode's end. Returns how many."""
        g = None if gpu is None else str(gpu)
        node = one_line(node, 200)  # as the label was written (fire)
        keys = [
            k
            for k in self.active
            if k[0] == node
            and (alertname is None or k[1] == alertname)
            and (pattern is None or k[2] == pattern)
            and (g is None or k[3] == g)
        ]
        if not keys:
            return 0
        end = self.now() if ends_at is None else ends_at
        done = [replace(self.active.pop(k), status="resolved", ends_at=end) for k in keys]
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
            try:
                await retry_async(
                    functools.partial(sink.send, alerts),
                    retries=self.retries,
                    first_delay_s=self.backoff_s,
                    retry_on=(TimeoutError, OSError, aiohttp.ClientError),
                )
            except (TimeoutError, OSError, aiohttp.ClientError) as exc:
                self.failed += 1
                log.error("alert delivery to %s failed after %d tries: %s", sink.name, self.retries + 1, exc)
            else:
                self.delivered += 1
        for a in alerts:
            log.warning(
                "alert %s %s on %s (%s): %s",
                a.status,
                a.labels.get("alertname"),
                a.labels.get("node"),
                a.labels.get("pattern"),
                a.annotations.get("summary"),
            )
