"""The job verdict: where a job's allocated GPU-hours went, why, and what it cost.

:func:`build_job_report` is pure: a job's Slurm state, its ``job.windows`` (10 s summaries per
node and GPU, from the correlator) and its failures in, a :class:`~gpuwarden.shared.models.JobReport`
out. Every GPU of the job, from the job's start to its end (or the last window while it runs),
falls into exactly one share of the breakdown, so the shares add up to the allocated GPU-hours:

* ``lost-to-failure``: from the onset of a failure that costs the job its work (a GPU that fell
  off the bus, an uncorrectable memory error, a hung GSP, a failed health check: severity critical
  or fatal with a drain, reset, reboot, RMA or restart action) to the job's end or requeue, on
  the GPUs the failure's cost covers (every GPU of the job for a job-scope rule);
* ``hung``: windows inside a ``collective-hang`` episode;
* ``checkpoint-stall``: inside a ``checkpoint-stall`` episode, windows where every GPU pauses, or
  where a minority writes (below 30 %) while the others spin at low power in a collective;
* ``idle``: windows where every GPU of the job is idle (busiest reading at most 5 %);
* ``partially-idle``: a GPU idle while another GPU of the job works;
* ``straggler-wait``: inside a ``straggler-gpu``/``straggler-node`` episode, ``1 - r`` of every
  busy window, where ``r`` is the straggler's metric (the failure's: SM clock, else power) over the
  median of the other GPUs in the same window: a synchronous job runs at its slowest GPU's pace;
* ``input-wait``: inside an ``input-starvation`` episode, the idle share (``1 - util/100``) of a
  busy window;
* ``busy``: the rest of the windows;
* ``no-telemetry``: allocated time no window covers (or a window without utilisation).

:class:`JobReporter` keeps what it needs per job (compact columns, not the messages) and builds
reports on demand, when a job ends or is requeued, and when one is due. A running job's report
ends no earlier than the end of the window holding its latest failure (a report is never taken
before a failure it counts); a failure's report waits for the windows up to there, so it is the
same however late they arrive (:mod:`.reporter`). The verdict names the GPUs and time ranges of
each waste category and gives advice that fits the cause (:mod:`.verdict`).

Modules: :mod:`.model` (the failure classes and thresholds the breakdown uses, a GPU's windows
as columns), :mod:`.breakdown` (the span and the per-window cost attribution),
:mod:`.verdict` (rounding to GPU-hours and USD, findings, the words and recommendations),
:mod:`.reporter` (the per-job accumulator).
"""

from __future__ import annotations

from .breakdown import build_job_report
from .model import IDLE_MAX_UTIL_PCT, REQUEUE_STATES, is_loss, side_of
from .reporter import JobReporter, job_report_rows

__all__ = [
    "IDLE_MAX_UTIL_PCT",
    "REQUEUE_STATES",
    "JobReporter",
    "build_job_report",
    "is_loss",
    "job_report_rows",
    "side_of",
]
