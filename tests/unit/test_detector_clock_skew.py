"""A node whose clock is wrong must not make the fleet look silent, and the nodes that really
stopped must still be found: the detector's event-time progress over sample partitions
(``gpuwarden.shared.eventtime.InputProgress``, ``Detector._idle``/``_sending``).

Before: one node 301-600 s ahead (the edge accepts up to 600 s) made every other partition
"idle" and every other node ``telemetry-silent`` every 30 s; in one partition (the in-process
runner, ``analyze``) 31 s ahead was enough."""

from __future__ import annotations

import math

import pytest

from factories import healthy_gpu
from gpuwarden.detector import Detector, load_catalog
from gpuwarden.shared.eventtime import InputProgress
from gpuwarden.shared.models import AttributedSample, Failure, GpuAttribution, NodeSample

T0 = 1_700_000_000.0
NODES = [f"gpu-node-{i:03d}" for i in range(8)]


def _run(
    nodes: list[str],
    partition_of: dict[str, int | None],
    seconds: int,
    skew: dict[str, float] | None = None,
    stops: dict[str, float] | None = None,
) -> list[Failure]:
    """Every node sends one sample a second, in event-time order, on its partition; ``skew``:
    node -> its clock's offset, s; ``stops``: node -> the second it stops sending."""
    d = Detector(load_catalog())
    skew, stops = skew or {}, stops or {}
    job = GpuAttribution(gpu_index=0, job_id="7", user="u", partition="gpu", job_start_ts=T0 - 600, job_gpus=8)
    out: list[Failure] = []
    for s in range(seconds):
        for n in nodes:
            if s >= stops.get(n, math.inf):
                continue
            sample = NodeSample(
                node=n, ts=T0 + s + skew.get(n, 0.0), collector_id="t", source="test", gpus=[healthy_gpu(0)]
            )
            out += d.on_sample(AttributedSample(sample=sample, jobs=[job]), partition=partition_of[n])
    return out + d.flush()


ONE = {n: None for n in NODES}  # one ordered stream: the in-process runner, analyze
SIX = {n: i % 6 for i, n in enumerate(NODES)}  # the default 6 partitions: nodes 0 and 6 share one
EIGHT = {n: i for i, n in enumerate(NODES)}  # a partition per node


@pytest.mark.parametrize("ahead", [45.0, 301.0, 599.0, -599.0])
@pytest.mark.parametrize("layout", [ONE, SIX, EIGHT], ids=["one-partition", "six-partitions", "eight-partitions"])
def test_a_node_with_its_clock_off_makes_no_one_silent(layout: dict[str, int | None], ahead: float) -> None:
    out = _run(NODES, layout, 420, skew={NODES[1]: ahead})
    assert [(f.pattern, f.node) for f in out] == []


@pytest.mark.parametrize("layout", [ONE, SIX, EIGHT], ids=["one-partition", "six-partitions", "eight-partitions"])
def test_with_a_node_clock_ahead_a_node_that_stops_is_still_silent(layout: dict[str, int | None]) -> None:
    out = _run(NODES, layout, 420, skew={NODES[1]: 400.0}, stops={NODES[6]: 30})
    assert {(f.pattern, f.node) for f in out} == {("telemetry-silent", NODES[6])}


@pytest.mark.parametrize("partitioned", [True, False], ids=["four-partitions", "one-partition"])
def test_three_of_four_nodes_powered_off_are_silent(partitioned: bool) -> None:
    """The one node left carries the watermark: each partition of the others goes idle once
    it is 300 s behind and quiet; in one partition the others stop being live at once."""
    nodes = NODES[:4]
    layout: dict[str, int | None] = {n: (i if partitioned else None) for i, n in enumerate(nodes)}
    out = _run(nodes, layout, 420, stops={n: 20 for n in nodes[1:]})
    opened = {f.node: f.first_seen for f in out if f.pattern == "telemetry-silent"}
    assert set(opened) == set(nodes[1:])
    latest = T0 + 20 + (300 + 30 if partitioned else 30) + 10  # idle + after_s; a few records of slack
    assert all(t <= latest for t in opened.values()), opened


# -- InputProgress -----------------------------------------------------------------------------
def test_progress_is_the_newest_time_when_the_sources_agree() -> None:
    p = InputProgress()
    for s in range(10):
        for n in ("a", "b", "c"):
            assert p.observe(n, T0 + s) == T0 + s
    assert p.live("a") and not p.live("never")


def test_progress_is_held_near_the_median_against_one_source_ahead() -> None:
    p = InputProgress(lead_s=5.0)
    for s in range(100):
        for n in ("a", "b", "c"):
            p.observe(n, T0 + s + (600 if n == "c" else 0))
        assert p.value <= T0 + s + 5.0
    assert p.value >= T0 + 99 - 1  # the peers still carry it


def test_progress_is_monotone_and_not_held_back_by_a_source_behind() -> None:
    p = InputProgress()
    seen = []
    for s in range(50):
        for n in ("a", "b", "c"):
            seen.append(p.observe(n, T0 + s - (3600 if n == "a" else 0)))
    assert seen == sorted(seen) and seen[-1] == T0 + 49


def test_a_source_that_stops_is_no_longer_live_after_three_rounds() -> None:
    p = InputProgress()
    for s in range(5):
        for n in ("a", "b"):
            p.observe(n, T0 + s)
    for s in range(5, 11):
        p.observe("a", T0 + s)
        assert p.live("b") == (s < 10)  # 3 rounds of 2 sources: the 6th sample of a alone
    assert p.live("a")


def test_progress_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        InputProgress(lead_s=-1.0)
    with pytest.raises(ValueError):
        InputProgress(rounds=0)
