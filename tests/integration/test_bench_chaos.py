"""``gpuwarden bench chaos --short`` on a real 3-broker KRaft cluster (issue 13, point 8):
broker kill -9, service kill -9 and SIGTERM, a cluster outage, fuzzed/oversize and forged
records, a foreign drain. Nothing found may be lost, duplicated or overwritten."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

GPUWARDEN = Path(sys.executable).with_name("gpuwarden")
LINE = re.compile(
    r"^chaos: injected (\d+), found (\d+), lost (\d+), duplicate failures (\d+), duplicate drains (\d+), "
    r"foreign reasons overwritten (\d+), fuzzed (\d+), dead-lettered (\d+), crashes (\d+), "
    r"hostile (\d+), stopped at the edge (\d+), leaked (\d+), windows lost (\d+), "
    r"readings lost (\d+), samples lost before Kafka (\d+), drains beyond the breaker (\d+), "
    r"false positives (\d+)$"
)


def test_bench_chaos_short_loses_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(GPUWARDEN), "bench", "chaos", "--short", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=420,
    )
    text = out.stdout + out.stderr
    print(out.stdout[-4000:])
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    m = LINE.match(last)
    assert m, f"no chaos line at the end:\n{text[-4000:]}"
    (injected, found, lost, dup_f, dup_d, overwritten, fuzzed, dead, crashes, hostile, stopped, leaked, wlost,
     rlost, dropped, over_breaker, fps) = map(int, m.groups())  # fmt: skip
    assert injected == 5 and found == injected, last
    assert (lost, dup_f, dup_d, overwritten, crashes) == (0, 0, 0, 0, 0), last
    assert fuzzed == 50 and dead == fuzzed, last
    # issue 25: 1,000 schema-shaped hostile records on each of the 5 raw input topics, each
    # dead-lettered exactly once, by its topic's edge service
    assert hostile == 5000 and stopped == hostile and leaked == 0, last
    # every job window the valid samples on gpu.samples closed reached job.windows, whole
    assert wlost == 0 and rlost == 0, last
    # every tick the collector took while up reached gpu.samples (the outage buffer held them
    # through the outage), and no drain went past the circuit breaker
    assert dropped == 0 and over_breaker == 0, last
    # no finding on a healthy node: the kills, the outage and the hostile records raise nothing
    assert fps == 0, last
    assert out.returncode == 0, text[-4000:]
