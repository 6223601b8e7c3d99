"""Which kernel-log reader a node gets: :func:`open_kernel_log`."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from .base import LineReader
from .file_follower import FileFollower
from .journalctl import JournalctlFollower
from .kmsg import KmsgReader

__all__ = ["open_kernel_log"]

log = logging.getLogger(__name__)


def open_kernel_log(
    path: str,
    state_path: Path | None = None,
    boot_ts: float | None = None,
    journal: Callable[[], LineReader | None] | None = None,
) -> LineReader | None:
    """The kernel-log reader for ``path``: :class:`KmsgReader` for a ``/dev/...`` device that
    can be opened, else (permission denied, missing device) the ``journal`` fallback
    (default: :class:`JournalctlFollower` when ``journalctl`` is on PATH, else None, logged);
    any other path is a file followed from its end (:class:`FileFollower`)."""
    if not path.startswith("/dev/"):
        return FileFollower(Path(path), from_end=True)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        return KmsgReader(path, state_path=state_path, boot_ts=boot_ts)
    except OSError as exc:
        if journal is None:
            import shutil

            def journal() -> LineReader | None:
                return JournalctlFollower() if shutil.which("journalctl") else None

        reader = journal()
        if reader is None:
            log.error("cannot read %s (%s) and journalctl is not available: no kernel-log XIDs", path, exc)
        else:
            log.warning("cannot read %s (%s); following the kernel log with journalctl -k instead", path, exc)
        return reader
