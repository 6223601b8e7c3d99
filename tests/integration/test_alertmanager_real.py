"""The remediator's alerts through a real Alertmanager (Debian ``prometheus-alertmanager``, or
its image ``prom/alertmanager`` of the same version when ``tests/servers.py`` chooses containers)
with the route tree a site writes: ``severity="critical"`` pages, ``severity="warning"`` opens
a ticket, both webhooks into a small aiohttp receiver here. Checks what the receivers got and
what ``/api/v2/alerts`` shows, in dry-run (the default): a fatal XID 79 pages; and that
gpuwarden's own generic webhook body has the keys and types of Alertmanager's real one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiokafka import AIOKafkaProducer
from kafkatools import read
from pydantic import SecretStr

import server_containers
from factories import make_failure, node_states
from gpuwarden.remediator import Remediator, RemediatorSettings
from gpuwarden.remediator.alerts import Alerter, AlertmanagerSink, JsonWebhookSink
from gpuwarden.remediator.policy_file import PolicyAction, PolicyFile, PolicyRule
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import Action, FailureState, Remediation, Severity
from gpuwarden.sim.slurm import FakeSlurm
from prerequisites import give_up
from servers import ServerChoice, choose_server

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Receivers:
    """Webhook receivers: what Alertmanager posted to /pager and /ticket, and what gpuwarden's
    own generic webhook posted to /direct."""

    def __init__(self) -> None:
        self.got: dict[str, list[dict[str, Any]]] = {"pager": [], "ticket": [], "direct": []}

    def view(self, name: str) -> Any:
        async def handle(req: web.Request) -> web.Response:
            self.got[name].append(await req.json())
            return web.Response(text="ok")

        return handle

    def alerts(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        return [(a["status"], a) for body in self.got[name] for a in body["alerts"]]


def alertmanager_binary() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@pytest.fixture
def alertmanager_choice(docker_engine: bool) -> ServerChoice:
    """Alertmanager in a container, the Debian package's, or missing (see tests/servers.py)."""
    return choose_server("Alertmanager", os.environ, docker_engine, alertmanager_binary() is not None)


@pytest.fixture
async def receivers(alertmanager_choice: ServerChoice) -> AsyncIterator[tuple[Receivers, int]]:
    """The webhook receivers on a free port: on loopback, or on every interface when Alertmanager
    runs in a container (it posts to this host through the docker bridge)."""
    rec = Receivers()
    app = web.Application()
    for name in rec.got:
        app.router.add_post(f"/{name}", rec.view(name))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    bind = server_containers.BIND_FOR_CONTAINERS if alertmanager_choice == "container" else "127.0.0.1"
    await web.TCPSite(runner, bind, port).start()
    try:
        yield rec, port
    finally:
        await runner.cleanup()


SITE_CONFIG = """\
# what a site writes: page on critical, ticket on warning, the rest to nobody
global: {{resolve_timeout: 5m}}
route:
  receiver: blackhole
  group_by: [alertname, cluster, node]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 4h
  routes:
    - matchers: ['severity="critical"']
      receiver: pager
    - matchers: ['severity="warning"']
      receiver: ticket
receivers:
  - name: blackhole
  - name: pager
    webhook_configs: [{{url: 'http://{host}:{port}/pager', send_resolved: true}}]
  - name: ticket
    webhook_configs: [{{url: 'http://{host}:{port}/ticket', send_resolved: true}}]
"""


@pytest.fixture
def alertmanager(receivers: tuple[Receivers, int], alertmanager_choice: ServerChoice, tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager with SITE_CONFIG routing to ``receivers``; yields its base URL."""
    host = server_containers.HOST_FROM_CONTAINER if alertmanager_choice == "container" else "127.0.0.1"
    with _run_alertmanager(SITE_CONFIG.format(host=host, port=receivers[1]), alertmanager_choice, tmp_path) as base:
        yield base


SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"


@pytest.fixture
def shipped_alertmanager(
    receivers: tuple[Receivers, int], alertmanager_choice: ServerChoice, tmp_path: Path
) -> Iterator[str]:
    """A real Alertmanager with the shipped deploy/alertmanager/alertmanager.yml: its routes and
    inhibit rules as shipped, its two receivers pointed at ``receivers`` and its timers at 1 s."""
    import yaml

    host = server_containers.HOST_FROM_CONTAINER if alertmanager_choice == "container" else "127.0.0.1"
    cfg = yaml.safe_load(SHIPPED.read_text())
    cfg["route"].update(group_wait="1s", group_interval="1s")
    for r in cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = f"http://{host}:{receivers[1]}/{r['name']}"
    with _run_alertmanager(yaml.safe_dump(cfg), alertmanager_choice, tmp_path) as base:
        yield base


@contextlib.contextmanager
def _run_alertmanager(config: str, choice: ServerChoice, tmp_path: Path) -> Iterator[str]:
    """Alertmanager (container or the Debian package's binary) with ``config``, checked by
    ``amtool check-config`` first; yields its base URL once ready."""
    if choice == "missing":
        give_up("Debian package prometheus-alertmanager not installed (listed in deploy/debian-packages.txt)")
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(config)
    check = shutil.which("amtool")  # in the same Debian package
    if check is None and os.environ.get("CI"):
        pytest.fail("amtool not installed (Debian package prometheus-alertmanager)")
    if check:
        res = subprocess.run([check, "check-config", str(cfg)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stdout + res.stderr
    if choice == "container":
        with server_containers.alertmanager(cfg.read_text()) as base:
            yield base
        return
    binary = alertmanager_binary()
    assert binary is not None  # the choice said "local"
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"alertmanager not ready: {(tmp_path / 'alertmanager.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


class _Prod(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.1)


async def test_dry_run_xid79_pages_through_a_real_alertmanager_and_resolves(
    alertmanager: str, receivers: tuple[Receivers, int]
) -> None:
    rec, rport = receivers
    now = time.time()
    fake = FakeSlurm(nodes=node_states(8, now))
    settings = RemediatorSettings(
        remediator_cluster="prod-a",
        remediator_max_drain_fraction=1.0,
        remediator_console_url="https://console.example.org",
    )  # dry-run: the default
    policy = PolicyFile(
        rules=(
            PolicyRule(id="bus", pattern="gpu-fallen-off-bus", action=PolicyAction.DRAIN),
            PolicyRule(id="hot", pattern="thermal-throttle", action=PolicyAction.ALERT),
        )
    )
    alerter = Alerter(
        [
            AlertmanagerSink(SecretStr(alertmanager)),
            JsonWebhookSink(SecretStr(f"http://127.0.0.1:{rport}/direct"), external_url="http://gpuwarden"),
        ],
        labels={"cluster": "prod-a", "service": "gpuwarden-remediator"},
    )
    r = Remediator(settings, client=fake, producer=_Prod(), alerter=alerter, policy=policy)  # type: ignore[arg-type]
    await r.seed()
    xid = make_failure(
        failure_id="79e1a2b3c4d5e6f7", node="gpu-node-003", gpu_index=5, job_id="1001",
        severity=Severity.FATAL, first_seen=now - 30, last_seen=now - 1,
    )  # fmt: skip
    hot = make_failure(
        failure_id="7e57e57e57e57e57", pattern="thermal-throttle", node="gpu-node-005", gpu_index=2,
        job_id="1002", severity=Severity.WARNING, recommended_action=Action.ALERT,
        first_seen=now - 20, last_seen=now - 1,
    )  # fmt: skip
    assert (await r.handle_failure(xid)).decision.value == "dry-run"
    assert (await r.handle_failure(hot)).decision.value == "executed"
    assert fake.calls == []  # dry-run: Slurm untouched, but on-call hears it
    await _wait(lambda: rec.alerts("pager") and rec.alerts("ticket"))
    [(status, page)] = rec.alerts("pager")
    assert status == "firing"
    assert page["labels"] == {
        "alertname": "GpuwardenNodeDrained", "cluster": "prod-a", "service": "gpuwarden-remediator",
        "node": "gpu-node-003", "gpu": "5", "job_id": "1001", "pattern": "gpu-fallen-off-bus",
        "severity": "critical", "gpuwarden_severity": "fatal", "dry_run": "true",
    }  # fmt: skip
    assert "dry-run" in page["annotations"]["summary"]
    assert page["annotations"]["runbook_url"].endswith("/docs/runbooks/gpu-fallen-off-bus.md")
    assert page["generatorURL"] == "https://console.example.org/failures/79e1a2b3c4d5e6f7"
    [(_, ticket)] = rec.alerts("ticket")
    assert ticket["labels"]["pattern"] == "thermal-throttle" and ticket["labels"]["severity"] == "warning"
    assert ticket["labels"]["alertname"] == "GpuwardenFailure"
    # Alertmanager's own view: the episode's start
    async with aiohttp.ClientSession() as s, s.get(f"{alertmanager}/api/v2/alerts") as resp:
        active = await resp.json()
    [am_xid] = [a for a in active if a["labels"]["pattern"] == "gpu-fallen-off-bus"]
    assert am_xid["status"]["state"] == "active" and am_xid["receivers"][0]["name"] == "pager"
    assert am_xid["startsAt"].startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 30)))
    assert am_xid["generatorURL"] == page["generatorURL"]

    # the failure resolves: the page resolves, endsAt = the episode's last signal
    done = xid.model_copy(update={"state": FailureState.RESOLVED, "last_seen": time.time()})
    await r.handle_failure(done)
    await _wait(lambda: any(s == "resolved" for s, _ in rec.alerts("pager")))
    [(_, resolved)] = [x for x in rec.alerts("pager") if x[0] == "resolved"]
    assert resolved["labels"] == page["labels"] and resolved["endsAt"] > resolved["startsAt"]

    # gpuwarden's generic webhook speaks Alertmanager's webhook format: same keys, same types
    real, ours = rec.got["pager"][0], rec.got["direct"][0]
    assert set(ours) == set(real), set(ours) ^ set(real)
    assert {k: type(v) for k, v in ours.items()} == {k: type(v) for k, v in real.items()}
    assert set(ours["alerts"][0]) == set(real["alerts"][0])
    assert ours["version"] == real["version"] == "4"
    assert ours["commonLabels"] == real["commonLabels"]
    assert ours["alerts"][0]["labels"] == real["alerts"][0]["labels"]
    assert ours["alerts"][0]["startsAt"][:19] == real["alerts"][0]["startsAt"][:19]


async def test_remediator_service_dry_run_xid79_reaches_alertmanager_as_critical(
    alertmanager: str, receivers: tuple[Receivers, int], bus_env: dict[str, str], tmp_path: Path
) -> None:
    """The README's install path end to end: ``gpuwarden remediator`` as the unit runs it (its
    settings in the environment, dry-run by default), a fatal XID 79 failure on ``failures`` of a
    real Kafka, and the page in a real Alertmanager with the labels a site routes on."""
    rec, _ = receivers
    bs, prefix = bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"], bus_env["GPUWARDEN_TOPIC_PREFIX"]
    scenario = tmp_path / "cluster.yaml"
    scenario.write_text("name: am-service\nduration_s: 86400\ncluster: {nodes: 8}\n")
    port = free_port()
    env = {
        **os.environ,
        **bus_env,
        "GPUWARDEN_HTTP_PORT": str(port),
        "GPUWARDEN_REMEDIATOR_ALERTMANAGER_URL": alertmanager,
        "GPUWARDEN_REMEDIATOR_CLUSTER": "prod-a",
        "GPUWARDEN_REMEDIATOR_EXTERNAL_URL": "http://gpuwarden-central:9475",
        # no Slurm here: the simulated backend stands in for scontrol (dry-run touches neither)
        "GPUWARDEN_REMEDIATOR_BACKEND": "simulated",
        "GPUWARDEN_REMEDIATOR_SCENARIO": str(scenario),
        "GPUWARDEN_REMEDIATOR_STATE_FILE": str(tmp_path / "slurm-state.json"),
    }
    env.pop("GPUWARDEN_REMEDIATOR_ENFORCE", None)  # the default: dry-run
    gpuwarden = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "gpuwarden"
    log = (tmp_path / "remediator.log").open("wb")
    proc = subprocess.Popen([str(gpuwarden), "remediator"], env=env, stdout=log, stderr=subprocess.STDOUT)
    now = time.time()
    xid = make_failure(
        failure_id="79aa5e71ce0ff1ce", rule_id="xid-79-fallen-off-bus", node="gpu-node-003", gpu_index=5,
        job_id="1001", severity=Severity.FATAL, first_seen=now - 30, last_seen=now - 1,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as s:

            async def ready() -> bool:
                try:
                    async with s.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            deadline = time.monotonic() + 30
            while not await ready():
                assert proc.poll() is None, (tmp_path / "remediator.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "remediator not healthy within 30 s"
                await asyncio.sleep(0.2)
            p = AIOKafkaProducer(bootstrap_servers=bs)
            await p.start()
            try:
                await p.send_and_wait(f"{prefix}failures", xid.to_json(), key=b"gpu-node-003")
            finally:
                await p.stop()
            [raw] = await read(bs, f"{prefix}remediations", 1)
            rem = Remediation.model_validate_json(raw)
            assert rem.decision.value == "dry-run" and rem.dry_run and rem.node == "gpu-node-003"
            assert rem.failure_ids == [xid.failure_id]

            async def am_alerts() -> list[dict[str, Any]]:
                async with s.get(f"{alertmanager}/api/v2/alerts") as resp:
                    return [a for a in await resp.json() if a["labels"].get("node") == "gpu-node-003"]

            deadline = time.monotonic() + 20
            while not (active := await am_alerts()):
                assert time.monotonic() < deadline, (
                    "no alert in Alertmanager: " + (tmp_path / "remediator.log").read_text()[-3000:]
                )
                await asyncio.sleep(0.2)
        [a] = active
        assert a["labels"] == {
            "alertname": "GpuwardenNodeDrained", "cluster": "prod-a", "service": "gpuwarden-remediator",
            "node": "gpu-node-003", "gpu": "5", "job_id": "1001", "pattern": "gpu-fallen-off-bus",
            "severity": "critical", "gpuwarden_severity": "fatal", "dry_run": "true",
        }  # fmt: skip
        assert a["annotations"]["runbook_url"].endswith("/docs/runbooks/gpu-fallen-off-bus.md")
        assert "dry-run" in a["annotations"]["summary"]
        assert a["generatorURL"] == f"http://gpuwarden-central:9475/failures/{xid.failure_id}"
        assert a["status"]["state"] == "active" and [r["name"] for r in a["receivers"]] == ["pager"]
        assert a["startsAt"].startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 30)))
        await _wait(lambda: rec.alerts("pager"))  # and routed: the pager's webhook got it
        [(status, page)] = rec.alerts("pager")
        assert status == "firing" and page["labels"] == a["labels"] and not rec.alerts("ticket")
    finally:
        proc.terminate()
        rc = proc.wait(20)
        log.close()
    assert rc == 0, (tmp_path / "remediator.log").read_text()[-3000:]


@pytest.mark.parametrize("remediator", [True, False], ids=["with-remediator-alerts", "prometheus-only"])
async def test_one_xid79_is_one_page_with_the_shipped_alertmanager_config(
    shipped_alertmanager: str, receivers: tuple[Receivers, int], remediator: bool
) -> None:
    """Issue 26, point 3: an XID 79 fires, for one node, what the shipped Prometheus rules and the
    remediator send: GpuwardenFailureOpenFatal (gpu-fallen-off-bus), GpuwardenFailureOpenCritical
    (a gpu-missing that was not folded), GpuwardenGpuLost and the remediator's GpuwardenNodeDrained.
    With the shipped routes and inhibit rules the pager gets exactly one notification with one
    alert (the remediator's), nothing opens a ticket, and the others show as inhibited."""
    rec, _ = receivers
    node = "gpu-node-003"
    now = time.time()
    prom = [
        {"alertname": "GpuwardenFailureOpenFatal", "severity": "critical", "gpuwarden_severity": "fatal",
         "node": node, "gpu": "5", "pattern": "gpu-fallen-off-bus", "job_id": "1001"},
        {"alertname": "GpuwardenFailureOpenCritical", "severity": "critical", "gpuwarden_severity": "critical",
         "node": node, "gpu": "", "pattern": "gpu-missing", "job_id": "1001"},
        # the labels the shipped rule gives it (count by (node) ...: promtool tests the rule itself)
        {"alertname": "GpuwardenGpuLost", "severity": "warning", "node": node},
    ]  # fmt: skip
    body = [{"labels": lb, "annotations": {"summary": lb["alertname"]}} for lb in prom]
    async with aiohttp.ClientSession() as http, http.post(f"{shipped_alertmanager}/api/v2/alerts", json=body) as r:
        assert r.status == 200, await r.text()
    if remediator:
        al = Alerter([AlertmanagerSink(SecretStr(shipped_alertmanager))], labels={"cluster": "prod-a"})
        f = make_failure(node=node, gpu_index=5, severity=Severity.FATAL, first_seen=now - 5, last_seen=now)
        assert await al.fire("GpuwardenNodeDrained", node, f.pattern, "fatal", f"would drain {node}", gpu=5,
                             job_id="1001", dry_run=True, starts_at=f.first_seen, failure_id=f.failure_id)  # fmt: skip
    await asyncio.sleep(6)  # group_wait 1 s, group_interval 1 s: several rounds
    paged = "GpuwardenNodeDrained" if remediator else "GpuwardenFailureOpenFatal"
    pages = rec.alerts("pager")
    assert [(st, a["labels"]["alertname"]) for st, a in pages] == [("firing", paged)], pages
    assert rec.alerts("ticket") == []
    async with aiohttp.ClientSession() as http, http.get(f"{shipped_alertmanager}/api/v2/alerts") as r:
        shown = {a["labels"]["alertname"]: a["status"] for a in await r.json()}
    assert shown[paged]["state"] == "active"
    others = {"GpuwardenFailureOpenFatal", "GpuwardenFailureOpenCritical", "GpuwardenGpuLost"} - {paged}
    assert all(shown[n]["state"] == "suppressed" and shown[n]["inhibitedBy"] for n in others), shown


@pytest.mark.parametrize("case", ["drain-failed", "breaker-open"])
async def test_a_failed_drain_and_an_open_breaker_are_one_page_each(
    shipped_alertmanager: str, receivers: tuple[Receivers, int], case: str
) -> None:
    """The remediator's other critical alerts with what Prometheus fires for the same fault: a
    drain that failed (``GpuwardenRemediationFailed``, the rules' fatal failure of the node) and an
    open circuit breaker (``GpuwardenCircuitBreakerOpen``, the rules' ``GpuwardenRemediatorBreakerOpen``
    on its metric) each page once (they paged twice before inhibit rules 1 and 5 named them)."""
    rec, _ = receivers
    node = "gpu-node-003"
    now = time.time()
    if case == "drain-failed":
        prom = [{"alertname": "GpuwardenFailureOpenFatal", "severity": "critical", "gpuwarden_severity": "fatal",
                 "node": node, "gpu": "5", "pattern": "gpu-fallen-off-bus", "job_id": "1001"}]  # fmt: skip
        paged = "GpuwardenRemediationFailed"
    else:
        prom = [{"alertname": "GpuwardenRemediatorBreakerOpen", "severity": "critical", "job": "gpuwarden-remediator",
                 "instance": "c:9475"}]  # fmt: skip
        paged = "GpuwardenCircuitBreakerOpen"
    body = [{"labels": lb, "annotations": {"summary": lb["alertname"]}} for lb in prom]
    async with aiohttp.ClientSession() as http, http.post(f"{shipped_alertmanager}/api/v2/alerts", json=body) as r:
        assert r.status == 200, await r.text()
    from gpuwarden.remediator.remediation_alerts import RemediationAlerts

    sink = AlertmanagerSink(SecretStr(shipped_alertmanager))
    alerter = Alerter([sink], labels={"cluster": "prod-a"})
    alerts = RemediationAlerts(alerter, dry_run=False, generator_url=lambda _: None)
    if case == "drain-failed":
        f = make_failure(node=node, gpu_index=5, severity=Severity.FATAL, first_seen=now - 5, last_seen=now)
        await alerts.drain_failed(f, "scontrol: Unable to contact slurm controller")
    else:
        await alerts.breaker_open("3 of 20 nodes down (max 10 %)")
    await asyncio.sleep(6)  # group_wait 1 s, group_interval 1 s: several rounds
    pages = rec.alerts("pager")
    assert [(st, a["labels"]["alertname"]) for st, a in pages] == [("firing", paged)], pages
    assert rec.alerts("ticket") == []
    async with aiohttp.ClientSession() as http, http.get(f"{shipped_alertmanager}/api/v2/alerts") as r:
        shown = {a["labels"]["alertname"]: a["status"] for a in await r.json()}
    other = prom[0]["alertname"]
    assert shown[other]["state"] == "suppressed" and shown[other]["inhibitedBy"], shown
