"""A fixture for tests that run faust agents under ``test_context()``.

faust's aiokafka consumer runs in a ``mode.threads.ServiceThread`` that creates an event
loop of its own and closes it only when the thread stops. Under ``test_context()`` the
thread never starts, so its loop (and the loop's self-pipe sockets) would be left for the
garbage collector, which reports ``ResourceWarning: unclosed event loop`` in whatever test
runs next. The fixture closes the loops such threads created during the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["close_faust_thread_loops"]


@pytest.fixture
def close_faust_thread_loops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Yield the ``ServiceThread``s created during the test; close their own loops after it."""
    from mode.threads import ServiceThread

    made: list[Any] = []
    original = ServiceThread.__init__

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ServiceThread, "__init__", record)
    yield made
    for thread in made:
        loop = thread.thread_loop
        if thread._close_thread_loop_on_stop and not loop.is_running() and not loop.is_closed():
            loop.close()
