"""``gpuwarden bench slurm``: parse + diff time per poll on a synthetic large cluster."""

from __future__ import annotations

import random
import statistics
import time
from typing import Annotated, Any

import orjson
import typer

from gpuwarden.shared.slurm import SinfoJsonParser, SqueueJsonParser, parse_sinfo_json, parse_squeue_json
from gpuwarden.slurm_watcher.diff import diff_jobs, diff_nodes

__all__ = ["bench_slurm", "synthetic_cluster"]

_META = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}, "Slurm": {"release": "22.05.8"}}


def synthetic_cluster(
    nodes: int, jobs: int, gpus_per_node: int = 8, seed: int = 1
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``squeue --json`` and a ``sinfo --json`` document (v0.0.38 shapes of Slurm 22.05) of a
    cluster with ``nodes`` nodes (``gpu-node-00001``...) and ``jobs`` jobs: ~80 % running on 1-4
    nodes with ``gres_detail`` GPU indices, the rest pending. Deterministic for a ``seed``."""
    rnd = random.Random(seed)
    names = [f"gpu-node-{i:05d}" for i in range(1, nodes + 1)]
    job_docs = []
    for jid in range(1, jobs + 1):
        running = rnd.random() < 0.8
        n = rnd.choice((1, 1, 1, 2, 4)) if running else 1
        start = rnd.randrange(0, max(1, nodes - n))
        alloc = names[start : start + n]
        g = rnd.choice((1, 2, 4, 8))
        first = rnd.randrange(0, gpus_per_node - g + 1)
        job_docs.append(
            {
                "job_id": jid,
                "array_job_id": 0,
                "array_task_id": None,
                "name": f"job-{jid}",
                "user_name": f"user{jid % 97}",
                "account": f"proj{jid % 13}",
                "partition": "gpu",
                "job_state": "RUNNING" if running else "PENDING",
                "state_reason": "None" if running else "Resources",
                "nodes": ",".join(alloc) if running else "",
                "submit_time": 1_800_000_000 + jid,
                "start_time": 1_800_000_100 + jid if running else 0,
                "end_time": 1_800_086_400 + jid if running else 0,
                "exit_code": 0,
                "tres_per_node": f"gres:gpu:{g}",
                "gres_detail": [f"gpu:{g}(IDX:{first}-{first + g - 1})" for _ in alloc] if running else [],
                "job_resources": {"nodes": ",".join(alloc), "allocated_nodes": [{"nodename": a} for a in alloc]}
                if running
                else {},
            }
        )
    node_docs = [
        {
            "name": nm,
            "state": "mixed",
            "state_flags": [],
            "reason": "",
            "reason_set_by_user": "",
            "reason_changed_at": 0,
            "gres": f"gpu:{gpus_per_node}",
            "gres_used": "gpu:4(IDX:0-3)",
            "partitions": ["gpu"],
        }
        for nm in names
    ]
    return {"meta": _META, "errors": [], "jobs": job_docs}, {"meta": _META, "errors": [], "nodes": node_docs}


def _mutate(squeue: dict[str, Any], sinfo: dict[str, Any], rnd: random.Random, frac: float) -> None:
    jobs = squeue["jobs"]
    for j in rnd.sample(jobs, int(len(jobs) * frac)):
        j["job_state"] = {"RUNNING": "COMPLETING", "COMPLETING": "COMPLETED", "PENDING": "PENDING"}.get(
            j["job_state"], "RUNNING"
        )
    for n in rnd.sample(sinfo["nodes"], max(1, int(len(sinfo["nodes"]) * frac))):
        n["state_flags"] = [] if n["state_flags"] else ["DRAIN"]


def bench_slurm(
    nodes: Annotated[int, typer.Option(help="Nodes in the synthetic cluster")] = 1000,
    jobs: Annotated[int, typer.Option(help="Jobs in the synthetic cluster")] = 5000,
    cycles: Annotated[int, typer.Option(help="Polls to time")] = 20,
    change: Annotated[float, typer.Option(help="Fraction of jobs/nodes changing per poll")] = 0.02,
    cache: Annotated[
        bool, typer.Option(help="Reuse unchanged records between polls (SqueueJsonParser, as the watcher does)")
    ] = True,
) -> None:
    """Parse + diff time per poll of the slurm-watcher (squeue --json + sinfo --json text of a
    synthetic cluster, v0.0.38 shapes); prints ms per cycle (median, p95, max); target < 200 ms.
    ``--no-cache`` times the stateless parsers (every record parsed and validated each poll)."""
    rnd = random.Random(2)
    sq_parser, si_parser = SqueueJsonParser(), SinfoJsonParser()
    parse_q = sq_parser.parse if cache else parse_squeue_json
    parse_s = si_parser.parse if cache else parse_sinfo_json
    squeue, sinfo = synthetic_cluster(nodes, jobs)
    prev_j: dict[str, Any] = {}
    prev_n: dict[str, Any] = {}
    parse_ms: list[float] = []
    diff_ms: list[float] = []
    total: list[float] = []
    sizes = (0, 0)
    changes: list[int] = []
    for i in range(cycles + 1):
        q_text, s_text = orjson.dumps(squeue), orjson.dumps(sinfo)
        sizes = (len(q_text), len(s_text))
        t0 = time.perf_counter()
        js, _ = parse_q(q_text, 1_800_000_000.0 + i)
        ns = parse_s(s_text, 1_800_000_000.0 + i)
        t1 = time.perf_counter()
        cj, prev_j = diff_jobs(prev_j, js, 1_800_000_000.0 + i)
        cn, prev_n = diff_nodes(prev_n, ns)
        t2 = time.perf_counter()
        if i:  # cycle 0 warms up (first snapshot)
            parse_ms.append((t1 - t0) * 1000)
            diff_ms.append((t2 - t1) * 1000)
            total.append((t2 - t0) * 1000)
            changes.append(len(cj) + len(cn))
        _mutate(squeue, sinfo, rnd, change)

    def p95(x: list[float]) -> float:
        return sorted(x)[max(0, round(0.95 * len(x)) - 1)]

    reuse = f"on (last poll: {sq_parser.hits + si_parser.hits} records reused)" if cache else "off"
    typer.echo(
        f"synthetic cluster: {nodes} nodes, {jobs} jobs; squeue --json {sizes[0] / 1e6:.1f} MB, "
        f"sinfo --json {sizes[1] / 1e6:.2f} MB; {cycles} polls, ~{statistics.mean(changes):.0f} changes/poll; "
        f"record cache {reuse}"
    )
    typer.echo(f"parse ms/poll: median {statistics.median(parse_ms):.1f}  p95 {p95(parse_ms):.1f}")
    typer.echo(f"diff  ms/poll: median {statistics.median(diff_ms):.1f}  p95 {p95(diff_ms):.1f}")
    med = statistics.median(total)
    typer.echo(
        f"total ms/poll: median {med:.1f}  p95 {p95(total):.1f}  max {max(total):.1f}  "
        f"(target < 200 ms: {'met' if p95(total) < 200 else 'NOT met'})"
    )
