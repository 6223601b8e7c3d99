"""Rate-limited logging of the Kafka client: while a broker is unreachable aiokafka logs every
reconnect attempt (tens of MB a minute); this keeps one line per message kind and interval."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["KAFKA_LOGGERS", "RateLimitFilter", "limit_kafka_logging"]

#: Logger name prefixes whose repeated lines are limited (aiokafka and its submodules).
KAFKA_LOGGERS = ("aiokafka", "kafka")


class RateLimitFilter(logging.Filter):
    """Let through at most one record per (logger, message template) every ``interval_s``
    seconds for loggers named with one of ``prefixes`` and for any record logged with
    ``extra={"rate_limited": True}`` (a per-record line under bad input: a dead letter, a
    handler error); others pass untouched. The next one that passes says how many were
    suppressed in between, so a flood of bad records costs one line per kind and interval."""

    def __init__(
        self,
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        prefixes: tuple[str, ...] = KAFKA_LOGGERS,
    ) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}
        self.suppressed_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name.startswith(self.prefixes) or getattr(record, "rate_limited", False)):
            return True
        key = (record.name, str(record.msg))
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            self.suppressed_total += 1
            return False
        self._last[key] = now
        n = self._suppressed.pop(key, 0)
        if n:
            record.msg = f"{record.msg} [{n} similar line(s) suppressed in the last {self.interval_s:g}s]"
        return True


def limit_kafka_logging(interval_s: float = 30.0) -> RateLimitFilter:
    """Install one :class:`RateLimitFilter` on every handler of the root logger (replacing an
    earlier one), so the Kafka client's lines from any of its modules are limited; returns it."""
    flt = RateLimitFilter(interval_s)
    for h in logging.getLogger().handlers:
        for old in [f for f in h.filters if isinstance(f, RateLimitFilter)]:
            h.removeFilter(old)
        h.addFilter(flt)
    return flt
