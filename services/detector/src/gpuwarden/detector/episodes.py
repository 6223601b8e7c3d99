"""Event episodes of the detector: XIDs, SXIDs and other kernel-log events matched by the
catalog's event rules, folded per (rule, node, GPU) into one open failure for as long as the
rule's burst window keeps it going, plus the repeat-offender history of application XIDs.

State (in the detector's snapshot): ``episodes`` and ``_app_xids``. Mixed into
:class:`~gpuwarden.detector.engine.Detector`, which owns the inputs, the allocations, the GPU
identities and the pending-finding stage these methods use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuwarden.shared.models import (
    MAX_GPUS_PER_NODE,
    AttributedEvent,
    EventKind,
    Evidence,
    Failure,
    FailureState,
    GpuAttribution,
    GpuEvent,
)

from .catalog import Catalog, Rule
from .render import Finding, render

if TYPE_CHECKING:
    from .pending import PendingStage

__all__ = ["MAX_APP_XIDS", "MAX_EVIDENCE", "AppXid", "Episode", "EventEpisodes", "GpuInfo"]

#: evidence entries kept per failure
MAX_EVIDENCE = 20
#: application XIDs kept per GPU for the repeat rules: past it, the oldest XID of the job with the
#: most goes, so a storm under one job cannot push the other jobs out (~1 KB each, the event's raw
#: line capped at 500 characters)
MAX_APP_XIDS = 256


def _gpu_key(ev: GpuEvent) -> int | str | None:
    """Which GPU an event's episode and repeat history are kept under: its index, else its PCI bus
    id (a kernel log alone names GPUs by bus id only: two GPUs of one node stay apart, and the same
    GPU in two logs is one), else None (node-wide)."""
    if ev.gpu_index is not None:
        return ev.gpu_index
    if ev.pci_bus_id:
        return _bus_key(ev.pci_bus_id)
    return None


def _bus_key(pci_bus_id: str) -> str:
    """A PCI bus id without its domain and function 0, lower-case (``0000:18:00.0``,
    ``00000000:18:00.0`` and ``18:00`` are one GPU)."""
    bus = pci_bus_id.lower()
    bus = bus.split(":", 1)[1] if bus.count(":") == 2 else bus
    return bus.removesuffix(".0")


@dataclass
class GpuInfo:
    """A GPU's identity as its samples last gave it."""

    uuid: str | None = None
    pci_bus_id: str | None = None


@dataclass
class AppXid:
    """One application XID in a GPU's repeat history, under the job the correlator gave it.
    ``event``/``job``: None only for an entry read from a state file written before they were
    kept (it still counts its job, but cannot be the XID a finding opens at)."""

    ts: float
    job_id: str
    event: GpuEvent | None = None
    job: GpuAttribution | None = None


def _evidence(ev: GpuEvent) -> Evidence:
    """An event's evidence entry: its code (else message) and its raw line."""
    return Evidence(
        signal=ev.kind.value,
        value=ev.code if ev.code is not None else ev.message,
        unit="code",
        threshold=None,
        ts=ev.ts,
        source=ev.raw[:500],
    )


@dataclass
class Episode:
    """One open failure: its rule, first event, what is known so far, and the emitted state."""

    rule: Rule
    first: GpuEvent
    job: GpuAttribution | None
    info: GpuInfo | None
    last_seen: float
    occurrences: int = 1
    evidence: list[Evidence] = field(default_factory=list)
    last_emitted: float = 0.0
    failure: Failure | None = None
    seen: set[str] = field(default_factory=set)
    pending: bool = False  # folded updates not emitted yet


class EventEpisodes:
    """The event rules' part of the detector (a mixin of :class:`~gpuwarden.detector.engine.Detector`)."""

    episodes: dict[tuple[str, str, int | str | None], Episode]
    #: (node, GPU key) -> event id -> recent application XID under the correlator's job (repeat offenders)
    _app_xids: dict[tuple[str, int | str], dict[str, AppXid]]
    catalog: Catalog
    price: float
    update_interval_s: float
    _gpus: dict[tuple[str, int], GpuInfo]
    _stage: PendingStage

    if TYPE_CHECKING:

        def _job_at(self, node: str, gpu: int, ts: float) -> GpuAttribution | None: ...

        def _node_job(self, node: str, ts: float) -> GpuAttribution | None: ...

    def _init_episodes(self) -> None:
        self.episodes = {}
        self._app_xids = {}

    def _index_by_bus(self, msg: AttributedEvent) -> AttributedEvent:
        """The event with the GPU index (and UUID) of its PCI bus id, as the node's samples gave
        them, when the event names the bus only. A collector restarted after a GPU fell off the
        bus cannot enumerate that GPU any more and reads the XID from the kernel log by bus id
        alone; this detector still knows which index the bus was (from the samples, else from an
        open episode of that bus, e.g. one adopted from ``failures`` after a restart)."""
        ev = msg.event
        if ev.gpu_index is not None or not ev.pci_bus_id:
            return msg
        bus = _bus_key(ev.pci_bus_id)
        found: tuple[int, str | None] | None = None
        for index in range(MAX_GPUS_PER_NODE):  # the node's GPUs: at most 64 lookups, not a scan of all
            info = self._gpus.get((ev.node, index))
            if info is not None and info.pci_bus_id and _bus_key(info.pci_bus_id) == bus:
                found = (index, info.uuid)
                break
        if found is None:  # no sample of the bus yet (a restart without state): an open episode of it
            for ep in self.episodes.values():
                first = ep.first
                same_node = first.node == ev.node and first.gpu_index is not None
                if same_node and first.pci_bus_id and _bus_key(first.pci_bus_id) == bus:
                    found = (first.gpu_index, first.gpu_uuid)  # type: ignore[assignment]
                    break
        if found is None:
            return msg
        event = ev.model_copy(update={"gpu_index": found[0], "gpu_uuid": ev.gpu_uuid or found[1]})
        return msg.model_copy(update={"event": event})

    def _on_event(self, msg: AttributedEvent, raw: bool = False) -> list[Failure]:
        """``raw``: ``msg`` is the event lane's raw copy (no job of the correlator's): its episode
        takes this detector's own view of the job for now, and the repeat history waits for the
        correlator's copy."""
        msg = self._index_by_bus(msg)
        ev = msg.event
        rule = self.catalog.for_event(ev.kind.value, ev.code, ev.fatal, ev.message or ev.raw)
        if rule is None:
            return []
        evidence = _evidence(ev)
        if ev.caused_by_xid is not None:
            cause = self.catalog.for_event(ev.kind.value, ev.caused_by_xid)
            ep = self.episodes.get((cause.id, ev.node, _gpu_key(ev))) if cause else None
            if ep is not None and 0 <= ev.ts - ep.last_seen <= ep.rule.burst_window_s:
                return self._fold(ep, ev, evidence)
        job = msg.job
        taken = self._take_attribution(rule, ev, job) if job is not None else None
        if taken is not None:
            out = taken
        else:
            if job is None and ev.gpu_index is not None:
                job = self._job_at(ev.node, ev.gpu_index, ev.ts)
            if job is None and ev.gpu_index is None:
                job = self._node_job(ev.node, ev.ts)
            out = self._observe(rule, ev, job, evidence)
        if not raw:
            # a GPU known by its bus id only counts under the node's one job, found above (the
            # correlator's copy names no GPU's job, and a job whose GRES has no GPU indices is in
            # this view only)
            bus_only = msg.job is None and ev.gpu_index is None and msg.attribution == "known"
            out.extend(self._count_repeat(ev, job if bus_only else msg.job))
        return out

    def _take_attribution(self, rule: Rule, ev: GpuEvent, job: GpuAttribution) -> list[Failure] | None:
        """The correlator's copy of the event that opened an episode (its raw copy came first):
        the correlator's job is the one attribution (one place attributes), so an episode opened
        without a job, or with another job from this detector's own view of ``slurm.jobs`` (with
        several workers, only its share of the jobs), takes it and is re-emitted (same
        ``failure_id``). Only the opening event names the episode's job: the copy of a later
        event folded into it changes nothing here. Returns the failures (empty: nothing new);
        None: not such a copy (the caller goes on)."""
        ep = self.episodes.get((rule.id, ev.node, _gpu_key(ev)))
        if ep is None or ev.event_id not in (ep.first.event_id, *ep.seen):
            return None
        before = ep.job.job_id if ep.job is not None else None
        if ev.event_id != ep.first.event_id or before == job.job_id:
            return []  # a folded event's copy, or the same job: nothing new
        ep.job = job
        return [self._emit(ep)]

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

    def _count_repeat(self, ev: GpuEvent, job: GpuAttribution | None) -> list[Failure]:
        """Application XIDs recurring on one GPU under several jobs (``xid-repeat`` rules): the
        GPU, not the code. The history holds each XID under the job of the correlator's copy
        only (``job``; None: no job or unknown, and the XID is not counted; a GPU named by its bus
        id alone takes the node's one job, :meth:`_on_event`). This detector's own
        view of ``slurm.jobs`` may be behind (at a job hand-over it still names the job that just
        ended), and its early guess once decided what was counted, so the finding depended on
        which copy came first. Now a finding opens at the first XID, in event time, at which a
        rule's distinct jobs within its window are reached, whatever order the copies came in:
        its ``failure_id`` is the same at any replay speed. Later qualifying XIDs fold into it."""
        rules = self.catalog.repeat_rules(ev.code)
        gkey = _gpu_key(ev)
        if not rules or gkey is None:
            return []
        hist = self._repeat_history(ev.node, gkey)
        if job is None:
            hist.pop(ev.event_id, None)
            return []
        small = ev.model_copy(update={"raw": ev.raw[:500]}) if len(ev.raw) > 500 else ev
        hist[ev.event_id] = AppXid(ev.ts, job.job_id, small, job)
        newest = max(e.ts for e in hist.values())
        keep = max(r.match.window_s or 0.0 for r in rules)
        entries = sorted(
            ((k, e) for k, e in hist.items() if newest - e.ts <= keep),
            key=lambda ke: (ke[1].ts, ke[0]),
        )
        while len(entries) > MAX_APP_XIDS:  # the oldest XID of the job with the most goes: jobs stay
            per: dict[str, int] = {}
            for _, e in entries:
                per[e.job_id] = per.get(e.job_id, 0) + 1
            most = max(per, key=lambda j: (per[j], j))
            del entries[next(i for i, (_, e) in enumerate(entries) if e.job_id == most)]
        if len(entries) != len(hist):
            hist.clear()
            hist.update(entries)
        out: list[Failure] = []
        for rule in rules:
            window, need = rule.match.window_s, rule.match.jobs
            if window is None or need is None:
                continue
            ep = self.episodes.get((rule.id, ev.node, gkey))
            done = set() if ep is None else {ep.first.event_id, *ep.seen}
            mine = [e for _, e in entries if e.event is None or e.event.code in rule.match.codes]
            per_job: dict[str, int] = {}  # jobs of the XIDs in the window ending at e (two pointers)
            lo = 0
            for e in mine:
                per_job[e.job_id] = per_job.get(e.job_id, 0) + 1
                while e.ts - mine[lo].ts > window:
                    gone = mine[lo].job_id
                    per_job[gone] -= 1
                    if not per_job[gone]:
                        del per_job[gone]
                    lo += 1
                if len(per_job) < need or e.event is None or e.event.event_id in done:
                    continue
                if ep is not None and e.ts < ep.first.ts:
                    continue  # before the open finding: already part of what it reports
                jobs = ", ".join(sorted(per_job))
                note = e.event.model_copy(update={"message": f"XIDs {sorted(rule.match.codes)} under jobs {jobs}"})
                out.extend(self._observe(rule, note, e.job, _evidence(e.event)))
                ep = self.episodes.get((rule.id, ev.node, gkey))
                done = set() if ep is None else {ep.first.event_id, *ep.seen}
        return out

    def _repeat_history(self, node: str, gkey: int | str) -> dict[str, AppXid]:
        """A GPU's repeat history; one from an older state file (a list of ``(ts, job id)``) is
        read into the current form (its entries count their jobs)."""
        hist = self._app_xids.get((node, gkey))
        if isinstance(hist, list):
            hist = {f"state-{i}": AppXid(float(ts), str(j)) for i, (ts, j) in enumerate(hist)}
            self._app_xids[(node, gkey)] = hist
        elif hist is None:
            hist = self._app_xids[(node, gkey)] = {}
        return hist

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

    def _reattribute(self, nodes: set[str]) -> list[Failure]:
        """Open episodes on ``nodes`` that had no job: re-emitted (same ``failure_id``) with the
        job that Slurm's allocations now give them."""
        out = []
        for ep in self.episodes.values():
            if ep.job is None and ep.first.node in nodes and ep.first.gpu_index is not None:
                ep.job = self._job_at(ep.first.node, ep.first.gpu_index, ep.first.ts)
                if ep.job is not None:
                    out.append(self._emit(ep))
        return out
