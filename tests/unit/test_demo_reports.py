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
