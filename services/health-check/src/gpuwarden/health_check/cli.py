"""``gpuwarden health-check prolog|epilog|run NAME...|list``.

Prints one line (``STATUS: check: reason; ... | N checks in Ts``) on stdout and exits with the
Nagios code of the worst check: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN. A usage error (unknown
option or command, a value of the wrong type) is UNKNOWN too: ``UNKNOWN: <command>: <error>`` on
stdout, click's usage message on stderr, exit 3 (not click's 2, which would read as CRITICAL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from typing import Annotated, Any, NoReturn, cast

import typer
from pydantic import ValidationError
from typer.core import TyperCommand, TyperGroup

from gpuwarden.shared.clihelp import help_markup

__all__ = ["app", "main"]

# click's UsageError (BadParameter's base class both in click and in the click that newer typer
# versions vendor as typer._click)
_UsageError = cast("type[Exception]", typer.BadParameter.__base__)


def _usage_unknown(ctx: Any, exc: Any) -> NoReturn:
    """A usage error as a Nagios UNKNOWN: one line on stdout, exit 3."""
    exc.show()  # click's plain "Usage: ... Error: ..." on stderr
    msg = " ".join(str(exc.format_message()).split())
    print(f"UNKNOWN: {ctx.command_path}: {msg}", flush=True)
    raise typer.Exit(3) from exc


class _NagiosCommand(TyperCommand):
    """A subcommand whose usage errors exit 3 (UNKNOWN) with one ``UNKNOWN:`` line."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _UsageError as exc:
            _usage_unknown(ctx, exc)


class _NagiosGroup(TyperGroup):
    """``health-check`` itself: an unknown command or option is UNKNOWN too (no arguments at all
    still shows the help)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args:
            return super().parse_args(ctx, args)
        try:
            return super().parse_args(ctx, args)
        except _UsageError as exc:
            _usage_unknown(ctx, exc)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as exc:
            _usage_unknown(ctx, exc)


app = typer.Typer(
    rich_markup_mode=help_markup(),
    name="health-check",
    cls=_NagiosGroup,
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
        try:  # validated like the variable (gt=0, le=3600): a model_copy(update=) would not check it
            s = HealthCheckSettings(health_budget_s=budget)
        except ValidationError as exc:
            print(f"UNKNOWN: --budget {budget:g}: {'; '.join(e['msg'] for e in exc.errors())}")
            raise typer.Exit(3) from exc
    try:
        gl = sorted({int(x) for x in gpus.split(",") if x.strip()}) if gpus is not None else None
        if gl is not None and (not gl or gl[0] < 0):
            raise ValueError(gpus)
    except ValueError:
        print(f"UNKNOWN: --gpus {gpus!r} is not a list of GPU indices")
        raise typer.Exit(3) from None
    try:
        inputs = default_inputs(s, os.environ.get("SLURMD_NODENAME") or s.health_node)
    except (OSError, ValueError) as exc:
        print(f"UNKNOWN: cannot set up inputs: {exc}"[:300])
        raise typer.Exit(3) from exc
    kill_all = getattr(inputs.runner, "kill_all", None)
    if kill_all is not None:  # the wrapper's guard sends SIGTERM first: take the tools down with us

        def _on_term(signum: int, _frame: object) -> None:
            kill_all()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, _on_term)
    make = None if no_publish else (lambda: Producer(s))
    try:
        summary, _ = asyncio.run(health_run(phase, names, s, inputs, make_producer=make, gpus=gl))  # type: ignore[arg-type]
    except ValueError as exc:
        print(f"UNKNOWN: {exc}")
        raise typer.Exit(3) from exc
    except Exception as exc:  # a bug must not look like a verdict on the node
        logging.getLogger(__name__).exception("health-check %s failed", phase)
        print(f"UNKNOWN: internal error {type(exc).__name__}: {exc}"[:300], flush=True)
        raise typer.Exit(3) from exc
    if verbose:
        for r in summary.results:
            d = {"check": r.check, "status": r.status.name, "reason": r.reason, "gpu_index": r.gpu_index}
            print(json.dumps({**d, "duration_s": r.duration_s}), file=sys.stderr)
    print(summary.line, flush=True)
    raise typer.Exit(int(summary.status))


@app.command(cls=_NagiosCommand)
def prolog(budget: Budget = None, gpus: Gpus = None, no_publish: NoPublish = False, verbose: Verbose = False) -> None:
    """Checks before a job: the job's GPUs (SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES), XIDs since the last epilog."""
    _go("prolog", [], budget, gpus, no_publish, verbose)


@app.command(cls=_NagiosCommand)
def epilog(budget: Budget = None, gpus: Gpus = None, no_publish: NoPublish = False, verbose: Verbose = False) -> None:
    """Checks after a job: leftover processes/memory, XIDs since the job started."""
    _go("epilog", [], budget, gpus, no_publish, verbose)


@app.command("run", cls=_NagiosCommand)
def run_cmd(
    names: Annotated[list[str] | None, typer.Argument(help="Checks to run (default: all but dcgm); see 'list'")] = None,
    budget: Budget = None,
    gpus: Gpus = None,
    no_publish: NoPublish = False,
    verbose: Verbose = False,
) -> None:
    """Run checks by name outside a job (phase 'periodic')."""
    _go("periodic", names or [], budget, gpus, no_publish, verbose)


@app.command("list", cls=_NagiosCommand)
def list_cmd() -> None:
    """Print the registered checks and the phases that run them by default."""
    from .checks import CHECKS

    for name, spec in CHECKS.items():
        print(f"{name}\t{','.join(sorted(spec.phases)) or 'by name / GPUWARDEN_HEALTH_DCGM_LEVEL>0'}")


def main() -> None:
    app()
