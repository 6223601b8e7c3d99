"""slurm-watcher's optional jobcomp/kafka source: an end record over the poller's view (GPU
indices from the poller), nothing for what the poller already has, and a poller that never
goes back from that end while squeue still lists the job COMPLETING. Records from the
fixture tests/fixtures/slurm/synthetic/jobcomp-kafka-records.txt (the plugin's record shape)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuwarden.shared.bus import MemoryPublisher
from gpuwarden.shared.models import JobState, NodeState
from gpuwarden.shared.slurm.jobcomp import parse_jobcomp_record
from gpuwarden.sim.slurm import FakeSlurm
from gpuwarden.slurm_watcher import SlurmWatcher, SlurmWatcherSettings
from gpuwarden.slurm_watcher.jobcomp import merge_end

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "synthetic" / "jobcomp-kafka-records.txt"
RECORDS = [line for line in FIXTURE.read_text().splitlines() if line.startswith("{")]
START_5001, END_5001 = RECORDS[0], RECORDS[1]  # job 5001 on gpu-[01-02]: start, then FAILED


def polled_5001(state: str = "RUNNING") -> JobState:
    return JobState(job_id="5001", ts=1000.0, state=state, user="user01", nodes=["gpu-01", "gpu-02"],
                    gpus={"gpu-01": [0, 1, 2, 3], "gpu-02": [0, 1, 2, 3]}, start_ts=1748779205.0)  # fmt: skip


def test_an_end_the_poller_has_not_seen_is_published_with_the_pollers_gpus() -> None:
    rec = parse_jobcomp_record(END_5001, 2000.0)
    assert rec.gpus == {} and rec.state == "FAILED"
    out = merge_end(rec, {"5001": polled_5001()})
    assert out is not None
    assert (out.state, out.exit_code, out.confirmed, out.ts) == ("FAILED", 2, True, 2000.0)
    assert out.gpus == {"gpu-01": [0, 1, 2, 3], "gpu-02": [0, 1, 2, 3]}
    assert out.end_ts == rec.end_ts and out.end_ts is not None


def test_a_start_record_and_an_end_already_known_add_nothing() -> None:
    assert merge_end(parse_jobcomp_record(START_5001, 2000.0), {"5001": polled_5001()}) is None
    assert merge_end(parse_jobcomp_record(END_5001, 2000.0), {"5001": polled_5001("COMPLETED")}) is None


def test_an_end_of_a_job_the_poller_never_saw_goes_out_without_gpus() -> None:
    out = merge_end(parse_jobcomp_record(END_5001, 2000.0), {})
    assert out is not None and out.gpus == {} and out.nodes == ["gpu-01", "gpu-02"]


def test_the_watcher_publishes_the_end_once_and_its_polls_never_reopen_the_job() -> None:
    async def scenario() -> None:
        clock = {"t": 1000.0}
        fake = FakeSlurm(nodes=[NodeState(node="gpu-01", ts=1.0, state="ALLOCATED")], jobs=[polled_5001()])
        pub = MemoryPublisher()
        s = SlurmWatcherSettings(slurm_watcher_lease="none", slurm_watcher_jobcomp_topic="slurm-jobcomp", http_port=0)
        w = SlurmWatcher(s, client=fake, producer=pub, now=lambda: clock["t"], accounting=None)  # type: ignore[arg-type]
        await w.poll_once()
        assert [j.state for j in pub.of("slurm.jobs")] == ["RUNNING"]
        await w._on_jobcomp(parse_jobcomp_record(END_5001, 1001.0))
        await w._on_jobcomp(parse_jobcomp_record(END_5001, 1001.5))  # a redelivered record
        jobs = pub.of("slurm.jobs")
        assert [j.state for j in jobs] == ["RUNNING", "FAILED"] and jobs[1].gpus["gpu-02"] == [0, 1, 2, 3]
        # squeue still lists it COMPLETING for a while, then not at all: nothing more is published
        fake.jobs_list = [polled_5001("COMPLETING")]
        clock["t"] = 1002.0
        await w.poll_once()
        fake.jobs_list = []
        for t in (1004.0, 1006.0, 1008.0):
            clock["t"] = t
            await w.poll_once()
        assert [j.state for j in pub.of("slurm.jobs")] == ["RUNNING", "FAILED"]
        assert w.jobcomp_published == 1 and w._jobcomp_ended == {}
        assert w.health()["jobcomp_published"] == 1

    asyncio.run(scenario())
