"""Job verdicts consistent with their failures (issue 24, part 3): a verdict is never taken
before a failure it counts and is the same however late the windows arrive; an open critical
or fatal failure is never "Nothing to do" and its action is named; each waste category names
its GPUs and time ranges (ISO-8601 UTC and seconds into the job); the advice on idle time fits
its cause (idle from the start: --gres; idle after working: a rank that died or hung)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from factories import make_failure
from gpuwarden.demo import inprocess
from gpuwarden.demo.scoring import RunResult
from gpuwarden.detector.jobreport import JobReporter, build_job_report
from gpuwarden.detector.jobreport.verdict import gpus_text, iso, time_range
from gpuwarden.detector.service import DetectorService, DetectorSettings
from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import (
    Action,
    Category,
    Failure,
    FailureState,
    JobReport,
    JobState,
    JobWindow,
    Severity,
    dumps,
)
from gpuwarden.shared.scenario import load_scenario
from prerequisites import need_path

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
GPUS = {"n1": [0, 1], "n2": [0, 1]}


def job(state: str = "RUNNING", gpus: dict[str, list[int]] | None = None, **kw: Any) -> JobState:
    gpus = GPUS if gpus is None else gpus
    base: dict[str, Any] = dict(job_id="7", ts=T0, state=state, user="u", nodes=sorted(gpus), gpus=gpus, start_ts=T0)
    base.update(kw)
    return JobState.model_validate(base)


def win(node: str, gpu: int, start_s: float, util: float = 95.0) -> JobWindow:
    return JobWindow(
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
        sm_clock_mhz_mean=1900.0,
        memory_used_mib_max=70000.0,
    )


def windows(a: float = 0, b: float = 100, idle: dict[str, tuple[float, float]] | None = None) -> list[JobWindow]:
    """Every GPU's windows over [a, b) s; ``idle``: ``"n:i"`` -> its idle [from, to) s."""
    idle = idle or {}
    out = []
    for n, idx in GPUS.items():
        for i in idx:
            lo, hi = idle.get(f"{n}:{i}", (-1.0, -1.0))
            out += [win(n, i, s, util=0.0 if lo <= s < hi else 95.0) for s in range(int(a), int(b), 10)]
    return out


def xid(first_s: float = 15.0, **kw: Any) -> Failure:
    base: dict[str, Any] = dict(
        failure_id="x",
        job_id="7",
        node="n1",
        gpu_index=1,
        severity=Severity.FATAL,
        first_seen=T0 + first_s,
        last_seen=T0 + first_s,
        affected_gpus=4,
    )
    base.update(kw)
    f: Failure = make_failure(**base)
    return f


def hours(rep: JobReport) -> dict[str, float]:
    return {b.category.value: b.gpu_hours for b in rep.breakdown if b.gpu_hours}


def gpu_h(gpu_s: float) -> Any:
    """GPU-seconds as the report's GPU-hours (rounded to 1e-6 by largest remainder)."""
    return pytest.approx(gpu_s / 3600, abs=1.5e-6)


# -- as_of: after every failure it counts, deterministic in event time ------------------------------------


def test_a_running_report_ends_after_the_failure_it_counts_even_ahead_of_the_windows() -> None:
    # the windows reached +10 s; the XID (event lane) is at +15 s: the report ends at +20 s
    rep = build_job_report(job(), windows(0, 10), [xid()], 3.26)
    assert rep.as_of == T0 + 20 and rep.as_of > rep.findings[0].first_seen
    assert hours(rep)["lost-to-failure"] == gpu_h(4 * 5)  # 15..20 s on the job's 4 GPUs
    assert rep.busy_pct < 100 and rep.waste_gpu_hours > 0
    assert "fell off the bus" in rep.verdict and not any(r.startswith("Nothing") for r in rep.recommendations)


def test_an_explicit_as_of_before_a_failure_leaves_the_failure_out() -> None:
    rep = build_job_report(job(), windows(0, 30), [xid(first_s=25.0)], 3.26, as_of=T0 + 20)
    assert rep.as_of == T0 + 20 and rep.findings == [] and "fell off" not in rep.verdict
    final = build_job_report(job("FAILED", ts=T0 + 20, end_ts=T0 + 20), windows(0, 30), [xid(first_s=25.0)], 3.26)
    assert final.findings == []  # after the job's end: not the job's


def test_a_failure_ahead_of_its_windows_makes_the_report_wait_then_end_at_its_cut() -> None:
    def run(order: list[Any]) -> JobReport:
        r = JobReporter(3.26)
        r.observe(job())
        for w in windows(0, 10):
            r.observe(w)
        r.observe(xid())
        assert r.mark("7") is None  # the windows of the XID's second are not in: wait
        assert r.due("7", 0) is None and not r.settled("7")
        got = None
        for w in order:
            r.observe(w)
            got = got or r.due("7", 0)
        assert got is not None
        return got

    ordered = run(windows(10, 30))
    shuffled = run(list(reversed(windows(10, 30))))  # other nodes ahead, GPUs in another order
    assert ordered.as_of == T0 + 20 and ordered == shuffled
    assert hours(ordered) == {"busy": gpu_h(4 * 15), "lost-to-failure": gpu_h(4 * 5)}


def test_late_windows_and_failures_update_the_final_report() -> None:
    r = JobReporter(3.26)
    r.observe(job())
    for w in windows(0, 50):
        r.observe(w)
    [final] = r.observe(job("COMPLETED", ts=T0 + 60, end_ts=T0 + 60))
    assert hours(final)["no-telemetry"] == gpu_h(4 * 10)  # the last window is still on its way
    late = windows(50, 60)
    for w in late[:-1]:
        r.observe(w)
        assert r.due("7", 0) is None  # not all GPUs' windows reached the end yet
    r.observe(late[-1])
    updated = r.due("7", 0)
    assert updated is not None and updated.final and hours(updated) == {"busy": gpu_h(4 * 60)}
    assert r.due("7", 0) is None  # once
    r.observe(xid(first_s=55.0))  # a failure of the last window, found from it
    with_xid = r.mark("7")
    assert with_xid is not None and with_xid.final and with_xid.as_of == T0 + 60
    assert hours(with_xid)["lost-to-failure"] == gpu_h(4 * 5) and r.report("7") == with_xid
    assert r.observe(win("n1", 0, 60)) == [] and r.report("7") == with_xid  # after the end: ignored


async def test_the_detector_service_publishes_the_failure_s_report_once_its_windows_are_in() -> None:
    out = MemoryPublisher()
    svc = DetectorService(DetectorSettings(detector_report_interval_s=0), producer=out)  # type: ignore[arg-type]
    await svc.handle("slurm.jobs", job())
    for w in windows(0, 10):
        await svc.handle("job.windows", w)
    await svc.emit(xid())
    assert out.of("job.reports") == []  # the XID is ahead of its windows: the report waits
    for w in windows(10, 20):
        await svc.handle("job.windows", w)
    [rep] = out.of("job.reports")
    assert rep.as_of == T0 + 20 and [f.failure_id for f in rep.findings] == ["x"]
    assert hours(rep)["lost-to-failure"] == gpu_h(4 * 5)


def _demo_stream(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any]]:
    """The demo scenario in process; what its job reporter observed, in order."""
    seen: list[Any] = []

    class Recording(JobReporter):
        def observe(self, value: Any) -> list[JobReport]:
            if isinstance(value, JobState | JobWindow | Failure):
                seen.append(value)
            return super().observe(value)

    monkeypatch.setattr(inprocess, "JobReporter", Recording)
    sc = load_scenario(Path(str(files("gpuwarden.demo").joinpath("scenarios", "demo-xid79.yaml"))))
    inprocess.run_inprocess(sc)
    return sc, seen


def _arrival(v: Any, lag_s: float) -> float:
    """When a message reaches the run's reader, scenario s: windows ``lag_s`` behind their end
    (plus the correlator's 5 s grace), failures and job states at once."""
    if isinstance(v, JobWindow):
        return v.window_end + 5 + lag_s - inprocess.START
    if isinstance(v, Failure):
        return v.last_seen - inprocess.START
    return float(v.ts) - inprocess.START


def test_the_demo_verdict_is_after_the_xid_and_the_same_however_late_the_windows_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sc, stream = _demo_stream(monkeypatch)
    xid_at = next(v for v in stream if isinstance(v, Failure) and v.pattern == "gpu-fallen-off-bus").first_seen
    verdicts = []
    for lag, stop in ((0.0, 16.0), (3.0, 17.0), (12.0, 16.5), (25.0, 30.0)):
        rr = RunResult(sc, sim_start=inprocess.START, stopped_early=True)
        todo = sorted(stream, key=lambda v: _arrival(v, lag))
        at = stop
        fed = 0
        while True:  # the run stops when the XID was found; then waits for its verdict to settle
            while fed < len(todo) and _arrival(todo[fed], lag) <= at:
                v = todo[fed]
                short = (
                    "failures"
                    if isinstance(v, Failure)
                    else "job.windows"
                    if isinstance(v, JobWindow)
                    else "slurm.jobs"
                )
                rr.observe(short, dumps(v))
                fed += 1
            if rr.verdicts_settled() or fed == len(todo):
                break
            at += 0.5
        [row] = rr.report()["job_reports"]
        assert row["as_of"] > xid_at and row["busy_pct"] < 100 and row["waste_gpu_hours"] > 0
        assert "fell off the bus" in row["verdict"]
        verdicts.append((row["as_of"], row["breakdown"], row["verdict"], row["recommendations"]))
    assert all(v == verdicts[0] for v in verdicts), [v[0] for v in verdicts]
    assert verdicts[0][0] == inprocess.START + 20  # the end of the XID's window


# -- an open critical or fatal failure is never "Nothing to do" ------------------------------------------


def ecc(**kw: Any) -> Failure:
    base: dict[str, Any] = dict(
        failure_id="e",
        pattern="uncorrectable-ecc",
        rule_id="xid-48-double-bit-ecc",
        job_id="7",
        node="n2",
        gpu_index=0,
        severity=Severity.CRITICAL,
        recommended_action=Action.RESET_GPU,
        first_seen=T0 + 100,
        last_seen=T0 + 100,
        affected_gpus=1,
    )
    base.update(kw)
    f: Failure = make_failure(**base)
    return f


def test_an_open_critical_failure_is_never_nothing_to_do_and_its_action_is_named() -> None:
    # the job was busy all along; the ECC error came at the report's end: no cost yet
    rep = build_job_report(job("COMPLETED", ts=T0 + 100, end_ts=T0 + 100), windows(), [ecc()], 3.26)
    assert rep.busy_pct == 100.0 and rep.waste_gpu_hours == 0
    assert not any("Nothing to do" in r for r in rep.recommendations)
    [r] = rep.recommendations
    assert "GPU 0 on n2 had an uncorrectable ECC error (critical, open)" in r
    assert "action reset-gpu" in r and "nvidia-smi -r -i 0 on n2" in r and "--exclude=n2" in r
    assert "GPU 0 on n2 had an uncorrectable ECC error (critical, open, from 2023-11-14T22:15:00Z)" in rep.verdict
    # a critical failure that costs no work (an alert) still gets its action named
    hot = ecc(failure_id="h", pattern="thermal-shutdown-risk", rule_id="t", recommended_action=Action.ALERT)
    rep = build_job_report(job(), windows(), [hot], 3.26, as_of=T0 + 100)
    assert any("action alert" in r for r in rep.recommendations), rep.recommendations
    # resolved: nothing open, nothing wasted
    ok = build_job_report(
        job(), windows(), [hot.model_copy(update={"state": FailureState.RESOLVED})], 3.26, as_of=T0 + 100
    )
    assert ok.recommendations == ["Nothing to do: the job kept its GPUs busy."]


def test_a_kernel_log_job_without_telemetry_names_its_failure_and_never_says_nothing_to_do() -> None:
    kl = job("COMPLETED", gpus={"recorded-node": []}, ts=T0 + 1, end_ts=T0 + 1)
    f = ecc(node="recorded-node", gpu_index=None, pci_bus_id="0000:19:00.0", first_seen=T0, last_seen=T0)
    rep = build_job_report(kl, [], [f], 3.26)
    assert "GPU at PCI 0000:19:00.0 on recorded-node had an uncorrectable ECC error" in rep.verdict
    assert any("action reset-gpu" in r and "nvidia-smi -r -i 0000:19:00.0" in r for r in rep.recommendations)
    assert not any("Nothing to do" in r for r in rep.recommendations)
    bare = build_job_report(kl, [], [], 3.26)
    assert "nothing to judge" in bare.verdict and bare.recommendations[0].startswith("Nothing to judge")


REALDATA = Path(__file__).resolve().parents[2].parent / "shared" / "realdata"


def test_a_real_kernel_log_with_a_memory_error_is_not_nothing_to_do() -> None:
    """Through the real kernel-log path (``gpuwarden analyze`` of gpud's dmesg with XID 48/63/94)."""
    path = need_path(REALDATA / "xid-kernel-logs-gpud" / "dmesg.0.log")
    from gpuwarden.recordings import load_recording
    from gpuwarden.recordings.analyze import analyze_recording

    rec = load_recording([path])
    res = analyze_recording(rec.samples, rec.events, fields=frozenset(rec.fields))
    assert res.reporter is not None
    [rep] = res.reporter.reports()
    assert not any("Nothing to do" in r for r in rep.recommendations), rep.recommendations
    # the finding as analyze attributes it to the recording's job (job_id set): named, action too
    [f] = res.sorted_failures()
    assert res.job is not None
    state = res.job.model_copy(update={"state": "COMPLETED", "end_ts": res.end_ts, "ts": res.end_ts})
    rep = build_job_report(state, [], [f.model_copy(update={"job_id": res.job.job_id})], 3.26)
    assert "had an uncorrectable ECC error" in rep.verdict and f.severity is Severity.CRITICAL
    assert any("action reset-gpu" in r for r in rep.recommendations)


# -- which GPU, when; advice that fits the cause ---------------------------------------------------------


def test_a_gpu_idle_for_five_minutes_mid_run_is_named_with_when_and_blamed_on_a_rank() -> None:
    ws = windows(0, 900, idle={"n2:1": (300, 600)})
    rep = build_job_report(job(), ws, [], 3.26, as_of=T0 + 900)
    assert hours(rep)["partially-idle"] == gpu_h(300)
    span = "GPU 1 on n2 2023-11-14T22:18:20Z..22:23:20Z (+300..+600 s into the job, 300 s)"
    assert span in rep.verdict and "partially-idle" in rep.verdict
    [r] = rep.recommendations
    assert r.startswith("GPU 1 on n2 worked, then sat idle 2023-11-14T22:18:20Z..22:23:20Z")
    assert "then resumed" in r and "died or hung" in r and "logs" in r and "not a --gres matter" in r
    # still idle at the report's end: not resumed
    rep = build_job_report(job(), windows(0, 600, idle={"n2:1": (300, 600)}), [], 3.26, as_of=T0 + 600)
    assert "had not resumed" in rep.recommendations[0]


def test_a_gpu_idle_from_the_job_s_start_is_a_gres_matter() -> None:
    ws = windows(0, 600, idle={"n2:1": (0, 600), "n2:0": (0, 600)})
    rep = build_job_report(job(), ws, [], 3.26, as_of=T0 + 600)
    assert "both GPUs on n2 2023-11-14T22:13:20Z..22:23:20Z (+0..+600 s into the job, 600 s)" in rep.verdict
    [r] = rep.recommendations
    assert r.startswith("both GPUs on n2 sat idle from the job's start") and "--gres" in r and "died" not in r
    # a GPU that starts work late is a late rank, neither --gres nor a dead one
    late = build_job_report(job(), windows(0, 600, idle={"n1:0": (0, 120)}), [], 3.26, as_of=T0 + 600)
    [r] = late.recommendations
    assert "GPU 0 on n1 started work only at 2023-11-14T22:15:20Z" in r and "--gres" not in r


def test_every_gpu_idle_mid_run_is_not_a_release_the_allocation_matter() -> None:
    ws = windows(0, 600, idle={g: (200, 400) for g in ("n1:0", "n1:1", "n2:0", "n2:1")})
    rep = build_job_report(job(), ws, [], 3.26, as_of=T0 + 600)
    assert "all 4 GPUs 2023-11-14T22:16:40Z..22:20:00Z (+200..+400 s into the job, 200 s)" in rep.verdict
    [r] = rep.recommendations
    assert r.startswith("Every GPU of the job stopped working at 2023-11-14T22:16:40Z") and "then resumed" in r
    never = build_job_report(
        job(), windows(0, 600, idle={g: (0, 600) for g in ("n1:0", "n1:1", "n2:0", "n2:1")}), [], 3.26, as_of=T0 + 600
    )
    assert (
        never.recommendations[0].startswith("Every GPU of the job sat idle")
        and "Release" in never.recommendations[0].title()
    )


def test_lost_and_hung_time_name_their_gpus_and_ranges() -> None:
    one = xid(first_s=40.0, affected_gpus=1)
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
    )
    rep = build_job_report(job(), windows(), [one, hang], 3.26, as_of=T0 + 100)
    assert "(lost-to-failure: 0.017 GPU-h, $0.05): GPU 1 on n1 2023-11-14T22:14:00Z..22:15:00Z" in rep.verdict
    assert "(hung: " in rep.verdict and "GPUs" in rep.verdict.split("(hung: ")[1]
    assert any("action restart-job" in r for r in rep.recommendations)
    assert any(
        r.startswith("Resubmit from the last checkpoint excluding n1") and "action drain" in r
        for r in rep.recommendations
    )


def test_words_for_times_and_gpu_sets() -> None:
    assert iso(T0) == "2023-11-14T22:13:20Z" and iso(T0 + 0.25) == "2023-11-14T22:13:20.250Z" and iso(42.0) == "+42 s"
    assert time_range(T0 + 300, T0 + 600, T0) == "2023-11-14T22:18:20Z..22:23:20Z (+300..+600 s into the job, 300 s)"
    assert time_range(T0, T0 + 86400, T0).startswith("2023-11-14T22:13:20Z..2023-11-15T22:13:20Z")
    every = [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
    assert gpus_text(every, every) == "all 4 GPUs"
    assert gpus_text([("n1", 0), ("n1", 1)], every) == "both GPUs on n1"
    eight = [("a", i) for i in range(8)] + [("b", 0)]
    assert gpus_text([("a", i) for i in (0, 1, 2, 5)], eight) == "GPUs 0-2, 5 on a"
    assert gpus_text([("a", i) for i in range(8)], eight) == "all 8 GPUs on a"
