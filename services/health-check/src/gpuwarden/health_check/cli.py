"""``gpuwarden health-check prolog|epilog|run NAME...|list``.

Prints one line (``STATUS: check: reason; ... | N checks in Ts``) on stdout and exits with the
Nagios code of the worst check: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Annotated

import typer
from pydantic import ValidationError

__all__ = ["app", "main"]

app = typer.Typer(
    name="health-check",
    help="Fast, job-aware GPU node checks for Slurm prolog/epilog (Nagios exit codes); results to Kafka 'health'.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

Budget = Annotated[float | None, typer.Option(help="Hard time budget, s [env GPUWARDEN_HEALTH_BUDGET_S, 10]")]
Gpus = Annotated[str | None, typer.Option(help="GPU indices, e.g. 0,1 (default: the job's, or all)")]
NoPublish = Annotated[bool, typer.Option("--no-publish", help="Do not publish results to Kafka")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Also print every result as JSON on stderr")]


def _go(phase: str, names: list[str], budget: float | None, gpus: str | None, no_publish: bool, verbose: bool) -> None:
    from gpuwarden.shared.bus import Producer
    from gpuwarden.shared.settings import describe_settings_error

    from .run import default_inputs, health_run
    from .settings import HealthCheckSettings

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        s = HealthCheckSettings()
    except ValidationError as exc:
        print(f"UNKNOWN: {describe_settings_error(exc)}")
        raise typer.Exit(3) from exc
    if budget is not None:
        s = s.model_copy(update={"health_budget_s": budget})
    try:
        gl = [int(x) for x in gpus.split(",") if x.strip()] if gpus else None
    except ValueError:
        print(f"UNKNOWN: --gpus {gpus!r} is not a list of GPU indices")
        raise typer.Exit(3) from None
    import os

    try:
        inputs = default_inputs(s, os.environ.get("SLURMD_NODENAME") or s.health_node)
    except (OSError, ValueError) as exc:
        print(f"UNKNOWN: cannot set up inputs: {exc}"[:300])
        raise typer.Exit(3) from exc
    make = None if no_publish else (lambda: Producer(s))
    try:
        summary, _ = asyncio.run(health_run(phase, names, s, inputs, make_producer=make, gpus=gl))  # type: ignore[arg-type]
    except ValueError as exc:
        print(f"UNKNOWN: {exc}")
        raise typer.Exit(3) from exc
    if verbose:
        for r in summary.results:
            d = {"check": r.check, "status": r.status.name, "reason": r.reason, "gpu_index": r.gpu_index}
            print(json.dumps({**d, "duration_s": r.duration_s}), file=sys.stderr)
    print(summary.line, flush=True)
    raise typer.Exit(int(summary.status))


@app.command()
def prolog(budget: Budget = None, gpus: Gpus = None, no_publish: NoPublish = False, verbose: Verbose = False) -> None:
    """Checks before a job: the job's GPUs (SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES), XIDs since the last epilog."""
    _go("prolog", [], budget, gpus, no_publish, verbose)


@app.command()
def epilog(budget: Budget = None, gpus: Gpus = None, no_publish: NoPublish = False, verbose: Verbose = False) -> None:
    """Checks after a job: leftover processes/memory, XIDs since the job started."""
    _go("epilog", [], budget, gpus, no_publish, verbose)


@app.command("run")
def run_cmd(
    names: Annotated[list[str] | None, typer.Argument(help="Checks to run (default: all but dcgm); see 'list'")] = None,
    budget: Budget = None,
    gpus: Gpus = None,
    no_publish: NoPublish = False,
    verbose: Verbose = False,
) -> None:
    """Run checks by name outside a job (phase 'periodic')."""
    _go("periodic", names or [], budget, gpus, no_publish, verbose)


@app.command("list")
def list_cmd() -> None:
    """Print the registered checks and the phases that run them by default."""
    from .checks import CHECKS

    for name, spec in CHECKS.items():
        print(f"{name}\t{','.join(sorted(spec.phases)) or 'by name / GPUWARDEN_HEALTH_DCGM_LEVEL>0'}")


def main() -> None:
    app()
