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
