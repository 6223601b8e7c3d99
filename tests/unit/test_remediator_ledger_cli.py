"""Ledger persistence, ``gpuwarden remediator status`` / ``reset-breaker`` (ledger and HTTP),
retries with backoff then alert (no loop), and the lease standby — against FakeSlurm."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from factories import make_failure
from gpuwarden.remediator import Alerter, MemoryAlertSink, Remediator, RemediatorSettings
from gpuwarden.remediator.cli import app
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.lease import LeaseBoard, MemoryLease
from gpuwarden.shared.models import Failure, NodeState, Severity
from gpuwarden.shared.models import RemediationDecision as D
from gpuwarden.sim.slurm import FakeSlurm

NOW = 2_000_000.0


class Prod(MemoryPublisher):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def failure(node: str, fid: str) -> Failure:
    return make_failure(failure_id=fid, node=node, severity=Severity.FATAL, gpu_index=0, first_seen=NOW,
                        last_seen=NOW, verdict="v", affected_gpus=1, usd_per_hour=3.0)  # fmt: skip


def make(ledger: Path, **kw: object) -> tuple[Remediator, FakeSlurm, MemoryAlertSink]:
    fake = FakeSlurm(nodes=[NodeState(node=f"gpu-node-{i:03d}", ts=NOW, state="IDLE") for i in range(1, 5)])
    sink = MemoryAlertSink()
    s = RemediatorSettings(
        remediator_enforce=True, remediator_ledger_file=ledger, remediator_retry_backoff_s=0.01, **kw
    )  # type: ignore[arg-type]
    return Remediator(s, client=fake, producer=Prod(), now=lambda: NOW, alerter=Alerter([sink])), fake, sink  # type: ignore[arg-type]


async def test_breaker_persists_status_and_reset_via_ledger(tmp_path: Path) -> None:
    led = tmp_path / "ledger.json"
    r, fake, _ = make(led)
    await r.seed()
    assert (await r.handle_failure(failure("gpu-node-003", "aaaaaaaa1"))).decision == D.EXECUTED
    assert (await r.handle_failure(failure("gpu-node-004", "bbbbbbbb2"))).decision == D.REFUSED  # 1 of 4 allowed
    cli = CliRunner()
    out = cli.invoke(app, ["status", "--ledger", str(led)])
    assert out.exit_code == 0, out.output
    assert "breaker: OPEN" in out.output and "gpu-node-003" in out.output and "aaaaaaaa1" in out.output
    assert "[breaker-fraction]" in out.output
    # a restarted remediator keeps the latched breaker (persisted)
    r2, _, _ = make(led)
    r2.client = fake
    await r2.seed()
    assert r2.history.breaker_reason and "gpu-node-003" in r2.history.drained
    out = cli.invoke(app, ["reset-breaker", "--ledger", str(led)])
    assert out.exit_code == 0 and "circuit breaker closed (was: [rule=breaker-fraction]" in out.output
    fake.nodes_map["gpu-node-003"] = fake.nodes_map["gpu-node-003"].model_copy(update={"flags": [], "reason": None})
    r2.nodes.clear()
    assert (await r2.handle_failure(failure("gpu-node-004", "cccccccc3"))).decision == D.EXECUTED
    assert r2.history.breaker_reason is None


async def test_status_and_reset_over_http(tmp_path: Path) -> None:
    r, _, _ = make(tmp_path / "l.json")
    r.history.breaker_reason = "tripped"
    await r.http.start()
    try:
        url = f"http://127.0.0.1:{r.http.port}"
        cli = CliRunner()
        out = await asyncio.to_thread(cli.invoke, app, ["status", "--url", url, "--json"])
        assert out.exit_code == 0 and '"open": true' in out.output
        # a control request needs the service's token (none set: refused)
        out = await asyncio.to_thread(cli.invoke, app, ["reset-breaker", "--url", url])
        assert out.exit_code == 1 and "401" in out.output and r.history.breaker_reason == "tripped"
        r.http.control_token = "s3cret-token-for-tests"
        out = await asyncio.to_thread(cli.invoke, app, ["reset-breaker", "--url", url, "--token", "wrong"])
        assert out.exit_code == 1 and "401" in out.output and r.history.breaker_reason == "tripped"
        out = await asyncio.to_thread(
            cli.invoke,
            app,
            ["reset-breaker", "--url", url],
            env={"GPUWARDEN_HTTP_CONTROL_TOKEN": "s3cret-token-for-tests"},
        )
        assert out.exit_code == 0 and "was: tripped" in out.output and r.history.breaker_reason is None
    finally:
        await r.http.stop()
    bad = CliRunner().invoke(app, ["status"])
    assert bad.exit_code == 2 and "--url" in bad.output


async def test_failed_drain_retries_with_backoff_then_alerts_and_never_loops(tmp_path: Path) -> None:
    r, fake, sink = make(tmp_path / "l.json", remediator_command_retries=2)
    await r.seed()
    fake.fail_with = 1
    f = failure("gpu-node-003", "dddddddd4")
    rem = await r.handle_failure(f)
    assert rem.decision == D.FAILED and "[rule=command]" in rem.reason
    assert len(fake.calls) == 3  # 1 try + 2 retries
    assert sink.sent[-1][0].labels["alertname"] == "GpuwardenRemediationFailed"
    again = await r.handle_failure(f)  # redelivered: no new attempt
    assert again.decision == D.SKIPPED and len(fake.calls) == 3


async def test_standby_replica_does_not_act(tmp_path: Path) -> None:
    board = LeaseBoard()
    a, _fa, _ = make(tmp_path / "a.json")
    b, fb, _ = make(tmp_path / "b.json")
    a.lease, b.lease = MemoryLease(board), MemoryLease(board)
    await a.lease.start()
    await b.lease.start()
    assert (await b.handle_failure(failure("gpu-node-003", "eeeeeeee5"))).decision == D.SKIPPED
    assert fb.calls == [] and not b.status()["active"] and a.status()["active"]


async def test_control_requests_need_the_token_and_the_same_origin(tmp_path: Path) -> None:
    """Issue 25: POST /breaker/reset without the token is 401 (also when no token is set), a
    cross-origin POST with the right token is 403, reads stay open."""
    import aiohttp

    r, _, _ = make(tmp_path / "l.json")
    r.history.breaker_reason = "tripped"
    await r.http.start()
    try:
        url = f"http://127.0.0.1:{r.http.port}"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/breaker/reset") as resp:
                assert resp.status == 401 and "GPUWARDEN_HTTP_CONTROL_TOKEN" in (await resp.json())["error"]
            r.http.control_token = "t0ken-t0ken-t0ken"
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "t0ken-t0ken-t0ken"}):
                async with s.post(f"{url}/breaker/reset", headers=headers) as resp:
                    assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
            good = {"Authorization": "Bearer t0ken-t0ken-t0ken"}
            async with s.post(f"{url}/breaker/reset", headers={**good, "Origin": "http://evil.example"}) as resp:
                assert resp.status == 403
            assert r.history.breaker_reason == "tripped"
            async with s.get(f"{url}/status") as resp:
                assert resp.status == 200
            async with s.post(f"{url}/breaker/reset", headers={**good, "Origin": url}) as resp:
                assert resp.status == 200 and (await resp.json())["was"] == "tripped"
            assert r.history.breaker_reason is None and r.http.refused == 5
    finally:
        await r.http.stop()
