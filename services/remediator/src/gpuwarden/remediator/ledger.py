"""The remediator's ledger file: history, breaker, drained nodes, open intents, recent actions."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.shared.models import Remediation

from .policy import History

__all__ = ["Ledger", "LedgerState"]

log = logging.getLogger(__name__)


@dataclass
class LedgerState:
    """What the ledger holds: the :class:`History` (None: the file has none), the recent
    decisions (as in ``/status``), ``breaker_reset_at`` (epoch s of the last
    ``reset-breaker --ledger``, 0 never) and the open intents."""

    history: History | None = None
    recent: list[dict[str, Any]] = field(default_factory=list)
    breaker_reset_at: float = 0.0
    intents: list[Remediation] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerState:
        """The state in a ledger file's content (``{}``: empty). An intent that does not
        validate is logged and left out.

        Raises:
            ValueError, KeyError, TypeError: the history or ``breaker_reset_at`` is malformed.
        """
        intents: list[Remediation] = []
        for raw in data.get("intents", []):
            try:
                intents.append(Remediation.model_validate(raw))
            except ValueError as exc:
                log.error("ignoring an unreadable intent in the ledger: %s", exc)
        return cls(
            history=History.from_json(data["history"]) if data.get("history") else None,
            recent=list(data.get("recent", [])),
            breaker_reset_at=float(data.get("breaker_reset_at") or 0.0),
            intents=intents,
        )

    def to_json(self, status: dict[str, Any]) -> dict[str, Any]:
        """The file's content, with the service's ``status`` and ``updated_at`` (now, epoch s)."""
        return {
            "history": self.history.to_json() if self.history is not None else {},
            "recent": list(self.recent),
            "status": status,
            "breaker_reset_at": self.breaker_reset_at,
            "intents": [r.model_dump(mode="json") for r in self.intents],
            "updated_at": time.time(),
        }


class Ledger:
    """The remediator's persisted state: a JSON file written atomically (tmp + rename).

    Holds the :class:`History`, the recent decisions and ``breaker_reset_at`` (set by
    ``gpuwarden remediator reset-breaker --ledger``; the running service picks it up)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        """The file's content (``{}`` if it does not exist).

        Raises:
            ValueError: the file is not a JSON object.
        """
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"ledger {self.path} is not a JSON object")
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Replace the file atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def breaker_reset_at(self) -> float:
        """When ``reset-breaker --ledger`` last asked to close the breaker, epoch s (0: never).

        Raises:
            OSError: the file cannot be read. ValueError: it is not a JSON object.
        """
        return float(self.read().get("breaker_reset_at") or 0.0)

    def request_breaker_reset(self, now: float) -> str | None:
        """Close the breaker in the file (and tell a running service); returns what it was."""
        data = self.read()
        hist = data.setdefault("history", {})
        was: str | None = hist.get("breaker_reason")
        hist["breaker_reason"] = None
        data["breaker_reset_at"] = now
        self.write(data)
        return was
