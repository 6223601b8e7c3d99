"""Parsers of Slurm 22.05 output, on recorded real output (tests/fixtures/slurm)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuwarden.shared.slurm import (
    expand_nodes,
    parse_gres_idx,
    parse_idx_list,
    parse_scontrol_job_gpus,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_sinfo_reasons,
    parse_squeue_json,
    validate_node_name,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
LOCAL = FIX / "slurm" / "local-22.05"
TS = 1796023520.0


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    """scontrol/sinfo print local time; the fixtures were recorded on a UTC machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-3", [0, 1, 2, 3]), ("0,2-3", [0, 2, 3]), ("5", [5]), ("", []), ("N/A", []), ("3,1,1", [1, 3])],
)
def test_parse_idx_list(text: str, expected: list[int]) -> None:
    assert parse_idx_list(text) == expected


def test_parse_idx_list_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_idx_list("3-1")
    with pytest.raises(ValueError):
        parse_idx_list("a")


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:4(IDX:0-3)", [0, 1, 2, 3]),
        ("gpu:a100:2(IDX:0,2)", [0, 2]),
        ("gpu:a100:1(IDX:0),gpu:v100:1(IDX:4)", [0, 4]),
        ("gpu:2(IDX:0-1),mps:100(0)", [0, 1]),
        ("gpu:0", []),
    ],
)
def test_parse_gres_idx(gres: str, expected: list[int]) -> None:
    assert parse_gres_idx(gres) == expected


def test_squeue_json_jobs_nodes_and_gpus() -> None:
    raw = json.loads((LOCAL / "squeue.json").read_text())
    jobs, need = parse_squeue_json((LOCAL / "squeue.json").read_text(), TS)
    assert need == []
    assert [j.job_id for j in jobs] == [str(j["job_id"]) for j in raw["jobs"]]
    by = {j.job_id: j for j in jobs}
    assert by["1"].state == "RUNNING" and by["1"].nodes == ["gpu-node-001"]
    assert by["1"].gpus == {"gpu-node-001": [0, 1, 2, 3]}
    assert by["1"].user == "root" and by["1"].account == "root" and by["1"].partition == "gpu"
    assert by["1"].start_ts == raw["jobs"][0]["start_time"]
    assert by["2"].nodes == ["gpu-node-002", "gpu-node-003"]
    assert by["2"].gpus == {"gpu-node-002": list(range(8)), "gpu-node-003": list(range(8))}
    assert by["3"].state == "COMPLETED" and by["3"].exit_code == 0
    assert by["4"].state == "FAILED" and by["4"].exit_code == 3  # ExitCode 3:0 (raw status 768)
    assert by["5"].state == "PENDING" and by["5"].nodes == [] and by["5"].start_ts is None
    assert all(j.ts == TS for j in jobs)


def test_squeue_json_unmatched_gres_detail_asks_for_scontrol() -> None:
    doc = json.loads((LOCAL / "squeue.json").read_text())
    job2 = next(j for j in doc["jobs"] if j["job_id"] == 2)
    job2["gres_detail"] = job2["gres_detail"][:1]  # one entry for two nodes: cannot match
    jobs, need = parse_squeue_json(json.dumps(doc), TS)
    assert need == ["2"]
    assert next(j for j in jobs if j.job_id == "2").gpus == {}


def test_squeue_json_rejects_non_json() -> None:
    with pytest.raises(ValueError):
        parse_squeue_json("squeue: error: Invalid user", TS)


def test_scontrol_show_job_d_gpus_per_node() -> None:
    gpus = parse_scontrol_job_gpus((LOCAL / "scontrol-show-job-d.txt").read_text())
    assert gpus["1"] == {"gpu-node-001": [0, 1, 2, 3]}
    assert gpus["2"] == {"gpu-node-002": list(range(8)), "gpu-node-003": list(range(8))}
    assert gpus["5"] == {}


def test_scontrol_show_job_d_several_detail_lines_and_sparse_idx() -> None:
    text = (
        "JobId=7 JobName=x\n   JOB_GRES=gpu:5\n"
        "     Nodes=gpu-node-001 CPU_IDs=0-1 Mem=2048 GRES=gpu:3(IDX:0,2-3)\n"
        "     Nodes=gpu-node-[002-003] CPU_IDs=0 Mem=1024 GRES=gpu:1(IDX:5)\n"
    )
    assert parse_scontrol_job_gpus(text) == {"7": {"gpu-node-001": [0, 2, 3], "gpu-node-002": [5], "gpu-node-003": [5]}}


def test_scontrol_agrees_with_squeue_json() -> None:
    jobs, _ = parse_squeue_json((LOCAL / "squeue.json").read_text(), TS)
    detail = parse_scontrol_job_gpus((LOCAL / "scontrol-show-job-d.txt").read_text())
    for jid, per_node in detail.items():
        assert next(j for j in jobs if j.job_id == jid).gpus == per_node


def test_sinfo_json_states_flags_reasons() -> None:
    plain = {n.node: n for n in parse_sinfo_json((LOCAL / "sinfo.json").read_text(), TS)}
    assert sorted(plain) == [f"gpu-node-00{i}" for i in range(1, 5)]
    assert plain["gpu-node-001"].state == "MIXED" and plain["gpu-node-004"].state == "IDLE"
    assert not any(n.drained for n in plain.values())
    assert plain["gpu-node-001"].gres == "gpu:8" and plain["gpu-node-001"].gres_used == "gpu:4"
    drained = {n.node: n for n in parse_sinfo_json((LOCAL / "sinfo-with-drained.json").read_text(), TS)}
    n2 = drained["gpu-node-002"]
    assert n2.drained and n2.state == "MIXED" and n2.flags == ["DRAIN", "DRAINING"]
    assert n2.reason == "test drain: bad gpu" and n2.reason_user == "root" and n2.reason_ts == 1796023516
    assert drained["gpu-node-004"].reason is None and drained["gpu-node-004"].reason_ts is None


def test_slurmrestd_v0042_state_list() -> None:
    (n,) = parse_sinfo_json((FIX / "slurm" / "slurmrestd-v0042-node-idle-drain-ecc.txt").read_text(), TS)
    assert (n.node, n.state, n.flags, n.reason, n.reason_user) == ("cn3", "IDLE", ["DRAIN"], "ECC memory error", "root")
    assert n.drained and n.partitions == ["normal"] and n.gres is None


def test_scontrol_show_node_matches_sinfo_json(utc: None) -> None:
    text = (LOCAL / "scontrol-show-node-all-with-drained.txt").read_text()
    nodes = {n.node: n for n in parse_scontrol_nodes(text, TS)}
    ref = {n.node: n for n in parse_sinfo_json((LOCAL / "sinfo-with-drained.json").read_text(), TS)}
    assert sorted(nodes) == sorted(ref)
    for name, n in nodes.items():
        r = ref[name]
        assert (n.state, n.flags, n.reason, n.reason_user, n.reason_ts, n.gres, n.gres_used, n.partitions) == (
            r.state,
            r.flags,
            r.reason,
            r.reason_user,
            r.reason_ts,
            r.gres,
            r.gres_used,
            r.partitions,
        ), name


def test_scontrol_show_node_single_and_not_responding() -> None:
    text = (LOCAL / "scontrol-show-node-alloc.txt").read_text()
    nodes = parse_scontrol_nodes(text, TS)
    assert nodes and nodes[0].node == "gpu-node-001" and nodes[0].state == "MIXED" and nodes[0].flags == []
    # as printed right after a RESUME (see the local cluster's README)
    resumed = parse_scontrol_nodes("NodeName=n1 Arch=x86_64\n   State=IDLE+NOT_RESPONDING ThreadsPerCore=1\n", TS)
    assert resumed[0].state == "IDLE" and resumed[0].flags == ["NOT_RESPONDING"] and not resumed[0].drained
    down = parse_scontrol_nodes(
        "NodeName=n2\n   State=DOWN* ThreadsPerCore=1\n   Reason=Not responding [slurm@2026-11-30T07:00:00]\n", TS
    )
    assert down[0].state == "DOWN" and down[0].flags == ["NOT_RESPONDING"] and down[0].reason_user == "slurm"


def test_scontrol_show_node_in_drain_session() -> None:
    nodes = parse_scontrol_nodes((LOCAL / "drain.txt").read_text(), TS)
    drained = [n for n in nodes if n.drained]
    assert {n.node for n in drained} == {"gpu-node-002", "gpu-node-003"}
    assert {n.reason for n in drained} == {"test drain: bad gpu", "idle drain"}


def test_sinfo_r_reason_with_spaces(utc: None) -> None:
    rows = parse_sinfo_reasons((FIX / "slurm" / "sinfo-R-kill-task-failed.txt").read_text())
    assert rows == [{"node": "ip-10-0-0-23", "reason": "Kill task failed", "user": "root", "reason_ts": 1706195543.0}]


def test_hostlist_fixture() -> None:
    lines = (FIX / "hostlist" / "scontrol-hostnames-multi-prefix-zero-pad.txt").read_text().splitlines()
    cmd = lines[0]
    expr = cmd.split()[-1]
    assert expand_nodes(expr) == [ln for ln in lines[1:] if ln.strip()]


@pytest.mark.parametrize("name", ["gpu-node-001", "n1", "a.b_c-d", "A" * 64])
def test_validate_node_name_ok(name: str) -> None:
    assert validate_node_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", "a b", "a;rm -rf /", "n[1-2]", "a,b", "x=y", "A" * 65, "nöde", "a\nb"])
def test_validate_node_name_rejects(name: str) -> None:
    with pytest.raises(ValueError):
        validate_node_name(name)
