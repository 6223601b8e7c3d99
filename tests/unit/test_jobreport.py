"""The job verdict (gpuwarden.detector.jobreport): breakdown by cause, adding up to the job's
GPU-hours; the accumulator's final/running reports; the detector publishing on ``job.reports``;
``gpuwarden report`` reading a run report; the Markdown form."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner, Result

from factories import make_failure
from gpuwarden.detector.jobreport import JobReporter, build_job_report, is_loss
from gpuwarden.detector.reportview import render_markdown
from gpuwarden.detector.service import DetectorService, DetectorSettings, admin_comment_argv
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import (
    Action,
    Category,
    Evidence,
    FailureState,
    JobReport,
    JobState,
    JobWindow,
    Severity,
    WasteCategory,
)

T0 = 1_700_000_000.0
GPUS = {"n1": [0, 1], "n2": [0, 1]}  # 4 GPUs, 100 s: 400 GPU-s = 0.111111 GPU-h


def job(state: str = "RUNNING", **kw: Any) -> JobState:
    base: dict[str, Any] = dict(
        job_id="7", ts=T0, state=state, user="u", nodes=sorted(GPUS), gpus=GPUS, start_ts=T0, end_ts=T0 + 3600
    )
    base.update(kw)
    return JobState.model_validate(base)


def win(node: str, gpu: int, start_s: float, util: float = 95.0, clock: float = 1900.0, **kw: Any) -> JobWindow:
    base: dict[str, Any] = dict(
        job_id="7",
        node=node,
        gpu_index=gpu,
        window_start=T0 + start_s,
        window_end=T0 + start_s + 10,
        samples=10,
        utilization_gpu_pct_mean=util,
        utilization_gpu_pct_max=min(100.0, util + 3) if util > 0 else 0.0,
        power_w_mean=500.0 if util > 5 else 70.0,
        power_limit_w=700.0,
        sm_clock_mhz_mean=clock,
        tensor_activity_pct_mean=50.0,
        memory_used_mib_max=70000.0,
    )
    base.update(kw)
    return JobWindow.model_validate(base)


def windows(until_s: float = 100, **per_gpu: Any) -> list[JobWindow]:
    return [
        win(n, i, s, **per_gpu.get(f"{n}:{i}", {}))
        for n, idx in GPUS.items()
        for i in idx
        for s in range(0, int(until_s), 10)
    ]


def hours(rep: JobReport) -> dict[str, float]:
    return {b.category.value: b.gpu_hours for b in rep.breakdown if b.gpu_hours}


def test_busy_job_is_all_busy_and_adds_up() -> None:
    rep = build_job_report(job(), windows(), [], 3.26, as_of=T0 + 100)
    assert rep.gpu_hours == 0.111111 and rep.gpu_count == 4 and rep.duration_s == 100
    assert hours(rep) == {"busy": 0.111111}
    assert rep.usd == 0.36 and rep.busy_pct == 100.0 and rep.waste_gpu_hours == 0
    assert rep.tensor_activity_pct_mean == 50.0 and rep.tensor_activity_gpus == 4
    assert rep.side == "none" and not rep.final and rep.end_ts is None
    assert [b.category for b in rep.breakdown] == list(WasteCategory)  # every category, fixed order


def test_straggler_wait_is_one_minus_the_clock_ratio_of_every_busy_window() -> None:
    slow = [win("n2", 1, s, clock=950.0 if s >= 30 else 1900.0) for s in range(0, 100, 10)]
    ws = [w for w in windows() if (w.node, w.gpu_index) != ("n2", 1)] + slow
    f = make_failure(
        failure_id="s1",
        pattern="straggler-gpu",
        rule_id="straggler-gpu",
        severity=Severity.WARNING,
        recommended_action=Action.ALERT,
        node="n2",
        gpu_index=1,
        job_id="7",
        first_seen=T0 + 60,
        last_seen=T0 + 90,
        evidence=[
            Evidence(
                signal="sm_clock_mhz_mean_vs_job_median",
                value=0.5,
                unit="ratio",
                threshold=0.85,
                ts=T0 + 40,
                source="job.windows",
            )
        ],
    )
    rep = build_job_report(job(), ws, [f], 3.26, as_of=T0 + 100)
    # onset at +40 (the window ending there is the first): windows 30..90, 7 x 4 GPUs x 10 s x (1 - 0.5)
    assert hours(rep) == {"busy": round((400 - 140) / 3600, 6), "straggler-wait": round(140 / 3600, 6)}
    [item] = [b for b in rep.breakdown if b.category is WasteCategory.STRAGGLER_WAIT]
    assert item.side == "cluster" and item.failure_ids == ["s1"] and item.usd == 0.13
    assert rep.findings[0].gpu_hours == round(140 / 3600, 6) and rep.side == "cluster"
    assert "GPU 1 on n2 runs at 0.5 x the job's median" in rep.verdict and "Cluster-side" in rep.verdict
    assert "straggler-wait" in rep.summary and len(rep.summary) <= 250


def test_lost_to_failure_from_the_onset_to_the_end_on_every_gpu_of_a_job_scope_failure() -> None:
    f = make_failure(job_id="7", node="n1", gpu_index=1, first_seen=T0 + 55, last_seen=T0 + 55, affected_gpus=4)
    ended = job("FAILED", ts=T0 + 100, end_ts=T0 + 100)
    rep = build_job_report(ended, windows(), [f], 3.26)
    # 45 s x 4 GPUs lost; the window 50..60 counts 5 s busy before the XID
    assert hours(rep) == {"busy": round(220 / 3600, 6), "lost-to-failure": round(180 / 3600, 6)}
    assert rep.final and rep.end_ts == T0 + 100 and rep.state == "FAILED"
    assert "fell off the bus" in rep.verdict and any("--exclude=n1" in r for r in rep.recommendations)
    assert rep.findings[0].side == "cluster" and rep.findings[0].usd == 0.16


def test_idle_partially_idle_and_no_telemetry() -> None:
    ws = [w for w in windows(until_s=50, **{"n1:0": {"util": 0.0}, "n1:1": {"util": 0.0}})]
    ws += [win(n, i, s, util=0.0) for n, idx in GPUS.items() for i in idx for s in (50, 60)]  # all idle
    rep = build_job_report(job(), ws, [], 3.26, as_of=T0 + 100)
    # 0..50: 2 idle GPUs while 2 work (partially idle); 50..70: all idle; 70..100: no windows
    assert hours(rep) == {
        "busy": round(100 / 3600, 6),
        "partially-idle": round(100 / 3600, 6),
        "idle": round(80 / 3600, 6),
        "no-telemetry": round(120 / 3600, 6),
    }
    assert any("without telemetry" in c for c in rep.cannot_determine)
    assert any("--gres" in r for r in rep.recommendations)


def test_hung_and_checkpoint_stall_windows_go_to_their_finding() -> None:
    hang = make_failure(
        failure_id="h",
        pattern="collective-hang",
        rule_id="collective-hang",
        category=Category.APPLICATION,
        recommended_action=Action.RESTART_JOB,
        node="n1",
        gpu_index=None,
        job_id="7",
        first_seen=T0 + 80,
        last_seen=T0 + 100,
        evidence=[Evidence(signal="power_ratio", value=0.2, threshold=0.35, ts=T0 + 60, source="job.windows")],
    )
    ckpt = make_failure(
        failure_id="c",
        pattern="checkpoint-stall",
        rule_id="checkpoint-stall",
        category=Category.EFFICIENCY,
        severity=Severity.INFO,
        recommended_action=Action.ALERT,
        node="n1",
        gpu_index=None,
        job_id="7",
        first_seen=T0 + 30,
        last_seen=T0 + 40,
        state=FailureState.RESOLVED,
        evidence=[Evidence(signal="stalled_window_share", value=0.3, threshold=0.15, ts=T0 + 10, source="job.windows")],
    )
    ws = windows(**{})
    ws = [
        w if not (20 <= w.window_start - T0 < 30) else w.model_copy(update={"utilization_gpu_pct_max": 1.0}) for w in ws
    ]
    rep = build_job_report(job(), ws, [hang, ckpt], 3.26, as_of=T0 + 100)
    assert hours(rep) == {
        "busy": round(160 / 3600, 6),
        "checkpoint-stall": round(40 / 3600, 6),  # the all-idle window 20..30 inside the episode
        "hung": round(200 / 3600, 6),  # windows 50..90: the one ending at the onset (+60) is the first
    }
    assert rep.side == "job" and "Job-side" in rep.verdict and not is_loss(hang)


def test_breakdown_must_add_up() -> None:
    rep = build_job_report(job(), windows(), [], 3.26, as_of=T0 + 100)
    bad = rep.model_dump()
    bad["gpu_hours"] = 1.0
    with pytest.raises(ValidationError, match="adds up"):
        JobReport.model_validate(bad)
    assert JobReport.model_validate_json(rep.to_json()) == rep  # the topic's JSON round-trips


def test_sums_are_exact_to_the_rounding_on_odd_spans() -> None:
    ws = [w for w in windows() if w.window_start - T0 != 30] + [win("n1", 0, 30, util=0.0)]
    rep = build_job_report(job(), ws, [], 2.99, as_of=T0 + 97.3)
    assert round(sum(b.gpu_hours for b in rep.breakdown), 6) == rep.gpu_hours == round(4 * 97.3 / 3600, 6)
    assert round(sum(b.usd for b in rep.breakdown), 2) == rep.usd


def test_reporter_final_on_end_running_when_due_and_requeue_restarts() -> None:
    r = JobReporter(3.26)
    assert r.observe(job()) == []
    for w in windows(until_s=60):
        r.observe(w)
    assert r.due("7", 100) is None
    running = r.due("7", 50)
    assert running is not None and not running.final and running.as_of == T0 + 60
    assert r.due("7", 50) is None  # nothing new since
    f = make_failure(job_id="7", node="n1", gpu_index=0, first_seen=T0 + 50, last_seen=T0 + 50, affected_gpus=4)
    r.observe(f)
    [final] = r.observe(job("COMPLETED", ts=T0 + 60, end_ts=T0 + 60))
    assert final.final and hours(final)["lost-to-failure"] == round(40 / 3600, 6)
    assert r.report("7") == final and r.observe(win("n1", 0, 70)) == []  # late windows of an ended job
    # a requeue ends one run; the next run starts afresh
    r2 = JobReporter(1.0)
    r2.observe(job())
    r2.observe(win("n1", 0, 0))
    [first] = r2.observe(job("REQUEUED", ts=T0 + 30))
    assert first.final and first.as_of == T0 + 30
    r2.observe(job(ts=T0 + 100, start_ts=T0 + 100))
    r2.observe(win("n1", 0, 100))
    again = r2.report("7")
    assert again is not None and again.start_ts == T0 + 100 and not again.final


def test_admin_comment_argv() -> None:
    assert admin_comment_argv("123_4", "a\nb  c") == ["scontrol", "update", "JobId=123_4", "AdminComment=a b c"]
    with pytest.raises(ValueError, match="not a Slurm job id"):
        admin_comment_argv("1;rm -rf /", "x")


async def test_detector_service_publishes_running_and_final_reports() -> None:
    out = MemoryPublisher()
    svc = DetectorService(DetectorSettings(detector_report_interval_s=30), producer=out)  # type: ignore[arg-type]
    await svc.handle("slurm.jobs", job())
    for w in windows(until_s=40):
        await svc.handle("job.windows", w)
    running = out.of("job.reports")
    assert len(running) == 1 and not running[0].final and running[0].as_of == T0 + 30
    await svc.handle("slurm.jobs", job("COMPLETED", ts=T0 + 40, end_ts=T0 + 40))
    final = out.of("job.reports")[-1]
    assert final.final and final.gpu_hours == round(4 * 40 / 3600, 6)
    assert [k for t, k, _ in out.sent if t == "job.reports"] == ["7", "7"]


def _run_file(tmp_path: Path, rep: JobReport) -> Path:
    """A run report file (``gpuwarden demo --report``'s shape) holding ``rep``."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"scenario": "x", "job_reports": [rep.model_dump(mode="json")]}))
    return path


def _report_cli(*args: str) -> Result:
    """``gpuwarden report ARGS`` through typer's test runner."""
    import typer

    from gpuwarden.detector.report_cli import report

    app = typer.Typer()
    app.command()(report)
    return CliRunner().invoke(app, list(args))


def test_report_command_reads_a_run_report_and_prints_markdown(tmp_path: Path) -> None:
    rep = build_job_report(job(), windows(), [], 3.26, as_of=T0 + 100)
    path = _run_file(tmp_path, rep)
    res = _report_cli("7", "--file", str(path), "--markdown")
    assert res.exit_code == 0, res.output
    assert "| **total** | **0.111111** | **0.36** | 100 % | | |" in res.output
    assert res.output == render_markdown(rep)
    res = _report_cli("7", "--file", str(path), "--json")
    assert res.exit_code == 0 and JobReport.model_validate_json(res.output) == rep
    res = _report_cli("8", "--file", str(path))
    assert res.exit_code == 1


def test_markdown_report_escapes_hostile_names_and_text(tmp_path: Path) -> None:
    """Issue 25: ``gpuwarden report --markdown`` with a job name, verdict, advice and a GPU row
    carrying Markdown/HTML, a newline and a bidi override: every line keeps its shape, nothing
    opens a link or inline HTML, the override is printed as an escape."""
    rep = build_job_report(job(), windows(), [], 3.26, as_of=T0 + 100)
    evil = "x | y <img src=x onerror=alert(1)> [link](http://evil) \u202etxt\n# forged heading"
    g0 = rep.per_gpu[0].model_copy(update={"node": f"gpu-node-001 | {evil}"})
    rep = rep.model_copy(
        update={"name": evil, "verdict": evil, "recommendations": [evil], "per_gpu": [g0, *rep.per_gpu[1:]]}
    )
    res = _report_cli("7", "--file", str(_run_file(tmp_path, rep)), "--markdown")
    assert res.exit_code == 0, res.output
    md = res.output
    assert "\u202e" not in md and "\\u202e" in md
    assert "\\<img src=x onerror=alert(1)\\>" in md
    assert re.search(r"(?<!\\)<img", md) is None and re.search(r"(?<!\\)\]\(http", md) is None
    assert not any(line.startswith("# forged") for line in md.splitlines())
    gpu_rows = [ln for ln in md.splitlines() if ln.startswith("| gpu-node-001")]
    assert len(gpu_rows) == 1 and gpu_rows[0].replace("\\|", "").count("|") == 10  # 9 cells: shape kept


@pytest.mark.parametrize("seed", range(12))
def test_due_gives_the_same_reports_with_and_without_the_settle_memo(seed: int) -> None:
    """:meth:`JobReporter._settled` starts at the GPU that held a pending report back last time
    (O(1) while it is unchanged). A reporter that always scans every GPU must publish the same
    reports after the same windows, whatever the windows' order: a loss failure on one GPU, a
    GPU that stops reporting, windows of a round arriving shuffled and a few rounds late."""
    import random

    rng = random.Random(seed)
    gpus = {f"n{k}": [0, 1, 2, 3] for k in range(4)}
    st = job(nodes=sorted(gpus), gpus=gpus)
    stopped = (f"n{rng.randrange(4)}", rng.randrange(4))
    ws = [
        win(n, i, s)
        for s in range(0, 400, 10)
        for n, idx in gpus.items()
        for i in idx
        if not ((n, i) == stopped and s >= 200)
    ]
    ws.sort(key=lambda w: w.window_start + rng.uniform(0, 40))  # late and out of order
    node, gpu = rng.choice([(n, i) for n, idx in gpus.items() for i in idx])
    failures = {
        rng.randrange(len(ws)): make_failure(failure_id=f"f{k}", job_id="7", node=node, gpu_index=gpu,
                                             first_seen=T0 + rng.uniform(50, 300), last_seen=T0 + 300)
        for k in range(3)
    }  # fmt: skip

    def run(memo: bool) -> list[tuple[int, float, str]]:
        rep = JobReporter(3.26)
        rep.observe(st)
        out = []
        for k, w in enumerate(ws):
            rep.observe(w)
            if k in failures:
                rep.observe(failures[k])
                rep.mark("7")
            if not memo:
                for j in rep._jobs.values():
                    j.unsettled = None
            got = rep.due("7", 60.0)
            if got is not None:
                out.append((k, got.as_of, got.model_dump_json()))
        return out

    with_memo = run(True)
    assert with_memo == run(False)
    assert with_memo, "reports were published"


def test_the_settle_memo_sees_a_new_job_state_even_when_its_object_id_is_reused() -> None:
    """The memo keyed on ``id(state)`` once; CPython gives a freed object's id to the next one,
    so a changed state (Slurm now names GPU 0 only) could leave a stale "not settled"."""
    rep = JobReporter(3.26)
    gpus2 = {"n1": [0, 1]}
    rep.observe(job(nodes=["n1"], gpus=gpus2, ts=T0 + 1))
    for s in range(0, 100, 10):
        rep.observe(win("n1", 0, s))
    for s in range(0, 50, 10):
        rep.observe(win("n1", 1, s))
    j = rep._jobs["7"]
    assert rep._settled(j, "7", T0 + 80) is False and j.unsettled is not None and j.unsettled[0] == ("n1", 1)
    for k in range(50):  # states come and go: ids are reused
        rep.observe(job(nodes=["n1"], gpus={"n1": [0]}, ts=T0 + 2 + k))
    assert rep._settled(j, "7", T0 + 80) is True  # GPU 1 is no longer the job's
