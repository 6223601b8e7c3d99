"""Speed independence of the real pipeline: each scenario through ``gpuwarden simulate`` at two
speeds (default 5 and 50) must give the same failures, while a CPU hog keeps every core busy.

Detection works in event time (docs/architecture.md#scenarios), so the failure ids a scenario
gives must not depend on ``--speed`` nor on how loaded the machine is. For every scenario this
runs ``gpuwarden simulate SCENARIO --speed S --no-live --report R.json`` once per speed, one
after the other, and compares the sets of ``failure_id`` and of ``(pattern, node, gpu)`` of every
failure the pipeline published (the report's ``failures``), and checks each run's ``score``
against the scenario's expectation. ``--hog`` starts one busy-loop process per core before the
first run and kills them after the last (they also die with this process: PR_SET_PDEATHSIG).

    python -m gpuwarden.sim.speedcheck --hog tests/scenarios/*.yaml      # make test-speed
    python -m gpuwarden.sim.speedcheck --hog --speeds 5 50 --jobs 1 tests/scenarios/xid-other.yaml

Prints one line per scenario (``same`` or ``DIFFERENT: only at 5: ..., only at 50: ...``, and
any failed score or run) and a summary; exits 1 on any difference, failed score or failed run.
Times: a 300 s scenario takes about 60 s of wall time at speed 5, plus the services' start-up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.shared.scenario import load_scenario
from gpuwarden.sim.brokers import die_with_parent

__all__ = ["RunOutcome", "ScenarioCheck", "check_scenario", "cpu_hog", "main", "run_simulate"]

DEFAULT_SPEEDS = (5.0, 50.0)
#: Wall seconds a run may take beyond its scenario time at its speed (start-up, drain, a loaded machine).
_SLACK_S = 300.0

FailureKey = tuple[str, str, int | None]  # (pattern, node, gpu index)


@dataclass
class RunOutcome:
    """One ``gpuwarden simulate`` run."""

    speed: float
    rc: int | None  # None: killed at the timeout
    wall_s: float
    report: dict[str, Any] | None = None
    error: str | None = None

    @property
    def failures(self) -> list[dict[str, Any]]:
        return list(self.report["failures"]) if self.report else []

    @property
    def ids(self) -> set[str]:
        return {str(f["failure_id"]) for f in self.failures}

    @property
    def keys(self) -> set[FailureKey]:
        return {(str(f["pattern"]), str(f["node"]), f["gpu_index"]) for f in self.failures}

    @property
    def score_passed(self) -> bool:
        return bool(self.report and self.report["score"]["passed"])

    def score_problem(self) -> str | None:
        """Why the run does not meet the scenario's expectation (None when it does)."""
        if self.report is None:
            return self.error or f"no report (exit {self.rc})"
        sc = self.report["score"]
        if sc["passed"]:
            return None
        parts = []
        if sc["missed"]:
            parts.append("missed " + _some(_expect_text(m) for m in sc["missed"]))
        if sc["false_positives"]:
            parts.append("false positives " + _some(_failure_text(f) for f in sc["false_positives"]))
        return "; ".join(parts)


@dataclass
class ScenarioCheck:
    """Both speeds of one scenario."""

    scenario: str
    runs: list[RunOutcome] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(r.report is not None for r in self.runs)

    @property
    def same(self) -> bool:
        """Every run has a report and all give the same failure ids and (pattern, node, gpu)."""
        if not self.complete or not self.runs:
            return False
        first = self.runs[0]
        return all(r.ids == first.ids and r.keys == first.keys for r in self.runs[1:])

    @property
    def passed(self) -> bool:
        return self.same and all(r.score_passed for r in self.runs)

    def differences(self) -> str:
        """``only at 5: [...], only at 50: [...]`` (failures whose id is not in every run)."""
        everywhere = set.intersection(*(r.ids for r in self.runs)) if self.runs else set()
        parts = []
        for r in self.runs:
            extra = [f for f in r.failures if f["failure_id"] not in everywhere]
            if extra:
                parts.append(f"only at {self._label(r)}: " + _some(_failure_text(f) for f in extra))
        return ", ".join(parts) or "same ids, different (pattern, node, gpu)"

    def _label(self, run: RunOutcome) -> str:
        """``50``, or ``50 (run 2)`` when the same speed runs more than once (``--speeds 50 50``)."""
        label = f"{run.speed:g}"
        if sum(r.speed == run.speed for r in self.runs) > 1:
            label += f" (run {self.runs.index(run) + 1})"
        return label

    def line(self) -> str:
        """One line: the verdict, the failures found, each run's wall time, any failed score."""
        times = ", ".join(
            f"{r.speed:g}x: {len(r.ids) if r.report else '-'} failures in {r.wall_s:.0f} s" for r in self.runs
        )
        if not self.complete:
            verdict = "RUN FAILED"
        elif self.same:
            verdict = "same"
        else:
            verdict = "DIFFERENT: " + self.differences()
        out = f"{self.scenario}: {verdict} ({times})"
        for r in self.runs:
            problem = r.score_problem()
            if problem:
                what = "score failed" if r.report is not None else "run failed"
                out += f"\n    {what} at {self._label(r)}: {problem}"
        return out


def _some(items: Iterable[str], n: int = 4) -> str:
    """The first ``n`` items, comma-separated, then ``(+k more)``."""
    got = list(items)
    return ", ".join(got[:n]) + (f" (+{len(got) - n} more)" if len(got) > n else "")


def _failure_text(f: dict[str, Any]) -> str:
    gpu = f.get("gpu_index")
    where = f"{f['node']}" + (f"/gpu{gpu}" if gpu is not None else "")
    return f"{f['pattern']}@{where} t={f.get('first_seen_s')} id={str(f['failure_id'])[:12]}"


def _expect_text(e: dict[str, Any]) -> str:
    where = e.get("node") or "any node"
    if e.get("gpu") is not None:
        where += f"/gpu{e['gpu']}"
    return f"{e['pattern']}@{where}"


def _gpuwarden() -> list[str]:
    exe = Path(sys.executable).with_name("gpuwarden")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("gpuwarden")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from gpuwarden.shared.cli import main; sys.exit(main())"]


def default_timeout_s(scenario: Path, speed: float) -> float:
    """Wall-clock limit of one run: the scenario's duration at ``speed``, three times over, plus
    :data:`_SLACK_S` (simulate itself ends in virtual time; this only guards against a hang)."""
    return 3 * load_scenario(scenario).duration_s / speed + _SLACK_S


def run_simulate(
    scenario: Path, speed: float, workdir: Path, timeout_s: float | None = None, keep_logs: bool = False
) -> RunOutcome:
    """``gpuwarden simulate SCENARIO --speed S --no-live --report`` in its own embedded broker
    (``GPUWARDEN_BOOTSTRAP_SERVERS`` is not passed on); its output goes to ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / f"{scenario.stem}-speed{speed:g}.json"
    log = workdir / f"{scenario.stem}-speed{speed:g}.log"
    report.unlink(missing_ok=True)
    limit = timeout_s if timeout_s is not None else default_timeout_s(scenario, speed)
    argv = [*_gpuwarden(), "simulate", str(scenario), "--speed", f"{speed:g}", "--no-live", "--report", str(report)]
    if keep_logs:
        argv.append("--keep-logs")
    env = {k: v for k, v in os.environ.items() if k != "GPUWARDEN_BOOTSTRAP_SERVERS"}
    t0 = time.monotonic()
    rc: int | None
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # simulate stops its services on Ctrl-C
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = None
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    wall = round(time.monotonic() - t0, 1)
    outcome = RunOutcome(speed=speed, rc=rc, wall_s=wall)
    if rc is None:
        outcome.error = f"not finished after {limit:.0f} s (log {log})"
    elif report.exists():
        try:
            outcome.report = json.loads(report.read_text())
        except (OSError, ValueError) as exc:
            outcome.error = f"unreadable report {report}: {exc}"
    else:
        outcome.error = f"exit {rc}, no report: {_log_reason(log)} (log {log})"
    return outcome


def _log_reason(log: Path) -> str:
    """The ``error:`` line simulate printed and the last exception line of the log (a service's
    traceback), else its last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("error:")]
    exc = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b", ln)]
    parts = [*said[-1:], *exc[-1:]]
    return " / ".join(parts) if parts else (lines[-1] if lines else "empty log")


def check_scenario(
    scenario: Path,
    speeds: Sequence[float] = DEFAULT_SPEEDS,
    workdir: Path | None = None,
    timeout_s: float | None = None,
    keep_logs: bool = False,
) -> ScenarioCheck:
    """Run ``scenario`` at each of ``speeds`` in turn and collect the outcomes."""
    wd = workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-speedcheck-"))
    check = ScenarioCheck(scenario.stem)
    for s in speeds:
        check.runs.append(run_simulate(scenario, s, wd, timeout_s, keep_logs))
    return check


@contextlib.contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One busy-loop Python process per core (``processes``, default ``os.cpu_count()``) for the
    duration of the ``with`` block; killed on exit, and with this process if it dies."""
    n = processes if processes is not None else (os.cpu_count() or 1)
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            hogs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=die_with_parent,
                )
            )
        yield hogs
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpuwarden.sim.speedcheck",
        description="Each scenario through gpuwarden simulate at two speeds: the same failure ids, a passing score.",
    )
    ap.add_argument("scenarios", nargs="*", type=Path, metavar="SCENARIO", help="scenario YAML files")
    ap.add_argument(
        "--speeds", nargs="+", default=[f"{s:g}" for s in DEFAULT_SPEEDS], help="speeds to compare (default 5 50)"
    )
    ap.add_argument("--hog", action="store_true", help="keep every core busy (one busy loop per core) meanwhile")
    ap.add_argument("--hog-processes", type=int, default=None, help="busy loops with --hog (default: one per core)")
    ap.add_argument("--jobs", type=int, default=1, help="scenarios checked at once (default 1)")
    ap.add_argument("--timeout", type=float, default=None, help="wall seconds per run (default: 3x its time + 300)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep reports and logs here (default: a temp dir)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the service logs of passing runs too")
    ap.add_argument("--summary-json", type=Path, default=None, help="write every run's outcome here as JSON")
    args = ap.parse_args(argv)
    # ``--speeds 5 50 a.yaml b.yaml``: the scenarios after the speeds belong to the positionals
    speeds: list[float] = []
    for tok in args.speeds:
        try:
            speeds.append(float(tok))
        except ValueError:
            args.scenarios.append(Path(tok))
    args.speeds = speeds
    if not args.scenarios:
        ap.error("no SCENARIO given")
    if len(args.speeds) < 2:
        ap.error("--speeds needs at least two speeds")
    if any(not 0.1 <= s <= 50 for s in args.speeds):
        ap.error("speeds must lie in 0.1..50 (gpuwarden simulate's range)")
    for p in args.scenarios:
        try:
            load_scenario(p)
        except (OSError, ValueError) as exc:
            ap.error(f"{p}: {exc}")
    own_workdir = args.workdir is None
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-speedcheck-"))
    hog_n = (args.hog_processes or os.cpu_count() or 1) if args.hog else 0
    print(
        f"speedcheck: {len(args.scenarios)} scenarios at speeds {' and '.join(f'{s:g}' for s in args.speeds)}, "
        f"{'CPU hog of ' + str(hog_n) + ' busy loops' if args.hog else 'no CPU hog'}, {args.jobs} at a time; "
        f"reports in {workdir}",
        flush=True,
    )
    t0 = time.monotonic()
    results: list[ScenarioCheck] = []

    def one(p: Path) -> ScenarioCheck:
        return check_scenario(p, args.speeds, workdir, args.timeout, args.keep_logs)

    hog: contextlib.AbstractContextManager[list[subprocess.Popen[bytes]]] = (
        cpu_hog(hog_n) if args.hog else contextlib.nullcontext([])
    )
    with hog, ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for res in pool.map(one, args.scenarios):
            results.append(res)
            print(res.line(), flush=True)
    different = [r.scenario for r in results if r.complete and not r.same]
    failed_runs = [r.scenario for r in results if not r.complete]
    failed_score = [r.scenario for r in results if r.complete and not all(x.score_passed for x in r.runs)]
    ok = [r for r in results if r.passed]
    print(
        f"summary: {len(ok)}/{len(results)} same and scored; {len(different)} different"
        + (f" ({', '.join(different)})" if different else "")
        + f"; {len(failed_score)} failed score"
        + (f" ({', '.join(failed_score)})" if failed_score else "")
        + f"; {len(failed_runs)} failed runs"
        + (f" ({', '.join(failed_runs)})" if failed_runs else "")
        + f"; {time.monotonic() - t0:.0f} s",
        flush=True,
    )
    if args.summary_json:
        args.summary_json.write_text(
            json.dumps(
                [
                    {
                        "scenario": r.scenario,
                        "same": r.same,
                        "passed": r.passed,
                        "runs": [
                            {
                                "speed": x.speed,
                                "rc": x.rc,
                                "wall_s": x.wall_s,
                                "error": x.error,
                                "score_passed": x.score_passed,
                                "failures": [
                                    {
                                        k: f.get(k)
                                        for k in ("failure_id", "pattern", "node", "gpu_index", "first_seen_s")
                                    }
                                    for f in x.failures
                                ],
                            }
                            for x in r.runs
                        ],
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    if own_workdir and len(ok) == len(results):
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
