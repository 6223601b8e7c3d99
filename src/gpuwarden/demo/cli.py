"""``gpuwarden demo`` and ``gpuwarden simulate``: the whole pipeline on a simulated fleet."""

from __future__ import annotations

import asyncio
import shutil
import time
from importlib.resources import files
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from gpuwarden.shared.models import Failure
from gpuwarden.shared.scenario import load_scenario

from .console_mode import hold_until_interrupt, start_console
from .reports import check_report_path, write_report
from .runner import Pipeline

console = Console(emoji=False, highlight=False)
DEMO_SCENARIO = files(__package__).joinpath("scenarios", "demo-xid79.yaml")


def _view(p: Pipeline) -> Group:
    r = p.result
    t = Table(title=f"gpuwarden - {p.scenario.name}", expand=False)
    t.add_column("service")
    t.add_column("pid", justify="right")
    t.add_column("state")
    t.add_column("ready at (s)", justify="right")
    for sp in p.procs:
        state = "[green]running[/]" if sp.alive else f"[red]exited {sp.proc.returncode if sp.proc else ''}[/]"
        t.add_row(sp.name, str(sp.proc.pid if sp.proc else "-"), state, str(sp.ready_s or "-"))
    c = r.counts
    flow = Table.grid(padding=(0, 2))
    if p.phase == "running" and r.wall_start:
        p.sim_t = min(p.scenario.duration_s, max(0.0, (time.time() - r.wall_start) * p.speed))
    sim_t = p.sim_t
    flow.add_row("phase", p.phase)
    flow.add_row("elapsed", f"{time.time() - r.started_wall:5.1f} s wall, scenario t={sim_t:5.1f} s")
    flow.add_row(
        "gpu.samples", f"{c.get('gpu.samples', 0)} node samples (-> gpu.attributed {c.get('gpu.attributed', 0)})"
    )
    flow.add_row("gpu.events", f"{c.get('gpu.events', 0)} (-> attributed {c.get('gpu.events.attributed', 0)})")
    flow.add_row("slurm", f"jobs {c.get('slurm.jobs', 0)}, nodes {c.get('slurm.nodes', 0)}")
    flow.add_row(
        "failures",
        f"[bold]{len(r.failures)}[/]  remediations {len(r.remediations)}  dead-lettered {len(r.deadletters)}",
    )
    return Group(t, Panel(flow, title="pipeline"))


def _failure_panel(f: Failure, sim_start: float) -> Panel:
    g = Table.grid(padding=(0, 2))
    g.add_row("pattern", f"[bold red]{f.pattern}[/] ({f.rule_id}, {f.severity.value})")
    where = (
        f"node {f.node}, GPU {f.gpu_index} (PCI {f.pci_bus_id or 'unknown'}, {f.gpu_uuid or 'uuid unknown'})"
        if f.gpu_index is not None
        else f"node {f.node} (node-wide)"
    )
    g.add_row("where", escape(where))
    g.add_row("job", f"{f.job_id} user {f.user} partition {f.partition}" if f.job_id else "none")
    g.add_row("first seen", f"t={f.first_seen - sim_start:.1f} s into the scenario")
    g.add_row("verdict", escape(f.verdict))
    for e in f.evidence[:3]:
        g.add_row("evidence", escape(f"{e.signal}={e.value} {e.unit or ''} at t={e.ts - sim_start:.1f}s: {e.source}"))
    g.add_row(
        "cost",
        f"{f.cost.affected_gpus} GPUs, ${f.cost.usd_per_hour:.2f}/h, {f.cost.gpu_hours_lost:.3f} GPU-h since it was "
        "first seen (the work the job lost is in its verdict)",
    )
    g.add_row("action", f.recommended_action.value)
    for c in f.cannot_determine:
        g.add_row("cannot tell", escape(c))
    return Panel(g, title="failure")


async def _run(
    p: Pipeline,
    report: Path | None,
    until_found: bool,
    live: bool,
    max_wall_s: float,
    keep_logs: bool = False,
    console_ui: bool = False,
) -> int:
    rc = 1
    ui = None
    with Live(_view(p), console=console, refresh_per_second=4, transient=False, auto_refresh=live) as lv:
        try:
            await p.start(on_phase=lambda _: lv.update(_view(p)))
            if console_ui:
                ui = await start_console(p)
                console.print(f"console: http://127.0.0.1:{ui.http.port}/ (up until Ctrl-C)")
            # Virtual time: the run ends when the sources published their last tick and the
            # pipeline drained (Pipeline.finished); max_wall_s only guards against a hang.
            deadline = time.time() + max_wall_s
            while True:
                await p.poll()
                lv.update(_view(p))
                dead = [sp for sp in p.crashed()]
                if dead:
                    p.phase = f"[red]{dead[0].name} exited[/]"
                    console.print(f"[red]{dead[0].name} exited:[/]\n{dead[0].log_tail()}")
                    break
                if until_found and p.done():
                    await asyncio.sleep(0.5)
                    await p.poll()
                    p.phase = "done"
                    p.result.stopped_early = True
                    break
                if await p.finished():
                    p.phase = "scenario finished"
                    p.result.stopped_early = False
                    break
                if time.time() > deadline:
                    p.phase = f"[red]not finished after {max_wall_s:.0f} s of wall time[/]"
                    console.print(f"[red]not finished after {max_wall_s:.0f} s: lag {p.drain_lags()}[/]")
                    break
            lv.update(_view(p))
            if ui is not None:
                p.phase = f"console on http://127.0.0.1:{ui.http.port}/ - Ctrl-C stops"
                await hold_until_interrupt(p, lambda: lv.update(_view(p)))
        finally:
            p.phase = "stopping services"
            if ui is not None:
                await ui.stop()
            await p.stop()
            lv.update(_view(p))
    rep = p.result.report()
    console.print()
    for f in sorted(p.result.failures.values(), key=lambda f: f.first_seen):
        console.print(_failure_panel(f, p.result.sim_start))
    seen: dict[tuple[str, str, str, str], int] = {}
    for r in p.result.remediations:
        k = (r.decision.value, r.action.value, r.node, r.reason)
        seen[k] = seen.get(k, 0) + 1
    for r in {(r.decision.value, r.action.value, r.node, r.reason): r for r in p.result.remediations}.values():
        n = seen[(r.decision.value, r.action.value, r.node, r.reason)]
        colour = "green" if r.decision.value in ("executed", "dry-run") else "yellow"
        body = f"[{colour}]{r.decision.value}[/] {r.action.value} {escape(r.node)}: {escape(r.reason)}"
        times = f" (x{n}: one per failure update)" if n > 1 else ""
        console.print(Panel(f"{body}{times}\nargv: {escape(str(r.argv))}", title="drain decision"))
    sc = rep["score"]
    ttf = rep["stats"]["time_to_first_failure_s"]
    console.print(
        f"score: {len(sc['found'])}/{sc['expected']} expected found, {len(sc['missed'])} missed, "
        f"{len(sc['false_positives'])} false positives; "
        + (f"first failure on the bus {ttf} s after start" if ttf is not None else "no failure reported")
    )
    if not sc["passed"] or keep_logs:
        console.print(f"service logs kept in {p.workdir / 'logs'}")
    if report:
        write_report(report, rep, console)
    if sc["passed"]:
        rc = 0
        if not keep_logs:
            shutil.rmtree(p.workdir, ignore_errors=True)
    return rc


def _go(
    scenario: Path,
    report: Path | None,
    speed: float,
    bootstrap: str | None,
    until_found: bool,
    max_wall_s: float,
    enforce: bool,
    live: bool,
    keep_logs: bool = False,
    console_ui: bool = False,
) -> None:
    check_report_path(report, console)
    try:
        sc = load_scenario(scenario)
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    p = Pipeline(Path(scenario), sc, speed=speed, bootstrap_servers=bootstrap, enforce=enforce)
    try:
        rc = asyncio.run(_run(p, report, until_found, live, max_wall_s, keep_logs, console_ui))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: services stopped[/]")
        raise typer.Exit(130) from None
    except typer.Exit:  # its own exit code (click's Exit is a RuntimeError)
        raise
    except (RuntimeError, OSError) as exc:
        logs = p.workdir / "logs"
        console.print(f"\n[red]error:[/] {escape(str(exc))}" + (f"\nservice logs in {logs}" if logs.exists() else ""))
        raise typer.Exit(1) from exc
    raise typer.Exit(rc)


Bootstrap = Annotated[
    str | None,
    typer.Option(
        help="Use this Kafka (host:port) instead of the embedded broker; GPUWARDEN_BOOTSTRAP_SERVERS "
        "is deliberately not read here, so a shell set up for the services still gets its own broker"
    ),
]


def demo(
    report: Annotated[
        Path | None, typer.Option(help="Write the JSON run report (docs/architecture.md#scenarios) here")
    ] = None,
    speed: Annotated[float, typer.Option(min=0.1, max=50, help="Scenario seconds per wall second")] = 1.0,
    bootstrap_servers: Bootstrap = None,
    live: Annotated[bool, typer.Option(help="Refresh the live view (off: print it on change only)")] = True,
    keep_logs: Annotated[bool, typer.Option(help="Keep the service logs even when the run passes")] = False,
    console_ui: Annotated[
        bool, typer.Option("--console", help="Serve the web console and keep everything up until Ctrl-C")
    ] = False,
) -> None:
    """Simulated 8-node H100 fleet, one training job, XID 79 on one GPU: find it, attribute it, drain the node."""
    with DEMO_SCENARIO.open("rb"):  # fail early if the package data is missing
        pass
    _go(
        Path(str(DEMO_SCENARIO)),
        report,
        speed,
        bootstrap_servers,
        until_found=True,
        max_wall_s=300,
        enforce=True,
        live=live,
        keep_logs=keep_logs,
        console_ui=console_ui,
    )


def simulate(
    scenario: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="Scenario YAML (docs/architecture.md#scenarios)")
    ],
    report: Annotated[Path | None, typer.Option(help="Write the JSON report here")] = None,
    speed: Annotated[float, typer.Option(min=0.1, max=50, help="Scenario seconds per wall second")] = 1.0,
    bootstrap_servers: Bootstrap = None,
    enforce: Annotated[bool, typer.Option(help="Let the remediator drain nodes of the simulated Slurm")] = True,
    live: Annotated[bool, typer.Option(help="Refresh the live view")] = True,
    keep_logs: Annotated[bool, typer.Option(help="Keep the service logs even when the run passes")] = False,
) -> None:
    """Run a scenario through the whole pipeline and score it (exit 0 when every expectation is met)."""
    _go(
        scenario,
        report,
        speed,
        bootstrap_servers,
        until_found=False,
        max_wall_s=3600,
        enforce=enforce,
        live=live,
        keep_logs=keep_logs,
    )
