"""RestSlurm over a fake HTTP transport serving recorded slurmrestd documents (Slurm 22.05, v0.0.42)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gpuwarden.shared.slurm import AiohttpTransport, RestSlurm, SlurmError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
LOCAL = FIX / "local-22.05"


class FakeTransport:
    def __init__(self, routes: dict[tuple[str, str], tuple[int, bytes] | Exception]) -> None:
        self.routes = routes
        self.calls: list[tuple[str, str, bytes | None]] = []

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.calls.append((method, path, body))
        r = self.routes.get((method, path), (404, b'{"errors":[{"error":"Unable find requested URL"}]}'))
        if isinstance(r, Exception):
            raise r
        return r


def _v42_node() -> bytes:
    t = (FIX / "slurmrestd-v0042-node-idle-drain-ecc.txt").read_text()
    return t[t.index("{") :].encode()


async def test_jobs_nodes_accounting_v0038() -> None:
    tr = FakeTransport(
        {
            ("GET", "/slurm/v0.0.38/jobs"): (200, (LOCAL / "restd-slurm_v0.0.38_jobs.json").read_bytes()),
            ("GET", "/slurm/v0.0.38/nodes"): (200, (LOCAL / "restd-slurm_v0.0.38_nodes.json").read_bytes()),
            ("GET", "/slurmdb/v0.0.38/job/4"): (200, (LOCAL / "sacct.json").read_bytes()),
        }
    )
    r = RestSlurm(tr, now=lambda: 5.0, backoff_s=0)
    jobs = {j.job_id: j for j in await r.jobs()}
    assert jobs["1"].gpus == {"gpu-node-001": [0, 1, 2, 3]} and jobs["1"].ts == 5.0
    assert jobs["2"].gpus == {n: list(range(8)) for n in ("gpu-node-002", "gpu-node-003")}
    nodes = await r.nodes()
    assert [n.node for n in nodes] == [f"gpu-node-00{i}" for i in range(1, 5)]
    acct = {a.job_id: a for a in await r.accounting(["4"])}
    assert acct["4"].state == "FAILED" and acct["4"].confirmed
    with pytest.raises(ValueError):
        await r.accounting(["1;rm"])


async def test_node_v0042_and_unknown_node() -> None:
    unknown = orjson.dumps({"errors": [{"error": "Invalid node name specified", "errno": 2018}], "nodes": []})
    tr = FakeTransport(
        {
            ("GET", "/slurm/v0.0.42/node/cn3"): (200, _v42_node()),
            ("GET", "/slurm/v0.0.42/node/cn9"): (200, unknown),
        }
    )
    r = RestSlurm(tr, version="v0.0.42", backoff_s=0)
    n = await r.node("cn3")
    assert n is not None and (n.state, n.flags, n.reason) == ("IDLE", ["DRAIN"], "ECC memory error")
    assert await r.node("cn9") is None
    with pytest.raises(ValueError):
        await r.node("cn3;reboot")


async def test_update_node_versions() -> None:
    tr = FakeTransport({("POST", "/slurm/v0.0.42/node/cn3"): (200, b'{"errors": []}')})
    old = await RestSlurm(tr, version="v0.0.38").update_node("cn3", "DRAIN", "gpuwarden: x")
    assert old.exit_code == 2 and "v0.0.39" in old.stderr and tr.calls == []
    res = await RestSlurm(tr, version="v0.0.42").update_node("cn3", "DRAIN", "gpuwarden: xid-79 gpu=3")
    assert res.ok and tr.calls == [
        ("POST", "/slurm/v0.0.42/node/cn3", b'{"state":["DRAIN"],"reason":"gpuwarden: xid-79 gpu=3"}')
    ]
    with pytest.raises(ValueError):
        await RestSlurm(tr, version="v0.0.42").update_node("cn3", "DRAIN", None)


async def test_retries_then_clear_error() -> None:
    tr = FakeTransport(
        {
            ("GET", "/slurm/v0.0.38/nodes"): ConnectionRefusedError("connect to /run/x.sock refused"),
            ("GET", "/slurm/v0.0.38/jobs"): (500, b"slurmctld down"),
        }
    )
    r = RestSlurm(tr, retries=2, backoff_s=0)
    with pytest.raises(SlurmError, match="refused"):
        await r.nodes()
    assert len(tr.calls) == 3
    with pytest.raises(SlurmError, match="HTTP 500"):
        await r.jobs()


async def test_error_document_is_a_clear_error() -> None:
    doc = orjson.dumps(
        {
            "meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
            "errors": [{"error": "Unable to contact slurm controller (connect failure)"}],
        }
    )
    r = RestSlurm(FakeTransport({("GET", "/slurm/v0.0.38/jobs"): (200, doc)}))
    with pytest.raises(ValueError, match=r"22\.05\.8.*Unable to contact"):
        await r.jobs()


def test_transport_urls() -> None:
    t = AiohttpTransport("unix:/run/s.sock", token="tok", user="alice")
    assert (t.socket, t.base) == ("/run/s.sock", "http://localhost")
    assert t.headers["X-SLURM-USER-TOKEN"] == "tok" and t.headers["X-SLURM-USER-NAME"] == "alice"
    assert "X-SLURM-USER-TOKEN" not in AiohttpTransport("http://127.0.0.1:6820/").headers
    with pytest.raises(ValueError):
        AiohttpTransport("ftp://x")
    with pytest.raises(ValueError):
        RestSlurm(FakeTransport({}), version="latest")


def _fixture_doc(name: str) -> bytes:
    t = (FIX / name).read_text()
    return t[t.index("{") :].encode()


async def test_v0043_v0044_paths_and_documents() -> None:
    tr = FakeTransport(
        {
            ("GET", "/slurm/v0.0.44/jobs"): (200, _fixture_doc("slurmrestd-v0044-job-gpus-multi-nodes.txt")),
            ("GET", "/slurm/v0.0.44/node/cn1"): (200, _fixture_doc("slurmrestd-v0044-node-mixed-drain-ecc.txt")),
            ("GET", "/slurmdb/v0.0.44/job/5739"): (200, _fixture_doc("slurmrestd-v0044-slurmdb-job-failed.txt")),
        }
    )
    r = RestSlurm(tr, version="v0.0.44", retries=0, backoff_s=0)
    (job,) = await r.jobs()
    assert job.gpus == {"gpu1": [0, 1, 2, 3], "gpu2": [0, 1, 2, 3]}
    node = await r.node("cn1")
    assert node is not None and node.state == "MIXED" and "DRAIN" in node.flags and node.drained
    (acct,) = await r.accounting(["5739"])
    assert acct.state == "FAILED" and acct.exit_code == 1 and acct.confirmed
    tr43 = FakeTransport({("GET", "/slurm/v0.0.43/nodes"): (200, _fixture_doc("slurmrestd-v0043-node-gpu-mixed.txt"))})
    (n43,) = await RestSlurm(tr43, version="v0.0.43", retries=0).nodes()
    assert n43.gpus_used_idx == [0]
    res = await RestSlurm(tr43, version="v0.0.43").update_node("gpu1", "RESUME", None)
    assert tr43.calls[-1][:2] == ("POST", "/slurm/v0.0.43/node/gpu1") and res.argv[1] == "/slurm/v0.0.43/node/gpu1"


def test_deprecated_and_untested_versions_warn(caplog: pytest.LogCaptureFixture) -> None:
    tr = FakeTransport({})
    for v in ("v0.0.38", "v0.0.42", "v0.0.43", "v0.0.44"):
        caplog.clear()
        RestSlurm(tr, version=v)
        assert not [r for r in caplog.records if r.levelname == "WARNING"], v
    for v in ("v0.0.40", "v0.0.41"):
        caplog.clear()
        RestSlurm(tr, version=v)
        assert any("deprecated" in r.getMessage() and v in r.getMessage() for r in caplog.records), v
    caplog.clear()
    RestSlurm(tr, version="v0.0.45")
    assert any("newer than the tested" in r.getMessage() for r in caplog.records)
