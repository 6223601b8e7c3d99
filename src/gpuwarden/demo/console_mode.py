"""``gpuwarden demo --console``: the web console on the run's broker, kept up until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

__all__ = ["hold_until_interrupt", "start_console"]


async def start_console(p: Any, port: int = 0) -> Any:
    """Start the console service in this process, reading the topics of pipeline ``p``
    (its broker and prefix), on 127.0.0.1:``port`` (0: a free one). Returns the service;
    its page is ``http://127.0.0.1:{svc.http.port}/``.

    Raises:
        aiokafka.errors.KafkaError: the broker is unreachable.
    """
    from gpuwarden.console.service import ConsoleService, ConsoleSettings

    svc = ConsoleService(
        ConsoleSettings(bootstrap_servers=p.bootstrap, topic_prefix=p.prefix, http_host="127.0.0.1", http_port=port)
    )
    await svc.start()
    return svc


async def hold_until_interrupt(p: Any, on_tick: Callable[[], None]) -> None:
    """Keep reading the pipeline (``p.poll()``) until SIGINT (Ctrl-C) or SIGTERM; the services
    and the console stay up meanwhile. Returns normally, so the caller stops and reports."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            await p.poll()
            on_tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
