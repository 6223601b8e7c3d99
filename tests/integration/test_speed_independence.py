"""Speed independence through the real services: a fixed sample of the scored suite
(tests/scenarios) through ``gpuwarden simulate`` at ``--speed 5`` and ``--speed 50``, while a CPU
hog keeps every core busy, gives the same failure ids (and pattern, node, GPU) at both speeds and
meets the scenario's expectation at both. Detection works in event time, so neither the speed nor
a loaded machine may change a verdict. ``make test-speed`` runs the same check over every scenario
(:mod:`gpuwarden.sim.speedcheck`).

The sample (18): the healthy partial-allocation fleet (jobs on part of each node from t=0, no
fault) and a fleet whose jobs hand GPUs over in the same second, four healthy near misses
(``-negative``), and faults of different kinds (an XID, throttling, ECC, a job's shape, a zombie
process, a silent node, a fault on a node without a job, one job-level finding for a large job,
application XIDs under two jobs on one GPU). A 300 s scenario takes about 75 s of wall time at
speed 5 and 20-30 s at speed 50 under the hog on two cores; the sample some 30 minutes in all.
The rest of the suite (``make test-speed``, 4 at a time, on 2026-12-07): 131 of the 132 scenarios
outside the sample the same at both speeds, in 4,407 s; the one that differed is fixed and in the
sample now.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.sim.speedcheck import check_scenario, cpu_hog

pytestmark = pytest.mark.integration

SUITE = Path(__file__).resolve().parents[1] / "scenarios"
SPEEDS = (5.0, 50.0)
SAMPLE = [
    # healthy
    "healthy-partial-allocation",
    "zombie-process-negative",
    "gpu-fallen-off-bus-negative",
    "thermal-throttle-negative",
    "straggler-gpu-negative",
    # faults
    "gpu-fallen-off-bus",  # XID 79
    "thermal-throttle",
    "power-cap-throttle",
    "straggler-gpu",  # a job's shape
    "zombie-process",
    "telemetry-silent",
    "clocks-low",
    # one fault, one finding (count: 1): the XID's GPU vanishing (gpu-missing), the DBE counter and
    # the row remap are its evidence whichever detector lane reads first (the pending stage); once
    # measured different at 50x before that stage existed (2026-12-02)
    "uncorrectable-ecc",
    "mixed-fault-on-idle-node",
    # one job-level finding for an 8-node job (aggregate: job): differed at 50x under the hog in
    # about 1 run of 3 until job windows waited for a correlator partition that is behind and
    # for the job's running state (2026-12-06: 3 runs of 3 the same since)
    "partial-idle-large-job",
    "straggler-node-large-job",  # one straggler-node for a 16-node job (4 runs of 4 the same since)
    # application XIDs under two jobs on one GPU: missed at 50x under the hog in the first full
    # `make test-speed` (2026-12-07) until the repeat history took only the correlator's jobs
    "repeat-offender-gpu-s37",
    "healthy-job-churn",  # jobs handing GPUs over in the same second: no finding
]


@pytest.mark.parametrize("name", SAMPLE)
def test_same_failure_ids_at_speed_5_and_50_under_cpu_load(name: str, tmp_path: Path) -> None:
    path = SUITE / f"{name}.yaml"
    assert path.exists(), path
    with cpu_hog():
        check = check_scenario(path, SPEEDS, tmp_path)
    # pytest.fail, not assert: the line says it all (an assert would also print every report)
    if not check.passed:
        pytest.fail(check.line(), pytrace=False)
    for run in check.runs:
        assert run.report is not None and run.report["stats"]["deadlettered"] == 0, check.line()
