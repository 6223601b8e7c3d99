"""jobcomp/kafka job records (optional job source): parsing and GPU indices from the poller."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.shared.models import JobState
from gpuwarden.shared.slurm.jobcomp import fill_gpus, parse_jobcomp_lines, parse_jobcomp_record

SYN = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "synthetic"


def test_start_and_end_records() -> None:
    start, end, task = parse_jobcomp_lines((SYN / "jobcomp-kafka-records.txt").read_text(), 5.0)
    assert (start.job_id, start.state, start.end_ts, start.exit_code, start.confirmed) == (
        "5001",
        "RUNNING",
        None,
        None,
        None,
    )
    assert start.nodes == ["gpu-01", "gpu-02"] and start.gpus == {} and start.ts == 5.0
    assert (end.state, end.exit_code, end.confirmed, end.end_ts) == ("FAILED", 2, True, 1748779805.0)
    assert (task.job_id, task.state, task.exit_code) == ("5008_2", "CANCELLED", 143)


def test_record_variants_and_errors() -> None:
    j = parse_jobcomp_record(
        {"jobid": 7, "state": "CANCELLED by 1000", "exit_code": "0:9", "@end": "2025-06-01T12:00:00Z", "nodes": ""},
        1.0,
    )
    assert (j.state, j.exit_code, j.end_ts, j.nodes) == ("CANCELLED", 137, 1748779200.0, [])
    j = parse_jobcomp_record(b'{"jobid": 8, "array_job_id": 0, "array_task_id": 4294967294, "state": "COMPLETED"}', 1.0)
    assert (j.job_id, j.exit_code) == ("8", None)
    with pytest.raises(ValueError, match="no 'jobid'"):
        parse_jobcomp_record({"state": "COMPLETED"}, 1.0)
    with pytest.raises(ValueError, match="not JSON"):
        parse_jobcomp_record("nope", 1.0)
    with pytest.raises(ValueError, match="line 2"):
        parse_jobcomp_lines('{"jobid": 1}\n[1]\n', 1.0)
    with pytest.raises(ValueError, match="no record"):
        parse_jobcomp_lines("\n# nothing\n", 1.0)


def test_fill_gpus_from_the_poller() -> None:
    (end,) = [j for j in parse_jobcomp_lines((SYN / "jobcomp-kafka-records.txt").read_text(), 5.0) if j.confirmed][:1]
    polled = {
        "5001": JobState(
            job_id="5001",
            ts=4.0,
            state="RUNNING",
            nodes=["gpu-01", "gpu-02"],
            gpus={"gpu-01": [0, 1, 2, 3], "gpu-02": [0, 1, 2, 3], "other": [0]},
        )
    }
    filled = fill_gpus(end, polled)
    assert filled.gpus == {"gpu-01": [0, 1, 2, 3], "gpu-02": [0, 1, 2, 3]}
    assert filled.state == "FAILED" and end.gpus == {}
    assert fill_gpus(end, {}) is end  # never polled (shorter than a poll period): stays empty
