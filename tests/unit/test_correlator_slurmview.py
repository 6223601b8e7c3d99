"""The correlator's :class:`SlurmView`: the Slurm watermark (reached once the reader's position
in ``slurm.jobs`` passes the watermark's offsets) and the allocations it keeps."""

from __future__ import annotations

import math

from gpuwarden.correlator.slurmview import SlurmView
from gpuwarden.shared.models import JobState, SlurmWatermark

T0 = 1_700_000_000.0


def wm(ts: float, offsets: dict[int, int] | None = None) -> SlurmWatermark:
    return SlurmWatermark(cluster="c", ts=ts, jobs_offsets=offsets or {})


def job(job_id: str, ts: float, node: str = "n1", state: str = "RUNNING", end_ts: float | None = None) -> JobState:
    return JobState(job_id=job_id, ts=ts, state=state, nodes=[node], gpus={node: [0]}, start_ts=ts - 10, end_ts=end_ts)


def test_watermark_is_minus_inf_before_any() -> None:
    v = SlurmView()
    assert v.watermark() == -math.inf
    assert v.on_position(0, 10) is False  # nothing pending
    v.apply_job(job("1", T0))
    assert v.watermark() == -math.inf  # jobs alone say nothing about completeness
    assert v.stats()["watermark"] is None


def test_pending_watermark_waits_for_the_positions_of_every_partition() -> None:
    v = SlurmView()
    assert v.on_watermark(wm(T0, {0: 5, 1: 3})) is False
    assert v.stats()["pending_watermarks"] == 1
    assert v.on_position(0, 5) is False  # partition 1 not there yet
    assert v.on_position(1, 2) is False
    assert v.watermark() == -math.inf
    assert v.on_position(1, 3) is True
    assert v.watermark() == T0
    assert v.stats()["pending_watermarks"] == 0


def test_watermark_without_offsets_is_reached_at_once() -> None:
    """Partitions the watcher never wrote to are absent from jobs_offsets."""
    v = SlurmView()
    assert v.on_watermark(wm(T0)) is True
    assert v.watermark() == T0


def test_newest_reached_watermark_wins() -> None:
    v = SlurmView()
    for ts, off in ((T0, 2), (T0 + 10, 4), (T0 + 20, 6)):
        assert v.on_watermark(wm(ts, {0: off})) is False
    assert v.on_position(0, 5) is True
    assert v.watermark() == T0 + 10  # T0 + 20 needs offset 6
    assert v.stats()["pending_watermarks"] == 1
    assert v.on_position(0, 6) is True
    assert v.watermark() == T0 + 20


def test_watermark_never_goes_back() -> None:
    v = SlurmView()
    v.on_watermark(wm(T0 + 10))
    assert v.on_watermark(wm(T0 + 5)) is False  # older: ignored
    assert v.on_watermark(wm(T0 + 10)) is False  # the same: nothing new
    assert v.watermark() == T0 + 10 and v.stats()["pending_watermarks"] == 0
    # Positions do not go back either (a re-read of an old record).
    v.on_position(0, 7)
    v.on_position(0, 3)
    assert v.positions == {0: 7}
    assert v.on_watermark(wm(T0 + 20, {0: 7})) is True


def test_watermarks_arriving_out_of_order_still_advance_to_the_newest_reached() -> None:
    v = SlurmView()
    v.on_watermark(wm(T0 + 20, {0: 6}))
    v.on_watermark(wm(T0 + 10, {0: 4}))
    assert v.on_position(0, 4) is True and v.watermark() == T0 + 10
    assert v.on_position(0, 6) is True and v.watermark() == T0 + 20
    assert v.watermarks_in == 2


def test_ungated_view_is_always_complete() -> None:
    v = SlurmView(gated=False)
    assert v.watermark() == math.inf
    v.on_watermark(wm(T0, {0: 5}))
    assert v.watermark() == math.inf


def test_allocations_are_per_node_and_the_same_object_until_they_change() -> None:
    v = SlurmView()
    assert v.apply_job(job("1", T0, node="n1")) == {"n1"}
    first = v.allocations("n1")
    assert set(first) == {"1"} and v.allocations("n2") == {} and v.nodes() == 1
    assert v.apply_job(job("1", T0)) == set()  # the same again: no change
    assert v.allocations("n1") is first
    assert v.apply_job(job("1", T0 - 5, state="COMPLETED", end_ts=T0 - 1)) == set()  # stale: ignored
    assert v.apply_job(job("1", T0 + 5, state="COMPLETED", end_ts=T0 + 2)) == {"n1"}
    assert v.allocations("n1") is not first and v.allocations("n1")["1"].end_ts == T0 + 2
    assert v.jobs_in == 4


def test_ended_allocations_expire_past_retention_in_watermark_time() -> None:
    v = SlurmView(retention_s=100.0)
    v.apply_job(job("old", T0 - 100))
    v.apply_job(job("old", T0 + 5, state="COMPLETED", end_ts=T0))
    v.apply_job(job("running", T0 - 100, node="n2"))
    v.on_watermark(wm(T0 + 10))
    # A JobState far ahead does not expire anything while gated: the watermark is event time.
    v.apply_job(job("future", T0 + 5000, node="n3"))
    assert set(v.allocations("n1")) == {"old"}
    v.on_watermark(wm(T0 + 99))
    assert set(v.allocations("n1")) == {"old"}  # ended T0: within the retention
    # Past the retention; checked at most once per minute of event time (the last at T0 + 99).
    v.on_watermark(wm(T0 + 160))
    assert v.allocations("n1") == {}  # gone, and the node with it
    assert set(v.allocations("n2")) == {"running"}  # a running job never expires
    assert v.nodes() == 2


def test_ungated_view_expires_by_the_newest_job_ts() -> None:
    v = SlurmView(retention_s=100.0, gated=False)
    v.apply_job(job("old", T0 - 100))
    v.apply_job(job("old", T0 + 5, state="COMPLETED", end_ts=T0))
    v.apply_job(job("other", T0 + 50, node="n2"))
    assert set(v.allocations("n1")) == {"old"}
    v.apply_job(job("other", T0 + 200, node="n2"))
    assert v.allocations("n1") == {}
