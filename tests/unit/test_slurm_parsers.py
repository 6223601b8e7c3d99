"""`gpuwarden parse ...` wrappers and the v0.0.38..v0.0.42 shapes of the Slurm JSON parsers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuwarden.shared.slurm import parsers as P
from gpuwarden.shared.slurm.jsonparse import api_version, parse_sacct_json, parse_squeue_json
from gpuwarden.shared.slurm.textparse import parse_scontrol_jobs

FIX = Path(__file__).resolve().parents[1] / "fixtures"
LOCAL = FIX / "slurm" / "local-22.05"
SYN = FIX / "slurm" / "synthetic"


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    """scontrol prints local time; the fixtures were recorded on a UTC machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_api_version_detection() -> None:
    docs = {
        "squeue.json": "v0.0.38",
        "sacct.json": "v0.0.38",
        "restd-slurm_v0.0.38_nodes.json": "v0.0.38",
    }
    for name, ver in docs.items():
        assert api_version(json.loads((LOCAL / name).read_text())) == ver, name
    assert api_version(json.loads((SYN / "squeue-v0.0.42.json").read_text())) == "v0.0.42"
    text = (FIX / "slurm" / "slurmrestd-v0042-node-idle-drain-ecc.txt").read_text()
    assert api_version(json.loads(text[text.index("{") :])) == "v0.0.42"
    assert api_version({"jobs": []}) is None


def test_sacct_22_05_end_states() -> None:
    jobs = {j.job_id: j for j in parse_sacct_json((LOCAL / "sacct.json").read_text(), 1.0)}
    assert sorted(jobs) == ["1", "2", "3", "4", "5"]
    j1, j2, j4 = jobs["1"], jobs["2"], jobs["4"]
    assert (j1.state, j1.exit_code, j1.nodes, j1.user, j1.account, j1.partition) == (
        "COMPLETED",
        0,
        ["gpu-node-001"],
        "root",
        "root",
        "gpu",
    )
    assert (j1.submit_ts, j1.start_ts, j1.end_ts, j1.confirmed) == (1796023511.0, 1796023512.0, 1796023542.0, True)
    assert j2.nodes == ["gpu-node-002", "gpu-node-003"] and j2.gpus == {}
    # 22.05's JSON reports SUCCESS/0 for the job that exited 3 (sacct.txt shows 3:0): unknown, not 0
    assert (j4.state, j4.exit_code) == ("FAILED", None)


def test_sacct_v0042_shapes() -> None:
    jobs = {j.job_id: j for j in parse_sacct_json((SYN / "sacct-v0.0.42.json").read_text(), 1.0)}
    assert sorted(jobs) == ["103", "104_7"]
    assert (jobs["103"].state, jobs["103"].exit_code, jobs["103"].nodes) == ("FAILED", 3, ["gn-03"])
    assert (jobs["104_7"].state, jobs["104_7"].exit_code) == ("CANCELLED", 128 + 9)
    assert jobs["103"].start_ts == 1800000010.0 and jobs["103"].end_ts == 1800000020.0


def test_squeue_v0042_shapes() -> None:
    jobs, need = parse_squeue_json((SYN / "squeue-v0.0.42.json").read_text(), 5.0)
    by = {j.job_id: j for j in jobs}
    assert need == []
    r = by["101"]
    assert (r.state, r.nodes, r.gpus) == ("RUNNING", ["gn-01", "gn-02"], {"gn-01": [0, 1], "gn-02": [2, 3]})
    assert (r.submit_ts, r.start_ts, r.user, r.account, r.reason) == (1800000000.0, 1800000010.0, "alice", "proj", None)
    p = by["102"]
    assert (p.state, p.nodes, p.start_ts, p.reason) == ("PENDING", [], None, "Resources")
    assert (by["103"].state, by["103"].exit_code, by["103"].gpus) == ("FAILED", 3, {"gn-03": [5]})
    assert (by["104_7"].state, by["104_7"].exit_code) == ("CANCELLED", 143)


def test_squeue_22_05_submit_and_reason() -> None:
    jobs, _ = parse_squeue_json((LOCAL / "squeue.json").read_text(), 5.0)
    by = {j.job_id: j for j in jobs}
    assert by["1"].submit_ts == 1796023511.0 and by["1"].reason is None
    pending = [j for j in jobs if j.state == "PENDING"]
    assert pending and all(j.reason for j in pending)


def test_scontrol_jobs_full(utc: None) -> None:
    jobs = parse_scontrol_jobs((LOCAL / "scontrol-show-job-d.txt").read_text(), 3.0)
    by = {j.job_id: j for j in jobs}
    assert by["1"].gpus == {"gpu-node-001": [0, 1, 2, 3]}
    assert by["2"].gpus == {n: list(range(8)) for n in ("gpu-node-002", "gpu-node-003")}
    assert (by["1"].user, by["1"].account, by["1"].partition, by["1"].state) == ("root", "root", "gpu", "RUNNING")
    assert by["1"].submit_ts == 1796023511.0 and by["1"].start_ts == 1796023512.0 and by["1"].end_ts is None
    assert (by["5"].state, by["5"].nodes, by["5"].reason) == ("PENDING", [], "Resources")


def test_scontrol_job_one_line_exit_and_signal() -> None:
    text = (
        "JobId=7 JobName=x UserId=bob(1001) Account=a Partition=gpu JobState=FAILED Reason=NonZeroExitCode "
        "ExitCode=3:0 SubmitTime=2026-01-01T00:00:00 StartTime=2026-01-01T00:00:01 EndTime=2026-01-01T00:00:02 "
        "NodeList=n[1-2] Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3) Nodes=n2 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)\n"
        "JobId=8 JobName=y UserId=bob(1001) JobState=CANCELLED ExitCode=0:15 NodeList=n3\n"
    )
    a, b = parse_scontrol_jobs(text, 1.0)
    assert (a.job_id, a.user, a.exit_code, a.nodes, a.gpus) == ("7", "bob", 3, ["n1", "n2"], {"n1": [3], "n2": [0, 1]})
    assert (b.job_id, b.exit_code, b.gpus) == ("8", 143, {})
    with pytest.raises(ValueError, match="JobState"):
        parse_scontrol_jobs("JobId=9 JobName=z\n", 1.0)


@pytest.mark.parametrize(
    ("fn", "path", "key", "count"),
    [
        (P.squeue_json, LOCAL / "squeue.json", "jobs", None),
        (P.sinfo_json, LOCAL / "sinfo.json", "nodes", 4),
        (P.sacct_json, LOCAL / "sacct.json", "jobs", 5),
        (P.slurmrestd_jobs, LOCAL / "restd-slurm_v0.0.38_jobs.json", "jobs", None),
        (P.slurmrestd_nodes, LOCAL / "restd-slurm_v0.0.38_nodes.json", "nodes", 4),
        (P.slurmrestd_nodes, FIX / "slurm" / "slurmrestd-v0042-node-idle-drain-ecc.txt", "nodes", 1),
        (P.squeue_json, SYN / "squeue-v0.0.42.json", "jobs", 4),
    ],
)
def test_json_wrappers(fn, path: Path, key: str, count: int | None) -> None:  # type: ignore[no-untyped-def]
    out = fn(path.read_text())
    assert out["api_version"] and out[key]
    if count is not None:
        assert len(out[key]) == count


def test_restd_slurmdb_jobs_go_to_the_sacct_parser() -> None:
    out = P.slurmrestd_jobs((LOCAL / "restd-slurmdb_v0.0.38_jobs.json").read_text())
    assert out["jobs"] and any(j.confirmed for j in out["jobs"])


def test_v0042_drained_node() -> None:
    (n,) = P.slurmrestd_nodes((FIX / "slurm" / "slurmrestd-v0042-node-idle-drain-ecc.txt").read_text())["nodes"]
    assert (n.node, n.state, n.flags, n.reason, n.reason_user) == ("cn3", "IDLE", ["DRAIN"], "ECC memory error", "root")


def test_text_wrappers(utc: None) -> None:
    (r,) = P.sinfo_r((FIX / "slurm" / "sinfo-R-kill-task-failed.txt").read_text())
    assert r == {"node": "ip-10-0-0-23", "reason": "Kill task failed", "user": "root", "reason_ts": 1706195543.0}
    nodes = P.scontrol_node((LOCAL / "scontrol-show-node-all-with-drained.txt").read_text())
    assert len(nodes) == 4
    assert {j.job_id for j in P.scontrol_job((LOCAL / "scontrol-show-job-d.txt").read_text())} >= {"1", "2", "5"}


def test_hostlist_wrapper() -> None:
    (h,) = P.hostlist((FIX / "hostlist" / "scontrol-hostnames-multi-prefix-zero-pad.txt").read_text())
    assert h["nodes"] == [
        "ml-16-node-001",
        "ml-16-node-002",
        "ml-16-node-004",
        "ml-17-node-001",
        "ml-17-node-002",
        "ml-17-node-003",
    ]
    out = P.hostlist("gpu-[009-011]\n# c\nb-[3,1,1]\n")
    assert [o["nodes"] for o in out] == [["gpu-009", "gpu-010", "gpu-011"], ["b-3", "b-1", "b-1"]]
    with pytest.raises(ValueError):
        P.hostlist("gpu-[001-")


@pytest.mark.parametrize(
    ("fn", "path"),
    [
        (P.squeue_json, LOCAL / "sacct.json"),
        (P.squeue_json, LOCAL / "sinfo.json"),
        (P.sinfo_json, LOCAL / "squeue.txt"),
        (P.sacct_json, LOCAL / "sinfo.json"),
        (P.scontrol_job, LOCAL / "drain.txt"),
        (P.scontrol_node, LOCAL / "scontrol-show-job-d.txt"),
        (P.sinfo_r, LOCAL / "sacct.txt"),
    ],
)
def test_wrappers_reject_other_output(fn, path: Path) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text() if path.exists() else "JOBID PARTITION NAME\n1 gpu x\n"
    with pytest.raises(ValueError):
        fn(text)


def test_slurm_error_document_is_quoted() -> None:
    doc = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [{"error": "Unable to contact slurmctld"}]}
    with pytest.raises(ValueError, match="Unable to contact slurmctld"):
        P.squeue_json(json.dumps(doc))


def test_state_lists_of_24_11_and_later() -> None:
    from gpuwarden.shared.slurm.fields import base_job_state, node_state

    assert node_state(["IDLE", "DRAIN"], None) == ("IDLE", ["DRAIN"])
    assert node_state(["MIXED", "DRAIN", "COMPLETING"], None) == ("MIXED", ["DRAIN", "COMPLETING", "DRAINING"])
    assert node_state(["DRAIN", "IDLE"], None) == ("IDLE", ["DRAIN"])  # base moved to the front
    assert node_state(["DOWN*", "DRAIN"], None) == ("DOWN", ["DRAIN", "NOT_RESPONDING"])
    assert node_state([], None) == ("UNKNOWN", [])
    assert base_job_state(["RUNNING"]) == "RUNNING"
    assert base_job_state(["PENDING", "REQUEUED"]) == "PENDING"
    assert base_job_state(["REQUEUED", "PENDING"]) == "PENDING"
    assert base_job_state(["CONFIGURING"]) == "CONFIGURING"
    assert base_job_state([]) == "UNKNOWN"
    assert base_job_state("completed") == "COMPLETED"


def test_sinfo_json_23_02_groups_shape() -> None:
    from gpuwarden.shared.slurm.jsonparse import parse_sinfo_json

    text = (SYN / "sinfo-json-v0.0.42-node-groups.txt").read_text()
    nodes = {n.node: n for n in parse_sinfo_json(text[text.index("{") :], 1.0)}
    assert list(nodes) == ["gpu-a-001", "gpu-a-002", "gpu-a-003", "cpu-001"]
    a = nodes["gpu-a-001"]
    assert a.partitions == ["gpu", "debug"] and a.gpus_used_idx == [0, 1, 5] and a.reason_ts == 1800000000.0
    assert nodes["gpu-a-002"].cpus == 128 and nodes["gpu-a-002"].alloc_cpus is None
    assert nodes["cpu-001"].reason == "Not responding" and nodes["cpu-001"].state == "DOWN"
    with pytest.raises(ValueError, match="no 'nodes' list"):
        parse_sinfo_json('{"meta": {}}', 1.0)
    assert api_version({"meta": {"plugin": {"data_parser": "data_parser/v0.0.44"}}}) == "v0.0.44"
