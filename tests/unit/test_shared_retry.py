"""gpuwarden.shared.retry: attempts, sleeps and which outcomes are retried (fake sleep)."""

from __future__ import annotations

import pytest

from gpuwarden.shared.retry import backoff_wait, retry_async


class Script:
    """An operation that plays a list of outcomes (an exception instance is raised)."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    async def __call__(self) -> object:
        out = self.outcomes[min(self.calls, len(self.outcomes) - 1)]
        self.calls += 1
        if isinstance(out, BaseException):
            raise out
        return out


class Sleeps:
    def __init__(self) -> None:
        self.slept: list[float] = []

    async def __call__(self, s: float) -> None:
        self.slept.append(s)


async def test_exponential_sleeps_then_the_last_exception_unwrapped() -> None:
    op, sleep = Script(OSError("down")), Sleeps()
    with pytest.raises(OSError, match="down"):
        await retry_async(op, retries=3, first_delay_s=0.5, retry_on=OSError, sleep=sleep)
    assert op.calls == 4
    assert sleep.slept == [0.5, 1.0, 2.0]


async def test_a_lambda_returning_a_coroutine_is_awaited() -> None:
    op, sleep = Script(OSError(), 5), Sleeps()
    assert await retry_async(lambda: op(), retries=1, first_delay_s=0.1, retry_on=OSError, sleep=sleep) == 5
    assert op.calls == 2 and sleep.slept == [0.1]


async def test_linear_sleeps() -> None:
    op, sleep = Script(TimeoutError(), TimeoutError(), "ok"), Sleeps()
    got = await retry_async(op, retries=2, first_delay_s=0.5, growth="linear", retry_on=TimeoutError, sleep=sleep)
    assert got == "ok" and op.calls == 3 and sleep.slept == [0.5, 1.0]


async def test_an_exception_not_named_is_raised_at_once() -> None:
    op, sleep = Script(ValueError("bad name"), "never"), Sleeps()
    with pytest.raises(ValueError, match="bad name"):
        await retry_async(op, retries=5, first_delay_s=1.0, retry_on=(OSError, TimeoutError), sleep=sleep)
    assert op.calls == 1 and sleep.slept == []


async def test_retry_by_result_returns_the_last_result_when_used_up() -> None:
    op, sleep = Script(1, 1, 1, 0), Sleeps()
    got = await retry_async(op, retries=2, first_delay_s=0.2, retry_if=lambda rc: rc != 0, sleep=sleep)
    assert got == 1 and op.calls == 3 and sleep.slept == [0.2, 0.4]
    op2 = Script(1, 0, 7)
    assert await retry_async(op2, retries=2, first_delay_s=0, retry_if=lambda rc: rc != 0, sleep=sleep) == 0
    assert op2.calls == 2


async def test_result_and_exception_conditions_together() -> None:
    op, sleep = Script(OSError(), 124, "done"), Sleeps()
    got = await retry_async(
        op, retries=2, first_delay_s=0.1, retry_on=OSError, retry_if=lambda r: r == 124, sleep=sleep
    )
    assert got == "done" and op.calls == 3 and sleep.slept == [0.1, 0.2]


async def test_no_retries_means_one_call_and_no_sleep() -> None:
    op, sleep = Script(OSError("x")), Sleeps()
    with pytest.raises(OSError):
        await retry_async(op, retries=0, first_delay_s=9.0, retry_on=OSError, sleep=sleep)
    assert op.calls == 1 and sleep.slept == []


async def test_default_sleep_is_asyncio_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    slept: list[float] = []

    async def fake(s: float) -> None:
        slept.append(s)

    monkeypatch.setattr(asyncio, "sleep", fake)
    op = Script(OSError(), "ok")
    assert await retry_async(op, retries=1, first_delay_s=0.25, retry_on=OSError) == "ok"
    assert slept == [0.25]


async def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="retries"):
        await retry_async(Script("x"), retries=-1, first_delay_s=0)
    with pytest.raises(ValueError, match="first_delay_s"):
        backoff_wait(-0.1)
    with pytest.raises(ValueError, match="growth"):
        backoff_wait(1.0, "cubic")  # type: ignore[arg-type]
