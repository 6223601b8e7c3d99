"""A missing prerequisite fails the test, naming it and how to get it; nothing is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from prerequisites import give_up, need_path


def test_a_missing_path_fails_without_ci_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception, match="absent"):
        need_path(tmp_path / "nope")
    with pytest.raises(pytest.fail.Exception, match="make prereqs"):
        give_up("promtool not installed")


def test_a_missing_path_fails_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must have it"):
        need_path(tmp_path / "nope")
    with pytest.raises(pytest.fail.Exception, match="promtool"):
        give_up("promtool not installed")


def test_a_present_path_is_returned(tmp_path: Path) -> None:
    assert need_path(tmp_path) == tmp_path
