"""Node-scope condition signals, evaluated by the engine from the node's samples and health results.

``gpu-count-drop`` (a GPU vanished from the node's samples), ``silent`` (no sample from a node
that reported before while other nodes keep reporting), ``health-failed`` (a failed
prolog/epilog check on the ``health`` topic). They carry parameters only: the engine tracks
the node state they are judged on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import FrozenModel

__all__ = ["GpuCountDrop", "HealthFailed", "Silent"]


class GpuCountDrop(FrozenModel):
    type: Literal["gpu-count-drop"]


class Silent(FrozenModel):
    type: Literal["silent"]
    after_s: float = Field(30, gt=0, description="No sample this long while other nodes report, s")


class HealthFailed(FrozenModel):
    type: Literal["health-failed"]
