"""A missing prerequisite skips on a developer's machine and fails under CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from prerequisites import give_up, need_path


def test_a_missing_path_skips_without_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="absent"):
        need_path(tmp_path / "nope")


def test_a_missing_path_fails_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must have it"):
        need_path(tmp_path / "nope")
    with pytest.raises(pytest.fail.Exception, match="promtool"):
        give_up("promtool not installed")


def test_a_present_path_is_returned(tmp_path: Path) -> None:
    assert need_path(tmp_path) == tmp_path
