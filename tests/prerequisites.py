"""What a test needs from outside the checkout, and what happens when it is missing: the test
fails, naming what is missing and how to get it. Nothing is skipped: every prerequisite can be
had on any machine that runs the suite (``make prereqs`` installs the Debian packages of
``deploy/debian-packages.txt``, Java and Maven, as ``make test`` and ``.ci/run`` do; ``../shared``
lies beside every checkout of the project), so a missing one is a broken setup, never a pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
"""The read-only reference material beside the checkout (``../shared``)."""


def give_up(reason: str) -> NoReturn:
    """Fail the running test with ``reason`` and how to get what is missing."""
    where = "CI must have it" if os.environ.get("CI") else "`make prereqs` (as root) installs the packages"
    pytest.fail(f"{reason} ({where})")


def need_path(path: Path) -> Path:
    """``path`` when it exists; else :func:`give_up` naming it."""
    if not path.exists():
        give_up(f"{path} absent (../shared not beside this checkout?)")
    return path


def needs(path: Path) -> pytest.MarkDecorator:
    """A test marker: before the test runs, :func:`need_path` ``path`` (else the test fails, naming it);
    applied by ``pytest_runtest_setup`` in ``tests/conftest.py``."""
    return pytest.mark.needs_path(path)
