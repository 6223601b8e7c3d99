"""The console in a real browser: Debian's headless ``chromium`` loads the page while the demo
scenario runs (six services on the embedded broker) and, without a reload, shows the injected
XID 79, its job's verdict and the drain decision as they arrive (read through the DevTools
protocol). ``GPUWARDEN_CONSOLE_SCREENSHOT=path.png`` also saves a screenshot of the page.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuwarden.console.service import ConsoleService, ConsoleSettings
from gpuwarden.demo.runner import Pipeline
from gpuwarden.shared.scenario import load_scenario
from prerequisites import give_up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "gpuwarden" / "demo" / "scenarios" / "demo-xid79.yaml"


def chromium() -> str:
    """The chromium binary; missing: a failure in CI (.ci/run installs it), else a skip."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        give_up("chromium is not installed (apt-get install chromium; deploy/debian-packages.txt)")
    assert exe is not None
    return exe


class DevTools:
    """A minimal Chrome DevTools protocol client over one page's websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self._ids)
        await self.ws.send_json({"id": i, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 30)
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    async def eval(self, expr: str) -> Any:
        r = await self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")


async def start_chromium(exe: str, profile: Path) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1700",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    buf = b""
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stderr.readline)
        if not line and proc.poll() is not None:
            break
        buf += line
        m = re.search(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise RuntimeError(f"chromium did not start: {buf[-2000:]!r}")


@contextlib.asynccontextmanager
async def browser_page(profile: Path, url: str) -> AsyncIterator[DevTools]:
    """Headless chromium (profile in ``profile``) with one page navigated to ``url``, driven over
    the DevTools protocol; the browser is killed on exit."""
    exe = chromium()
    browser, port = await start_chromium(exe, profile)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json") as r:
                page = next(t for t in await r.json() if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 << 20) as ws:
                cdp = DevTools(ws)
                await cdp.call("Page.enable")
                await cdp.call("Page.navigate", url=url)
                yield cdp
    finally:
        browser.kill()
        browser.wait(10)
        if browser.stderr is not None:
            browser.stderr.close()


async def test_console_shows_failure_verdict_and_drain_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chromium()
    monkeypatch.delenv("GPUWARDEN_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("GPUWARDEN_DETECTOR_REPORT_INTERVAL_S", "10")  # running verdicts every 10 s
    p = Pipeline(DEMO, load_scenario(DEMO), speed=1.0, workdir=tmp_path / "run")
    ui: ConsoleService | None = None
    try:
        await p.start()
        ui = ConsoleService(
            ConsoleSettings(bootstrap_servers=p.bootstrap, topic_prefix=p.prefix, http_port=0, console_token="s3cret")
        )
        await ui.start()
        url = f"http://127.0.0.1:{ui.http.port}/?token=s3cret"
        async with browser_page(tmp_path / "profile", url) as cdp:
            origin = None
            text, seen = "", {}
            deadline = time.monotonic() + 150
            want = {
                "failure": lambda t: "gpu-fallen-off-bus" in t and "gpu-node-003 GPU 5" in t,
                "verdict": lambda t: "fell off the bus (XID 79)" in t and "lost-to-failure" in t,
                "drain": lambda t: re.search(r"executed\s+drain\s+gpu-node-003", t) is not None,
                "live": lambda t: "live" in t,
            }
            while time.monotonic() < deadline and len(seen) < len(want):
                await p.poll()
                await asyncio.sleep(0.5)
                origin = origin or await cdp.eval("performance.timeOrigin")
                text = await cdp.eval("document.body ? document.body.innerText : ''") or ""
                for k, check in want.items():
                    if k not in seen and check(text):
                        seen[k] = round(time.monotonic() - (deadline - 150), 1)
            assert set(seen) == set(want), f"missing on the page: {set(want) - set(seen)}\n{text[-3000:]}"
            # updated in place, never reloaded: the document is the one first loaded
            assert await cdp.eval("performance.timeOrigin") == origin
            cells = await cdp.eval(
                "[...document.querySelectorAll('[data-node=\"gpu-node-003\"] .cell')].map(c => c.className)"
            )
            assert "cell sev-fatal" in cells, cells  # GPU 5's worst open condition colours it
            shot = os.environ.get("GPUWARDEN_CONSOLE_SCREENSHOT")
            if shot:
                await asyncio.sleep(2)
                await cdp.call(
                    "Emulation.setDeviceMetricsOverride", width=1400, height=1800, deviceScaleFactor=1, mobile=False
                )
                img = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                Path(shot).write_bytes(base64.b64decode(img["data"]))
            print(f"\nconsole: seen after {seen} s")
        # the token guards the API: no token, no state
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{ui.http.port}/api/state") as r:
            assert r.status == 401
    finally:
        if ui is not None:
            await ui.stop()
        await p.stop()


#: Text an attacker (or a careless admin's drain reason) could put into a failure record: HTML that
#: would run, a right-to-left override that disguises a name, a newline that forges a line.
HOSTILE_TEXT = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>gpu-\u202e100-edon\nINFO forged'


async def test_hostile_text_renders_escaped_in_a_real_browser(tmp_path: Path, bus_env: dict[str, str]) -> None:
    """Issue 25: a failure whose node and verdict carry HTML, a bidi override and a newline shows
    them as visible, inert text in headless Chromium: no element is created, no script runs, the
    override and the newline are printed as escapes."""
    from aiokafka import AIOKafkaProducer

    from factories import make_failure

    chromium()
    f = make_failure(failure_id="hostile-1", node="gpu-node-0\u202e10", verdict=f"XID 79: {HOSTILE_TEXT}")
    prod = AIOKafkaProducer(bootstrap_servers=bus_env["GPUWARDEN_BOOTSTRAP_SERVERS"])
    await prod.start()
    try:
        await prod.send_and_wait(f"{bus_env['GPUWARDEN_TOPIC_PREFIX']}failures", f.to_json(), key=b"gpu-node-010")
    finally:
        await prod.stop()
    ui = ConsoleService(ConsoleSettings(http_port=0, console_token="s3cret-console-token"))
    await ui.start()
    try:
        url = f"http://127.0.0.1:{ui.http.port}/?token=s3cret-console-token"
        async with browser_page(tmp_path / "profile", url) as cdp:
            text = ""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "onerror" not in text:
                await asyncio.sleep(0.5)
                text = await cdp.eval("document.body ? document.body.innerText : ''") or ""
            assert "<img src=x onerror=" in text and "<script>" in text, text[-2000:]  # shown as text
            assert "\u202e" not in text and "\\u202e" in text  # the override is visible, not applied
            assert "\\x0aINFO forged" in text  # the newline is an escape: no second line
            assert await cdp.eval("window.__pwned === undefined") is True
            assert await cdp.eval("document.querySelectorAll('img[src=\"x\"], body script').length") == 0
    finally:
        await ui.stop()
