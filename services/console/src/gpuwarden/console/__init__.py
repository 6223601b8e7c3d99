"""gpuwarden console: a read-only web page of the fleet, its failures, remediations and job verdicts."""

from .state import ConsoleState

__all__ = ["ConsoleState"]
