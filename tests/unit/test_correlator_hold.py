"""The correlator's hold: with a gated :class:`SlurmView`, samples and events wait until the
Slurm watermark passes their ``ts`` (then ``known``), or go out ``unknown`` after ``hold_s`` of
(fake) wall clock or beyond ``max_held_per_node``; the checkpoint helpers (``held_floor``,
``take_dirty``, ``restore``, ``drop``); and event-time determinism of the result."""

from __future__ import annotations

import random
from collections.abc import Iterable

import orjson
import pytest

from gpuwarden.correlator.core import Correlator, Output
from gpuwarden.correlator.slurmview import SlurmView
from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    EventKind,
    GpuEvent,
    GpuSample,
    JobState,
    JobWindow,
    NodeSample,
    SlurmWatermark,
)

T0 = 1_700_000_000.0
N1, N2 = "gpu-node-001", "gpu-node-002"


class Clock:
    """A fake ``monotonic``."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def gated(clock: Clock | None = None, **kw: object) -> Correlator:
    return Correlator(
        SlurmView(retention_s=3600.0, gated=True),
        topic_name=lambda s: f"t.{s}",
        monotonic=clock or Clock(),
        window_s=10.0,
        window_grace_s=5.0,
        **kw,  # type: ignore[arg-type]
    )


def job(
    job_id: str = "1001", ts: float = T0, start: float = T0 - 50, nodes: Iterable[str] = (N1,), **kw: object
) -> bytes:
    nodes = list(nodes)
    return JobState(
        job_id=job_id,
        ts=ts,
        state=str(kw.pop("state", "RUNNING")),
        user="alice",
        nodes=nodes,
        gpus={n: [0, 1] for n in nodes},
        start_ts=start,
        **kw,
    ).to_json()


def watermark(ts: float, offsets: dict[int, int] | None = None) -> bytes:
    return SlurmWatermark(cluster="c", ts=ts, jobs_offsets=offsets or {}).to_json()


def sample(ts: float, node: str = N1, gpus: int = 2) -> bytes:
    return NodeSample(
        node=node,
        ts=ts,
        collector_id="c",
        source="simulated",
        gpus=[GpuSample(index=i, utilization_gpu_pct=50.0) for i in range(gpus)],
    ).to_json()


def xid(ts: float, node: str = N1, gpu: int = 1) -> bytes:
    return GpuEvent(
        event_id=f"e{ts}",
        node=node,
        ts=ts,
        kind=EventKind.XID,
        code=79,
        gpu_index=gpu,
        raw="Xid 79",
        source="simulated",
    ).to_json()


def read_job(c: Correlator, value: bytes, offset: int, partition: int = 0) -> list[Output]:
    """What the service's Slurm reader does: apply the JobState, move the position, release."""
    outs = c.handle("slurm.jobs", value, partition=partition, offset=offset)
    if c.view.on_position(partition, offset + 1):
        outs += c.release()
    return outs


def attributed(outs: list[Output]) -> list[AttributedSample]:
    return [decode("gpu.attributed", o.value) for o in outs if o.topic == "gpu.attributed"]  # type: ignore[misc]


def ts_of(outs: list[Output]) -> list[float]:
    return [a.sample.ts for a in attributed(outs)]


# -- held, then released known ------------------------------------------------------------
def test_sample_before_any_watermark_is_held_then_released_known_with_its_job() -> None:
    c = gated()
    assert read_job(c, job(), 0) == []
    assert c.handle("gpu.samples", sample(T0 - 10)) == []  # no watermark yet: -inf
    assert (c.held_count, c.view.watermark()) == (1, float("-inf"))
    [out] = c.handle("slurm.watermarks", watermark(T0, {0: 1}))
    assert (out.topic, out.key) == ("gpu.attributed", N1)
    assert b'"attribution"' not in out.value  # known is the default and not written
    [att] = attributed([out])
    assert att.attribution == "known"
    assert [(j.gpu_index, j.job_id) for j in att.jobs] == [(0, "1001"), (1, "1001")]
    assert (c.held_count, c.held, c.released, c.unknown) == (0, {}, 1, 0)
    # Now that the watermark is past, a sample at or before it joins at once.
    assert ts_of(c.handle("gpu.samples", sample(T0))) == [T0]


def test_event_is_held_and_released_known_too() -> None:
    c = gated()
    read_job(c, job(), 0)
    assert c.handle("gpu.events", xid(T0 - 5)) == []
    [out] = c.handle("slurm.watermarks", watermark(T0, {0: 1}))
    ev = decode("gpu.events.attributed", out.value)
    assert isinstance(ev, AttributedEvent) and ev.attribution == "known"
    assert ev.job is not None and (ev.job.job_id, ev.job.gpu_index) == ("1001", 1)


def test_jobstate_arriving_late_with_an_earlier_start_is_honoured_for_held_records() -> None:
    """The sample comes before Slurm told anyone about its job: held, it still gets the job."""
    c = gated()
    assert c.handle("gpu.samples", sample(T0 - 10)) == []
    assert c.handle("gpu.events", xid(T0 - 9)) == []
    # The job's first JobState, observed at T0, started at T0 - 50 (before the held records).
    assert read_job(c, job(ts=T0, start=T0 - 50), 0) == []  # no watermark yet: still held
    assert c.held_count == 2
    outs = c.handle("slurm.watermarks", watermark(T0, {0: 1}))
    [att] = attributed(outs)
    assert [j.job_id for j in att.jobs] == ["1001", "1001"] and att.attribution == "known"
    [ev] = [decode("gpu.events.attributed", o.value) for o in outs if o.topic == "gpu.events.attributed"]
    assert isinstance(ev, AttributedEvent) and ev.job is not None and ev.job.job_id == "1001"


def test_watermark_whose_offsets_are_not_reached_does_not_release() -> None:
    c = gated()
    assert c.handle("gpu.samples", sample(T0 - 10)) == []
    # The watermark promises slurm.jobs up to offset 1 of partition 0: not read yet.
    assert c.handle("slurm.watermarks", watermark(T0, {0: 1})) == []
    assert (c.held_count, c.view.watermark()) == (1, float("-inf"))
    assert c.release() == []
    # The job record (offset 0) arrives; once the reader's position passes it, the hold ends
    # with the job known.
    assert c.handle("slurm.jobs", job(), partition=0, offset=0) == []  # applied, position not moved yet
    assert c.held_count == 1
    assert c.view.on_position(0, 1) is True
    [att] = attributed(c.release())
    assert [j.job_id for j in att.jobs] == ["1001", "1001"]


def test_watermark_before_the_records_ts_does_not_release() -> None:
    c = gated()
    c.handle("gpu.samples", sample(T0 + 10))
    assert c.handle("slurm.watermarks", watermark(T0)) == []
    assert c.view.watermark() == T0 and c.held_count == 1
    assert ts_of(c.handle("slurm.watermarks", watermark(T0 + 10))) == [T0 + 10]  # ts <= watermark


# -- released unknown ------------------------------------------------------------------------
def test_hold_timeout_releases_unknown_and_folds_into_no_window() -> None:
    clock = Clock()
    c = gated(clock, hold_s=30.0)
    read_job(c, job(), 0)  # the view knows the job, but no watermark says the view is complete
    assert c.handle("gpu.samples", sample(T0 - 10)) == []
    assert c.handle("gpu.events", xid(T0 - 9)) == []
    clock.t = 29.9
    assert c.release() == []
    clock.t = 30.0
    outs = c.release()
    assert [o.topic for o in outs] == ["gpu.attributed", "gpu.events.attributed"]
    s, e = outs
    assert b'"attribution":"unknown"' in s.value
    att = decode("gpu.attributed", s.value)
    assert isinstance(att, AttributedSample)
    assert (att.attribution, att.jobs, att.sample.ts) == ("unknown", [], T0 - 10)
    ev = decode("gpu.events.attributed", e.value)
    assert isinstance(ev, AttributedEvent)
    assert (ev.attribution, ev.job, ev.node_jobs) == ("unknown", None, [])
    assert (c.held_count, c.unknown, c.released) == (0, 2, 0)
    # The unknown sample folded into no window (it still moved the node's watermark).
    assert not (c.windows.get(N1) or {}).get("w")
    assert [o for o in c.flush() if o.topic == "job.windows"] == []


def test_hold_timeout_counts_unknown_in_metrics() -> None:
    from gpuwarden.shared.metrics import ServiceMetrics

    clock = Clock()
    metrics = ServiceMetrics("correlator")
    c = gated(clock, metrics=metrics)
    c.handle("gpu.samples", sample(T0))
    clock.t = 1000.0
    assert len(c.release()) == 1
    assert metrics.registry.get_sample_value("gpuwarden_correlator_unknown_attributions_total") == 1.0


def test_a_later_sample_never_overtakes_an_earlier_held_one_of_its_node() -> None:
    clock = Clock()
    c = gated(clock, hold_s=30.0)
    read_job(c, job(nodes=(N1, N2)), 0)
    c.handle("slurm.watermarks", watermark(T0, {0: 1}))
    assert ts_of(c.handle("gpu.samples", sample(T0 + 20))) == []  # past the watermark: held
    clock.t = 10.0
    # Older in event time and already covered by the watermark, but behind a held one: waits.
    assert c.handle("gpu.samples", sample(T0 - 5)) == []
    assert c.handle("gpu.events", xid(T0 - 4)) == []
    # Another node is not held up by it.
    assert ts_of(c.handle("gpu.samples", sample(T0 - 5, node=N2))) == [T0 - 5]
    assert c.held_count == 3
    # The head times out first (unknown); the rest, covered by the watermark, follow in order, known.
    clock.t = 30.0
    outs = c.release()
    assert [(o.topic, decode(o.topic, o.value).attribution) for o in outs] == [  # type: ignore[attr-defined]
        ("gpu.attributed", "unknown"),
        ("gpu.attributed", "known"),
        ("gpu.events.attributed", "known"),
    ]
    assert ts_of(outs) == [T0 + 20, T0 - 5]
    assert c.held_count == 0


def test_a_node_released_by_the_watermark_comes_out_in_arrival_order() -> None:
    c = gated()
    for ts in (T0 + 3, T0 + 1, T0 + 2):  # arrival order differs from event order
        assert c.handle("gpu.samples", sample(ts)) == []
    assert ts_of(c.handle("slurm.watermarks", watermark(T0 + 1))) == []  # the head (T0 + 3) is not passed
    assert ts_of(c.handle("slurm.watermarks", watermark(T0 + 3))) == [T0 + 3, T0 + 1, T0 + 2]


def test_one_release_of_several_nodes_comes_out_merged_by_event_time() -> None:
    """A watermark that passes 40 s of two nodes' held samples at once (one Slurm poll at a fast
    replay) releases them in event-time order, not node by node: a shared ``gpu.attributed``
    partition never shows one node 40 s ahead of the other (the detector's telemetry-silent
    measures a node against its partition's newest time)."""
    c = gated()
    read_job(c, job(nodes=(N1, N2)), 0)
    for t in range(40):
        for node in (N1, N2):
            assert c.handle("gpu.samples", sample(T0 + t, node=node)) == []
    outs = c.handle("slurm.watermarks", watermark(T0 + 39, {0: 1}))
    order = [(a.sample.ts, a.sample.node) for a in attributed(outs)]
    assert order == [(T0 + t, n) for t in range(40) for n in (N1, N2)]
    assert c.held_count == 0


def test_merged_release_keeps_each_nodes_arrival_order() -> None:
    c = gated()
    for ts in (T0 + 3, T0 + 1, T0 + 2):
        c.handle("gpu.samples", sample(ts))
    c.handle("gpu.samples", sample(T0 + 2, node=N2))
    outs = c.handle("slurm.watermarks", watermark(T0 + 3))
    assert [(a.sample.ts, a.sample.node) for a in attributed(outs)] == [
        (T0 + 2, N2),
        (T0 + 3, N1),
        (T0 + 1, N1),
        (T0 + 2, N1),
    ]


def test_a_join_that_raises_loses_that_record_only_the_rest_stay_held_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = gated()
    for t in range(4):
        for node in (N1, N2):
            c.handle("gpu.samples", sample(T0 + t, node=node))
    real = c._sample

    def failing(smp: NodeSample, value: bytes, known: bool) -> list[Output]:
        if smp.node == N2 and smp.ts == T0 + 1:
            raise RuntimeError("boom")
        return real(smp, value, known)

    monkeypatch.setattr(c, "_sample", failing)
    c.view.on_watermark(SlurmWatermark(cluster="c", ts=T0 + 3, jobs_offsets={}))
    with pytest.raises(RuntimeError):
        c.release()
    # N1@0, N2@0, N1@1 were joined (their outputs went with the raise), N2@1 is lost, the rest wait
    assert c.held_count == 4
    assert {n: [r.ts - T0 for r in q] for n, q in c.held.items()} == {N1: [2.0, 3.0], N2: [2.0, 3.0]}
    monkeypatch.setattr(c, "_sample", real)
    assert [(a.sample.ts - T0, a.sample.node) for a in attributed(c.release())] == [
        (2, N1),
        (2, N2),
        (3, N1),
        (3, N2),
    ]


def test_a_later_record_behind_a_timed_out_head_waits_its_own_hold() -> None:
    clock = Clock()
    c = gated(clock, hold_s=30.0)
    c.handle("gpu.samples", sample(T0))
    clock.t = 20.0
    c.handle("gpu.samples", sample(T0 + 1))
    clock.t = 30.0
    assert ts_of(c.release()) == [T0]
    clock.t = 49.0
    assert c.release() == []
    clock.t = 50.0
    assert ts_of(c.release()) == [T0 + 1]


def test_max_held_per_node_releases_the_oldest_as_unknown() -> None:
    c = gated(max_held_per_node=3)
    for i in range(3):
        assert c.handle("gpu.samples", sample(T0 + i)) == []
    assert c.handle("gpu.samples", sample(T0, node=N2)) == []
    outs = c.handle("gpu.samples", sample(T0 + 3))  # the fourth of N1
    assert [(a.sample.node, a.sample.ts, a.attribution) for a in attributed(outs)] == [(N1, T0, "unknown")]
    assert (len(c.held[N1]), len(c.held[N2]), c.held_count) == (3, 1, 4)
    assert [r.ts for r in c.held[N1]] == [T0 + 1, T0 + 2, T0 + 3]


# -- checkpoints -------------------------------------------------------------------------------
def test_held_floor_is_the_oldest_held_offset_per_partition_and_kind() -> None:
    c = gated()
    assert c.held_floor(0) is None
    c.handle("gpu.samples", sample(T0 + 1, N1), partition=0, offset=10)
    c.handle("gpu.events", xid(T0 + 1, N1), partition=0, offset=3)
    c.handle("gpu.samples", sample(T0 + 2, N1), partition=0, offset=11)
    c.handle("gpu.samples", sample(T0 + 5, N2), partition=1, offset=7)
    c.handle("gpu.samples", sample(T0 + 6, N2), partition=1, offset=8)
    c.handle("gpu.events", xid(T0 + 6, N2), partition=1, offset=40)
    assert (c.held_floor(0), c.held_floor(1), c.held_floor(2)) == (10, 7, None)
    assert (c.held_floor(0, "gpu.events"), c.held_floor(1, "gpu.events")) == (3, 40)
    c.handle("slurm.watermarks", watermark(T0 + 1))  # releases N1's first sample and its event
    assert (c.held_floor(0), c.held_floor(0, "gpu.events"), c.held_floor(1)) == (11, None, 7)
    c.handle("slurm.watermarks", watermark(T0 + 10))
    assert (c.held_floor(0), c.held_floor(1), c.held_floor(1, "gpu.events")) == (None, None, None)


def _stream(seconds: int = 40) -> list[tuple[str, bytes, int, int]]:
    """(topic, value, partition, offset): N1 on partition 0, N2 on partition 1, 1 Hz."""
    out = []
    for i in range(seconds):
        for p, node in enumerate((N1, N2)):
            out.append(("gpu.samples", sample(T0 + i, node), p, i))
    return out


def _windows(outs: list[Output]) -> list[JobWindow]:
    ws = [w for o in outs if o.topic == "job.windows" and isinstance(w := decode("job.windows", o.value), JobWindow)]
    assert len(ws) == sum(o.topic == "job.windows" for o in outs)
    return sorted(ws, key=lambda w: (w.job_id, w.node, w.gpu_index, w.window_start))


def _slurm(c: Correlator, upto: float) -> list[Output]:
    """Slurm's stream up to a watermark at ``upto``: one job on both nodes, one watermark per 5 s."""
    outs = read_job(c, job(ts=T0, start=T0 - 50, nodes=(N1, N2)), 0)
    for t in range(0, int(upto - T0) + 1, 5):
        outs += c.handle("slurm.watermarks", watermark(T0 + t, {0: 1}))
    return outs


def test_take_dirty_restore_round_trip_gives_the_windows_of_an_uninterrupted_run() -> None:
    stream = _stream()
    # Uninterrupted.
    a = gated()
    whole = _slurm(a, T0 + 100)
    for topic, value, p, off in stream:
        whole += a.handle(topic, value, partition=p, offset=off)
    whole += a.flush()

    # Interrupted: the watermark stops at T0 + 20, records after it are held; checkpoint at the
    # middle of the stream, then a fresh worker restores the snapshot and re-reads each partition
    # from its committed offset (capped at the held floor, as the service commits).
    b = gated()
    first = _slurm(b, T0 + 20)
    middle = len(stream) // 2 + 10
    for topic, value, p, off in stream[:middle]:
        first += b.handle(topic, value, partition=p, offset=off)
    assert b.held_count > 0
    handled = {p: max(off for _t, _v, q, off in stream[:middle] if q == p) + 1 for p in (0, 1)}
    committed = {p: min(handled[p], b.held_floor(p) or handled[p]) for p in (0, 1)}
    snapshot = b.take_dirty()
    assert sorted((p, n) for p, n, _ in snapshot) == [(0, N1), (1, N2)]
    assert b.take_dirty() == []  # nothing changed since
    assert b.drop({0, 1}) == 2 and b.held == {} and b.held_count == 0

    c = gated()
    for p, node, state in snapshot:
        c.restore(node, p, orjson.loads(state))
    c.restore("gone-node", 0, None)  # a tombstone: nothing
    assert c.windows.get("gone-node") is None
    rest = _slurm(c, T0 + 100)  # the Slurm view is read again from the lookback
    for topic, value, p, off in stream:
        if off >= committed[p]:
            rest += c.handle(topic, value, partition=p, offset=off)
    rest += c.flush()

    assert _windows(first + rest) == _windows(whole)
    assert len(_windows(whole)) == 2 * 2 * 4  # 2 nodes x 2 GPUs x 4 windows
    key = lambda o: (o.key, orjson.loads(o.value)["sample"]["ts"])
    got = sorted((o for o in first + rest if o.topic == "gpu.attributed"), key=key)
    assert [o.value for o in got] == [o.value for o in sorted(attributed_outs(whole), key=key)]


def attributed_outs(outs: list[Output]) -> list[Output]:
    return [o for o in outs if o.topic == "gpu.attributed"]


def test_drop_forgets_only_the_revoked_partitions_nodes() -> None:
    c = gated()
    c.handle("slurm.watermarks", watermark(T0 + 5))
    for i in range(8):
        c.handle("gpu.samples", sample(T0 + i, N1), partition=0, offset=i)
        c.handle("gpu.samples", sample(T0 + i, N2), partition=1, offset=i)
    assert c.held_count == 4 and c.take_dirty()
    assert c.drop({0}) == 1
    assert (set(c.held), c.held_count, set(c.partition_of)) == ({N2}, 2, {N2})
    assert c.windows.get(N1) is None and c.windows.get(N2) is not None
    assert c.held_floor(0) is None and c.held_floor(1) == 6
    assert c.drop({0}) == 0


# -- event-time determinism ------------------------------------------------------------------------
def _det_streams() -> tuple[list[tuple[str, bytes]], dict[str, list[tuple[str, bytes]]]]:
    """Slurm's stream (a poll every 5 s: the JobStates it found, then its watermark) and each
    node's input, 1 Hz; samples after the last watermark (T0 + 60) end as unknown at the flush."""
    polls: dict[int, list[bytes]] = {
        0: [job("A", ts=T0, start=T0 - 100, nodes=(N1,))],
        # B started at T0 + 3, between two polls: the poll at T0 + 5 is the first to see it.
        5: [job("B", ts=T0 + 5, start=T0 + 3, nodes=(N2,))],
        # A ended at T0 + 30 (seen at T0 + 35); C took its GPUs at T0 + 32.
        35: [
            job("A", ts=T0 + 35, start=T0 - 100, nodes=(N1,), state="COMPLETED", end_ts=T0 + 30),
            job("C", ts=T0 + 35, start=T0 + 32, nodes=(N1, N2)),
        ],
        40: [job("B", ts=T0 + 40, start=T0 + 3, nodes=(N2,), state="COMPLETED", end_ts=T0 + 37)],
    }
    slurm: list[tuple[str, bytes]] = []
    offset = 0
    for t in range(0, 61, 5):
        for value in polls.get(t, []):
            slurm.append(("slurm.jobs", value))
            offset += 1
        slurm.append(("slurm.watermarks", watermark(T0 + t, {0: offset})))
    nodes: dict[str, list[tuple[str, bytes]]] = {N1: [], N2: []}
    for i in range(66):
        for node in (N1, N2):
            nodes[node].append(("gpu.samples", sample(T0 + i + 0.5, node)))
    nodes[N1].insert(13, ("gpu.events", xid(T0 + 12.7, N1)))
    nodes[N2].insert(40, ("gpu.events", xid(T0 + 39.1, N2, gpu=0)))
    return slurm, nodes


def _run(order: list[tuple[str, str, bytes]], c: Correlator) -> tuple[dict[str, list[bytes]], list[JobWindow]]:
    jobs_offset = 0
    outs: list[Output] = []
    for stream, topic, value in order:
        if topic == "slurm.jobs":
            outs += read_job(c, value, jobs_offset)
            jobs_offset += 1
        else:
            outs += c.handle(topic, value, partition=0 if stream != N2 else 1)
    outs += c.flush()
    assert c.held_count == 0
    per_node: dict[str, list[bytes]] = {}
    for o in outs:
        if o.topic in ("gpu.attributed", "gpu.events.attributed"):
            per_node.setdefault(o.key or "", []).append(o.value)
    return per_node, _windows(outs)


def _interleave(streams: dict[str, list[tuple[str, bytes]]], rng: random.Random) -> list[tuple[str, str, bytes]]:
    """A random merge that keeps each stream's own order."""
    pos = dict.fromkeys(streams, 0)
    out: list[tuple[str, str, bytes]] = []
    while True:
        live = [s for s in streams if pos[s] < len(streams[s])]
        if not live:
            return out
        s = rng.choice(live)
        out.append((s, *streams[s][pos[s]]))
        pos[s] += 1


def _concat(streams: dict[str, list[tuple[str, bytes]]], names: list[str]) -> list[tuple[str, str, bytes]]:
    return [(s, t, v) for s in names for t, v in streams[s]]


@pytest.mark.parametrize("seed", range(6))
def test_result_depends_on_event_time_only_not_on_arrival_interleaving(seed: int) -> None:
    slurm, nodes = _det_streams()
    streams = {"slurm": slurm, **nodes}
    slurm_first = _run(_concat(streams, ["slurm", N1, N2]), gated())
    samples_first = _run(_concat(streams, [N1, N2, "slurm"]), gated())
    shuffled = _run(_interleave(streams, random.Random(seed)), gated())
    assert samples_first == slurm_first
    assert shuffled == slurm_first

    per_node, windows = slurm_first
    att = {n: [orjson.loads(v) for v in vs] for n, vs in per_node.items()}
    # Samples after the last watermark went out unknown at the flush; the rest known.
    for n in (N1, N2):
        samples = [a for a in att[n] if "sample" in a]
        assert [a["sample"]["ts"] for a in samples if a.get("attribution") == "unknown"] == [
            T0 + i + 0.5 for i in range(60, 66)
        ]
        assert all(a.get("attribution", "known") == "known" for a in samples if a["sample"]["ts"] < T0 + 60)
    jobs_at = {a["sample"]["ts"]: {j["job_id"] for j in a["jobs"]} for a in att[N2] if "sample" in a}
    assert jobs_at[T0 + 2.5] == set() and jobs_at[T0 + 3.5] == {"B"}  # B honoured from its start
    # C overlaps B's GPUs from T0 + 32 (inconsistent Slurm data): the later start wins.
    assert jobs_at[T0 + 31.5] == {"B"} and jobs_at[T0 + 32.5] == {"C"} and jobs_at[T0 + 37.5] == {"C"}
    assert {w.job_id for w in windows} == {"A", "B", "C"}


def test_gated_result_equals_an_ungated_run_with_the_whole_slurm_view_first() -> None:
    """Up to the last watermark, the held join gives what a complete view would have given."""
    slurm, nodes = _det_streams()
    streams = {"slurm": slurm, **nodes}
    gated_att, _ = _run(_interleave(streams, random.Random(99)), gated())
    ungated_att, _ = _run(_concat(streams, ["slurm", N1, N2]), Correlator())

    def known(vs: list[bytes]) -> list[bytes]:
        return [v for v in vs if b'"attribution":"unknown"' not in v]

    for n in (N1, N2):
        assert known(gated_att[n]) == ungated_att[n][: len(known(gated_att[n]))]
        assert len(gated_att[n]) == len(ungated_att[n])


def test_a_kafka_outage_does_not_run_down_the_hold() -> None:
    """Full chaos bench: a 60 s outage released the samples held at its start as ``unknown`` (46
    readings missing from their windows), though the watcher's first watermark after the outage
    covered them. The service's hold clock stands still while the broker does not answer."""
    from gpuwarden.correlator.service import HoldClock

    wall = Clock()
    age: list[float | None] = [None]  # no fetch answer yet: counted as answering
    hc = HoldClock(lambda: age[0], stale_s=3.0, clock=wall)
    c = gated(hc, hold_s=30.0)  # type: ignore[arg-type]
    read_job(c, job(), 0)
    assert c.handle("gpu.samples", sample(T0 - 10)) == []
    age[0] = 0.1
    for t in range(1, 5):  # the broker answers for 4 s
        wall.t = float(t)
        assert c.release() == []
    age[0] = 3.5  # the outage: no answer for more than 3 s
    for t in range(5, 65):
        wall.t = float(t)
        assert c.release() == []  # 60 s, nothing goes out unknown
    assert hc.paused_s == 60.0 and c.held_count == 1
    age[0] = 0.2  # the broker answers again; the watcher's watermark comes within the hold
    wall.t = 66.0
    assert c.release() == []
    [out] = c.handle("slurm.watermarks", watermark(T0, {0: 1}))
    assert b'"attribution"' not in out.value and c.unknown == 0  # known (the default, not written)
    # a stalled watcher while the broker answers: the bound still holds, 30 s of answered time
    assert c.handle("gpu.samples", sample(T0 + 5)) == []
    wall.t = 66.0 + 29.0
    assert c.release() == []
    wall.t = 66.0 + 30.0
    assert [a.attribution for a in attributed(c.release())] == ["unknown"]
