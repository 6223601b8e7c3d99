"""The one retry helper of gpuwarden, on `tenacity <https://tenacity.readthedocs.io>`_.

Every retried operation (a Slurm read, a drain or resume, an alert delivery, a slurmrestd GET)
goes through :func:`retry_async`, so "retries" and "backoff" mean the same everywhere:

* ``retries`` is the number of attempts **after** the first (``retries=2``: at most 3 calls);
* the sleep before retry ``k`` (1-based) is ``first_delay_s * 2 ** (k - 1)`` (``exponential``:
  0.5, 1, 2 s for 0.5) or ``first_delay_s * k`` (``linear``: 0.5, 1, 1.5 s);
* an attempt is retried when it raised one of ``retry_on`` or returned a result for which
  ``retry_if`` is true; any other exception propagates at once, unretried;
* when the attempts are used up the last outcome stands: its exception is raised as it was
  (never wrapped in ``tenacity.RetryError``), or its result is returned for the caller to judge.

Retry at one layer only: a caller that retries an operation must not call something that
retries the same operation with the same setting (see the remediator's drain).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_result,
    retry_never,
    stop_after_attempt,
    wait_exponential,
    wait_incrementing,
)
from tenacity.retry import retry_base
from tenacity.wait import wait_base

__all__ = ["Growth", "backoff_wait", "retry_async"]

log = logging.getLogger(__name__)

T = TypeVar("T")

Growth = Literal["exponential", "linear"]
"""How the sleep grows between retries: ``exponential`` doubles it, ``linear`` adds the first one."""


def backoff_wait(first_delay_s: float, growth: Growth = "exponential") -> wait_base:
    """The tenacity wait strategy of :func:`retry_async`: ``first_delay_s`` (s) before the first
    retry, then doubling (``exponential``) or growing by ``first_delay_s`` (``linear``).

    Raises:
        ValueError: ``first_delay_s`` is negative, or ``growth`` is unknown.
    """
    if first_delay_s < 0:
        raise ValueError(f"first_delay_s must be >= 0 s, got {first_delay_s!r}")
    if growth == "exponential":
        return wait_exponential(multiplier=first_delay_s, exp_base=2, min=0)
    if growth == "linear":
        return wait_incrementing(start=first_delay_s, increment=first_delay_s)
    raise ValueError(f"unknown backoff growth {growth!r}: exponential or linear")


async def _asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)  # looked up at call time: tests may patch asyncio.sleep


async def retry_async(
    fn: Callable[[], Awaitable[T]],
    *,
    retries: int,
    first_delay_s: float,
    growth: Growth = "exponential",
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    retry_if: Callable[[T], bool] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> T:
    """Await ``fn()`` up to ``1 + retries`` times, sleeping between attempts (see the module).

    Args:
        fn: one attempt (a fresh awaitable per call).
        retries: attempts after the first, count (0: one attempt, no sleep).
        first_delay_s: sleep before the first retry, s.
        growth: ``exponential`` (doubling) or ``linear`` sleeps.
        retry_on: exception types that make an attempt retried (default: none).
        retry_if: a result for which this is true makes the attempt retried (default: none).
        sleep: the sleep function, s (default: :func:`asyncio.sleep`; tests pass a fake).

    Returns:
        The first result not retried, or the last result when the attempts are used up.

    Raises:
        ValueError: ``retries`` or ``first_delay_s`` is negative.
        BaseException: what ``fn`` raised, unchanged: at once when it is not in ``retry_on``,
            else after the last attempt.
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries!r}")
    retry: retry_base = retry_never
    if retry_on:
        retry = retry_if_exception_type(retry_on)
    if retry_if is not None:
        by_result = retry_if_result(retry_if)
        retry = by_result if retry is retry_never else retry | by_result

    def last_outcome(state: RetryCallState) -> T:
        assert state.outcome is not None
        return state.outcome.result()  # type: ignore[no-any-return]  # raises the last exception

    def note(state: RetryCallState) -> None:
        assert state.outcome is not None
        what = state.outcome.exception() or "a result to retry"
        delay = state.next_action.sleep if state.next_action else 0.0
        log.debug("attempt %d/%d: %s; retrying in %.2f s", state.attempt_number, retries + 1, what, delay)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(retries + 1),
        wait=backoff_wait(first_delay_s, growth),
        retry=retry,
        sleep=sleep or _asyncio_sleep,
        before_sleep=note,
        retry_error_callback=last_outcome,
        reraise=True,
    )

    async def attempt() -> T:  # a coroutine function, whatever fn is (a lambda returning a coroutine)
        return await fn()

    return await retrying(attempt)
