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

The state is split by what owns it: :mod:`.episodes` (the event rules' open episodes and the
repeat-offender history), :mod:`.jobwindows` (job windows until complete, job history and
start times), :mod:`.pending` (candidates held until their explanation window closed), and
this module (the inputs, the GPU- and node-scope condition trackers, Slurm's allocations, GPU
identities and the event-time watermarks). :meth:`Detector.snapshot` writes all of it
(:mod:`.snapshot`).
"""

from __future__ import annotations

from typing import Any

import hostlist

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
from gpuwarden.shared.eventtime import LIVE_ROUNDS, InputProgress
from gpuwarden.shared.models import (
    AttributedEvent,
    AttributedSample,
    Evidence,
    Failure,
    FailureState,
    GpuAttribution,
    GpuSample,
    HealthCheckResult,
    JobState,
    JobWindow,
    NodeState,
    stable_id,
)

from . import snapshot as snapshot_format
from .catalog import Catalog
from .conditions import (
    JOB_DEPENDENT,
    ConditionRule,
    GpuCountDrop,
    HealthFailed,
    NvlinkRate,
    Reading,
    RuleBase,
    Silent,
    Tracker,
    gpu_evaluator,
)
from .episodes import MAX_EVIDENCE, Episode, EventEpisodes, GpuInfo
from .jobwindows import JobWindows
from .pending import PendingStage
from .render import Finding, render

__all__ = ["Detector", "Episode"]

#: event time, s: a sample partition this far behind the newest that has also been quiet (below)
#: counts as idle (all its nodes silent), not lagging: the watermark goes on without it
IDLE_PARTITION_S = 300.0
#: event time a collector may stamp an event before the samples it publishes with it (one tick
#: of its kernel-log reader), s
EVENT_LANE_MARGIN_S = 2.0


class Detector(EventEpisodes, JobWindows):
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
        self._init_episodes()  # .episodes: the event rules' open episodes
        self._init_job_windows()  # .jobwindows: job windows waiting to be complete, job history
        self._gpus: dict[tuple[str, int], GpuInfo] = {}
        self._allocs: dict[str, dict[str, Allocation]] = {}
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
        #: (node, gpu) -> how many trackers of ``_trackers`` it has (derived, not state: rebuilt by
        #: :meth:`restore`). A healthy reading of a GPU with none changes nothing, so the sample
        #: loop skips :meth:`_cond` for it (most GPUs, most of the time).
        self._tracked: dict[tuple[str, int | None], int] = {}
        self._prev: dict[tuple[str, int], tuple[float, GpuSample]] = {}
        #: the last reading of each GPU that carried NVLink counters (a collector may read them
        #: every Nth tick only: NVLink error rates are computed between those readings).
        self._prev_nvlink: dict[tuple[str, int], tuple[float, GpuSample]] = {}
        self._gpu_count_max: dict[str, int] = {}
        self._node_last: dict[str, float] = {}
        self._node_states: dict[str, NodeState] = {}
        self._watermark = 0.0
        self._silence_checked = 0.0
        #: gpu.samples partition (-1: one ordered stream) -> its event-time progress over its nodes
        self._parts: dict[int, InputProgress] = {}
        #: partition -> :attr:`_arrivals` at its newest record; node -> its partition
        self._part_arrival: dict[int, int] = {}
        self._node_part: dict[str, int] = {}
        #: samples read, over every partition (the clock of a partition's quiet, in records)
        self._arrivals = 0
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
        reads one partition ahead of another never makes the lagging nodes look silent. A
        partition's progress is robust to a node whose clock is wrong
        (:class:`~gpuwarden.shared.eventtime.InputProgress`); a partition far behind the newest
        (:data:`IDLE_PARTITION_S`) is left out of the minimum only once it has also been quiet
        (no sample of it while LIVE_ROUNDS x the nodes known came): all its nodes stopped,
        rather than one node's clock ran ahead of it. A node still sending is never
        ``telemetry-silent``, whatever its clock says.
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
                self._gpus[key] = GpuInfo(g.uuid, g.pci_bus_id)
            prev = self._prev.get(key)
            p_prev, dt = (prev[1], ts - prev[0]) if prev else (None, 0.0)
            nv = self._prev_nvlink.get(key)
            p_nv, dt_nv = (nv[1], ts - nv[0]) if nv else (None, 0.0)
            job = jobs.get(g.index)
            has_job = job is not None
            tracked = (node, g.index) in self._tracked
            for rule, sig, evaluate, nvlink, needs_job in self._gpu_rules:
                if needs_job and unknown:
                    if tracked:
                        self._interrupt(rule, node, g.index)
                    continue
                # a GPU with no tracker needs only the unhealthy readings (full=tracked)
                if nvlink:
                    reading = evaluate(sig, g, p_nv, dt_nv, has_job, tracked)
                else:
                    reading = evaluate(sig, g, p_prev, dt, has_job, tracked)
                if reading is not None and (tracked or reading.unhealthy):
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
        """Job-scope condition rules over one window start of a job, once it is complete
        (:meth:`~gpuwarden.detector.jobwindows.JobWindows._on_window`)."""
        return self._release(self._on_window(w), w.window_end)

    def on_job(self, job: JobState) -> list[Failure]:
        """Update the allocation table; re-emit open failures this job now explains."""
        nodes = set()
        if base_state(job.state) in ACTIVE_STATES:
            self._job_started(job)
        for a in fan_out(job):
            held = apply_allocation(self._allocs.get(a.node, {}), a, keep_gpuless=True)
            self._allocs[a.node] = expire(held, job.ts, self.retention_s)
            nodes.add(a.node)
        out = []
        if base_state(job.state) not in ACTIVE_STATES | PENDING_STATES:
            out += self._job_ended(job)
        out += self._reattribute(nodes)
        return self._release(out, job.ts)

    def on_event(self, msg: AttributedEvent, *, raw: bool = False) -> list[Failure]:
        """Failures opened or updated by one event (empty if no rule matches or in a quiet burst).

        A secondary XID that names its cause (``caused_by_xid``) is folded into the cause's
        open failure on the same GPU instead of opening one of its own. ``raw``: the event
        lane's raw ``gpu.events`` copy (:func:`~gpuwarden.detector.lanes.as_attributed`), which
        this detector attributes from its own allocations for the moment; only the correlator's
        copy (``gpu.events.attributed``) counts toward ``repeat-offender-gpu``.
        """
        return self._release(self._on_event(msg, raw), msg.event.ts)

    def flush(self) -> list[Failure]:
        """The end of a finite stream (a recording, a scenario): the latest version of every
        episode with updates held back by ``update_interval_s``, every job window start still
        waiting for a silent node evaluated (:meth:`flush_job_windows`), and every candidate the
        pending stage still holds, decided now."""
        out = self.flush_job_windows()
        out += [self._emit(ep) for ep in self.episodes.values() if ep.pending]
        return self._stage.release(out, self._stage.clock, self._explain, self, final=True)

    # -- the pending-finding stage (.pending) ------------------------------------------------
    def _release(self, candidates: list[Failure], ts: float) -> list[Failure]:
        """Every path out of the engine: candidates through the pending-finding stage, on the
        event-time watermark (the sample partitions' minimum; before any sample, the newest
        input time)."""
        if ts > self._input_high:
            self._input_high = ts
        clock = self._watermark if self._parts else self._input_high
        if self._event_mark is not None:
            clock = min(clock, self._event_mark)
        ending = self.__dict__.get("ending")
        if ending and min(ending.values()) <= clock:  # an ended job's starts waited long enough
            candidates = candidates + self.ended_jobs_due(clock)
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

    def job_start(self, job_id: str | None) -> float | None:
        """When ``job_id`` started: Slurm's start, else its first window (the start-up's origin
        the job-window rules use), epoch s; None when unknown."""
        if job_id is None:
            return None
        ctx = self._job_ctx.get(job_id)
        if ctx is not None and ctx.start_ts is not None:
            return ctx.start_ts
        return self._job_starts.get(job_id)

    def aggregate(self, members: list[Failure], state: FailureState, scope: str = "node") -> Failure:
        """One node-level failure for GPU findings of one rule, node and job: ``gpu_index``
        None, the GPUs named in the verdict and the evidence, cost over all of them, first seen
        the earliest member's. ``scope="job"``: GPU findings of one rule and job on several
        nodes (:meth:`aggregate_job`)."""
        if scope == "job":
            return self.aggregate_job(members, state)
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
        head = f"GPUs {','.join(map(str, gpus))}"
        finding = _group_finding(first, members, state, first.node, gpus[0] if gpus else 0, head, evidence, gpus)
        return render(rule, finding, self.price, rule.cost.scope)

    def aggregate_job(self, members: list[Failure], state: FailureState) -> Failure:
        """One job-level failure for GPU findings of one rule and job on several nodes: ``node``
        the first of them (sorted), ``gpu_index`` None, the nodes as a Slurm hostlist in the
        verdict, one evidence entry per node with its GPUs, cost over every member GPU, id
        ``stable_id(rule, "job", job id, first seen)``."""
        first = min(members, key=lambda m: (m.first_seen, m.node, m.gpu_index or 0))
        rule = self._conditions.get(first.rule_id) or next(r for r in self.catalog.rules if r.id == first.rule_id)
        by_node: dict[str, set[int]] = {}
        for m in members:
            by_node.setdefault(m.node, set()).update([m.gpu_index] if m.gpu_index is not None else [])
        nodes = sorted(by_node)
        where = hostlist.collect_hostlist(nodes)
        n_gpus = sum(len(g) for g in by_node.values())
        shapes = {tuple(sorted(g)) for g in by_node.values()}
        evidence = [
            Evidence(
                signal="nodes",
                value=where,
                unit=None,
                threshold=None,
                ts=first.first_seen,
                source=f"{len(nodes)} nodes, {n_gpus} GPUs of job {first.job_id}",
            ),
            *[
                Evidence(
                    signal="gpus",
                    value=",".join(map(str, sorted(by_node[n]))),
                    unit=None,
                    threshold=None,
                    ts=first.first_seen,
                    source=n,
                )
                for n in nodes
            ],
            *[e for m in members for e in m.evidence[:1]],
        ][:MAX_EVIDENCE]
        # the same GPUs on every node: named; else every index that idles somewhere
        gpus = sorted({g for s in by_node.values() for g in s}) if len(shapes) > 1 else sorted(next(iter(shapes)))
        head = f"{n_gpus} GPUs on {len(nodes)} nodes"
        finding = _group_finding(first, members, state, where, min(by_node[first.node] or {0}), head, evidence, gpus)
        f = render(rule, finding, self.price, rule.cost.scope)
        affected = f.cost.affected_gpus if rule.cost.scope == "job" else n_gpus
        hours = max(0.0, f.last_seen - f.first_seen) / 3600.0
        cost = f.cost.model_copy(
            update={
                "affected_gpus": affected,
                "usd_per_hour": round(affected * self.price, 4),
                "gpu_hours_lost": round(affected * hours, 6),
            }
        )
        fid = stable_id(rule.id, "job", first.job_id, first.first_seen)
        return f.model_copy(update={"node": nodes[0], "failure_id": fid, "cost": cost})

    # -- helpers ---------------------------------------------------------------------
    def _node_conditions(self, node: str, ts: float, gpu_count: int, partition: int | None) -> list[Failure]:
        out: list[Failure] = []
        self._gpu_count_max[node] = max(self._gpu_count_max.get(node, 0), gpu_count)
        self._node_last[node] = max(self._node_last.get(node, 0.0), ts)
        key = -1 if partition is None else partition
        prog = self._parts.get(key)
        if prog is None:
            prog = self._parts[key] = InputProgress()
        prog.observe(node, ts)
        if self._node_part.get(node) != key:
            self._node_part[node] = key
        self._arrivals += 1
        self._part_arrival[key] = self._arrivals
        if len(self._parts) == 1:
            self._watermark = prog.value
        else:
            newest = max(p.value for p in self._parts.values())
            self._watermark = min(p.value for k, p in self._parts.items() if not self._idle(k, newest))
        advanced = self._watermark >= self._silence_checked + 1.0  # check silence once per event-time second
        if advanced:
            self._silence_checked = self._watermark
        # a node with no tracker of a node rule needs only the unhealthy readings (as its GPUs)
        tracked = (node, None) in self._tracked
        for rule in self._by_scope["node"]:
            sig = rule.signal
            if isinstance(sig, GpuCountDrop):
                mx = self._gpu_count_max[node]
                drop = gpu_count < mx
                if not drop and not tracked:
                    continue
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
                if tracked:  # it sends: a silence of it ends
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
                    newest = max(p.value for p in self._parts.values())
                    for other, last in sorted(self._node_last.items()):
                        gap = self._watermark - last
                        if other == node or gap < sig.after_s or self._down(other) or self._sending(other, newest):
                            continue
                        reading = Reading(True, "seconds_since_sample", gap, "s", sig.after_s)
                        out += self._cond(rule, other, None, self._watermark, reading, None, "gpu.attributed")
        return out

    def _idle(self, part: int, newest: float) -> bool:
        """Whether sample partition ``part`` is idle: :data:`IDLE_PARTITION_S` behind ``newest``
        and quiet (none of the last LIVE_ROUNDS x (nodes known) samples is of it).

        Quiet is counted in samples, so it adds nothing where a partition is idle: 300 s of the
        others are far more samples. Where one node's clock runs ahead, it keeps the others in.
        Not airtight: a fetch that hands over more than 3 x (nodes) samples of the skewed
        node's partition before the others' (a backlog read at high speed) can leave them out
        until their next sample."""
        p = self._parts[part]
        if newest - p.value <= IDLE_PARTITION_S:
            return False
        return self._arrivals - self._part_arrival[part] > LIVE_ROUNDS * len(self._node_part)

    def _sending(self, node: str, newest: float) -> bool:
        """Whether ``node`` is still sending: one of its partition's latest samples is its own
        (:meth:`InputProgress.live`) and the partition is not idle (``newest``: the newest
        partition's progress, event time s)."""
        part = self._node_part.get(node, None)
        if part is None or not self._parts[part].live(node):
            return False
        return not self._idle(part, newest)

    def _down(self, node: str) -> bool:
        st = self._node_states.get(node)
        return st is not None and (st.state.upper().startswith(("DOWN", "POWER")) or "POWERED_DOWN" in st.flags)

    def _job_ended(self, job: JobState) -> list[Failure]:
        """A job that ended resolves its job-scope conditions (nothing left to be idle or slow)."""
        out: list[Failure] = []
        end = job.end_ts if job.end_ts is not None else job.ts
        self._forget_job(job.job_id, end)
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
            self._untrack(key)
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
            gpu_key = (node, gpu)
            self._tracked[gpu_key] = self._tracked.get(gpu_key, 0) + 1
        what = tr.step(rule, ts, reading, source)
        if not tr.opened and tr.bad_since is None:
            self._untrack(key)
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
            self._untrack(key)

    def _untrack(self, key: tuple[str, str, int | None, str | None]) -> None:
        """Forget the tracker of ``key`` (rule id, node, GPU, job id) and count it off its GPU."""
        del self._trackers[key]
        gpu_key = (key[1], key[2])
        left = self._tracked.get(gpu_key, 0) - 1
        if left > 0:
            self._tracked[gpu_key] = left
        else:
            self._tracked.pop(gpu_key, None)

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

    # -- state that survives a restart (issue 13) ------------------------------------------
    _NOT_STATE = frozenset(
        {
            "catalog",
            "_conditions",
            "_by_scope",
            "_job_rules",
            "_gpu_rules",
            "_tracked",
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
        self._tracked = {}
        for _rule_id, node, gpu, _job_id in self._trackers:
            self._tracked[(node, gpu)] = self._tracked.get((node, gpu), 0) + 1


def _group_finding(
    first: Failure,
    members: list[Failure],
    state: FailureState,
    where: str,
    job_gpu: int,
    head: str,
    evidence: list[Evidence],
    gpus: list[int],
) -> Finding:
    """The :class:`Finding` of a node- or job-level failure made of ``members`` (``first`` the
    earliest): on ``where`` (a node, or a hostlist), the job as ``first`` names it (on GPU
    ``job_gpu``), the message ``head`` and ``first``'s last reading, spans and counts over all."""
    job = (
        GpuAttribution(gpu_index=job_gpu, job_id=first.job_id, user=first.user, partition=first.partition)
        if first.job_id
        else None
    )
    last = first.evidence[-1] if first.evidence else None
    message = head + (f": {last.signal}={last.value}{' ' + last.unit if last.unit else ''}" if last else "")
    return Finding(
        node=where,
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
