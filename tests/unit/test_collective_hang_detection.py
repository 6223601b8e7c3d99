"""collective-hang: found within 3 minutes of event time, never on a real checkpoint wait (issue 24, part 5).

A hang has every GPU of the job spinning (full utilisation at idle power); the evidence is strong
when each GPU fell from its own working power earlier in the job and holds its busy SM clock, and
the rule then opens after its ``for_s`` (150 s); with the power limit alone to go on it waits
``weak_for_s`` (300 s). A checkpoint leaves rank 0 working alone while the others spin, and ends.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.demo.inprocess import run_inprocess
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.detector.conditions import Hang
from gpuwarden.recordings import gpu_spec, load_recording
from gpuwarden.recordings.analyze import analyze_recording, fill_from_spec
from gpuwarden.shared.models import Failure, FailureState, JobState, JobWindow
from gpuwarden.shared.scenario import load_scenario
from prerequisites import need_path

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "scenarios"
REALDATA = ROOT.parent / "shared" / "realdata"
#: the checkpoint-interval sweep of the README's table: every one a checkpoint wait, none a hang
CHECKPOINT_RECORDINGS = {
    "ckpt1": True,
    "ckpt10": True,
    "ckpt50": True,
    "ckpt100": True,
    "power-trace_2025-07-26-23-32-09": True,
    "ckpt500": False,
    "ckpt1000": False,
}
T0 = 1_700_000_000.0
WINDOW_S = 10.0


def _rule_hang() -> tuple[float, Hang]:
    rule = next(c for c in load_catalog().conditions if c.id == "collective-hang")
    assert isinstance(rule.signal, Hang)
    return rule.for_s, rule.signal


def test_the_hang_rule_opens_within_3_minutes_on_strong_evidence() -> None:
    for_s, sig = _rule_hang()
    assert for_s <= 150 and sig.weak_for_s >= 300


@pytest.mark.parametrize("name", ["collective-hang", "collective-hang-s23", "collective-hang-s37"])
def test_a_collective_hang_scenario_is_found_within_180_s_of_event_time(name: str) -> None:
    score = run_inprocess(load_scenario(SUITE / f"{name}.yaml")).report()["score"]
    assert score["passed"], score
    [found] = [f for f in score["found"] if f["pattern"] == "collective-hang"]
    assert found["delay_s"] < 180, found


def _need_realdata() -> None:
    need_path(REALDATA)


@pytest.mark.parametrize("stem", sorted(CHECKPOINT_RECORDINGS))
def test_no_collective_hang_on_a_real_checkpoint_recording(stem: str) -> None:
    """Ranks 1-7 spin at 100 % and ~150 W for up to 550 s (ckpt1) while rank 0 works alone."""
    _need_realdata()
    rec = load_recording([REALDATA / "h100x8-llama3-8b-ckpt" / f"{stem}.csv.gz"])
    samples, assumed = fill_from_spec(rec.samples, rec.fields, gpu_spec("H100-SXM5-80GB"))
    fails = analyze_recording(samples, rec.events, fields=frozenset(rec.fields) | frozenset(assumed)).sorted_failures()
    patterns = {f.pattern for f in fails}
    assert "collective-hang" not in patterns, patterns
    assert ("checkpoint-stall" in patterns) is CHECKPOINT_RECORDINGS[stem], patterns


# --- the signal on hand-made windows: 8 GPUs on two nodes, 10 s windows ----------------------------

WORK = {"utilization_gpu_pct_mean": 97.0, "power_w_mean": 620.0, "sm_clock_mhz_mean": 1980.0}
SPIN = {"utilization_gpu_pct_mean": 100.0, "power_w_mean": 112.0, "sm_clock_mhz_mean": 1975.0}


def _windows(k: int, per_gpu: Callable[[str, int, int], dict[str, Any] | None]) -> list[JobWindow]:
    out = []
    for node in ("n1", "n2"):
        for g in range(4):
            fields = per_gpu(node, g, k)
            if fields is None:
                continue  # not reported this window
            base: dict[str, Any] = {
                "job_id": "91",
                "node": node,
                "gpu_index": g,
                "user": "carol",
                "partition": "gpu",
                "job_gpus": 8,
                "window_start": T0 + WINDOW_S * k,
                "window_end": T0 + WINDOW_S * (k + 1),
                "samples": 10,
                "utilization_gpu_pct_max": 100.0,
                "utilization_gpu_pct_min": 90.0,
                "power_limit_w": 700.0,
                "max_sm_clock_mhz": 1980.0,
                "memory_used_mib_max": 60_000.0,
                "memory_total_mib": 81_559.0,
                "tensor_activity_pct_mean": 40.0,
                **WORK,
            }
            out.append(JobWindow(**{**base, **fields}))
    return out


def _hang_opened_after_s(
    per_gpu: Callable[[str, int, int], dict[str, Any] | None], start: int, count: int
) -> float | None:
    """Event seconds from the start of window ``start`` (the hang's onset) to the collective-hang's
    detection (its ``first_seen``), None when it never opens."""
    d = Detector(load_catalog())
    # the job's running state, as the detector's event lane reads it from slurm.jobs
    d.on_job(JobState(job_id="91", ts=T0, state="RUNNING", user="carol", partition="gpu", nodes=["n1", "n2"],
                      gpus={"n1": [0, 1, 2, 3], "n2": [0, 1, 2, 3]}, start_ts=T0))  # fmt: skip
    out: list[Failure] = []
    for k in range(count):
        for w in _windows(k, per_gpu):
            out += d.on_window(w)
    out += d.flush()
    opened = [f for f in out if f.pattern == "collective-hang" and f.state is FailureState.OPEN]
    return min(f.first_seen for f in opened) - (T0 + WINDOW_S * start) if opened else None


def test_a_hang_after_real_work_is_found_within_3_minutes() -> None:
    """600 W / 1980 MHz, then 100 % at 112 W with the clock held: strong evidence."""
    after = _hang_opened_after_s(lambda n, g, k: SPIN if k >= 40 else {}, 40, 100)
    assert after is not None and after < 180, after


def test_a_hang_without_a_working_baseline_waits_the_weak_duration() -> None:
    """Spinning from the job's first window: no working power to fall from, only the limit ratio."""
    _, sig = _rule_hang()
    after = _hang_opened_after_s(lambda n, g, k: SPIN, 0, 60)
    assert after is not None and sig.weak_for_s <= after < sig.weak_for_s + 3 * WINDOW_S, after


def test_a_hang_at_a_fallen_sm_clock_is_only_weak_evidence() -> None:
    """Full utilisation at low power with the SM clock at half its busy clock: maybe a clock-locked
    GPU working slowly, not spinning; judged on the limit alone (weak_for_s)."""
    _, sig = _rule_hang()
    slow = {**SPIN, "sm_clock_mhz_mean": 990.0}
    after = _hang_opened_after_s(lambda n, g, k: slow if k >= 40 else {}, 40, 100)
    assert after is not None and after >= sig.weak_for_s, after


def test_a_hang_with_a_gpu_unreported_is_only_weak_evidence() -> None:
    """A GPU of the job missing from the windows (a logger gap) might be rank 0 working alone."""
    _, sig = _rule_hang()
    gap = lambda n, g, k: None if (n, g) == ("n1", 0) and k >= 40 else (SPIN if k >= 40 else {})
    after = _hang_opened_after_s(gap, 40, 100)
    assert after is not None and after >= sig.weak_for_s, after


def test_a_long_checkpoint_with_rank_0_working_alone_is_no_hang() -> None:
    """Rank 0 writes (< 30 %) for 500 s while the 7 others spin at their idle power, clocks held."""
    writer = {"utilization_gpu_pct_mean": 6.0, "utilization_gpu_pct_max": 12.0, "power_w_mean": 145.0}
    ckpt = lambda n, g, k: {} if k < 20 else (writer if (n, g) == ("n1", 0) else SPIN)
    assert _hang_opened_after_s(ckpt, 20, 70) is None


def test_a_120_s_all_gpu_pin_that_recovers_is_no_hang() -> None:
    """Shorter than the rule's 150 s on strong evidence."""
    assert _hang_opened_after_s(lambda n, g, k: SPIN if 40 <= k < 52 else {}, 40, 100) is None
