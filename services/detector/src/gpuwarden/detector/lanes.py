"""The detector's two consumer lanes, so an XID is never queued behind a sample backlog.

* **sample lane** (the service's consumer group): ``gpu.attributed`` and ``job.windows``, the
  high-volume topics (one message per node per tick, one per GPU per window).
* **event lane** (consumer group ``<group>-events``): ``gpu.events`` straight from the
  collectors, ``gpu.events.attributed`` from the correlator, and the small state topics the
  event rules need (``slurm.jobs``, ``slurm.nodes``, ``health``). A separate group has its own
  fetches and its own committed offsets: a backlog of samples, in the detector or anywhere
  upstream of it, never delays this lane. It is a few messages per second, so its consumer
  always sits at the end of its topics.

An event reaches the detector twice: raw on ``gpu.events`` (first: no correlator in the way;
the engine attributes it to a job from its own allocations, kept from ``slurm.jobs`` on the
same lane) and from the correlator on ``gpu.events.attributed``. The engine is idempotent per
``event_id`` (a second copy folds into the episode the first opened and emits nothing), so
the failure is the same whichever copy comes first.

Both lanes run in one event loop over one :class:`~gpuwarden.detector.engine.Detector`: no
locks, and the state the event rules read (allocations, GPU identities) is the same object.

With several detector workers, both lanes of one worker send their groups the same worker id and
the ``gpuwarden-affinity`` assignor (:mod:`gpuwarden.shared.bus.assignor`) gives each worker the
same partition numbers in both groups. The node-keyed topics keep one partition count
(:data:`~gpuwarden.shared.topics.COPARTITION_GROUPS`), so a node's samples, events, node states
and health checks reach one worker, and a job's windows and Slurm states another (or the same).
Each worker still sees only its share of ``slurm.jobs``: a raw event of a node whose job another
worker's partitions carry gets its job from the correlator's attributed copy
(:meth:`~gpuwarden.detector.engine.Detector.on_event` re-emits the failure with it).
"""

from __future__ import annotations

from gpuwarden.shared.models import AttributedEvent, GpuEvent
from gpuwarden.shared.settings import ServiceSettings

__all__ = ["EVENT_LANE", "SAMPLE_LANE", "as_attributed", "event_lane_group"]

#: Short topic names of the sample lane (the service's own consumer group).
SAMPLE_LANE = ("gpu.attributed", "job.windows")
#: Short topic names of the event lane (consumer group :func:`event_lane_group`).
EVENT_LANE = ("gpu.events", "gpu.events.attributed", "slurm.jobs", "slurm.nodes", "health")


def event_lane_group(settings: ServiceSettings, service: str = "detector") -> str:
    """The event lane's consumer group: the service's group (``GPUWARDEN_CONSUMER_GROUP``,
    default ``gpuwarden-<service>``) + ``-events``."""
    return f"{settings.consumer_group or f'gpuwarden-{service}'}-events"


def as_attributed(event: GpuEvent) -> AttributedEvent:
    """A raw ``gpu.events`` message as the engine's input, without a job (the engine attributes
    it from its own allocations: :meth:`~gpuwarden.detector.engine.Detector.on_event`)."""
    return AttributedEvent.model_construct(event=event, job=None, node_jobs=[])
