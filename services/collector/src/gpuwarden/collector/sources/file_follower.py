"""Kernel-log reader for a text file (``/var/log/kern.log``, a replay's ``kern.log``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FileFollower"]


class FileFollower:
    """Follow a text file like ``tail -f``: each call returns the complete lines appended since
    the last call. Starts at the beginning (``from_end=False``) or at the current end.
    A file that shrank (truncated or rotated) is read again from the start; a missing file
    reads as no lines."""

    def __init__(self, path: Path, from_end: bool = False) -> None:
        self.path = path
        self.offset = 0
        if from_end and path.exists():
            self.offset = path.stat().st_size

    def read_new_lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset = 0
        if size == self.offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:
            return []  # an incomplete line: wait for its newline
        self.offset += end + 1
        return data[: end + 1].decode("utf-8", errors="replace").splitlines()
