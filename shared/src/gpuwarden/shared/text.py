"""Text that reaches people: node names, reasons and driver messages made safe for one line of a
log, an alert, a console cell or a Markdown report (issue 25).

The input contract already refuses control characters in identifiers; free text (a driver's
message, a drain reason someone typed into ``scontrol``) can still carry them. Everything shown
goes through :func:`one_line` (or :func:`markdown` for Markdown): control characters (``\\n``,
``\\r``, ``\\x1b`` escape sequences, NUL...) and the bidirectional overrides/isolates that reorder
what a reader sees ("Trojan Source") are written as visible ``\\uXXXX`` escapes, so a name with a
newline cannot forge a log line and a right-to-left mark cannot disguise a node name. HTML is
escaped by the console itself (it sets ``textContent``, never ``innerHTML``).
"""

from __future__ import annotations

import logging
import re
import unicodedata

__all__ = ["BIDI_CONTROLS", "SafeFormatter", "markdown", "one_line"]

#: Bidirectional formatting characters (Unicode TR #9): embeddings, overrides, isolates, marks.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~])")


def _escape(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def one_line(text: object, max_chars: int = 1000) -> str:
    """``text`` as one safe line: control characters (category Cc, including newlines and ESC),
    bidirectional controls, line/paragraph separators and other format characters (Cf, e.g.
    zero-width joiners) written as ``\\xNN``/``\\uNNNN``; cut to ``max_chars`` with ``…``.
    Printable text (any script, emoji) is kept as it is."""
    s = str(text)
    out = []
    for ch in s:
        if (
            ch in BIDI_CONTROLS
            or (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0)
            or (ord(ch) >= 0xA0 and unicodedata.category(ch) in ("Cf", "Zl", "Zp", "Cs", "Co", "Cn"))
        ):
            out.append(_escape(ch))
        else:
            out.append(ch)
    line = "".join(out)
    return line if len(line) <= max_chars else line[: max_chars - 1] + "…"


def markdown(text: object, max_chars: int = 1000) -> str:
    """``text`` for inline Markdown (a table cell or a sentence): :func:`one_line`, then the
    Markdown/HTML metacharacters ``\\ ` * _ [ ] < > # | ~`` backslash-escaped, so a name can
    neither close a table cell, open a link, image or inline HTML, nor format itself."""
    return _MD_SPECIAL.sub(r"\\\1", one_line(text, max_chars))


class SafeFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose message part is :func:`one_line` (the traceback, when
    there is one, keeps its own lines): one log record is one line, whatever the data in it."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message, 4000)
        return super().formatMessage(record)
