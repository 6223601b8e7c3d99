"""``gpuwarden detector``: run the detector, or check a catalog file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuwarden.shared.cli import service_app


def _service() -> Any:
    from .service import DetectorService, DetectorSettings

    return DetectorService(DetectorSettings())


app = service_app(
    help="Detector: attributed GPU events and samples -> failures (catalog rules).",
    run_help="Run the detector service until SIGTERM/Ctrl-C (settings from GPUWARDEN_* variables).",
    factory=_service,
)


@app.command("check-catalog")
def check_catalog(path: Annotated[Path | None, typer.Argument(help="Catalog YAML (default: shipped)")] = None) -> None:
    """Load and validate a failure catalog; print its rules."""
    from rich.console import Console
    from rich.table import Table

    from .catalog import CatalogError, load_catalog

    try:
        cat = load_catalog(path)
    except (CatalogError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    t = Table("rule", "pattern", "when", "severity", "action", title="event rules")
    for r in cat.rules:
        codes = ",".join(str(c) for c in r.match.codes) or "any"
        fatal = "" if r.match.fatal is None else (" fatal" if r.match.fatal else " non-fatal")
        t.add_row(r.id, r.pattern, f"{r.match.event} {codes}{fatal}", r.severity.value, r.action.value)
    c = Table("rule", "pattern", "signal", "for / resolve (s)", "severity", "action", title="conditions")
    for cr in cat.conditions:
        c.add_row(
            cr.id,
            cr.pattern,
            f"{cr.scope}: {cr.signal.type}",
            f"{cr.for_s:g} / {cr.resolve_after_s:g}",
            cr.severity.value,
            cr.action.value,
        )
    console = Console(width=None if Console().is_terminal else 140)
    console.print(t)
    console.print(c)
    patterns = {e.pattern for e in cat.xid_table.values()}
    ruled = {code for r in cat.rules if r.match.event == "xid" for code in r.match.codes}
    plain = [code for code in cat.xid_table if code not in ruled]
    console.print(
        f"XID table: {len(cat.xid_table)} codes -> {len(patterns)} patterns; {len(plain)} of them without a rule "
        "of their own (the table gives their failure); unknown codes -> xid-other"
    )
