"""``gpuwarden remediator``: run it, resume a node gpuwarden drained, show status, reset the breaker."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuwarden.shared.cli import service_app


def _service() -> Any:
    from .service import Remediator
    from .settings import RemediatorSettings

    return Remediator(RemediatorSettings())


app = service_app(
    help="Remediator: failures -> policy-checked Slurm drains -> remediations (audit).",
    run_help="Run the remediator until SIGTERM/Ctrl-C (dry-run unless GPUWARDEN_REMEDIATOR_ENFORCE=true).",
    factory=_service,
)


@app.command("resume")
def resume(
    node: Annotated[str, typer.Argument(help="Node to resume, e.g. gpu-node-002")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be done")] = False,
) -> None:
    """Resume NODE, but only if gpuwarden drained it (reason starts with 'gpuwarden:')."""
    from gpuwarden.shared.slurm import SlurmError

    from .actuation import make_client, resume_node
    from .settings import RemediatorSettings

    try:
        client, _ = make_client(RemediatorSettings())
        rc, msg = asyncio.run(resume_node(client, node, dry_run=dry_run))
    except (SlurmError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(msg, err=rc != 0)
    raise typer.Exit(rc)


def _target(url: str | None, ledger: Path | None) -> tuple[str | None, Path | None]:
    from .settings import RemediatorSettings

    if url is None and ledger is None:
        ledger = RemediatorSettings().remediator_ledger_file
    if url is None and ledger is None:
        typer.echo(
            "error: give --url http://HOST:PORT (the running remediator) or --ledger FILE "
            "(or set GPUWARDEN_REMEDIATOR_LEDGER_FILE)",
            err=True,
        )
        raise typer.Exit(2)
    return url, ledger


def _http(method: str, url: str, token: str | None = None) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https://, got {url!r}")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        exc.close()  # the error holds the response and its socket
        if exc.code == 401:
            raise ValueError(
                f"{url} refused the request (401): give the service's GPUWARDEN_HTTP_CONTROL_TOKEN "
                "(--token or the same variable here)"
            ) from exc
        raise
    if not isinstance(data, dict):
        raise ValueError(f"{url} did not answer a JSON object")
    return data


@app.command("reset-breaker")
def reset_breaker(
    url: Annotated[str | None, typer.Option(help="Running remediator, e.g. http://127.0.0.1:8085")] = None,
    ledger: Annotated[Path | None, typer.Option(help="Ledger file (GPUWARDEN_REMEDIATOR_LEDGER_FILE)")] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="GPUWARDEN_HTTP_CONTROL_TOKEN", show_envvar=True, help="Control token of the running remediator"
        ),
    ] = None,
) -> None:
    """Close a tripped circuit breaker (a person decided draining may go on)."""
    url, ledger = _target(url, ledger)
    try:
        if url is not None:
            was = _http("POST", url.rstrip("/") + "/breaker/reset", token).get("was")
        else:
            assert ledger is not None
            from .ledger import Ledger

            was = Ledger(ledger).request_breaker_reset(time.time())
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"circuit breaker closed (was: {was or 'closed'})")


@app.command("status")
def status(
    url: Annotated[str | None, typer.Option(help="Running remediator, e.g. http://127.0.0.1:8085")] = None,
    ledger: Annotated[Path | None, typer.Option(help="Ledger file (GPUWARDEN_REMEDIATOR_LEDGER_FILE)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON")] = False,
    limit: Annotated[int, typer.Option(help="Recent actions to show")] = 10,
) -> None:
    """Show breaker state, recent actions and drained nodes with their failures."""
    url, ledger = _target(url, ledger)
    try:
        if url is not None:
            st = _http("GET", url.rstrip("/") + "/status")
        else:
            assert ledger is not None
            from .ledger import Ledger

            st = Ledger(ledger).read().get("status") or {}
            if not st:
                raise ValueError(f"ledger {ledger} has no status yet (has the remediator run with it?)")
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps(st, indent=2, sort_keys=True))
        return
    br = st.get("breaker", {})
    typer.echo(f"enforce: {st.get('enforce')}   active: {st.get('active')}   cluster: {st.get('cluster')}")
    typer.echo(f"breaker: {'OPEN - ' + str(br.get('reason')) if br.get('open') else 'closed'}")
    drained = st.get("drained", {})
    typer.echo(f"drained by gpuwarden: {len(drained)}")
    for node, d in sorted(drained.items()):
        typer.echo(f"  {node}  reason={d.get('reason')!r}")
        for fl in d.get("failures", []):
            state = "open" if fl.get("open") else f"resolved at {fl.get('resolved_at')}"
            typer.echo(f"    failure {fl.get('failure_id')} {fl.get('pattern')} ({state})")
    recent = st.get("recent", [])[-limit:]
    typer.echo(f"recent actions ({len(recent)}):")
    for r in recent:
        typer.echo(f"  {r.get('node')}  {r.get('decision')} {r.get('action')}  [{r.get('rule')}]  {r.get('reason')}")
