"""Alerts in every mode, through the service: a dry-run drain alerts exactly as an executed
one (same name and labels, ``dry_run="true"``), with GPU, job, episode times, runbook and
generatorURL; resolved, with the episode's end, when the failure resolves."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from factories import make_failure, node_states
from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.remediator.alerts import Alert, Alerter, MemoryAlertSink
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import Failure, FailureState, Severity
from gpuwarden.sim.slurm import FakeSlurm

NOW = 1_800_000_000.0


class MemProducer(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def xid79(state: FailureState = FailureState.OPEN, **kw: object) -> Failure:
    base: dict[str, object] = dict(
        failure_id="0123456789abcdef",
        node="gpu-node-003",
        gpu_index=5,
        job_id="1001",
        severity=Severity.FATAL,
        first_seen=NOW - 40,
        last_seen=NOW - 2 if state == FailureState.OPEN else NOW + 100,
        state=state,
    )
    base.update(kw)
    return make_failure(**base)


def make(enforce: bool, **kw: object) -> tuple[Remediator, FakeSlurm, MemoryAlertSink]:
    fake = FakeSlurm(nodes=node_states(8, NOW))
    fake.now = lambda: NOW
    sink = MemoryAlertSink()
    s = RemediatorSettings(remediator_enforce=enforce, remediator_cluster="c1", remediator_max_drain_fraction=1.0, **kw)  # type: ignore[arg-type]
    alerter = Alerter([sink], labels={"cluster": "c1", "service": "gpuwarden-remediator"}, now=lambda: NOW)
    r = Remediator(s, client=fake, producer=MemProducer(), now=lambda: NOW, alerter=alerter)  # type: ignore[arg-type]
    return r, fake, sink


def _only(sink: MemoryAlertSink) -> Alert:
    [[a]] = sink.sent
    return a


@pytest.mark.parametrize("enforce", [False, True])
async def test_a_fatal_xid79_alerts_in_dry_run_exactly_as_when_enforcing(enforce: bool) -> None:
    r, fake, sink = make(enforce, remediator_console_url="https://console.example/gw/")
    await r.seed()
    rem = await r.handle_failure(xid79())
    assert rem.decision.value == ("executed" if enforce else "dry-run")
    a = _only(sink)
    assert a.labels == {
        "cluster": "c1",
        "service": "gpuwarden-remediator",
        "alertname": "GpuwardenNodeDrained",
        "node": "gpu-node-003",
        "gpu": "5",
        "job_id": "1001",
        "pattern": "gpu-fallen-off-bus",
        "severity": "critical",
        "gpuwarden_severity": "fatal",
        "dry_run": "false" if enforce else "true",
    }
    assert a.starts_at == NOW - 40 and a.ends_at is None and a.status == "firing"
    assert a.generator_url == "https://console.example/gw/failures/0123456789abcdef"
    assert a.annotations["runbook_url"].endswith("/docs/runbooks/gpu-fallen-off-bus.md")
    assert a.annotations["failure_id"] == "0123456789abcdef"
    if enforce:
        assert a.annotations["summary"].startswith("gpuwarden drained gpu-node-003")
        assert fake.calls and fake.calls[0][1] == "DRAIN"
    else:
        assert "would drain (dry-run, not drained)" in a.annotations["summary"]
        assert fake.calls == []
    # resolved when the failure resolves, endsAt = the episode's last signal
    await r.handle_failure(xid79(FailureState.RESOLVED))
    assert len(sink.sent) == 2
    [res] = sink.sent[1]
    assert res.status == "resolved" and res.ends_at == NOW + 100 and res.labels == a.labels
    assert not r.alerter.active


async def test_generator_url_falls_back_to_the_remediators_failure_page() -> None:
    r, _, sink = make(False, remediator_external_url="http://central:9475")
    await r.seed()
    f = xid79(pattern="thermal-throttle", severity=Severity.CRITICAL, failure_id="feedfacefeedface")
    rem = await r.handle_failure(f)
    assert rem.decision.value == "dry-run"
    assert _only(sink).generator_url == "http://central:9475/failures/feedfacefeedface"
    req = make_mocked_request("GET", "/failures/feedfacefeedface", match_info={"failure_id": "feedfacefeedface"})
    resp = await r.views.failure(req)
    assert resp.status == 200 and b"feedfacefeedface" in resp.body  # type: ignore[operator]
    req = make_mocked_request("GET", "/failures/nope", match_info={"failure_id": "nope"})
    assert (await r.views.failure(req)).status == 404


async def test_no_generator_url_without_console_or_external_url() -> None:
    r, _, sink = make(False)
    await r.seed()
    await r.handle_failure(xid79())
    assert _only(sink).generator_url is None
