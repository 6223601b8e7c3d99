"""Integration fixtures: a real local Slurm 22.05 cluster (deploy/slurm/start-local-slurm.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from prerequisites import give_up

ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "deploy" / "slurm" / "start-local-slurm.sh"


def _drained_nodes() -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-R", "-o", "%N"], capture_output=True, text=True, timeout=30).stdout
    from gpuwarden.shared.slurm import expand_nodes

    return [n for line in out.split() for n in expand_nodes(line)]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[list[str]]:
    """Start (or reuse) the local Slurm cluster; yield its node names, sorted.

    Skipped unless root (the script runs daemons as root and writes /etc/slurm). Nodes
    drained during the session are resumed in teardown; a cluster this fixture started is
    stopped again (``GPUWARDEN_TEST_KEEP_SLURM=1`` keeps it for faster reruns).
    """
    # CI runs as root with the packages installed by .ci/run: there a missing piece is a failure
    if os.geteuid() != 0:
        give_up("the local Slurm cluster needs root (deploy/slurm/start-local-slurm.sh)")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        give_up("no Slurm packages and no apt-get to install them")
    was_up = (
        shutil.which("scontrol") is not None
        and subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30).stdout.count("UP") > 0
    )
    proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"start-local-slurm.sh failed ({proc.returncode}): {proc.stderr[-2000:]}")
    before = set(_drained_nodes())
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=30).stdout
    names = sorted(set(out.split()))
    assert names and all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n) for n in names)
    try:
        yield names
    finally:
        for n in set(_drained_nodes()) - before:
            subprocess.run(["scontrol", "update", f"nodename={n}", "state=RESUME"], capture_output=True, timeout=30)
        if not was_up and os.environ.get("GPUWARDEN_TEST_KEEP_SLURM") != "1":
            # started here: stop it, so no daemon outlives the test run (CI waits for none)
            subprocess.run(["bash", str(START.with_name("stop-local-slurm.sh"))], capture_output=True, timeout=120)
