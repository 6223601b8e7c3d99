"""The ``--report FILE`` of demo/simulate/analyze: a one-line error, never a traceback."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import orjson
import pytest
import typer
from rich.console import Console

from gpuwarden.demo.reports import check_report_path, write_report


def _console() -> tuple[Console, StringIO]:
    out = StringIO()
    return Console(file=out, width=200, color_system=None), out


def test_a_missing_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    console, out = _console()
    with pytest.raises(typer.Exit) as exc:
        check_report_path(tmp_path / "nope" / "r.json", console)
    assert exc.value.exit_code == 2
    assert out.getvalue().startswith("error: cannot write the report") and "is not a folder" in out.getvalue()
    check_report_path(tmp_path / "r.json", console)  # an existing folder passes
    check_report_path(None, console)  # no report asked for


def test_a_folder_or_a_folder_without_write_permission_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console, out = _console()
    with pytest.raises(typer.Exit):
        check_report_path(tmp_path, console)  # a folder, not a file
    assert "it is a folder" in out.getvalue()
    # a root-owned working directory in an image (uid 10001): the run would end in "Permission denied"
    denied = {tmp_path}
    monkeypatch.setattr("os.access", lambda p, mode: Path(p) not in denied)
    with pytest.raises(typer.Exit) as exc:
        check_report_path(tmp_path / "r.json", console)
    assert exc.value.exit_code == 2
    assert out.getvalue().strip().splitlines()[-1] == (
        f"error: cannot write the report {tmp_path / 'r.json'}: no write permission on {tmp_path}"
    )
    (tmp_path / "r.json").write_text("{}")  # an existing file: its own permission counts
    check_report_path(tmp_path / "r.json", console)
    denied.add(tmp_path / "r.json")
    with pytest.raises(typer.Exit):
        check_report_path(tmp_path / "r.json", console)


def test_an_exit_at_the_end_of_a_run_keeps_its_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """write_report's exit 2 (an OS error) was caught as a RuntimeError (click's Exit is one):
    "error: 2" and exit code 1."""
    from gpuwarden.demo import cli

    async def run(*_a: object, **_k: object) -> int:
        raise typer.Exit(2)

    monkeypatch.setattr(cli, "_run", run)
    monkeypatch.setattr(cli, "load_scenario", lambda _p: object())
    monkeypatch.setattr(cli, "Pipeline", lambda *_a, **_k: object())
    with pytest.raises(typer.Exit) as exc:
        cli._go(tmp_path / "s.yaml", None, 5.0, None, True, 60.0, False, False)
    assert exc.value.exit_code == 2


def test_write_report_writes_json_and_reports_an_os_error(tmp_path: Path) -> None:
    console, out = _console()
    path = tmp_path / "r.json"
    write_report(path, {"failures": [{"pattern": "gpu-fallen-off-bus"}]}, console)
    assert orjson.loads(path.read_bytes()) == {"failures": [{"pattern": "gpu-fallen-off-bus"}]}
    assert f"report written to {path}" in out.getvalue()
    with pytest.raises(typer.Exit) as exc:
        write_report(tmp_path, {}, console)  # a folder, not a file
    assert exc.value.exit_code == 2
    last = out.getvalue().strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write the report {tmp_path}:"), last
