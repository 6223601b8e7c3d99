"""The detector service: attributed events and samples, job windows, Slurm state and health
check results -> ``failures``; and the job verdicts (:mod:`.jobreport`) -> ``job.reports``."""

from __future__ import annotations

import logging
import re
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from gpuwarden.shared.bus import Producer
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    Failure,
    GpuEvent,
    HealthCheckResult,
    JobReport,
    JobState,
    JobWindow,
    NodeState,
    dumps,
)
from gpuwarden.shared.service import Service

from .catalog import load_catalog
from .engine import Detector
from .jobreport import JobReporter
from .lanes import EVENT_LANE, SAMPLE_LANE, as_attributed, event_lane_group
from .settings import DetectorSettings
from .state import DetectorDurability

__all__ = ["DetectorService", "DetectorSettings", "admin_comment_argv"]

log = logging.getLogger(__name__)
_JOB_ID = re.compile(r"^[0-9]+(?:[_+][0-9]+)?$")


def admin_comment_argv(job_id: str, summary: str, scontrol: str = "scontrol") -> list[str]:
    """``scontrol update JobId=ID AdminComment=...`` as an argv list (no shell).

    Raises:
        ValueError: a job id that is not ``N``, ``N_M`` or ``N+M``.
    """
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    text = " ".join(summary.split())[:250]
    return [scontrol, "update", f"JobId={job_id}", f"AdminComment={text}"]


class DetectorService(Service):
    name = "detector"

    def __init__(self, settings: DetectorSettings, producer: Producer | None = None) -> None:
        super().__init__(settings, producer)
        self.detector = Detector(
            load_catalog(settings.detector_catalog),
            settings.detector_price_usd_per_gpu_hour,
            settings.detector_update_interval_s,
        )
        self.failures_out = 0
        self.m_unknown_samples = Counter(
            "gpuwarden_detector_unknown_samples",
            "gpu.attributed samples whose job attribution was unknown (job-dependent rules took no reading), count",
            registry=self.metrics.registry,
        )
        self.m_late_windows = Counter(
            "gpuwarden_detector_late_job_windows",
            "job.windows records that came after their job's window start was evaluated (the job rules went "
            "without them), count",
            registry=self.metrics.registry,
        )
        self.durable = DetectorDurability(self.detector, settings)  # event-time bounds, state file
        self.reports = JobReporter(settings.detector_price_usd_per_gpu_hour)
        self.reports_out = 0
        self._report_interval_s = settings.detector_report_interval_s
        self._admin_comment = settings.detector_report_admin_comment
        self.http.extra_routes += [
            web.get("/jobs", self._jobs_view),
            web.get("/jobs/{job_id}/report", self._report_view),
            web.post("/jobs/{job_id}/report", self._report_view),
        ]

    async def on_start(self) -> None:
        # a state file that was empty, damaged or missing: its open episodes come back from `failures`
        await self.durable.adopt_published(self.settings, self.durable.settings.detector_adopt_lookback_s)
        # Two lanes (.lanes): events and Slurm state never wait behind a sample backlog.
        # the sample lane batches its fetches (up to 100 ms): XIDs are in the event lane
        self.durable.attach(self.consume(list(SAMPLE_LANE), self.handle, fetch_min_bytes=256 * 1024))
        events = self.consume(list(EVENT_LANE), self.handle, group=event_lane_group(self.settings, self.name))
        self.durable.attach(events)
        # the pending stage decides a candidate only once the event lane has read past its window
        self.detector.track_event_lane()
        events.on_caught_up = self._events_caught_up

    async def handle(self, topic: str, value: Any, _record: Any = None) -> None:
        """Apply the engine to one decoded message and publish what it yields.

        Raises:
            ValueError: the record's event time is out of bounds (dead-lettered by the consumer).
        """
        self.durable.check_time(topic, value)
        if isinstance(value, GpuEvent):  # the event lane's raw copy (.lanes)
            out = self.detector.on_event(as_attributed(value), raw=True)
        elif isinstance(value, AttributedEvent):
            out = self.detector.on_event(value)
        elif isinstance(value, AttributedSample):
            if value.attribution == "unknown":
                self.m_unknown_samples.inc()
            out = self.detector.on_sample(value, getattr(_record, "partition", None))
        elif isinstance(value, JobState):
            out = self.detector.on_job(value)
            for rep in self.reports.observe(value):
                await self.publish_report(rep)
        elif isinstance(value, JobWindow):
            late = self.detector.late_windows
            out = self.detector.on_window(value)
            if self.detector.late_windows > late:
                self.m_late_windows.inc(self.detector.late_windows - late)
            self.reports.observe(value)
        elif isinstance(value, NodeState):
            out = self.detector.on_node(value)
        elif isinstance(value, HealthCheckResult):
            out = self.detector.on_health(value)
        else:  # pragma: no cover - the consumer only delivers registered models
            raise TypeError(f"unexpected {type(value).__name__} on {topic}")
        for f in out:
            await self.emit(f)
        if isinstance(value, JobWindow) and (due := self.reports.due(value.job_id, self._report_interval_s)):
            await self.publish_report(due)

    async def _events_caught_up(self) -> None:
        for f in self.detector.event_lane_caught_up():
            await self.emit(f)

    async def emit(self, failure: Failure) -> None:
        await self.publish("failures", failure.node, failure)
        await self.producer.flush()  # failures are rare and latency matters: deliver now
        self.failures_out += 1
        if failure.job_id:
            self.reports.observe(failure)
            # the verdict changes with every failure of the job: publish it now
            if (rep := self.reports.mark(failure.job_id)) is not None:
                await self.publish_report(rep)

    async def publish_report(self, report: JobReport) -> None:
        """Publish a report on ``job.reports`` (keyed by job id); a final one goes to the job's
        AdminComment too when ``GPUWARDEN_DETECTOR_REPORT_ADMIN_COMMENT`` is on."""
        await self.publish("job.reports", report.job_id, report)
        self.reports_out += 1
        if report.final and self._admin_comment:
            from gpuwarden.shared.command import AsyncSubprocessRunner, CommandNotFound, CommandTimeout

            try:
                argv = admin_comment_argv(report.job_id, report.summary)
                res = await AsyncSubprocessRunner().run(argv, 30.0)
            except (ValueError, CommandNotFound, CommandTimeout) as exc:
                log.warning("no AdminComment for job %s: %s", report.job_id, exc)
                return
            if not res.ok:
                log.warning("AdminComment of job %s not written: %s", report.job_id, res.output(300))

    async def _jobs_view(self, _: web.Request) -> web.Response:
        return web.json_response({"jobs": self.reports.jobs()})

    async def _report_view(self, request: web.Request) -> web.Response:
        """GET: the job's report now; POST: the same, also published on ``job.reports``."""
        job_id = request.match_info["job_id"]
        rep = self.reports.report(job_id)
        if rep is None:
            return web.json_response({"error": f"no data for job {job_id}"}, status=404)
        if request.method == "POST":
            await self.publish_report(rep)
            await self.producer.flush()
        return web.Response(body=dumps(rep), content_type="application/json")
