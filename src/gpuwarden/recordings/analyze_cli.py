"""``gpuwarden analyze FILE...``: findings on a recording, in the terminal and as a JSON report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuwarden.demo.reports import check_report_path, write_report

if TYPE_CHECKING:
    from .analyze import AnalyzeResult

console = Console(emoji=False, highlight=False)

_SEV = {"fatal": "bold red", "critical": "red", "warning": "yellow", "info": "cyan"}


def analyze(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Recordings: nvidia-smi CSV/dmon/table/XML logs, dcgm-exporter "
            "scrapes, kernel logs (dmesg, journalctl -k); .gz read as is"
        ),
    ],
    gpus: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="GPUs of a CSV log without an index column (rows cycle "
            "through them); inferred from the row timing when omitted",
        ),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option(help="Field names of a headerless CSV log, comma-separated (nvidia-smi --query-gpu names)"),
    ] = None,
    node: Annotated[str, typer.Option(help="Node name the recording is reported on")] = "recorded-node",
    gpu_model: Annotated[
        str | None,
        typer.Option(
            help="GPU model (e.g. H100-SXM5-80GB): its power limit, max SM "
            "clock and memory fill what the recording lacks, marked assumed"
        ),
    ] = None,
    price: Annotated[float, typer.Option(min=0, help="USD per GPU-hour for the cost figures")] = 3.26,
    job_id: Annotated[str, typer.Option(help="The Slurm job the recording is treated as (all its GPUs)")] = "recording",
    no_job: Annotated[bool, typer.Option("--no-job", help="Treat the GPUs as unallocated (no job)")] = False,
    user: Annotated[str | None, typer.Option(help="The job's user, for the report")] = None,
    tick: Annotated[
        float, typer.Option(min=0.001, max=60, help="Pipeline tick, s: finer readings are summarised")
    ] = 1.0,
    fmt: Annotated[str | None, typer.Option("--format", help="Force a format instead of detecting it")] = None,
    boot_time: Annotated[
        str | None,
        typer.Option(
            help="Boot time of the node (ISO-8601, UTC unless it names a zone, e.g. `uptime -s` in UTC; or "
            "epoch s) for kernel logs stamped in seconds since boot (plain `dmesg`)"
        ),
    ] = None,
    report: Annotated[Path | None, typer.Option(help="Write the JSON report (simulate's format) here")] = None,
    bootstrap_servers: Annotated[
        str | None,
        typer.Option(
            help="Run through the real correlator and detector services on this Kafka (host:port) "
            "instead of in-process; topics get a prefix of this run's own"
        ),
    ] = None,
) -> None:
    """Run a recording through the correlator and detector in event time and print the findings.

    Exit status: 0 when it ran (findings or not), 2 for unreadable input.
    """
    # imported here, not at module level: every gpuwarden command loads this plugin, and these
    # pull in the detector and the collector's readers (~25 MiB)
    from gpuwarden.detector.jobreport import job_report_rows
    from gpuwarden.recordings import gpu_spec, load_recording

    from .analyze import analyze_recording, fill_from_spec, job_summary, recording_summary

    check_report_path(report, console)
    try:
        boot_ts = _epoch(boot_time) if boot_time else None
        rec = load_recording(
            files,
            node=node,
            gpus=gpus,
            columns=[c.strip() for c in columns.split(",")] if columns else None,
            tick_s=tick,
            fmt=fmt,
            boot_ts=boot_ts,
        )
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from exc
    spec = None
    if gpu_model:
        spec = gpu_spec(gpu_model)
        if spec is None:
            console.print(f"[red]error:[/] unknown --gpu-model {escape(gpu_model)!s}")
            raise typer.Exit(2)
    elif (name := _recorded_name(rec)) is not None:
        spec = gpu_spec(name)
    samples, assumed = fill_from_spec(rec.samples, rec.fields, spec)
    fields = frozenset(rec.fields) | frozenset(assumed)
    try:
        if bootstrap_servers:
            result = _through_kafka(
                samples, rec.events, fields, None if no_job else job_id, user, price, bootstrap_servers
            )
        else:
            result = analyze_recording(
                samples,
                rec.events,
                fields=fields,
                job_id=None if no_job else job_id,
                user=user,
                price_usd_per_gpu_hour=price,
                spans=list(rec.spans.values()),
            )
    except ValueError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from exc
    except (RuntimeError, TimeoutError, OSError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc
    rep: dict[str, Any] = {
        "recording": recording_summary(rec, assumed),
        "job": job_summary(result, samples, price),
        "failures": result.rows(),
        "job_reports": job_report_rows(result.reporter),
        "remediations": [],
        "stats": {**result.counts, "cpu_s": round(result.cpu_s, 3)},
    }
    _print(rep)
    if result.reporter is not None:
        from gpuwarden.detector.reportview import render_terminal

        for jr in result.reporter.reports():
            console.print(render_terminal(jr, gpus=False))
    if report:
        write_report(report, rep, console)


def _through_kafka(
    samples: Any,
    events: Any,
    fields: frozenset[str],
    job_id: str | None,
    user: str | None,
    price: float,
    bootstrap: str,
) -> AnalyzeResult:
    """The recording through the real services: as ONE job (``analyze_kafka.run`` takes one),
    whatever runs the files form."""
    from . import analyze_kafka
    from .analyze import AnalyzeResult, index_by_pci, recording_job, span, with_missing_inputs

    if not samples and not events:
        raise ValueError("the recording holds no samples and no events")
    events = index_by_pci(samples, events)
    start, end = span(samples, events)
    job = recording_job(samples, events, job_id, user)
    t0 = time.process_time()
    failures = analyze_kafka.run(samples, events, job, bootstrap, price)
    result = AnalyzeResult(start, end, job, with_missing_inputs(failures, fields))
    result.cpu_s = time.process_time() - t0
    return result


def _epoch(text: str) -> float:
    """``--boot-time``: epoch s, or ISO-8601 (``Z``/offset, else UTC).

    Raises:
        ValueError: neither.
    """
    from datetime import UTC, datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValueError(f"--boot-time {text!r} is not ISO-8601 (2024-05-01T11:00:00Z) or epoch seconds") from exc
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def _recorded_name(rec: Any) -> str | None:
    for s in rec.samples[:1]:
        for g in s.gpus:
            if g.name:
                return str(g.name)
    return None


def _when(ts_utc: str | None, rel_s: float) -> str:
    """``2024-05-01T12:03:04Z (t=301 s)``; only ``t=301 s`` without a wall-clock time."""
    return f"{ts_utc} (t={rel_s:.0f} s)" if ts_utc else f"t={rel_s:.0f} s"


def _print(rep: dict[str, Any]) -> None:
    r = rep["recording"]
    head = Table.grid(padding=(0, 2))
    for f, kind in r["files"].items():
        sp = r.get("spans", {}).get(f)
        when = f", {sp['start_utc']} .. {sp['end_utc']}" if sp and sp["start_utc"] else ""
        head.add_row("file", escape(f"{f} ({kind}{when})"))
    head.add_row("node / GPUs", escape(f"{r['node']}: {len(r['gpus'])} GPUs {r['gpus']}"))
    period = f"{r['start_utc']} .. {r['end_utc']}, " if r.get("start_utc") else ""
    interval = format(r["interval_s"], ".3g") if r["interval_s"] else "-"
    head.add_row(
        "span",
        f"{period}{r['duration_s']:.0f} s, interval {interval} s, {r['rows']} rows, "
        f"{r['ticks']} ticks, {r['events']} events, {len(r['gaps'])} gaps",
    )
    head.add_row("fields", escape(", ".join(r["fields"]) or "-"))
    for k, v in r["assumed"].items():
        head.add_row("assumed", escape(f"{k} = {v} (from the GPU model's spec sheet)"))
    for n in r["notes"]:
        head.add_row("note", escape(n))
    console.print(head)
    fails = rep["failures"]
    if not fails:
        console.print("[green]no findings[/]")
    for f in fails:
        where = f"{f['node']}" + (f" GPU {f['gpu_index']}" if f["gpu_index"] is not None else "")
        ident = f.get("pci_bus_id") or f.get("gpu_uuid")
        if ident:
            where += f" ({ident})" if f["gpu_index"] is not None else f" GPU at {ident}"
        if f.get("job_id"):
            where += f", job {f['job_id']}"
        console.print(
            f"\n[{_SEV.get(f['severity'], '')}]{f['severity']}[/] [bold]{f['pattern']}[/] "
            f"({f['category']}, {f['rule_id']}) on {escape(where)}: action {f['recommended_action']}, {f['state']}"
        )
        n = f.get("occurrences", 1)
        console.print(
            f"  first seen {_when(f.get('first_seen_utc'), f['first_seen_s'])}, last seen "
            f"{_when(f.get('last_seen_utc'), f.get('last_seen_s', f['first_seen_s']))} "
            f"(window {f.get('window_s', 0):.0f} s, {n} occurrence{'s' if n != 1 else ''})"
        )
        console.print(f"  {escape(f['verdict'])}")
        for e in f["evidence"][:3]:
            at = f" at {e['ts_utc']}" if e.get("ts_utc") else ""
            thr = f" (threshold {escape(str(e['threshold']))})" if e.get("threshold") is not None else ""
            unit = f" {escape(str(e['unit']))}" if e.get("unit") else ""
            console.print(f"  [dim]evidence {escape(str(e['signal']))}={escape(str(e['value']))}{unit}{thr}{at}[/]")
        for c in f["cannot_determine"]:
            console.print(f"  [dim]cannot tell {escape(c)}[/]")
    j = rep["job"]
    jobs = j.get("jobs") or []
    for jr in jobs:
        period = f", {jr['start_utc']} .. {jr['end_utc']}" if jr.get("start_utc") else ""
        cost = f" (${j['usd']})" if len(jobs) == 1 else ""
        console.print(escape(f"job {jr['job_id']}: {jr['gpus']} GPUs{period}, {jr['gpu_hours']} GPU-h{cost}"))
    if len(jobs) > 1:
        console.print(escape(f"{len(jobs)} jobs (one per run of the files): {j['gpu_hours']} GPU-h (${j['usd']})"))
