"""The chaos bench's window ledger (issue 25, ``windows lost``): the job windows the samples on
``gpu.samples`` imply, against those ``job.windows`` carried."""

from __future__ import annotations

from gpuwarden.shared.models import GpuSample, JobWindow, NodeSample
from gpuwarden.sim.bench.windowledger import WindowLedger

T0 = 1_700_000_000.0  # a multiple of 10: window starts at T0, T0 + 10, ...


def _sample(node: str, ts: float, gpus: int = 2) -> bytes:
    return NodeSample(
        node=node, ts=ts, collector_id="c", source="simulated", gpus=[GpuSample(index=i) for i in range(gpus)]
    ).to_json()


def _window(node: str, gpu: int, start: float, samples: int) -> bytes:
    return JobWindow(
        job_id="1001", node=node, gpu_index=gpu, window_start=start, window_end=start + 10, samples=samples
    ).to_json()


def _feed(ledger: WindowLedger, node: str, seconds: int, first_offset: int = 0) -> None:
    for i in range(seconds):
        ledger.observe("gpu.samples", 0, first_offset + i, _sample(node, T0 + i))


def test_every_closed_window_that_came_whole_loses_nothing() -> None:
    led = WindowLedger(10.0, 5.0)
    _feed(led, "n1", 35)  # newest sample T0+34: windows T0 and T0+10 closed (end + grace <= 34), T0+20 not
    for start in (T0, T0 + 10, T0 + 20):
        for gpu in (0, 1):
            led.observe("job.windows", 0, 0, _window("n1", gpu, start, 10))
    loss = led.loss()
    assert (loss.expected, loss.lost, loss.readings_lost) == (4, 0, 0)


def test_a_missing_window_and_a_short_one_are_counted() -> None:
    led = WindowLedger(10.0, 5.0)
    _feed(led, "n1", 35)
    led.observe("job.windows", 0, 0, _window("n1", 0, T0, 10))
    led.observe("job.windows", 0, 0, _window("n1", 1, T0, 7))  # 3 readings short
    led.observe("job.windows", 0, 0, _window("n1", 1, T0, 6))  # a duplicate with fewer: the most counts
    led.observe("job.windows", 0, 0, _window("n1", 0, T0 + 10, 10))
    loss = led.loss()
    assert (loss.expected, loss.lost, loss.readings_lost) == (4, 1, 3)
    assert loss.examples == [("n1", 1, T0 + 10)]
    assert loss.short == [(("n1", 1, T0), 7, 10, [float(i) for i in range(10)])]  # for the notes


def test_injected_records_and_undecodable_ones_imply_no_window() -> None:
    led = WindowLedger(10.0, 5.0)
    _feed(led, "n1", 16)
    led.observe("job.windows", 0, 0, _window("n1", 0, T0, 10))
    led.observe("job.windows", 0, 0, _window("n1", 1, T0, 10))
    # a schema-valid record the bench injected far ahead: it would close every window of n2
    led.observe("gpu.samples", 1, 7, _sample("n2", T0 + 86_400))
    led.observe("gpu.samples", 1, 8, _sample("n2", T0))
    led.observe("gpu.samples", 1, 9, b'{"schema_version": 1, "node": ')  # fuzz: ignored
    led.observe("failures", 1, 10, b"{}")  # another topic: ignored
    assert led.loss(exclude=[(1, 7)]).lost == 0  # n2's only valid sample closes nothing
    assert led.loss().lost == 2  # taken as valid, the injected one closes n2's window T0 (2 GPUs)


def test_missing_ticks_count_samples_lost_before_kafka_outside_the_collectors_downtime() -> None:
    led = WindowLedger(10.0, 5.0)
    for i in range(30):
        if i not in (4, 5, 12, 20, 21, 22):  # n1's ticks that never reached gpu.samples
            led.observe("gpu.samples", 0, i, _sample("n1", T0 + i))
        if i not in (20, 21, 22):
            led.observe("gpu.samples", 1, i, _sample("n2", T0 + i))
    assert led.missing_ticks(1.0) == (9, [("n1", T0 + 4), ("n1", T0 + 5), ("n1", T0 + 12), ("n1", T0 + 20),
                                          ("n1", T0 + 21)])  # fmt: skip
    # 20-22: the collector was down (a tick never taken is not a tick lost)
    assert led.missing_ticks(1.0, excused=[(T0 + 19.5, T0 + 22.5)]) == (3, [("n1", T0 + 4), ("n1", T0 + 5),
                                                                          ("n1", T0 + 12)])  # fmt: skip
    # a hostile record at an odd time (excluded by partition and offset) makes no gap of its own
    led.observe("gpu.samples", 0, 999, _sample("n1", T0 + 40))
    assert led.missing_ticks(1.0, exclude=[(0, 999)], excused=[(T0 + 19.5, T0 + 22.5)])[0] == 3
    assert led.missing_ticks(1.0, excused=[(T0 + 19.5, T0 + 22.5)])[0] == 3 + 10  # 30..39 of n1
    # ticks one node's source skipped on purpose ([from, to): 4 and 5, not 6)
    assert led.missing_ticks(1.0, exclude=[(0, 999)], excused=[(T0 + 19.5, T0 + 22.5)],
                             node_excused={"n1": [(T0 + 3.2, T0 + 6)]}) == (1, [("n1", T0 + 12)])  # fmt: skip
