"""What a test needs from outside the checkout, and what happens when it is missing.

A missing prerequisite skips the test on a developer's machine and fails it under CI
(``CI`` set, as ``.ci/run`` does): CI installs every Debian package of
``deploy/debian-packages.txt`` and has ``../shared`` beside the clone, so a missing one there
is a broken CI machine, never a pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
"""The read-only reference material beside the checkout (``../shared``)."""


def give_up(reason: str) -> NoReturn:
    """Skip the running test with ``reason``; under CI, fail it instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must have it)")
    pytest.skip(reason)


def need_path(path: Path) -> Path:
    """``path`` when it exists; else :func:`give_up` naming it."""
    if not path.exists():
        give_up(f"{path} absent (../shared not beside this checkout?)")
    return path


def needs(path: Path) -> pytest.MarkDecorator:
    """A test marker: before the test runs, :func:`need_path` ``path`` (skip here, fail under CI);
    applied by ``pytest_runtest_setup`` in ``tests/conftest.py``."""
    return pytest.mark.needs_path(path)
