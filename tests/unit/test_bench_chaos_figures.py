"""The chaos bench's pure parts: its scenario and its last line; and a setting that cannot be
used (a CA file that is not a certificate) failing at start."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuwarden.shared.scenario import load_scenario
from gpuwarden.shared.settings import BusSettings
from gpuwarden.sim.bench.chaos import ChaosFigures, chaos_failed, chaos_line, chaos_scenario, crash_lines
from gpuwarden.sim.kafka_cluster import new_cluster_id


def test_chaos_line_is_the_documented_format() -> None:
    f = ChaosFigures(injected=5, found=5, fuzzed=50, dead_lettered=49, crashes=1, hostile=5000, stopped_at_edge=4999)
    assert chaos_line(f) == (
        "chaos: injected 5, found 5, lost 0, duplicate failures 0, duplicate drains 0, "
        "foreign reasons overwritten 0, fuzzed 50, dead-lettered 49, crashes 1, "
        "hostile 5000, stopped at the edge 4999, leaked 0, windows lost 0, readings lost 0, "
        "samples lost before Kafka 0, drains beyond the breaker 0, false positives 0"
    )


def test_a_sample_lost_before_kafka_fails_the_run_and_names_itself() -> None:
    f = ChaosFigures(injected=5, found=5, fuzzed=50, dead_lettered=50, samples_lost_before_kafka=9)
    assert chaos_failed(f) == ["9 samples lost before Kafka (ticks with no sample)"]
    assert chaos_line(f).endswith("samples lost before Kafka 9, drains beyond the breaker 0, false positives 0")
    f = ChaosFigures(injected=5, found=5, fuzzed=50, dead_lettered=50, false_positives=2)
    assert chaos_failed(f) == ["2 false positives (failures no injected fault explains)"]


def test_chaos_scenario_loads_with_one_expectation_per_fault(tmp_path: Path) -> None:
    p = tmp_path / "chaos.yaml"
    p.write_text(yaml.safe_dump(chaos_scenario([14.0, 54.0], 145.0)))
    sc = load_scenario(p)
    assert [(f.node, f.gpu, f.at_s) for f in sc.faults] == [("gpu-node-001", 0, 14.0), ("gpu-node-002", 1, 54.0)]
    assert [(e.pattern, e.node, e.gpu) for e in sc.expect] == [
        ("gpu-fallen-off-bus", "gpu-node-001", 0),
        ("gpu-fallen-off-bus", "gpu-node-002", 1),
    ]
    with pytest.raises(ValueError, match="3 faults need"):
        chaos_scenario([1.0, 2.0, 3.0], 10.0, nodes=2)


def test_cluster_id_is_22_url_safe_characters() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 22 and not i.startswith("-") and set(i) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for i in ids)  # fmt: skip


def test_a_ca_file_that_is_not_a_certificate_fails_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("this is not a PEM certificate\n")
    monkeypatch.setenv("GPUWARDEN_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("GPUWARDEN_SSL_CAFILE", str(bad))
    s = BusSettings()
    with pytest.raises(OSError):  # ssl.SSLError: run_service reports it as "error: cannot start" (exit 2)
        s.kafka_kwargs()


def test_crash_lines_find_task_and_faust_agent_crashes_only() -> None:
    log = "\n".join(
        [
            "2026-12-01 14:02:09,070 ERROR [vm:1] faust.agents.actor: [^-Agent*: app.move]: Crashed reason=X()",
            "2026-12-01 14:02:10,000 ERROR [vm:1] gpuwarden.shared.service: detector: task consume:x crashed",
            "2026-12-01 14:02:11,000 WARNING [vm:1] detector: dead-lettering gpu.samples[0]@3: schema: crashed",
            "2026-12-01 14:02:12,000 ERROR [vm:1] aiokafka: Unable connect to node with id 1",
        ]
    )
    assert [ln[-10:] for ln in crash_lines(log)] == ["reason=X()", ":x crashed"]


def test_every_count_and_the_breaker_set_the_exit_code() -> None:
    """Issue 25: one drain too many fails the bench (it was only a note), as does any count."""
    ok = ChaosFigures(injected=5, found=5, fuzzed=50, dead_lettered=50)
    assert chaos_failed(ok) == []
    assert chaos_failed(ChaosFigures(injected=5, found=5, fuzzed=50, dead_lettered=50, over_breaker=1)) == [
        "1 drains beyond the circuit breaker"
    ]
    leaked = ChaosFigures(injected=5, found=5, fuzzed=50, dead_lettered=50, hostile=10, stopped_at_edge=9, leaked=1)
    assert len(chaos_failed(leaked)) == 2
    for bad in ({"lost": 1}, {"found": 4}, {"duplicate_failures": 1}, {"duplicate_drains": 1},
                {"foreign_overwritten": 1}, {"dead_lettered": 49}, {"crashes": 1}, {"hostile": 1},
                {"windows_lost": 1}, {"readings_lost": 3}):  # fmt: skip
        f = ChaosFigures(**{"injected": 5, "found": 5, "fuzzed": 50, "dead_lettered": 50, **bad})
        assert len(chaos_failed(f)) == 1, bad
