"""``gpuwarden bench detect DIR``: recall, precision and detection delay per pattern over a
folder of scored scenarios (docs/architecture.md#scenarios)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuwarden.shared.scenario import load_scenario

__all__ = ["detect", "summarise"]


def summarise(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per pattern: tp, fn, fp, recall, precision and delays (s) from scenario reports."""
    rows: dict[str, dict[str, Any]] = {}

    def row(p: str) -> dict[str, Any]:
        return rows.setdefault(p, {"tp": 0, "fn": 0, "fp": 0, "delays": []})

    for rep in reports:
        sc = rep["score"]
        for f in sc["found"]:
            r = row(f["pattern"])
            r["tp"] += 1
            r["delays"].append(f["delay_s"])
        for m in sc["missed"]:
            row(m["pattern"])["fn"] += 1
        for fp in sc["false_positives"]:
            row(fp["pattern"])["fp"] += 1
    for r in rows.values():
        r["recall"] = r["tp"] / (r["tp"] + r["fn"]) if r["tp"] + r["fn"] else None
        r["precision"] = r["tp"] / (r["tp"] + r["fp"]) if r["tp"] + r["fp"] else None
    return rows


def detect(
    folder: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Folder of scenario YAML files")],
    pattern: Annotated[str, typer.Option(help="Only files matching this glob")] = "*.yaml",
    pipeline: Annotated[
        bool, typer.Option(help="Run each scenario through the real services on a broker (slow) instead of in-process")
    ] = False,
    speed: Annotated[float, typer.Option(min=1, max=50, help="With --pipeline: scenario s per wall s")] = 10.0,
) -> None:
    """Run every scenario of FOLDER and print recall, precision and delay per pattern.

    Exit code 1 if any scenario misses an expectation or reports a false positive.
    """
    import asyncio

    from gpuwarden.demo.inprocess import run_inprocess

    console = Console(width=None if Console().is_terminal else 140)
    files = sorted(folder.glob(pattern))
    if not files:
        console.print(f"[red]error:[/] no scenario files matching {pattern} in {folder}")
        raise typer.Exit(2)
    reports: list[dict[str, Any]] = []
    failed: list[tuple[str, dict[str, Any]]] = []
    t0 = time.perf_counter()
    for path in files:
        try:
            sc = load_scenario(path)
        except (OSError, ValueError) as exc:
            console.print(f"[red]FAIL[/] {path.name}: {escape(str(exc))}")
            failed.append((path.name, {"missed": [], "false_positives": [], "error": str(exc)}))
            continue
        if pipeline:
            from gpuwarden.demo.runner import Pipeline

            pl = Pipeline(path, sc, speed=speed)

            async def go(pl: Pipeline = pl, duration_s: float = sc.duration_s) -> dict[str, Any]:
                try:
                    await pl.start()
                    # virtual time: until the sources finished and the pipeline drained
                    limit = time.time() + max(600.0, 10 * duration_s)
                    while not await pl.finished() and time.time() < limit:
                        await pl.poll()
                    return pl.result.report()
                finally:
                    await pl.stop()

            rep = asyncio.run(go())
        else:
            rep = run_inprocess(sc).report()
        reports.append(rep)
        ok = rep["score"]["passed"]
        if not ok:
            failed.append((path.name, rep["score"]))
        cpu = rep["stats"].get("cpu_s")
        node_ticks = rep["stats"].get("gpu.samples", 0)
        cost = f" (cpu {cpu:.1f} s, {node_ticks} node samples)" if cpu is not None else ""
        console.print(f"{'ok  ' if ok else 'FAIL'} {path.name}{cost}")
    wall = time.perf_counter() - t0
    rows = summarise(reports)
    table = Table(
        "pattern",
        "found",
        "missed",
        "false pos.",
        "recall",
        "precision",
        "delay p50 (s)",
        "delay max (s)",
        title=f"bench detect: {len(files)} scenarios in {wall:.1f} s ({'pipeline' if pipeline else 'in-process'})",
    )
    table.columns[0].no_wrap = True
    for p in sorted(rows):
        r = rows[p]
        d = r["delays"]
        table.add_row(
            p,
            str(r["tp"]),
            str(r["fn"]),
            str(r["fp"]),
            "-" if r["recall"] is None else f"{r['recall']:.2f}",
            "-" if r["precision"] is None else f"{r['precision']:.2f}",
            f"{statistics.median(d):.1f}" if d else "-",
            f"{max(d):.1f}" if d else "-",
        )
    console.print(table)
    tp = sum(r["tp"] for r in rows.values())
    fn = sum(r["fn"] for r in rows.values())
    fp = sum(r["fp"] for r in rows.values())
    console.print(
        f"overall: recall {tp / (tp + fn) if tp + fn else 1:.3f}, precision {tp / (tp + fp) if tp + fp else 1:.3f} "
        f"({tp} found, {fn} missed, {fp} false positives)"
    )
    cpus = [r["stats"]["cpu_s"] for r in reports if r["stats"].get("cpu_s") is not None]
    if cpus:
        ticks = sum(r["stats"].get("gpu.samples", 0) for r in reports if r["stats"].get("cpu_s") is not None)
        per = f", {sum(cpus) / ticks * 1000:.2f} ms per node sample" if ticks else ""
        console.print(f"cpu: {sum(cpus):.1f} s in-process ({len(cpus)} scenarios{per})")
    for name, res in failed:
        if "error" in res:
            continue
        missed = ", ".join(f"{m['pattern']}@{m.get('node', '*')}/gpu {m.get('gpu', '*')}" for m in res["missed"]) or "-"
        fps = ", ".join(f"{f['pattern']}@{f['node']}/gpu {f['gpu_index']}" for f in res["false_positives"]) or "-"
        console.print(f"[red]{name}[/]: missed {escape(missed)}; false positives {escape(fps)}")
    if any(res["false_positives"] for _, res in failed if "error" not in res):
        console.print(
            "hint: a pattern that is a consequence of the injected fault (a throttled GPU is also a "
            "straggler) belongs under the scenario's allow: list"
        )
    raise typer.Exit(1 if failed else 0)
