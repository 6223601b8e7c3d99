"""Issue 26, point 1 (part): ``gpuwarden --version`` names every installed gpuwarden package, and
a service's ``--help`` says what running it does."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from gpuwarden.shared.cli import app, load_plugins


def test_version_lists_the_installed_packages() -> None:
    load_plugins()
    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0, out.output
    found = dict(re.findall(r"(gpuwarden(?:-[a-z-]+)?) (\S+)", out.output))
    assert {"gpuwarden-shared", "gpuwarden-collector", "gpuwarden-detector"} <= set(found), out.output
    assert all(re.fullmatch(r"\d+\.\d+\S*", v) for v in found.values()), found


def test_a_service_help_says_what_it_runs() -> None:
    load_plugins()
    out = CliRunner().invoke(app, ["console", "--help"], env={"COLUMNS": "80"})
    assert out.exit_code == 0 and "Without a command: Serve the console" in " ".join(out.output.split())


def test_help_piped_at_80_columns_cuts_no_option_or_variable_name() -> None:
    """Issue 26, point 6: without a TTY (a pipe, a CI log) ``--help`` is click's plain text, which
    wraps; rich's panels cut ``--bootstrap-servers`` to ``--bootstrap-serve…`` at 80 columns."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("gpuwarden")
    env = {**os.environ, "COLUMNS": "80"}
    for args in (["simulate", "--help"], ["report", "--help"], ["analyze", "--help"], ["collector", "--help"]):
        out = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        assert "…" not in out and "╭" not in out, (args, out)
        assert max(len(line) for line in out.splitlines()) <= 80, args
        if args[0] in ("simulate", "report"):
            assert "--bootstrap-servers" in out, out
    out = subprocess.run([str(exe), "simulate", "--help"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert "GPUWARDEN_BOOTSTRAP_SERVERS" in out and "--enforce / --no-enforce" in out
