"""Pure helpers of ``gpuwarden bench pipeline`` (no broker, no timing)."""

from __future__ import annotations

import pytest

from gpuwarden.sim.bench.figures import LagSeries, percentile, rate, ratio, summarise_latencies


def test_percentile_interpolates_and_handles_edges() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    xs = [float(i) for i in range(1, 101)]  # 1..100
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 100.0
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0  # unsorted input
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_ratio() -> None:
    assert ratio(10.0, 40.0) == 0.25
    assert ratio(None, 1.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


def test_rate_uses_last_points_at_or_before_bounds() -> None:
    pts = [(0.0, 0.0), (1.0, 100.0), (2.0, 300.0), (3.0, 600.0)]
    assert rate(pts, 1.0, 3.0) == pytest.approx(250.0)
    assert rate(pts, 1.5, 2.9) == pytest.approx(200.0)  # (2, 300) - (1, 100) over 1 s
    assert rate(pts, -1.0, 3.0) is None  # nothing before t0
    assert rate(pts, 3.0, 3.0) is None  # one point only


def test_summarise_latencies_counts_missing() -> None:
    sent = {"a": 10.0, "b": 20.0, "c": 30.0}
    seen = {"a": 10.1, "b": 20.3}
    s = summarise_latencies(sent, seen)
    assert s["n"] == 2 and s["missing"] == 1
    assert s["p50_s"] == pytest.approx(0.2)
    assert s["max_s"] == pytest.approx(0.3)
    assert summarise_latencies({}, {})["p99_s"] is None


def test_lag_series() -> None:
    ls = LagSeries()
    ls.add(1.0, end=100, committed=40)
    ls.add(2.0, end=200, committed=190)
    ls.add(3.0, end=200, committed=250)  # committed past a stale end offset: lag 0, not negative
    assert ls.max_lag() == 60.0
    assert ls.max_lag(1.5, 3.0) == 10.0
    assert ls.lag_at(2.5) == 10.0
    assert ls.lag_at(0.5) is None
    assert ls.committed[-1] == (3.0, 250.0)
