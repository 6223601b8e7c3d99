"""Alerts against a local aiohttp receiver that checks the Alertmanager v2 postable-alerts
schema; Slack and generic webhooks; grouping/de-dup, resolve, retries; secrets never logged."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from gpuwarden.remediator.alerts import Alerter, AlertmanagerSink, JsonWebhookSink, MemoryAlertSink, SlackSink

TOKEN = "s3cr3t-token-never-logged"


def _ts(v: Any) -> dt.datetime:
    assert isinstance(v, str) and v.endswith("Z"), v
    return dt.datetime.fromisoformat(v.replace("Z", "+00:00"))


def validate_postable_alerts(body: Any) -> None:
    """Alertmanager v2 ``postableAlerts``: a list of objects with required ``labels``
    (string map, non-empty), optional ``annotations`` (string map), ``startsAt``/``endsAt``
    (RFC 3339 date-time), ``generatorURL`` (URI); nothing else."""
    assert isinstance(body, list) and body, "postableAlerts must be a non-empty list"
    for a in body:
        assert isinstance(a, dict)
        assert set(a) <= {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}, set(a)
        assert isinstance(a["labels"], dict) and a["labels"]
        for m in (a["labels"], a.get("annotations", {})):
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in m.items())
        assert "alertname" in a["labels"]
        if "startsAt" in a and "endsAt" in a:
            assert _ts(a["endsAt"]) >= _ts(a["startsAt"])
        elif "startsAt" in a:
            _ts(a["startsAt"])
        if "generatorURL" in a:
            assert a["generatorURL"].startswith("http")


class Receiver:
    def __init__(self) -> None:
        self.am: list[Any] = []
        self.slack: list[Any] = []
        self.hook: list[tuple[Any, str | None]] = []
        self.fail_next = 0

    async def alerts(self, req: web.Request) -> web.Response:
        body = await req.json()
        try:
            validate_postable_alerts(body)
        except AssertionError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if self.fail_next:
            self.fail_next -= 1
            return web.Response(status=503, text="busy")
        self.am.append(body)
        return web.json_response({})

    async def slack_view(self, req: web.Request) -> web.Response:
        self.slack.append(await req.json())
        return web.Response(text="ok")

    async def hook_view(self, req: web.Request) -> web.Response:
        self.hook.append((await req.json(), req.headers.get("Authorization")))
        return web.json_response({"ok": True})


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/api/v2/alerts", rec.alerts)
    app.router.add_post(f"/services/{TOKEN}", rec.slack_view)
    app.router.add_post("/hook", rec.hook_view)
    runner = web.AppRunner(app, access_log=None)  # the receiver is not under test; its log would show the URL
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield rec, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_alertmanager_v2_fire_dedup_resolve(receiver: tuple[Receiver, str]) -> None:
    rec, base = receiver
    t = [1_800_000_000.0]
    al = Alerter(
        [AlertmanagerSink(SecretStr(base), generator_url="http://rem/status")],
        labels={"cluster": "c1"},
        now=lambda: t[0],
        repeat_s=30,
    )
    assert await al.fire("GpuwardenNodeDrained", "gpu-node-003", "gpu-fallen-off-bus", "fatal", "drained")
    assert not await al.fire("GpuwardenNodeDrained", "gpu-node-003", "gpu-fallen-off-bus", "fatal", "again")
    assert await al.fire("GpuwardenNodeDrained", "gpu-node-004", "gpu-fallen-off-bus", "fatal", "drained")
    assert len(rec.am) == 2 and al.failed == 0
    first = rec.am[0][0]
    assert first["labels"] == {
        "cluster": "c1",
        "alertname": "GpuwardenNodeDrained",
        "node": "gpu-node-003",
        "pattern": "gpu-fallen-off-bus",
        "severity": "critical",  # fatal is routed as critical, the original kept
        "gpuwarden_severity": "fatal",
    }
    assert first["annotations"]["runbook_url"].endswith("/docs/runbooks/gpu-fallen-off-bus.md")
    assert first["startsAt"] == "2027-01-15T08:00:00.000Z" and "endsAt" not in first
    assert first["annotations"]["summary"] == "drained" and first["generatorURL"] == "http://rem/status"
    t[0] += 31
    await al.tick()  # Alertmanager gets the still-firing alerts again (no timeout)
    assert len(rec.am) == 3 and len(rec.am[2]) == 2
    t[0] += 5
    assert await al.resolve("gpu-node-003") == 1
    res = rec.am[-1][0]
    assert res["labels"]["node"] == "gpu-node-003" and _ts(res["endsAt"]) > _ts(res["startsAt"])
    assert await al.resolve("gpu-node-003") == 0  # nothing firing: no duplicate resolve


async def test_receiver_rejects_a_bad_payload_and_alerter_retries(receiver: tuple[Receiver, str]) -> None:
    rec, base = receiver
    bad = [{"labels": {}, "startsAt": "yesterday"}]
    try:
        validate_postable_alerts(bad)
        raise RuntimeError("the schema check accepted an invalid payload")
    except AssertionError:
        pass
    rec.fail_next = 1
    al = Alerter([AlertmanagerSink(SecretStr(base))], backoff_s=0.01)
    await al.fire("X", "gpu-node-003", "p", "critical", "s")
    assert len(rec.am) == 1 and al.delivered == 1 and al.failed == 0
    rec.fail_next = 5
    await al.fire("Y", "gpu-node-003", "p", "critical", "s")
    assert al.failed == 1  # gave up after retries: no endless loop


async def test_slack_and_webhook_and_secrets_not_logged(
    receiver: tuple[Receiver, str], caplog: pytest.LogCaptureFixture
) -> None:
    rec, base = receiver
    caplog.set_level(logging.DEBUG)
    slack = SlackSink(SecretStr(f"{base}/services/{TOKEN}"))
    hook = JsonWebhookSink(SecretStr(f"{base}/hook"), token=SecretStr(TOKEN))
    dead = SlackSink(SecretStr(f"http://127.0.0.1:1/services/{TOKEN}"))
    al = Alerter([slack, hook, dead], backoff_s=0.01, retries=1)
    await al.fire("GpuwardenFailure", "gpu-node-004", "thermal-throttle", "critical", "hot GPU")
    await al.resolve("gpu-node-004")
    assert [m["text"].split()[1] for m in rec.slack] == ["*FIRING*", "*RESOLVED*"]
    assert "gpu-node-004" in rec.slack[0]["text"] and "thermal-throttle" in rec.slack[0]["text"]
    (fired, auth), (resolved, _) = rec.hook
    assert auth == f"Bearer {TOKEN}"
    assert fired["status"] == "firing" and fired["alerts"][0]["labels"]["pattern"] == "thermal-throttle"
    assert resolved["status"] == "resolved" and _ts(resolved["alerts"][0]["endsAt"]).year > 1
    assert al.failed == 2  # the unreachable sink, fire and resolve
    assert TOKEN not in caplog.text and "services/" not in caplog.text
    assert TOKEN not in repr(slack.__dict__) and TOKEN not in str(hook.__dict__)


async def test_memory_sink_grouping_per_node_and_pattern() -> None:
    sink = MemoryAlertSink()
    al = Alerter([sink])
    await al.fire("A", "n1", "p1", "critical", "s")
    await al.fire("A", "n1", "p2", "critical", "s")
    await al.fire("A", "n1", "p1", "critical", "s")
    assert [b[0].labels["pattern"] for b in sink.sent] == ["p1", "p2"]
    assert await al.resolve("n1", pattern="p2") == 1 and list(al.active) == [("n1", "A", "p1", "")]


async def test_node_cap_alerts_instead_of_draining_through_the_service(receiver: tuple[Receiver, str]) -> None:
    """Per-node cap per 7 days, end to end in the service: FakeSlurm, a local Alertmanager."""
    from gpuwarden.remediator import Remediator, RemediatorSettings
    from gpuwarden.remediator.policy_file import DEFAULT_POLICY
    from gpuwarden.shared.bus import MemoryPublisher
    from gpuwarden.shared.models import (
        Action,
        Category,
        CostEstimate,
        Failure,
        FailureState,
        NodeState,
        Remediation,
        Severity,
    )
    from gpuwarden.sim.slurm import FakeSlurm

    class Prod(MemoryPublisher):
        async def start(self) -> None: ...
        async def stop(self) -> None: ...

    rec, base = receiver
    clock = [1_800_000_000.0]
    fake = FakeSlurm(nodes=[NodeState(node=f"gpu-node-{i:03d}", ts=1.0, state="IDLE") for i in range(1, 5)])
    fake.now = lambda: clock[0]
    alerter = Alerter([AlertmanagerSink(SecretStr(base))], labels={"cluster": "c1"}, now=lambda: clock[0])
    settings = RemediatorSettings(
        remediator_enforce=True,
        remediator_max_per_node_per_week=2,
        remediator_max_drains_per_window=100,
        remediator_max_drain_fraction=1.0,
    )
    prod = Prod()
    r = Remediator(
        settings,
        client=fake,  # type: ignore[arg-type]
        producer=prod,  # type: ignore[arg-type]
        now=lambda: clock[0],
        alerter=alerter,
        policy=DEFAULT_POLICY.model_copy(update={"hold_down_s": 0.0}),
    )
    await r.seed()

    def fail(fid: str, state: FailureState = FailureState.OPEN) -> Failure:
        return Failure(
            failure_id=fid,
            pattern="gpu-fallen-off-bus",
            rule_id="xid-79",
            category=Category.HARDWARE,
            severity=Severity.CRITICAL,
            node="gpu-node-002",
            gpu_index=3,
            first_seen=clock[0] - 5,
            last_seen=clock[0] - 1,
            verdict="GPU 3 fell off the bus",
            recommended_action=Action.DRAIN,
            cost=CostEstimate(affected_gpus=8, usd_per_hour=26.08, gpu_hours_lost=0.1),
            state=state,
        )

    for fid in ("cap-1", "cap-2"):  # two drains (each resolved and resumed) within the week
        assert (await r.handle_failure(fail(fid))).decision.value == "executed"
        clock[0] += 3600
        await r.handle_failure(fail(fid, FailureState.RESOLVED))
        [resumed] = await r.resume_due()
        assert resumed.action == Action.RESUME and resumed.decision.value == "executed"
        clock[0] += 3600
    fired_before = len(rec.am)
    third = await r.handle_failure(fail("cap-3"))
    assert third.decision.value == "refused" and third.reason.startswith("[rule=node-cap]")
    assert third.action == Action.DRAIN and third.exit_code is None  # no command ran
    assert [c[1] for c in fake.calls] == ["DRAIN", "RESUME", "DRAIN", "RESUME"]  # no third drain
    assert not fake.nodes_map["gpu-node-002"].drained
    new = [a for batch in rec.am[fired_before:] for a in batch]
    [alert] = [a for a in new if a["labels"]["alertname"] == "GpuwardenRemediationRefused"]
    assert alert["labels"]["node"] == "gpu-node-002" and alert["labels"]["pattern"] == "gpu-fallen-off-bus"
    assert "node-cap" in alert["annotations"]["summary"] and "endsAt" not in alert
    published = [v for t, _, v in prod.sent if t == "remediations"]
    assert isinstance(published[-1], Remediation) and published[-1].decision.value == "refused"
    clock[0] += 7 * 86400  # a week later the cap has room again
    assert (await r.handle_failure(fail("cap-4"))).decision.value == "executed"


@pytest.mark.parametrize(
    ("sev", "routed"), [("fatal", "critical"), ("critical", "critical"), ("warning", "warning"), ("info", "info")]
)
def test_severity_is_mapped_for_routing_and_the_original_kept(sev: str, routed: str) -> None:
    from gpuwarden.remediator.alerts import alertmanager_severity

    assert alertmanager_severity(sev) == routed


def test_unknown_severity_is_an_error() -> None:
    from gpuwarden.remediator.alerts import alertmanager_severity

    with pytest.raises(ValueError, match="unknown severity 'page'"):
        alertmanager_severity("page")


def validate_am_webhook(body: Any) -> None:
    """Alertmanager's webhook notification (``version`` 4, as in its docs' example): every key
    a receiver written for Alertmanager reads, with the right types."""
    assert body["version"] == "4"
    for k in ("groupKey", "status", "receiver", "externalURL"):
        assert isinstance(body[k], str), k
    assert isinstance(body["truncatedAlerts"], int)
    for k in ("groupLabels", "commonLabels", "commonAnnotations"):
        assert all(isinstance(v, str) for v in body[k].values()), k
    assert body["status"] in ("firing", "resolved")
    for a in body["alerts"]:
        assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
        _ts(a["startsAt"])
        _ts(a["endsAt"])


async def test_webhook_posts_alertmanagers_webhook_format(receiver: tuple[Receiver, str]) -> None:
    rec, base = receiver
    t = [1_800_000_000.0]
    al = Alerter([JsonWebhookSink(SecretStr(f"{base}/hook"))], labels={"cluster": "c1"}, now=lambda: t[0])
    await al.fire(
        "GpuwardenNodeDrained",
        "gpu-node-003",
        "gpu-fallen-off-bus",
        "fatal",
        "would drain",
        gpu=5,
        job_id="1001",
        dry_run=True,
        starts_at=t[0] - 30,
        failure_id="abcdef0123456789",
        generator_url="http://console/failures/abcdef0123456789",
    )
    await al.resolve("gpu-node-003", pattern="gpu-fallen-off-bus", gpu=5, ends_at=t[0] + 40)
    (fired, _), (resolved, _) = rec.hook
    for body in (fired, resolved):
        validate_am_webhook(body)
    assert fired["groupKey"] == '{}:{alertname="GpuwardenNodeDrained", node="gpu-node-003"}'
    assert fired["commonLabels"]["severity"] == "critical" and fired["commonLabels"]["gpuwarden_severity"] == "fatal"
    [a] = fired["alerts"]
    assert a["labels"]["gpu"] == "5" and a["labels"]["job_id"] == "1001" and a["labels"]["dry_run"] == "true"
    assert a["startsAt"] == "2027-01-15T07:59:30.000Z" and a["endsAt"] == "0001-01-01T00:00:00Z"
    assert a["generatorURL"] == "http://console/failures/abcdef0123456789"
    assert a["annotations"]["failure_id"] == "abcdef0123456789"
    [r] = resolved["alerts"]
    assert resolved["status"] == "resolved" and r["endsAt"] == "2027-01-15T08:00:40.000Z"
    assert r["fingerprint"] == a["fingerprint"]  # the same alert, resolved


async def test_alerts_of_different_gpus_are_separate() -> None:
    sink = MemoryAlertSink()
    al = Alerter([sink])
    assert await al.fire("A", "n1", "gpu-missing", "critical", "s", gpu=1)
    assert await al.fire("A", "n1", "gpu-missing", "critical", "s", gpu=2)
    assert not await al.fire("A", "n1", "gpu-missing", "critical", "s", gpu=2)
    assert await al.resolve("n1", pattern="gpu-missing", gpu=1) == 1
    assert list(al.active) == [("n1", "A", "gpu-missing", "2")]
    assert "gpu" not in (await _fire_no_gpu()).labels  # unknown GPU: the label is absent, not empty


async def _fire_no_gpu() -> Any:
    sink = MemoryAlertSink()
    al = Alerter([sink])
    await al.fire("A", "n1", "telemetry-silent", "warning", "s")
    return sink.sent[0][0]


def test_every_pattern_and_remediator_alert_has_a_runbook_in_the_repo() -> None:
    from pathlib import Path

    from gpuwarden.remediator.alerts import RUNBOOK_BASE_URL, runbook_url
    from gpuwarden.shared.models import PATTERNS

    docs = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
    for p in [*sorted(PATTERNS), "breaker", "resume"]:
        url = runbook_url(p)
        assert url == f"{RUNBOOK_BASE_URL}/{p}.md"
        text = (docs / f"{p}.md").read_text()
        assert text.startswith("# "), p
        assert "## What to do" in text, p


async def test_hostile_text_reaches_receivers_as_one_escaped_line() -> None:
    """Issue 25: labels and annotations of an Alertmanager payload carry no control or bidi
    characters (a receiver's Slack/e-mail template shows them as written), and resolve finds it."""
    from gpuwarden.remediator.alerts import alertmanager_payload

    sink = MemoryAlertSink()
    al = Alerter([sink])
    node = "gpu-node-001\nINFO executed drain on gpu-node-002"
    await al.fire("GpuwardenFailure", node, "gpu-fallen-off-bus", "fatal", "GPU \u202e5 lost\x1b[2J", "a\r\nb")
    [alert] = sink.sent[0]
    body = alertmanager_payload([alert])[0]
    assert body["labels"]["node"] == "gpu-node-001\\x0aINFO executed drain on gpu-node-002"
    assert body["annotations"]["summary"] == "GPU \\u202e5 lost\\x1b[2J"
    assert body["annotations"]["description"] == "a\\x0d\\x0ab"
    for v in [*body["labels"].values(), *body["annotations"].values()]:
        assert v.isprintable(), v
    assert await al.resolve(node) == 1
