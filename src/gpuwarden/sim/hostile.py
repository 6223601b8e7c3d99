"""Schema-shaped hostile records for the input topics (issue 25): valid JSON with every field a
collector, slurm-watcher or health check writes, and one or two values no real one writes.

Each record is a real record of the topic (built from the models) with values replaced from the
hostile sets below: event-time extremes (``1e308``, past 2100, negative, a day and a year ahead
of the wall clock), node names with shell, control, bidirectional and non-ASCII characters or
10,000 characters long, integers past 64 bits, 65-10,000 GPUs, GPU indices past 63, NVLink and process lists past their
bounds, job ids with shell characters, UUIDs and PCI bus ids with newlines, kernel lines past
4,096 characters. Deterministic for a seed. Every one of them is outside the topic's contract
(:mod:`gpuwarden.shared.contract`): a reader with progress near ``now`` refuses it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import orjson

__all__ = ["HOSTILE_TOPICS", "hostile_records"]

HOSTILE_NAMES = (
    "gpu-node-001$(id)",
    "gpu-node-`reboot`",
    "gpu\x00node",
    "gpu-node-001\nexecuted drain on gpu-node-002",
    "gpu-node-\u202e100-edon",
    "gpu-node-\u200b001",
    "gpu-node-\U0001f642",
    "n" * 10_000,
    "-rf",
    "",
    "node with space",
    "node;rm -rf /",
    "../../etc/passwd",
    "gpu-node-001\r",
    "x" * 65,
    "<img src=x onerror=alert(1)>",
)
HOSTILE_TEXT = ("a\x00b", "line\nINFO forged", "\x1b[2J", "\u202eevil", "x" * 300)
HOSTILE_TOKENS = ("GPU-1\n$(id)", "0000:44:00.0; reboot", "", "x" * 200, "a b", "\u202e")
#: integers past 64 bits (JSON has no bound; orjson, OTLP and the models' Int64 do)
HOSTILE_INTS = (2**64, 2**70, -(2**70))
HOSTILE_JOB_IDS = ("1; rm -rf /", "$(id)", "7\n8", "", "1" * 30, "123_[$(id)]", "-1")


def _times(now: float) -> tuple[float, ...]:
    return (1e308, 4.2e9, -1.0, now + 86400.0, now + 365 * 86400.0, float(2**53))


def _sample(now: float) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "node": "gpu-node-008",
        "ts": now,
        "collector_id": "gpu-node-008:4242",
        "source": "nvml",
        "gpus": [{"index": i, "power_w": 300.0, "utilization_gpu_pct": 90.0} for i in range(8)],
    }


def _event(now: float) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_id": "hostile-e",
        "node": "gpu-node-008",
        "ts": now,
        "kind": "xid",
        "code": 79,
        "gpu_index": 0,
        "message": "GPU has fallen off the bus.",
        "raw": "NVRM: Xid (PCI:0000:44:00): 79, pid=1234, GPU has fallen off the bus.",
        "source": "kmsg",
    }


def _job(now: float) -> dict[str, Any]:
    return {"schema_version": 1, "job_id": "4242", "ts": now, "state": "RUNNING",
            "nodes": ["gpu-node-008"], "gpus": {"gpu-node-008": [0, 1]}}  # fmt: skip


def _node(now: float) -> dict[str, Any]:
    return {"schema_version": 1, "node": "gpu-node-008", "ts": now, "state": "ALLOCATED"}


def _health(now: float) -> dict[str, Any]:
    return {"schema_version": 1, "node": "gpu-node-008", "ts": now, "phase": "prolog", "check": "nvidia-smi",
            "passed": True}  # fmt: skip


Mutation = Callable[[dict[str, Any], random.Random, float], None]


def _set(field: str, values: tuple[Any, ...]) -> Mutation:
    def m(d: dict[str, Any], rng: random.Random, _now: float) -> None:
        d[field] = rng.choice(values)

    return m


def _ts(field: str = "ts") -> Mutation:
    """The record's event time: any extreme; another time field (a job's end, a reason's time):
    only values outside the schema (a time limit may well end tomorrow)."""

    def m(d: dict[str, Any], rng: random.Random, now: float) -> None:
        d[field] = rng.choice(_times(now) if field == "ts" else _times(now)[:3] + _times(now)[5:])

    return m


def _gpu(field: str, values: tuple[Any, ...]) -> Mutation:
    def m(d: dict[str, Any], rng: random.Random, _now: float) -> None:
        d["gpus"][rng.randrange(len(d["gpus"]))][field] = rng.choice(values)

    return m


def _many_gpus(d: dict[str, Any], rng: random.Random, _now: float) -> None:
    d["gpus"] = [{"index": i % 64, "power_w": 1.0} for i in range(rng.choice((65, 128, 1000)))]


def _lists(d: dict[str, Any], rng: random.Random, _now: float) -> None:
    g = d["gpus"][0]
    if rng.random() < 0.5:
        g["nvlinks"] = [{"link": i, "active": True} for i in range(rng.choice((37, 100)))]
    else:
        g["processes"] = [{"pid": i} for i in range(rng.choice((1025, 2000)))]


def _job_nodes(d: dict[str, Any], rng: random.Random, _now: float) -> None:
    bad = rng.choice(HOSTILE_NAMES)
    d["nodes"] = ["gpu-node-008", bad]
    d["gpus"] = {bad: [0]} if rng.random() < 0.5 else {"gpu-node-008": [64, 10**6]}


#: topic -> (a real record of it, the mutations that make it hostile)
HOSTILE_TOPICS: dict[str, tuple[Callable[[float], dict[str, Any]], tuple[Mutation, ...]]] = {
    "gpu.samples": (
        _sample,
        (_ts(), _set("node", HOSTILE_NAMES), _many_gpus, _gpu("index", (64, 10**9, -1)),
         _gpu("uuid", HOSTILE_TOKENS), _gpu("pci_bus_id", HOSTILE_TOKENS), _gpu("name", HOSTILE_TEXT), _lists,
         _set("collector_id", HOSTILE_TOKENS), _gpu("ecc_sbe_volatile", HOSTILE_INTS),
         _gpu("pcie_replay_count", HOSTILE_INTS)),
    ),
    "gpu.events": (
        _event,
        (_ts(), _set("node", HOSTILE_NAMES), _set("raw", ("r" * 5000,)), _set("message", ("m" * 5000,)),
         _set("pci_bus_id", HOSTILE_TOKENS), _set("gpu_uuid", HOSTILE_TOKENS), _set("event_id", HOSTILE_TOKENS),
         _set("caused_by_xid", HOSTILE_INTS), _set("pid", HOSTILE_INTS)),
    ),
    "slurm.jobs": (
        _job,
        (_ts(), _ts("start_ts"), _ts("end_ts"), _set("job_id", HOSTILE_JOB_IDS), _job_nodes,
         _set("exit_code", HOSTILE_INTS)),
    ),
    "slurm.nodes": (
        _node,
        (_ts(), _ts("reason_ts"), _set("node", HOSTILE_NAMES), _set("reason", ("r" * 5000,)),
         _set("gpus_used_idx", ([64], [10**6], list(range(65)))), _set("cpus", HOSTILE_INTS)),
    ),
    "health": (
        _health,
        (_ts(), _set("node", HOSTILE_NAMES), _set("check", HOSTILE_TEXT), _set("job_id", HOSTILE_JOB_IDS[:5]),
         _set("gpu_index", (64, 10**9))),
    ),
}  # fmt: skip


def hostile_records(topic: str, n: int, now: float, seed: int = 25) -> Iterator[bytes]:
    """``n`` hostile values (JSON bytes) for the short-named ``topic`` (one of
    :data:`HOSTILE_TOPICS`), each a real record with one or two mutations; ``now`` (epoch s) is
    the wall clock the readers compare event times with.

    Raises:
        KeyError: ``topic`` has no hostile generator.
    """
    base, mutations = HOSTILE_TOPICS[topic]
    rng = random.Random(f"{seed}:{topic}")
    for _ in range(n):
        d = base(now)
        for m in rng.sample(mutations, k=1 if rng.random() < 0.7 else 2):
            m(d, rng, now)
        try:
            yield orjson.dumps(d)
        except TypeError:  # an integer past 64 bits: what another language's producer can write
            yield json.dumps(d, separators=(",", ":")).encode()
