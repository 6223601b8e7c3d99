"""Kernel-log reader through ``journalctl -k -f`` (when ``/dev/kmsg`` cannot be read), resuming by cursor."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

__all__ = ["JournalctlFollower", "LineStream", "PopenLines"]

log = logging.getLogger(__name__)


class LineStream(Protocol):
    """A running line-producing process: ``read_available()`` returns the complete lines it
    printed since the last call without blocking; ``returncode`` is None while it runs."""

    @property
    def returncode(self) -> int | None: ...

    def read_available(self) -> list[str]: ...

    def close(self) -> None: ...


class PopenLines:
    """:class:`LineStream` over a real subprocess (stdout read by a daemon thread into a queue)."""

    def __init__(self, argv: list[str]) -> None:
        import queue
        import subprocess

        self._q: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._t = threading.Thread(target=self._pump, name="journalctl-reader", daemon=True)
        self._t.start()

    def _pump(self) -> None:
        assert self._p.stdout is not None
        with self._p.stdout:  # closed at EOF (the process ended), by the only thread reading it
            for line in self._p.stdout:
                self._q.put(line.rstrip("\n"))

    @property
    def returncode(self) -> int | None:
        return self._p.poll()

    def read_available(self) -> list[str]:
        out: list[str] = []
        while not self._q.empty():
            out.append(self._q.get_nowait())
        return out

    def close(self) -> None:
        if self._p.poll() is None:
            self._p.terminate()
            try:
                self._p.wait(timeout=2)
            except Exception:
                self._p.kill()


class JournalctlFollower:
    """Kernel log through ``journalctl -k -f`` when ``/dev/kmsg`` cannot be read (a container
    without CAP_SYSLOG but with the journal mounted, for example).

    ``output="short-iso-precise"`` (default): lines ``2025-02-14T05:03:42.123456+00:00 host
    kernel: NVRM: ...`` go to the kmsg parser as they are (ISO event time). ``output="json"``:
    each record becomes ``<ISO of __REALTIME_TIMESTAMP> <MESSAGE>`` (MESSAGE given as a string
    or as a byte array), and its ``__CURSOR`` is saved in ``state_path`` (when given) so a
    restart resumes with ``--after-cursor`` without loss or repeats. Starts at the end of the
    journal (``-n 0``) without a saved cursor. The process is started through ``runner``
    (argv list, no shell; :class:`PopenLines` by default) and restarted, with a warning, when
    it exits.
    """

    def __init__(
        self,
        runner: Callable[[list[str]], LineStream] = PopenLines,
        output: str = "short-iso-precise",
        state_path: Path | None = None,
        journalctl: str = "journalctl",
    ) -> None:
        if output not in ("short-iso-precise", "json"):
            raise ValueError("output is 'short-iso-precise' or 'json'")
        self.runner = runner
        self.output = output
        self.state_path = state_path
        self.journalctl = journalctl
        self.cursor: str | None = None
        self.restarts = 0
        self._stream: LineStream | None = None
        if state_path is not None and state_path.exists():
            self.cursor = state_path.read_text().strip() or None

    def argv(self) -> list[str]:
        """The command line: ``journalctl -k -f -o FORMAT --no-pager`` and ``-n 0`` or
        ``--after-cursor CURSOR``."""
        argv = [self.journalctl, "-k", "-f", "-o", self.output, "--no-pager"]
        return argv + (["--after-cursor", self.cursor] if self.cursor else ["-n", "0"])

    def read_new_lines(self) -> list[str]:
        if self._stream is None:
            self._stream = self.runner(self.argv())
        stream = self._stream
        raw = stream.read_available()
        if stream.returncode is not None:  # exited: read what it left, restart next call
            raw += stream.read_available()
            log.warning("journalctl exited with %s; restarting it", stream.returncode)
            stream.close()
            self._stream = None
            self.restarts += 1
        return self.accept(raw)

    def accept(self, raw: list[str]) -> list[str]:
        """Pure part of :meth:`read_new_lines`: journalctl output lines -> kernel-log lines."""
        if self.output != "json":
            return [ln for ln in raw if ln and not ln.startswith("-- ")]  # "-- No entries --", "-- Boot ..."
        out: list[str] = []
        for ln in raw:
            try:
                rec = json.loads(ln)
                msg = rec.get("MESSAGE")
                if isinstance(msg, list):  # non-UTF-8 messages come as byte arrays
                    msg = bytes(msg).decode("utf-8", errors="replace")
                usec = int(rec["__REALTIME_TIMESTAMP"])
            except (ValueError, KeyError, TypeError, AttributeError):
                log.debug("journalctl: not a JSON record: %r", ln[:200])
                continue
            if isinstance(msg, str):
                iso = datetime.fromtimestamp(usec / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
                out.extend(f"{iso} {part}" for part in msg.splitlines() or [""])
            self.cursor = rec.get("__CURSOR") or self.cursor
        if out and self.state_path is not None and self.cursor:
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(self.cursor)
            tmp.replace(self.state_path)
        return out

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
