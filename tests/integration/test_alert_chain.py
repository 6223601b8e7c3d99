"""Issue 26, point 3, end to end: one XID 79 gives one page, through the whole chain as a site
runs it.

Real Apache Kafka; the six services as processes on a simulated fleet (``gpuwarden simulate``'s
pipeline, an XID 79 on gpu-node-002 GPU 3); a real Prometheus (Debian's) scraping the
otlp-bridge's ``/metrics`` every second and evaluating the shipped rules
(``deploy/prometheus/gpuwarden-rules.yml``, unchanged) into a real Alertmanager running the
shipped ``deploy/alertmanager/alertmanager.yml`` with its own timers (group_wait 30 s) and its
two receivers pointed at webhooks here; the remediator sends its own alert to the same
Alertmanager. The pager must get exactly one notification for the fault; the alerts Prometheus
fires for it must reach Alertmanager and show as inhibited; nothing opens a ticket.

Nothing here posts an alert by hand (``test_alertmanager_real`` checks the config with alerts
written to match the rules' labels; this checks that the rules really give those labels).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_alertmanager_real import (  # noqa: F401 - alertmanager_choice, receivers: fixtures used here
    SHIPPED,
    Receivers,
    _run_alertmanager,
    alertmanager_binary,
    alertmanager_choice,
    free_port,
    receivers,
)

from gpuwarden.demo.runner import Pipeline
from gpuwarden.shared.scenario import load_scenario
from prerequisites import give_up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gpuwarden-rules.yml"
SCENARIO = ROOT / "tests" / "scenarios" / "gpu-fallen-off-bus.yaml"  # XID 79 on gpu-node-002 GPU 3 at 60 s
NODE = "gpu-node-002"
#: the shipped group_wait (30 s) and a margin: every group of the fault has been notified or
#: inhibited once this long has passed after its first alert
SETTLE_S = 40.0


@pytest.fixture
def shipped_am(receivers: tuple[Receivers, int], tmp_path: Path) -> Iterator[str]:  # noqa: F811 - the fixture
    """The shipped Alertmanager config as shipped (routes, timers, inhibit rules), its receivers'
    URLs pointed at ``receivers``; yields its base URL."""
    if alertmanager_binary() is None or shutil.which("prometheus") is None:
        give_up("Debian packages prometheus and prometheus-alertmanager needed (deploy/debian-packages.txt)")
    cfg = yaml.safe_load(SHIPPED.read_text())
    for r in cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = f"http://127.0.0.1:{receivers[1]}/{r['name']}"
    with _run_alertmanager(yaml.safe_dump(cfg), "local", tmp_path) as base:
        yield base


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


class _Prometheus:
    """Debian's Prometheus: scrapes ``target`` every second as ``gpuwarden-otlp-bridge``, the
    shipped rules evaluated every second, alerts to ``alertmanager``."""

    def __init__(self, target: str, alertmanager: str, workdir: Path) -> None:
        self.port = free_port()
        am = urllib.parse.urlparse(alertmanager).netloc
        config = workdir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{RULES}']\n"
            f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{am}']}}]}}]}}\n"
            "scrape_configs:\n"
            f"  - job_name: gpuwarden-otlp-bridge\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={workdir / 'prom-data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    async def ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            await asyncio.sleep(0.3)
        raise RuntimeError(f"prometheus not ready: {self.log_path.read_text()[-2000:]}")

    def firing(self) -> dict[str, dict[str, str]]:
        """alertname -> labels of the firing alerts of :data:`NODE`."""
        got = _get(f"http://127.0.0.1:{self.port}/api/v1/alerts")["data"]["alerts"]
        return {a["labels"]["alertname"]: a["labels"] for a in got
                if a["state"] == "firing" and a["labels"].get("node") == NODE}  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@pytest.mark.parametrize("remediator_alerts", [True, False], ids=["with-remediator-alerts", "prometheus-only"])
async def test_one_xid79_through_services_prometheus_and_alertmanager_is_one_page(
    remediator_alerts: bool,
    kafka_bootstrap: str,
    receivers: tuple[Receivers, int],  # noqa: F811 - the fixture
    shipped_am: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the remediator's alerts the page is its GpuwardenNodeDrained (Prometheus' alerts of the
    node inhibited); without them (a site that alerts from Prometheus only) it is the rules'
    GpuwardenFailureOpenFatal."""
    rec, _ = receivers
    if remediator_alerts:
        monkeypatch.setenv("GPUWARDEN_REMEDIATOR_ALERTMANAGER_URL", shipped_am)
    else:
        monkeypatch.delenv("GPUWARDEN_REMEDIATOR_ALERTMANAGER_URL", raising=False)
    paged = "GpuwardenNodeDrained" if remediator_alerts else "GpuwardenFailureOpenFatal"
    p = Pipeline(SCENARIO, load_scenario(SCENARIO), speed=5.0, bootstrap_servers=kafka_bootstrap,
                 workdir=tmp_path / "run")  # fmt: skip
    prom: _Prometheus | None = None
    try:
        await p.start()
        bridge = next(sp for sp in p.procs if sp.name == "otlp-bridge")
        prom = _Prometheus(f"127.0.0.1:{bridge.port}", shipped_am, tmp_path)
        await prom.ready()
        # the fault, found and decided; Prometheus fires on the bridge's gpuwarden_failure_open
        deadline = time.monotonic() + 150
        fired: dict[str, dict[str, str]] = {}
        while time.monotonic() < deadline:
            await p.poll()
            fired = prom.firing()
            decided = any(r.node == NODE for r in p.result.remediations)
            if "GpuwardenFailureOpenFatal" in fired and decided and rec.alerts("pager"):
                break
            await asyncio.sleep(0.5)
        found = [f for f in p.result.failures.values() if f.node == NODE]
        assert [f.pattern for f in found if f.pattern == "gpu-fallen-off-bus"], [f.pattern for f in found]
        assert "GpuwardenFailureOpenFatal" in fired, (fired, prom.log_path.read_text()[-2000:])
        fatal = fired["GpuwardenFailureOpenFatal"]
        assert (fatal["severity"], fatal["pattern"], fatal["gpu"]) == ("critical", "gpu-fallen-off-bus", "3"), fatal
        assert rec.alerts("pager"), "nothing paged"
        # every group of the fault notified or inhibited (the shipped group_wait is 30 s)
        end = time.monotonic() + SETTLE_S
        while time.monotonic() < end:
            await p.poll()
            await asyncio.sleep(1.0)
        pages = [(st, a["labels"]["alertname"]) for st, a in rec.alerts("pager") if a["labels"].get("node") == NODE]
        assert pages == [("firing", paged)], rec.got["pager"]
        assert rec.alerts("ticket") == [], rec.got["ticket"]
        shown = {
            a["labels"]["alertname"]: a["status"]
            for a in _get(f"{shipped_am}/api/v2/alerts")
            if a["labels"].get("node") == NODE
        }
        assert shown[paged]["state"] == "active", shown
        # what else Prometheus fired for the fault reached Alertmanager, inhibited by the page
        for name in set(prom.firing()) & {"GpuwardenFailureOpenFatal", "GpuwardenFailureOpenCritical"} - {paged}:
            assert shown[name]["state"] == "suppressed" and shown[name]["inhibitedBy"], (name, shown)
        print(f"\nalert chain: Prometheus fired {sorted(fired)}; paged {pages}; Alertmanager shows {shown}")
    finally:
        if prom is not None:
            prom.stop()
        await p.stop()
