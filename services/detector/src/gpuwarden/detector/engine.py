# Over 500 lines: one class, Detector; every input handler reads and writes the same trackers,
# episodes and allocations (the rules themselves are data and live in conditions/ and catalog.yaml).
"""The detection engine: pure functions of the messages it is given (event time only).

:class:`Detector` turns attributed events into :class:`~gpuwarden.shared.models.Failure`
records using the catalog. Repeats of the same rule on the same node and GPU within the
rule's burst window fold into one episode (same ``failure_id``); an update is re-emitted
at most every ``update_interval_s`` of event time so a burst of 100 lines yields a handful
of messages, not 100.

A sample's jobs come from the correlator only (``AttributedSample.jobs``; one place
attributes samples): with ``attribution == "known"`` a GPU without an entry was held by no
job; with ``"unknown"`` (Slurm's view did not reach the sample's time) nothing is known about
who held the GPUs, so the job-dependent GPU rules (``conditions.JOB_DEPENDENT``:
``memory-without-job``) get no reading from it (:meth:`Tracker.interrupt`) while the
job-independent ones evaluate as usual, without a job.

Event attribution does not depend on arrival order: the detector keeps its own per-node GPU
allocations from ``slurm.jobs`` (event-time intervals). An event that arrives before its
job is known opens a failure without a job; when the job's state arrives later, the open
failure is re-emitted (same ``failure_id``) with the job, user, partition and cost. So a
replay at any speed ends with the same failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwarden.shared.allocations import (
    ACTIVE_STATES,
    PENDING_STATES,
    Allocation,
    apply_allocation,
    attributions_at,
    base_state,
    expire,
    fan_out,
)
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    EventKind,
    Evidence,
    Failure,
    FailureState,
    GpuAttribution,
    GpuEvent,
    GpuSample,
    HealthCheckResult,
    JobState,
    JobWindow,
    NodeState,
)

from . import snapshot as snapshot_format
from .catalog import Catalog, Rule
from .conditions import (
    JOB_DEPENDENT,
    ConditionRule,
    GpuCountDrop,
    HealthFailed,
    JobContext,
    NvlinkRate,
    Reading,
    RuleBase,
    Silent,
    Tracker,
    evaluate_job,
    gpu_evaluator,
)
from .pending import PendingStage
from .render import Finding, render

__all__ = ["Detector", "Episode"]

MAX_EVIDENCE = 20
IDLE_PARTITION_S = 300.0  # event time: a partition this far behind the newest counts as idle
#: event time a collector may stamp an event before the samples it publishes with it (one tick
#: of its kernel-log reader), s
EVENT_LANE_MARGIN_S = 2.0


#: A job's window start is evaluated with the windows it has once the job's newest node is this
#: many windows past it (a node that stopped reporting must not hold the job's rules forever).
WINDOW_LAG = 6


def _gpu_key(ev: GpuEvent) -> int | str | None:
    """Which GPU an event's episode and repeat history are kept under: its index, else its PCI bus
    id (a kernel log alone names GPUs by bus id only: two GPUs of one node stay apart, and the same
    GPU in two logs is one), else None (node-wide)."""
    if ev.gpu_index is not None:
        return ev.gpu_index
    if ev.pci_bus_id:
        bus = ev.pci_bus_id.lower()
        bus = bus.split(":", 1)[1] if bus.count(":") == 2 else bus
        return bus.removesuffix(".0")
    return None


@dataclass
class _GpuInfo:
    uuid: str | None = None
    pci_bus_id: str | None = None


@dataclass
class Episode:
    """One open failure: its rule, first event, what is known so far, and the emitted state."""

    rule: Rule
    first: GpuEvent
    job: GpuAttribution | None
    info: _GpuInfo | None
    last_seen: float
    occurrences: int = 1
    evidence: list[Evidence] = field(default_factory=list)
    last_emitted: float = 0.0
    failure: Failure | None = None
    seen: set[str] = field(default_factory=set)
    pending: bool = False  # folded updates not emitted yet


class Detector:
    """Stateful, deterministic rule engine.

    Args:
        catalog: the validated rules.
        price_usd_per_gpu_hour: cost model price, USD per GPU-hour.
        update_interval_s: minimum event-time gap between two emitted updates of one episode, s.
        allocation_retention_s: how long (event time) ended jobs stay known for late events, s.
    """

    def __init__(
        self,
        catalog: Catalog,
        price_usd_per_gpu_hour: float = 3.26,
        update_interval_s: float = 30.0,
        allocation_retention_s: float = 24 * 3600.0,
    ) -> None:
        self.catalog = catalog
        self.price = price_usd_per_gpu_hour
        self.update_interval_s = update_interval_s
        self.retention_s = allocation_retention_s
        self.episodes: dict[tuple[str, str, int | str | None], Episode] = {}
        self._gpus: dict[tuple[str, int], _GpuInfo] = {}
        self._allocs: dict[str, dict[str, Allocation]] = {}
        self._app_xids: dict[tuple[str, int | str], list[tuple[float, str]]] = {}
        self._conditions = {c.id: c for c in catalog.conditions}
        self._by_scope: dict[str, list[ConditionRule]] = {"gpu": [], "node": [], "job": []}
        for c in catalog.conditions:
            self._by_scope[c.scope].append(c)
        #: ids of the job-scope rules (``ConditionRule.scope`` is computed: too slow per reading).
        self._job_rules = frozenset(c.id for c in self._by_scope["job"])
        #: the GPU-scope rules with their evaluator, whether they compare with the last reading
        #: that carried NVLink counters and whether they depend on the GPU's job, resolved once
        #: (per GPU per sample they cost too much).
        self._gpu_rules = [
            (c, c.signal, gpu_evaluator(c.signal), isinstance(c.signal, NvlinkRate), type(c.signal) in JOB_DEPENDENT)
            for c in self._by_scope["gpu"]
        ]
        self._trackers: dict[tuple[str, str, int | None, str | None], Tracker] = {}
        self._prev: dict[tuple[str, int], tuple[float, GpuSample]] = {}
        #: the last reading of each GPU that carried NVLink counters (a collector may read them
        #: every Nth tick only: NVLink error rates are computed between those readings).
        self._prev_nvlink: dict[tuple[str, int], tuple[float, GpuSample]] = {}
        self._gpu_count_max: dict[str, int] = {}
        self._node_last: dict[str, float] = {}
        self._node_states: dict[str, NodeState] = {}
        self._watermark = 0.0
        self._silence_checked = 0.0
        self._part_watermarks: dict[int, float] = {}
        self._windows: dict[str, dict[float, dict[tuple[str, int], JobWindow]]] = {}
        #: job -> node -> newest window_start seen from that node (the job's window progress per node)
        self._window_marks: dict[str, dict[str, float]] = {}
        self._history: dict[str, list[list[JobWindow]]] = {}
        self._job_ctx: dict[str, JobContext] = {}
        self._job_starts: dict[str, float] = {}
        self.window_history = 30
        #: rule id -> its ``explain`` block: the pending-finding stage's rules (from the catalog)
        self._explain = catalog.explanations()
        #: every candidate failure leaves through this stage (:meth:`_release`)
        self._stage = PendingStage()
        #: the newest event time of any input (the stage's clock until a sample gives a watermark)
        self._input_high = 0.0
        #: how far the event lane has been read in event time (:meth:`event_lane_caught_up`); None:
        #: not tracked (one ordered stream: the in-process runner, ``analyze``)
        self._event_mark: float | None = None

    # -- inputs ----------------------------------------------------------------------
    def on_sample(self, msg: AttributedSample, partition: int | None = None) -> list[Failure]:
        """Condition rules of GPU and node scope on one sample; remembers GPU identities.

        A GPU's job is the correlator's attribution (``msg.jobs``) only, never this detector's
        allocation table. When ``msg.attribution`` is ``"unknown"`` the job-dependent rules
        (``memory-without-job``) take no reading from the sample: a pending streak restarts and
        an open failure neither resolves nor moves toward resolving (:meth:`Tracker.interrupt`);
        the other rules evaluate with no job.

        ``partition``: the Kafka partition the sample came from. The event-time watermark
        used for ``telemetry-silent`` is the minimum over partitions, so a consumer that
        reads one partition ahead of another never makes the lagging nodes look silent.
        """
        s = msg.sample
        node, ts = s.node, s.ts
        jobs = {a.gpu_index: a for a in msg.jobs}
        unknown = msg.attribution == "unknown"
        out: list[Failure] = []
        cond = self._cond
        for g in s.gpus:
            key = (node, g.index)
            info = self._gpus.get(key)
            if info is None or info.uuid != g.uuid or info.pci_bus_id != g.pci_bus_id:
                self._gpus[key] = _GpuInfo(g.uuid, g.pci_bus_id)
            prev = self._prev.get(key)
            p_prev, dt = (prev[1], ts - prev[0]) if prev else (None, 0.0)
            nv = self._prev_nvlink.get(key)
            p_nv, dt_nv = (nv[1], ts - nv[0]) if nv else (None, 0.0)
            job = jobs.get(g.index)
            has_job = job is not None
            for rule, sig, evaluate, nvlink, needs_job in self._gpu_rules:
                if needs_job and unknown:
                    self._interrupt(rule, node, g.index)
                    continue
                reading = evaluate(sig, g, p_nv, dt_nv, has_job) if nvlink else evaluate(sig, g, p_prev, dt, has_job)
                if reading is not None:
                    found = cond(rule, node, g.index, ts, reading, job, "gpu.attributed")
                    if found:
                        out += found
            self._prev[key] = (ts, g)
            if g.nvlinks is not None:
                self._prev_nvlink[key] = (ts, g)
        out += self._node_conditions(s.node, s.ts, len(s.gpus), partition)
        return self._release(out, ts)

    def on_node(self, state: NodeState) -> list[Failure]:
        """Remember Slurm's view of a node (a DOWN node is expected to be silent)."""
        self._node_states[state.node] = state
        return self._release([], state.ts)

    def on_health(self, h: HealthCheckResult) -> list[Failure]:
        """A failed prolog/epilog check is a ``health-check-failed`` condition on its node (and GPU)."""
        out: list[Failure] = []
        for rule in self._by_scope["node"]:
            if isinstance(rule.signal, HealthFailed):
                reading = Reading(
                    not h.passed, f"health_check:{h.check}", h.detail[:200] or str(h.passed), None, "pass"
                )
                job = GpuAttribution(gpu_index=h.gpu_index or 0, job_id=h.job_id) if h.job_id else None
                out += self._cond(rule, h.node, h.gpu_index, h.ts, reading, job, f"health/{h.phase}")
        return self._release(out, h.ts)

    def on_window(self, w: JobWindow) -> list[Failure]:
        """Job-scope condition rules over one window start of a job, once it is complete: all
        the job's GPUs reported it, or every node of the job has reported a newer window, or
        the newest node is :data:`WINDOW_LAG` windows past it (a node that stopped reporting).

        Readiness depends on the windows' event times, not on the order in which nodes'
        windows arrive: windows of a job's nodes come from different correlator partitions and
        can arrive a few windows apart (a replay at 50x releases a node's held samples in bulk).
        """
        groups = self._windows.setdefault(w.job_id, {})
        group = groups.setdefault(w.window_start, {})
        group[(w.node, w.gpu_index)] = w
        marks = self.__dict__.setdefault("_window_marks", {}).setdefault(w.job_id, {})
        # how many nodes have each newest window start: low/high without a scan of every node
        # (a 3,125-node job would make every window O(nodes))
        tally = self.__dict__.setdefault("_window_tally", {}).setdefault(w.job_id, {})
        if marks and not tally:  # marks restored from a state saved before the tally existed
            for start in marks.values():
                tally[start] = tally.get(start, 0) + 1
        old = marks.get(w.node)
        if old is None or w.window_start > old:
            marks[w.node] = w.window_start
            tally[w.window_start] = tally.get(w.window_start, 0) + 1
            if old is not None:
                if tally[old] <= 1:
                    del tally[old]
                else:
                    tally[old] -= 1
        low, high = min(tally), max(tally)
        lag = WINDOW_LAG * max(w.window_end - w.window_start, 1e-9)
        ready = [
            start
            for start in sorted(groups)
            if start < low or start <= high - lag or (w.job_gpus is not None and len(groups[start]) >= w.job_gpus)
        ]
        out: list[Failure] = []
        for start in ready:
            windows = sorted(groups.pop(start).values(), key=lambda x: (x.node, x.gpu_index))
            history = self._history.setdefault(w.job_id, [])
            first = windows[0]
            ctx = self._job_ctx.get(w.job_id)
            if ctx is None:
                ctx = self._job_ctx[w.job_id] = JobContext(self._job_starts.get(w.job_id, first.window_start))
            ctx.observe(windows)
            for rule in self._by_scope["job"]:
                for node, gpu, reading in evaluate_job(rule.signal, windows, history, ctx):
                    src = next((x for x in windows if x.node == node and (gpu is None or x.gpu_index == gpu)), first)
                    job = GpuAttribution(
                        gpu_index=src.gpu_index,
                        job_id=src.job_id,
                        user=src.user,
                        partition=src.partition,
                        job_gpus=src.job_gpus,
                    )
                    out += self._cond(rule, node, gpu, src.window_end, reading, job, "job.windows")
            history.append(windows)
            del history[: -self.window_history]
        return self._release(out, w.window_end)

    def on_job(self, job: JobState) -> list[Failure]:
        """Update the allocation table; re-emit open failures this job now explains."""
        nodes = set()
        if job.start_ts is not None and base_state(job.state) in ACTIVE_STATES:
            self._job_starts[job.job_id] = job.start_ts
            if job.job_id in self._job_ctx:
                self._job_ctx[job.job_id].start_ts = job.start_ts
        for a in fan_out(job):
            held = apply_allocation(self._allocs.get(a.node, {}), a, keep_gpuless=True)
            self._allocs[a.node] = expire(held, job.ts, self.retention_s)
            nodes.add(a.node)
        out = []
        if base_state(job.state) not in ACTIVE_STATES | PENDING_STATES:
            out += self._job_ended(job)
        for ep in self.episodes.values():
            if ep.job is None and ep.first.node in nodes and ep.first.gpu_index is not None:
                ep.job = self._job_at(ep.first.node, ep.first.gpu_index, ep.first.ts)
                if ep.job is not None:
                    out.append(self._emit(ep))
        return self._release(out, job.ts)

    def on_event(self, msg: AttributedEvent) -> list[Failure]:
        """Failures opened or updated by one event (empty if no rule matches or in a quiet burst).

        A secondary XID that names its cause (``caused_by_xid``) is folded into the cause's
        open failure on the same GPU instead of opening one of its own.
        """
        return self._release(self._on_event(msg), msg.event.ts)

    def _on_event(self, msg: AttributedEvent) -> list[Failure]:
        ev = msg.event
        rule = self.catalog.for_event(ev.kind.value, ev.code, ev.fatal, ev.message or ev.raw)
        if rule is None:
            return []
        evidence = Evidence(
            signal=ev.kind.value,
            value=ev.code if ev.code is not None else ev.message,
            unit="code",
            threshold=None,
            ts=ev.ts,
            source=ev.raw[:500],
        )
        if ev.caused_by_xid is not None:
            cause = self.catalog.for_event(ev.kind.value, ev.caused_by_xid)
            ep = self.episodes.get((cause.id, ev.node, _gpu_key(ev))) if cause else None
            if ep is not None and 0 <= ev.ts - ep.last_seen <= ep.rule.burst_window_s:
                return self._fold(ep, ev, evidence)
        job = msg.job
        if job is None and ev.gpu_index is not None:
            job = self._job_at(ev.node, ev.gpu_index, ev.ts)
        if job is None and ev.gpu_index is None:
            job = self._node_job(ev.node, ev.ts)
        out = self._observe(rule, ev, job, evidence)
        for rr in self.catalog.repeat_rules(ev.code):
            out.extend(self._repeat(rr, ev, job, evidence))
        return out

    def _observe(self, rule: Rule, ev: GpuEvent, job: GpuAttribution | None, evidence: Evidence) -> list[Failure]:
        key = (rule.id, ev.node, _gpu_key(ev))
        ep = self.episodes.get(key)
        if ep is not None and ev.ts < ep.first.ts:
            return []  # older than the open episode: a late duplicate of history already reported
        if ep is not None and ev.ts - ep.last_seen <= rule.burst_window_s:
            return self._fold(ep, ev, evidence)
        info = self._gpus.get((ev.node, ev.gpu_index)) if ev.gpu_index is not None else None
        ep = Episode(rule=rule, first=ev, job=job, info=info, last_seen=ev.ts, evidence=[evidence])
        self.episodes[key] = ep
        return [self._emit(ep)]

    def _fold(self, ep: Episode, ev: GpuEvent, evidence: Evidence) -> list[Failure]:
        """Count ``ev`` into an open episode; re-emit at most every ``update_interval_s``."""
        if ev.event_id == ep.first.event_id or ev.event_id in ep.seen:
            return []  # redelivery
        ep.seen.add(ev.event_id)
        ep.occurrences += 1
        ep.last_seen = max(ep.last_seen, ev.ts)
        if len(ep.evidence) < MAX_EVIDENCE:
            ep.evidence.append(evidence)
        if ev.ts - ep.last_emitted >= self.update_interval_s:
            return [self._emit(ep)]
        ep.pending = True
        return []

    def adopt(self, f: Failure) -> bool:
        """Take back an open failure of an event rule that this detector published before it lost
        its state (read back from ``failures`` at start: the state file was empty, damaged or
        missing): its episode is open again under the same ``failure_id``, so the next matching
        event within the rule's burst window folds into it instead of opening a second failure
        for the same episode, and its later update or resolve is one its consumers know.

        Returns True when adopted; False for a resolved failure, a rule this catalog does not
        have or that is not an event rule, or an episode this detector already has.
        """
        if f.state is not FailureState.OPEN:
            return False
        rule = next((r for r in self.catalog.rules if r.id == f.rule_id), None)
        if rule is None or rule.match.event not in ("xid", "sxid"):
            return False
        code = next((e.value for e in f.evidence if e.signal == rule.match.event and isinstance(e.value, int)), None)
        raw = next((e.source for e in f.evidence if e.signal == rule.match.event), "")
        first = GpuEvent(
            event_id=f"adopted-{f.failure_id}",
            node=f.node,
            ts=f.first_seen,
            kind=EventKind(rule.match.event),
            code=code if code is not None else (rule.match.codes[0] if rule.match.codes else None),
            gpu_index=f.gpu_index,
            pci_bus_id=f.pci_bus_id,
            gpu_uuid=f.gpu_uuid,
            raw=raw[:4096],
            source="failures",
        )
        key = (rule.id, f.node, _gpu_key(first))
        if key in self.episodes:
            return False
        job = (
            GpuAttribution(gpu_index=f.gpu_index, job_id=f.job_id, user=f.user, partition=f.partition)
            if f.job_id is not None and f.gpu_index is not None
            else None
        )
        info = self._gpus.get((f.node, f.gpu_index)) if f.gpu_index is not None else None
        self.episodes[key] = Episode(
            rule=rule,
            first=first,
            job=job,
            info=info,
            last_seen=f.last_seen,
            occurrences=f.occurrences,
            evidence=list(f.evidence[:MAX_EVIDENCE]),
            last_emitted=f.last_seen,
            failure=f,
        )
        self._stage.latest[f.failure_id] = f
        self._stage.published[f.failure_id] = f.last_seen
        return True

    def flush(self) -> list[Failure]:
        """The end of a finite stream (a recording, a scenario): the latest version of every
        episode with updates held back by ``update_interval_s``, and every candidate the
        pending stage still holds, decided now."""
        out = [self._emit(ep) for ep in self.episodes.values() if ep.pending]
        return self._stage.release(out, self._stage.clock, self._explain, self, final=True)

    # -- the pending-finding stage (.pending) ------------------------------------------------
    def _release(self, candidates: list[Failure], ts: float) -> list[Failure]:
        """Every path out of the engine: candidates through the pending-finding stage, on the
        event-time watermark (the sample partitions' minimum; before any sample, the newest
        input time)."""
        if ts > self._input_high:
            self._input_high = ts
        clock = self._watermark if self._part_watermarks else self._input_high
        if self._event_mark is not None:
            clock = min(clock, self._event_mark)
        if not candidates and (not self._stage.held or clock <= self._stage.clock):
            return candidates  # the hot path: nothing new, nothing due
        return self._stage.release(candidates, clock, self._explain, self)

    def track_event_lane(self) -> None:
        """Events reach this detector on a lane of their own (the service): from now on the pending
        stage's clock is the lower of the sample watermark and the event lane's mark, so a candidate
        is never decided before the events of its window have been read (at 50x one fetch of
        samples spans more event time than a window)."""
        if self._event_mark is None:
            self._event_mark = 0.0

    def event_lane_caught_up(self, margin_s: float = EVENT_LANE_MARGIN_S) -> list[Failure]:
        """The event lane has read its topics to their end: every event a collector published
        with the samples read so far is in, up to the sample watermark less ``margin_s`` (a
        collector reads the kernel log once per tick, s). Returns what the stage releases now."""
        mark = self._watermark - margin_s
        if self._event_mark is None or mark <= self._event_mark:
            return []
        self._event_mark = mark
        return self._release([], 0.0)

    def gpus_in_job(self, node: str, job_id: str | None) -> int:
        """GPUs of ``job_id`` on ``node`` from Slurm's allocations (the node's GPU count when the
        job or its GPU list is unknown), >= 1."""
        for a in self._allocs.get(node, {}).values():
            if job_id is not None and a.job_id == job_id and a.gpus:
                return len(a.gpus)
        return max(1, self._gpu_count_max.get(node, 1))

    def aggregate(self, members: list[Failure], state: FailureState) -> Failure:
        """One node-level failure for GPU findings of one rule, node and job: ``gpu_index``
        None, the GPUs named in the verdict and the evidence, cost over all of them, first seen
        the earliest member's."""
        first = min(members, key=lambda m: (m.first_seen, m.gpu_index or 0))
        rule = self._conditions.get(first.rule_id) or next(r for r in self.catalog.rules if r.id == first.rule_id)
        gpus = sorted({m.gpu_index for m in members if m.gpu_index is not None})
        evidence = [
            Evidence(
                signal="gpus",
                value=",".join(map(str, gpus)),
                unit=None,
                threshold=None,
                ts=first.first_seen,
                source=f"{len(gpus)} GPUs of {first.node}",
            ),
            *[e for m in members for e in m.evidence[:1]],
        ][:MAX_EVIDENCE]
        job = (
            GpuAttribution(
                gpu_index=gpus[0] if gpus else 0, job_id=first.job_id, user=first.user, partition=first.partition
            )
            if first.job_id
            else None
        )
        last = first.evidence[-1] if first.evidence else None
        message = f"GPUs {','.join(map(str, gpus))}" + (
            f": {last.signal}={last.value}{' ' + last.unit if last.unit else ''}" if last else ""
        )
        finding = Finding(
            node=first.node,
            gpu_index=None,
            first_seen=first.first_seen,
            last_seen=max(m.last_seen for m in members),
            occurrences=sum(m.occurrences for m in members),
            evidence=evidence,
            job=job,
            message=message,
            state=state,
            gpus=gpus,
        )
        return render(rule, finding, self.price, rule.cost.scope)

    def _repeat(self, rule: Rule, ev: GpuEvent, job: GpuAttribution | None, evidence: Evidence) -> list[Failure]:
        """Application XIDs recurring on one GPU under several jobs: the GPU, not the code."""
        gkey = _gpu_key(ev)
        if job is None or gkey is None or rule.match.window_s is None or rule.match.jobs is None:
            return []
        hist = self._app_xids.setdefault((ev.node, gkey), [])
        hist.append((ev.ts, job.job_id))
        window = rule.match.window_s
        hist[:] = [(t, j) for t, j in hist if ev.ts - t <= window]
        jobs = sorted({j for _, j in hist})
        if len(jobs) < rule.match.jobs:
            return []
        note = ev.model_copy(update={"message": f"XIDs {sorted(rule.match.codes)} under jobs {', '.join(jobs)}"})
        return self._observe(rule, note, job, evidence)

    # -- helpers ---------------------------------------------------------------------
    def _node_conditions(self, node: str, ts: float, gpu_count: int, partition: int | None) -> list[Failure]:
        out: list[Failure] = []
        self._gpu_count_max[node] = max(self._gpu_count_max.get(node, 0), gpu_count)
        self._node_last[node] = max(self._node_last.get(node, 0.0), ts)
        key = -1 if partition is None else partition
        self._part_watermarks[key] = max(self._part_watermarks.get(key, 0.0), ts)
        newest = max(self._part_watermarks.values())
        # a partition far behind the others is idle (all its nodes silent), not lagging
        self._watermark = min(w for w in self._part_watermarks.values() if newest - w <= IDLE_PARTITION_S)
        advanced = self._watermark >= self._silence_checked + 1.0  # check silence once per event-time second
        if advanced:
            self._silence_checked = self._watermark
        for rule in self._by_scope["node"]:
            sig = rule.signal
            if isinstance(sig, GpuCountDrop):
                mx = self._gpu_count_max[node]
                drop = gpu_count < mx
                out += self._cond(
                    rule,
                    node,
                    None,
                    ts,
                    Reading(drop, "gpu_count", gpu_count, "GPUs", mx),
                    self._node_job(node, ts) if drop else None,
                    "gpu.attributed",
                )
            elif isinstance(sig, Silent):
                out += self._cond(
                    rule,
                    node,
                    None,
                    ts,
                    Reading(False, "seconds_since_sample", 0.0, "s", sig.after_s),
                    None,
                    "gpu.attributed",
                )
                if advanced:
                    for other, last in sorted(self._node_last.items()):
                        gap = self._watermark - last
                        if other == node or gap < sig.after_s or self._down(other):
                            continue
                        reading = Reading(True, "seconds_since_sample", gap, "s", sig.after_s)
                        out += self._cond(rule, other, None, self._watermark, reading, None, "gpu.attributed")
        return out

    def _down(self, node: str) -> bool:
        st = self._node_states.get(node)
        return st is not None and (st.state.upper().startswith(("DOWN", "POWER")) or "POWERED_DOWN" in st.flags)

    def _job_ended(self, job: JobState) -> list[Failure]:
        """A job that ended resolves its job-scope conditions (nothing left to be idle or slow)."""
        out: list[Failure] = []
        end = job.end_ts if job.end_ts is not None else job.ts
        self._windows.pop(job.job_id, None)
        self.__dict__.get("_window_marks", {}).pop(job.job_id, None)
        self.__dict__.get("_window_tally", {}).pop(job.job_id, None)
        self._history.pop(job.job_id, None)
        self._job_ctx.pop(job.job_id, None)
        self._job_starts.pop(job.job_id, None)
        for key, tr in list(self._trackers.items()):
            rule_id, node, gpu, job_id = key
            if job_id != job.job_id or not tr.opened:
                continue
            rule = self._conditions[rule_id]
            tr.opened, tr.last_seen = False, max(tr.last_seen, end)
            out.append(
                self._render_condition(
                    rule,
                    node,
                    gpu,
                    tr,
                    FailureState.RESOLVED,
                    GpuAttribution(gpu_index=gpu or 0, job_id=job.job_id, user=job.user, partition=job.partition),
                )
            )
            del self._trackers[key]
        return out

    def _cond(
        self,
        rule: ConditionRule,
        node: str,
        gpu: int | None,
        ts: float,
        reading: Reading,
        job: GpuAttribution | None,
        source: str,
    ) -> list[Failure]:
        key = (rule.id, node, gpu, job.job_id if job and rule.id in self._job_rules else None)
        tr = self._trackers.get(key)
        if tr is None:
            if not reading.unhealthy:
                return []
            tr = self._trackers[key] = Tracker()
        what = tr.step(rule, ts, reading, source)
        if not tr.opened and tr.bad_since is None:
            del self._trackers[key]
        if what is None or (what == "update" and ts - tr.last_emitted < self.update_interval_s):
            return []
        tr.last_emitted = ts
        state = FailureState.RESOLVED if what == "resolved" else FailureState.OPEN
        return [self._render_condition(rule, node, gpu, tr, state, job)]

    def _interrupt(self, rule: ConditionRule, node: str, gpu: int | None) -> None:
        """No judged reading of ``rule`` on this GPU now (see :meth:`Tracker.interrupt`)."""
        key = (rule.id, node, gpu, None)
        tr = self._trackers.get(key)
        if tr is None:
            return
        tr.interrupt()
        if not tr.opened and tr.bad_since is None:
            del self._trackers[key]

    def _render_condition(
        self,
        rule: ConditionRule,
        node: str,
        gpu: int | None,
        tr: Tracker,
        state: FailureState,
        job: GpuAttribution | None,
    ) -> Failure:
        info = self._gpus.get((node, gpu)) if gpu is not None else None
        last = tr.evidence[-1] if tr.evidence else None
        finding = Finding(
            node=node,
            gpu_index=gpu,
            first_seen=tr.first_seen,
            last_seen=tr.last_seen,
            occurrences=max(1, tr.occurrences),
            evidence=tr.evidence,
            job=job,
            gpu_uuid=info.uuid if info else None,
            pci_bus_id=info.pci_bus_id if info else None,
            message=f"{last.signal}={last.value}{' ' + last.unit if last and last.unit else ''}" if last else "",
            state=state,
        )
        return render(rule, finding, self.price, rule.cost.scope)

    def _node_job(self, node: str, ts: float) -> GpuAttribution | None:
        """The job on ``node`` at ``ts`` when there is exactly one (a node-wide event, or one
        whose GPU is unknown, is that job's); None when there is none or several. Jobs with
        known GPUs come first; a job whose GPU indices Slurm did not give (a kernel log alone
        in ``analyze``, a GRES without indices) counts only when no job with GPUs holds the node."""
        held = [a for a in self._allocs.get(node, {}).values() if a.covers(ts)]
        held = [a for a in held if a.gpus] or held
        if len({a.job_id for a in held}) != 1:
            return None
        a = held[0]
        return a.attribution(a.gpus[0] if a.gpus else 0)

    def _job_at(self, node: str, gpu: int, ts: float) -> GpuAttribution | None:
        found = attributions_at(self._allocs.get(node, {}), ts, [gpu])
        return found[0] if found else None

    def _emit(self, ep: Episode) -> Failure:
        ep.last_emitted = ep.last_seen
        ep.pending = False
        ep.failure = self._render(ep)
        return ep.failure

    def _render(self, ep: Episode) -> Failure:
        ev, info = ep.first, ep.info
        finding = Finding(
            node=ev.node,
            gpu_index=ev.gpu_index,
            first_seen=ev.ts,
            last_seen=ep.last_seen,
            occurrences=ep.occurrences,
            evidence=ep.evidence,
            job=ep.job,
            gpu_uuid=ev.gpu_uuid or (info.uuid if info else None),
            pci_bus_id=ev.pci_bus_id or (info.pci_bus_id if info else None),
            code=ev.code,
            message=ev.message,
        )
        return render(ep.rule, finding, self.price, ep.rule.cost.scope)

    # -- state that survives a restart (issue 13) ------------------------------------------
    _NOT_STATE = frozenset(
        {
            "catalog",
            "_conditions",
            "_by_scope",
            "_job_rules",
            "_gpu_rules",
            "_explain",
            "price",
            "update_interval_s",
            "retention_s",
        }
    )

    def _rule_ids(self) -> list[str]:
        return sorted(self._conditions) + sorted(r.id for r in self.catalog.rules)

    def _rules_by_id(self) -> dict[str, Any]:
        return {r.id: r for r in self.catalog.rules} | self._conditions

    def snapshot(self) -> bytes:
        """The detector's state — condition trackers, open episodes, GPU identities,
        allocations, watermarks, job windows — as JSON bytes for :meth:`restore`, in the format
        of :mod:`gpuwarden.detector.snapshot` (tagged JSON with a version and the catalog's rule
        ids; the catalog and settings themselves are not in it: a rule is written by its id)."""
        state = {k: v for k, v in vars(self).items() if k not in self._NOT_STATE}
        rules = self._rules_by_id()

        def rule_id(obj: Any) -> str | None:
            rid = getattr(obj, "id", None) if isinstance(obj, RuleBase) else None
            return rid if isinstance(rid, str) and rules.get(rid) is obj else None

        return snapshot_format.dumps(self._rule_ids(), state, rule_id)

    def restore(self, data: bytes) -> None:
        """Replace this detector's state by a :meth:`snapshot`.

        Raises:
            ValueError: not a snapshot of this format and version (an older pickle included), a
                damaged one, one that names a class outside the state classes, or one taken with a
                different catalog (other rule ids); the state is left unchanged then.
        """
        ids, state = snapshot_format.loads(data, self._rules_by_id())
        if ids != self._rule_ids():
            raise ValueError("detector snapshot was taken with a different catalog (rule ids differ)")
        # state only: nothing that would replace the catalog, the settings or a method
        bad = [k for k in state if k in self._NOT_STATE or hasattr(type(self), k) or not k.isidentifier()]
        if bad:
            raise ValueError(f"detector snapshot holds attributes that are not state: {sorted(bad)[:5]}")
        vars(self).update(state)
