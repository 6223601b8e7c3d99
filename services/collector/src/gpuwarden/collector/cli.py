"""``gpuwarden collector``: run the collector, or parse recorded tool output to JSON.

Options override the ``GPUWARDEN_COLLECTOR_*`` environment variables.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from gpuwarden.shared.clihelp import help_markup
from gpuwarden.shared.settings import describe_settings_error

__all__ = ["app"]

app = typer.Typer(
    rich_markup_mode=help_markup(),
    name="collector",
    help="Collect GPU samples (NVML, nvidia-smi XML replay or simulation) and XID/SXID events, "
    "publish them to Kafka (gpu.samples, gpu.events). Without a subcommand: run the service.",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def run(
    ctx: typer.Context,
    source: Annotated[
        str | None, typer.Option(help="nvml | dcgm-exporter | replay | simulated [env GPUWARDEN_COLLECTOR_SOURCE]")
    ] = None,
    node: Annotated[str | None, typer.Option(help="Node name (nvml mode; default short hostname)")] = None,
    interval: Annotated[float | None, typer.Option(help="Wall seconds between ticks (default 1.0)")] = None,
    replay_dir: Annotated[Path | None, typer.Option(help="replay: folder of <node>/*.xml and <node>/kern.log")] = None,
    scenario: Annotated[Path | None, typer.Option(help="simulated: scenario YAML")] = None,
    nodes: Annotated[
        str | None, typer.Option(help="replay/simulated: hostlist of nodes, e.g. gpu-node-[001-004]")
    ] = None,
    kernel_log: Annotated[
        str | None, typer.Option(help="nvml: kernel log with XIDs (default /dev/kmsg; '' = none)")
    ] = None,
    http_port: Annotated[int | None, typer.Option(help="Port of /healthz and /metrics (0 = free port)")] = None,
    log_level: Annotated[str | None, typer.Option(help="Logging level (default INFO)")] = None,
) -> None:
    """Run the collector until SIGTERM/SIGINT (exit 0), or until a task crashes (exit 1)."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuwarden.shared.service import run_service

    from .service import CollectorService
    from .settings import CollectorSettings

    given: dict[str, Any] = {
        "collector_source": source,
        "collector_node": node,
        "collector_interval_s": interval,
        "collector_replay_dir": replay_dir,
        "collector_scenario": scenario,
        "collector_nodes": nodes,
        "collector_kernel_log": kernel_log,
        "http_port": http_port,
        "log_level": log_level,
    }
    try:
        settings = CollectorSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        # one line naming each bad setting, as every other service prints it
        typer.echo(f"error: {describe_settings_error(exc)}", err=True)
        raise typer.Exit(2) from exc
    from aiokafka.errors import KafkaError

    try:
        rc = run_service(lambda: CollectorService(settings), settings.log_level)
    except (OSError, ValueError, KeyError, KafkaError) as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from exc
    raise typer.Exit(rc)


@app.command("parse-xml")
def parse_xml(file: Annotated[Path, typer.Argument(help="nvidia-smi -q -x output ('-' = stdin)")]) -> None:
    """Print an nvidia-smi -q -x capture as JSON (driver, CUDA, DTD version, GPU samples, MIG)."""
    from dataclasses import asdict

    from gpuwarden.shared.nvidia.smi_xml import parse_nvidia_smi_xml

    text = sys.stdin.read() if str(file) == "-" else _read(file)
    try:
        rep = parse_nvidia_smi_xml(text)
    except ValueError as exc:
        typer.echo(f"error: {file}: {exc}", err=True)
        raise typer.Exit(1) from exc
    out = {
        "dtd_version": rep.dtd_version,
        "driver_version": rep.driver_version,
        "cuda_version": rep.cuda_version,
        "timestamp": rep.timestamp,
        "gpus": [g.model_dump(mode="json") for g in rep.gpus],
        "mig": {str(k): [asdict(d) for d in v] for k, v in rep.mig.items()},
    }
    typer.echo(json.dumps(out, indent=2))


@app.command("parse-log")
def parse_log(
    file: Annotated[Path, typer.Argument(help="Kernel log (dmesg, kern.log, journal) ('-' = stdin)")],
    node: Annotated[str, typer.Option(help="Node name to put in the events")],
    year: Annotated[int | None, typer.Option(help="Year of syslog-style timestamps (default: this year)")] = None,
) -> None:
    """Print the XID/SXID events of a kernel log as JSON lines (one GpuEvent per line)."""
    from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line

    text = sys.stdin.read() if str(file) == "-" else _read(file)
    now = time.time()
    for line in text.splitlines():
        try:
            ev = parse_kernel_log_line(line, node, now, year, source="file")
        except ValueError as exc:
            typer.echo(f"warning: {exc}: {line!r}", err=True)
            continue
        if ev is not None:
            typer.echo(ev.to_json().decode())


def _read(file: Path) -> str:
    try:
        return file.read_text(errors="replace")
    except OSError as exc:
        typer.echo(f"error: cannot read {file}: {exc}", err=True)
        raise typer.Exit(2) from exc
