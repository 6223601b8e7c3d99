"""Issue 26, point 6: a mistyped ``GPUWARDEN_*`` variable of a service is named at start with the
closest valid one, instead of silently leaving the default in force."""

from __future__ import annotations

import logging

import pytest

from gpuwarden.remediator import RemediatorSettings
from gpuwarden.shared.settings import unknown_settings


def test_a_typo_of_the_services_own_setting_is_named_with_its_closest_match() -> None:
    env = {
        "GPUWARDEN_REMEDIATOR_ENFORSE": "true",  # the typo of the issue
        "GPUWARDEN_REMEDIATOR_ENFORCE": "false",
        "GPUWARDEN_REMEDIATOR_QQQ": "1",
        "GPUWARDEN_DETECTOR_STATE_FILE": "/x",  # another service's: its own check
        "GPUWARDEN_BOOTSTRAP_SERVERS": "k:9092",
        "PATH": "/bin",
    }
    assert unknown_settings(RemediatorSettings(), env) == [
        "GPUWARDEN_REMEDIATOR_ENFORSE (did you mean GPUWARDEN_REMEDIATOR_ENFORCE?)",
        "GPUWARDEN_REMEDIATOR_QQQ",
    ]


def test_a_near_miss_of_a_shared_setting_is_named_and_other_tools_variables_are_not() -> None:
    """The new user's typos: a singular BOOTSTRAP_SERVER silently connected to 127.0.0.1:9092."""
    env = {
        "GPUWARDEN_BOOTSTRAP_SERVER": "k:9092",
        "GPUWARDEN_LOG_LEVL": "DEBUG",
        "GPUWARDEN_TEST_SERVERS": "local",  # the test setup's, not a typo
        "GPUWARDEN_SIM_SPEED": "10",
        "GPUWARDEN_CONSOLE_SCREENSHOT": "/tmp/x.png",
    }
    assert unknown_settings(RemediatorSettings(), env) == [
        "GPUWARDEN_BOOTSTRAP_SERVER (did you mean GPUWARDEN_BOOTSTRAP_SERVERS?)",
        "GPUWARDEN_LOG_LEVL (did you mean GPUWARDEN_LOG_LEVEL?)",
    ]


async def test_run_service_logs_it_at_start(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from gpuwarden.shared import service as svc

    monkeypatch.setenv("GPUWARDEN_REMEDIATOR_ENFORSE", "true")

    class Stub:
        settings = RemediatorSettings()

        async def start(self) -> None:
            raise RuntimeError("stop here")

        async def stop(self) -> None:
            return None

    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="stop here"):
        await svc._serve(Stub)  # type: ignore[arg-type]
    assert "unknown setting GPUWARDEN_REMEDIATOR_ENFORSE (did you mean GPUWARDEN_REMEDIATOR_ENFORCE?)" in caplog.text
