"""A job verdict (:class:`~gpuwarden.shared.models.JobReport`) for people: Markdown and the terminal."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from gpuwarden.shared.models import JobReport, WasteCategory
from gpuwarden.shared.text import markdown as md
from gpuwarden.shared.text import one_line

__all__ = ["render_markdown", "render_terminal"]

_COLOUR = {
    WasteCategory.BUSY: "green",
    WasteCategory.NO_TELEMETRY: "grey50",
    WasteCategory.LOST_TO_FAILURE: "red",
    WasteCategory.HUNG: "red",
}


def _t(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts is not None else "-"


def _n(x: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def _title(r: JobReport) -> str:
    """One line; every name in it made safe with :func:`~gpuwarden.shared.text.one_line`."""
    state = "final" if r.final else f"as of {_t(r.as_of)}"
    who = ", ".join(x for x in (r.user, r.account, r.partition) if x)
    return one_line(
        f"job {r.job_id}" + (f" {r.name}" if r.name else "") + (f" ({who})" if who else "") + f" - {r.state}, {state}"
    )


def render_markdown(r: JobReport) -> str:
    """The report as GitHub-flavoured Markdown: verdict, breakdown table, findings, GPUs. Every
    text that came from data (names, verdicts, evidence sources, advice) is escaped for Markdown
    and kept on one line (:func:`gpuwarden.shared.text.markdown`)."""
    out = [f"# {md(_title(r))}", "", md(r.verdict, 4000), ""]
    out += [
        f"- span: {_t(r.start_ts)} to {_t(r.as_of)} ({r.duration_s:.0f} s) on {r.gpu_count} GPUs, {len(r.nodes)} nodes",
        f"- allocated: **{r.gpu_hours:.3f} GPU-hours, ${r.usd:,.2f}** at ${r.price_usd_per_gpu_hour}/GPU-hour; "
        f"busy {r.busy_pct:.1f} %, wasted {r.waste_gpu_hours:.3f} GPU-hours (${r.waste_usd:,.2f})",
        f"- utilisation {_n(r.utilization_gpu_pct_mean, ' %')}; tensor activity (MFU proxy) "
        + (
            f"{r.tensor_activity_pct_mean:.1f} % over {r.tensor_activity_gpus} GPUs"
            if r.tensor_activity_pct_mean is not None
            else "not reported by these GPUs"
        ),
        "",
        "## Where the GPU-hours went",
        "",
        "| category | GPU-hours | USD | share | side | findings |",
        "|---|---:|---:|---:|---|---|",
    ]
    for b in r.breakdown:
        out.append(
            f"| {b.category.value} | {b.gpu_hours:.6f} | {b.usd:.2f} | {b.share_pct:.2f} % | {b.side or ''} | "
            f"{', '.join(b.failure_ids)} |"
        )
    out.append(f"| **total** | **{r.gpu_hours:.6f}** | **{r.usd:.2f}** | 100 % | | |")
    if r.findings:
        out += ["", "## Findings", ""]
        for f in r.findings:
            where = md(f"{f.node} GPU {f.gpu_index}" if f.gpu_index is not None else f.node)
            head = f"- **{f.pattern}** ({f.side}-side, {f.severity.value}, {f.state.value}) on {where}"
            out.append(
                f"{head}: {md(f.verdict, 4000)} "
                f"Cost: {f.gpu_hours:.4f} GPU-hours, ${f.usd:.2f}. Action: {f.recommended_action.value}."
            )
            for e in f.evidence[:4]:
                thr = f" (threshold {e.threshold})" if e.threshold is not None else ""
                out.append(f"  - {md(e.signal)} = {md(e.value)} {md(e.unit or '')}{thr} at {_t(e.ts)}: {md(e.source)}")
    out += ["", "## What to do", ""] + [f"- {md(x, 4000)}" for x in r.recommendations]
    out += ["", "## What the data cannot tell", ""] + [f"- {md(x, 4000)}" for x in r.cannot_determine]
    out += [
        "",
        "## GPUs",
        "",
        "| node | GPU | busy | util mean | util max | memory max (MiB) | power mean (W) | SM clock (MHz) | tensor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in r.per_gpu:
        out.append(
            f"| {md(g.node)} | {g.gpu_index} | {_n(g.busy_pct, ' %')} | {_n(g.utilization_gpu_pct_mean, ' %')} | "
            f"{_n(g.utilization_gpu_pct_max, ' %')} | {_n(g.memory_used_mib_max, '', 0)} | "
            f"{_n(g.power_w_mean, '', 0)} | {_n(g.sm_clock_mhz_mean, '', 0)} | "
            f"{_n(g.tensor_activity_pct_mean, ' %') if g.tensor_activity_pct_mean is not None else 'n/a'} |"
        )
    out += ["", f"`{one_line(r.summary).replace('`', chr(39))}`", ""]
    return "\n".join(out)


def render_terminal(r: JobReport, gpus: bool = True) -> RenderableType:
    """The report for a rich console: verdict panel, breakdown with bars, findings, GPUs."""
    head = Table.grid(padding=(0, 2))
    head.add_row("verdict", escape(one_line(r.verdict, 4000)))
    head.add_row("allocated", f"{r.gpu_hours:.3f} GPU-hours on {r.gpu_count} GPUs, ${r.usd:,.2f}")
    head.add_row("busy", f"{r.busy_pct:.1f} %, wasted {r.waste_gpu_hours:.3f} GPU-hours (${r.waste_usd:,.2f})")
    tensor = (
        f"{r.tensor_activity_pct_mean:.1f} % ({r.tensor_activity_gpus} GPUs)"
        if r.tensor_activity_pct_mean is not None
        else "not reported by these GPUs"
    )
    head.add_row("tensor activity", tensor)
    bd = Table("category", "GPU-hours", "USD", "share", "", "side", title="where the GPU-hours went")
    for b in r.breakdown:
        colour = _COLOUR.get(b.category, "yellow")
        bar = "#" * round(b.share_pct / 4)
        bd.add_row(
            b.category.value,
            f"{b.gpu_hours:.4f}",
            f"{b.usd:.2f}",
            f"{b.share_pct:.1f} %",
            f"[{colour}]{bar}[/]",
            b.side or "",
        )
    bd.add_row("[bold]total[/]", f"[bold]{r.gpu_hours:.4f}[/]", f"[bold]{r.usd:.2f}[/]", "100 %", "", "")
    parts: list[RenderableType] = [Panel(head, title=escape(_title(r))), bd]
    if r.findings:
        ft = Table("pattern", "side", "where", "cost", "action", title="findings")
        for f in r.findings:
            where = f"{f.node} GPU {f.gpu_index}" if f.gpu_index is not None else f.node
            ft.add_row(
                f.pattern,
                f.side,
                where,
                f"{f.gpu_hours:.3f} GPU-h ${f.usd:.2f}",
                f.recommended_action.value,
            )
        parts.append(ft)
    todo = Table.grid(padding=(0, 1))
    for f in r.findings:
        todo.add_row(escape(f.pattern), escape(f.verdict))
    for x in r.recommendations:
        todo.add_row("do", escape(x))
    for x in r.cannot_determine:
        todo.add_row("[grey50]cannot tell[/]", escape(x))
    parts.append(todo)
    if gpus and r.per_gpu:
        gt = Table("node", "GPU", "busy", "util", "mem max MiB", "power W", "SM MHz", "tensor", title="GPUs")
        for g in r.per_gpu:
            gt.add_row(
                g.node,
                str(g.gpu_index),
                _n(g.busy_pct, " %"),
                _n(g.utilization_gpu_pct_mean, " %"),
                _n(g.memory_used_mib_max, "", 0),
                _n(g.power_w_mean, "", 0),
                _n(g.sm_clock_mhz_mean, "", 0),
                _n(g.tensor_activity_pct_mean, " %") if g.tensor_activity_pct_mean is not None else "n/a",
            )
        parts.append(gt)
    return Group(*parts)
