"""The console's views (ConsoleState) and JSON endpoints, token and live events, over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from factories import make_failure
from gpuwarden.console.service import ConsoleService, ConsoleSettings
from gpuwarden.console.state import ConsoleState, gres_gpus
from gpuwarden.detector.jobreport import build_job_report
from gpuwarden.shared.models import (
    Action,
    Evidence,
    FailureState,
    JobState,
    JobWindow,
    NodeState,
    Remediation,
    RemediationDecision,
    Severity,
)

T0 = 1_700_000_000.0


def jw(gpu: int, s: float, util: float = 90.0) -> JobWindow:
    return JobWindow(
        job_id="1",
        node="n1",
        gpu_index=gpu,
        window_start=T0 + s,
        window_end=T0 + s + 10,
        samples=10,
        utilization_gpu_pct_mean=util,
        utilization_gpu_pct_max=util,
        power_w_mean=400.0,
    )


def rem(decision: RemediationDecision, reason: str, at: float) -> Remediation:
    return Remediation(
        remediation_id=f"r{at}",
        ts=T0,
        decided_at=T0 + at,
        node="n1",
        action=Action.DRAIN,
        argv=["scontrol", "update", "nodename=n1", "state=DRAIN"],
        dry_run=False,
        decision=decision,
        reason=reason,
    )


def loaded() -> ConsoleState:
    st = ConsoleState()
    st.apply("slurm.nodes", NodeState(node="n1", ts=T0, state="ALLOCATED", gres="gpu:h100:4(S:0-1)"))
    st.apply("slurm.nodes", NodeState(node="n2", ts=T0, state="IDLE", flags=["DRAIN"], gres="gpu:2"))
    job = JobState(job_id="1", ts=T0, state="RUNNING", nodes=["n1"], gpus={"n1": [0, 1, 2, 3]}, start_ts=T0)
    st.apply("slurm.jobs", job)
    ws = [jw(g, s) for g in range(4) for s in (0, 10, 20)]
    for w in ws:
        st.apply("job.windows", w)
    f = make_failure(
        failure_id="fx",
        node="n1",
        gpu_index=2,
        job_id="1",
        first_seen=T0 + 15,
        last_seen=T0 + 15,
        severity=Severity.FATAL,
        evidence=[Evidence(signal="xid", value=79, ts=T0 + 15, source="NVRM: Xid 79")],
    )
    st.apply("failures", f)
    st.apply(
        "failures",
        make_failure(failure_id="fw", node="n1", gpu_index=2, severity=Severity.WARNING, pattern="thermal-throttle"),
    )
    st.apply("failures", make_failure(failure_id="old", node="n1", gpu_index=0, state=FailureState.RESOLVED))
    st.apply("remediations", rem(RemediationDecision.EXECUTED, "drain-recommended", 1))
    st.apply("job.reports", build_job_report(job, ws, [f], 3.26))
    return st


def test_gres_gpus() -> None:
    assert gres_gpus("gpu:8") == 8 and gres_gpus("gpu:h100:4(S:0-1)") == 4 and gres_gpus("gpu:a:2,gpu:b:1") == 3
    assert gres_gpus(None) is None and gres_gpus("craynetwork:4") is None


def test_fleet_colours_each_gpu_by_its_worst_open_condition() -> None:
    st = loaded()
    fleet = {n["node"]: n for n in st.fleet()["nodes"]}
    assert [g["index"] for g in fleet["n1"]["gpus"]] == [0, 1, 2, 3] and len(fleet["n2"]["gpus"]) == 2
    g2 = fleet["n1"]["gpus"][2]
    assert (g2["severity"], g2["pattern"], g2["failure_id"], g2["job_id"]) == ("fatal", "gpu-fallen-off-bus", "fx", "1")
    assert fleet["n1"]["gpus"][0]["severity"] is None  # its failure resolved
    assert fleet["n2"]["drained"] and fleet["n2"]["gpus"][0]["job_id"] is None
    assert [f["failure_id"] for f in st.failure_rows()] == ["fx", "fw", "old"]  # open, worst first


def test_breaker_opens_on_a_refusal_and_closes_on_a_drain() -> None:
    st = ConsoleState()
    assert st.breaker()["open"] is False
    st.apply("remediations", rem(RemediationDecision.REFUSED, "circuit breaker: 3 drains in the last 600s (max 2)", 1))
    assert st.breaker() == {
        "open": True,
        "reason": "circuit breaker: 3 drains in the last 600s (max 2)",
        "since": T0 + 1,
    }
    st.apply("remediations", rem(RemediationDecision.EXECUTED, "drain-recommended", 2))
    assert st.breaker()["open"] is False


def test_evidence_and_job_gpus_series() -> None:
    st = loaded()
    ev = st.evidence("fx")
    assert ev is not None and ev["fault_ts"] == T0 + 15 and ev["series"] == "util"
    assert ev["lines"][0]["label"] == "n1 GPU 2" and ev["lines"][0]["points"][0] == [T0 + 10, 90.0]
    assert st.evidence("nope") is None
    gp = st.job_gpus("1", "power")
    assert gp is not None and len(gp["lines"]) == 4 and gp["lines"][0]["points"][-1] == [T0 + 30, 400.0]
    assert len(gp["per_gpu"]) == 4
    with pytest.raises(ValueError, match="series must be one of"):
        st.job_gpus("1", "bogus")


async def _get(s: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with s.get(url, **kw) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else await r.text())


async def test_endpoints_token_and_live_events() -> None:
    svc = ConsoleService(ConsoleSettings(http_port=0, console_token="tok", console_push_interval_s=0.05))
    svc.state = loaded()
    await svc.http.start()  # the HTTP side only: no broker in a unit test
    base = f"http://127.0.0.1:{svc.http.port}"
    auth = {"Authorization": "Bearer tok"}
    try:
        async with aiohttp.ClientSession() as s:
            assert (await _get(s, f"{base}/api/state"))[0] == 401
            assert (await _get(s, f"{base}/api/state", headers={"Authorization": "Bearer nope"}))[0] == 401
            status, page = await _get(s, f"{base}/")  # the page itself holds no data
            assert status == 200 and "/static/console.js" in page and "http" not in page.split("<body>")[1].lower()
            assert (await _get(s, f"{base}/static/console.js"))[0] == 200
            assert (await _get(s, f"{base}/static/../service.py"))[0] == 404
            status, state = await _get(s, f"{base}/api/state", headers=auth)
            assert status == 200 and state["fleet"]["nodes"][0]["node"] == "n1"
            assert state["jobs"][0]["job_id"] == "1" and "per_gpu" not in state["jobs"][0]
            assert state["remediations"][0]["decision"] == "executed" and state["breaker"]["open"] is False
            status, rep = await _get(s, f"{base}/api/jobs/1?token=tok")
            assert status == 200 and rep["gpu_count"] == 4 and len(rep["per_gpu"]) == 4
            assert (await _get(s, f"{base}/api/jobs/2", headers=auth))[0] == 404
            assert (await _get(s, f"{base}/api/jobs/1/gpus?series=x", headers=auth))[0] == 400
            status, ev = await _get(s, f"{base}/api/failures/fx/evidence", headers=auth)
            assert status == 200 and ev["pattern"] == "gpu-fallen-off-bus"
            assert (await _get(s, f"{base}/healthz"))[0] in (200, 503)  # open, as on every service
            async with s.get(f"{base}/api/events?token=tok") as r:
                assert r.headers["Content-Type"] == "text/event-stream"
                first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
                assert first == f"event: update\ndata: {svc.state.version}\n\n".encode()
                svc.state.apply("failures", make_failure(failure_id="new", node="n2", gpu_index=0))
                async with svc._changed:
                    svc._changed.notify_all()
                nxt = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
                assert nxt == f"event: update\ndata: {svc.state.version}\n\n".encode()
    finally:
        await svc.http.stop()
