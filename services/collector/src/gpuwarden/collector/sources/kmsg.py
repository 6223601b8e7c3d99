"""Kernel-log reader for ``/dev/kmsg`` (Linux >= 3.5 record format), resuming by sequence number."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from gpuwarden.shared.nvidia.kernel_log import split_kmsg_record

__all__ = ["KmsgReader"]

log = logging.getLogger(__name__)


class KmsgReader:
    """Read new records from ``/dev/kmsg`` (non-blocking), resuming by sequence number.

    Without a saved position it starts at the end of the ring buffer (a first start does not
    replay boot-time messages). With ``state_path`` it saves the last sequence number read
    (atomically, on every call that read something) and on restart reads the ring buffer from
    its start, skipping records up to that number, so nothing is lost or repeated across a
    restart; a gap (records overwritten while down) is logged with its size.
    ``boot_ts`` (epoch s of boot) lets the parser give records their event time
    (``boot_ts + usec``). Lines are returned as the raw records ``PRI,SEQ,USEC,FLAGS;TEXT``.

    Raises:
        PermissionError: the process may not read ``/dev/kmsg`` (needs CAP_SYSLOG or root
            when ``kernel.dmesg_restrict=1``).
    """

    def __init__(self, path: str = "/dev/kmsg", state_path: Path | None = None, boot_ts: float | None = None) -> None:
        self.path = path
        self.state_path = state_path
        self.boot_ts = boot_ts
        self._fd: int | None = None
        self.last_seq: int | None = None
        self.lost_records = 0
        if state_path is not None and state_path.exists():
            try:
                self.last_seq = int(state_path.read_text().strip())
            except ValueError:
                log.warning("kmsg state %s unreadable; starting at the end of the ring buffer", state_path)

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        if self.last_seq is None:
            os.lseek(fd, 0, os.SEEK_END)
        return fd

    def read_new_lines(self) -> list[str]:
        if self._fd is None:
            self._fd = self._open()
        recs = []
        while True:
            try:
                rec = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten records: skip on
                    continue
                raise
            if not rec:
                break
            recs.append(rec.decode("utf-8", errors="replace"))
        return self.accept(recs)

    def accept(self, records: list[str]) -> list[str]:
        """Pure part of :meth:`read_new_lines`: drop records at or below the last sequence
        number, count gaps, remember and save the new last sequence number. Returns the first
        line of each new record."""
        out = []
        for r in records:
            head = split_kmsg_record(r)
            if head is None:
                continue
            if self.last_seq is not None:
                if head.seq <= self.last_seq:
                    continue
                if head.seq > self.last_seq + 1:
                    gap = head.seq - self.last_seq - 1
                    self.lost_records += gap
                    log.warning("kmsg: %d records lost (overwritten) before seq %d", gap, head.seq)
            self.last_seq = head.seq
            out.append(r.split("\n", 1)[0])
        if out and self.state_path is not None:
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(str(self.last_seq))
            tmp.replace(self.state_path)
        return out

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
