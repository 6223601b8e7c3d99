"""The pending-finding stage: the one way out of the detection engine.

Every candidate :class:`~gpuwarden.shared.models.Failure` the rules produce — an XID episode
opening or updating, a condition opening, updating or resolving, a job-window rule — passes
:meth:`PendingStage.release`. A candidate of a rule with an ``explain:`` block in ``catalog.yaml``
(:class:`~gpuwarden.detector.conditions.Explain`) is held until the event-time watermark has
passed its ``first_seen + window_s``; then, in deadline order, it is

* **merged** into one node-level failure with the other GPUs of the same node and job that have
  the same finding (``aggregate: node``, at least ``share`` of the job's GPUs on the node), or into
  one job-level failure with the job's other nodes that have it so (``aggregate: job``, at least
  ``job_share`` of the job's nodes, two at least);
* **folded** into the failure that explains it (a finding of one of ``by`` within ``window_s`` in
  the ``scope``): its evidence joins that failure, which is re-emitted (same ``failure_id``), and
  nothing of its own is ever published; or
* **emitted** as a failure of its own (with its resolution, if it resolved while held); or
* **dropped**, when its job's start-up explains it (``startup_s``: first seen in the start-up and
  resolved before it was over).

A candidate of a rule without an ``explain:`` block passes at once. Folding follows chains (a
row remap explained by an XID 94 that an XID 48 explains joins the XID 48's failure). What holds
whatever the order and speed of the inputs: a ``resolved`` is published only for a
``failure_id`` whose ``open`` was published before; nothing is published for a folded
candidate; the evidence of a folded candidate rides on every later version of its cause.

The watermark is the caller's (:class:`~gpuwarden.detector.engine.Detector`: the minimum
over the sample partitions of ``gpu.attributed``; before any sample, the newest event time). No
I/O, no wall clock: the stage is part of the detector's state (snapshot/restore).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Protocol

from gpuwarden.shared.models import Evidence, Failure, FailureState

from .conditions import Explain

__all__ = ["MAX_EVIDENCE", "PendingStage", "StageContext"]

MAX_EVIDENCE = 20
#: event time after its last version that a failure stays known to the stage, s (a cause for a
#: late candidate, the "open" a late "resolved" needs)
HORIZON_S = 7 * 86400.0
#: how often (event time, s) the stage forgets failures older than :data:`HORIZON_S`
PRUNE_EVERY_S = 600.0


class StageContext(Protocol):
    """What the stage needs of the engine: GPU counts and a node-level rendering."""

    def gpus_in_job(self, node: str, job_id: str | None) -> int:
        """GPUs of ``job_id`` on ``node`` (the node's GPU count when unknown), >= 1."""
        ...

    def nodes_in_job(self, job_id: str) -> int:
        """Nodes of ``job_id`` as far as Slurm's allocations tell (0 when unknown)."""
        ...

    def job_start(self, job_id: str | None) -> float | None:
        """When ``job_id`` started (Slurm's start, else its first window), epoch s; None when unknown."""
        ...

    def aggregate(self, members: list[Failure], state: FailureState, scope: str = "node") -> Failure:
        """One failure for ``members`` (one rule, one job; several GPUs): node-level (one node) or
        job-level (``scope="job"``, several nodes)."""
        ...


@dataclass
class _Held:
    deadline: float
    latest_open: Failure
    resolved: Failure | None = None
    #: held for its job's start-up (``startup_s``): dropped if it resolved by the deadline
    startup: bool = False


@dataclass
class _Group:
    """A node-level (``aggregate: node``) or job-level (``aggregate: job``) failure built from GPU findings."""

    members: dict[str, Failure] = field(default_factory=dict)  # member failure id -> latest version
    failure: Failure | None = None  # the node- or job-level failure last published
    last_emitted: float = 0.0
    scope: str = "node"  # or "job" (a snapshot from before job-level groups has none: the class default)
    #: members resolved and the newest member ``last_seen``, kept as members change (a job-level
    #: group has thousands of members: a pass over them per member version made a job's end
    #: quadratic); -1: not counted yet (a group from an older snapshot), counted at its next change
    resolved: int = -1
    newest: float = 0.0

    def put(self, f: Failure) -> None:
        """``f`` as the latest version of one member."""
        if self.resolved < 0:
            self.members[f.failure_id] = f
            self.resolved = sum(1 for m in self.members.values() if m.state is FailureState.RESOLVED)
            self.newest = max(m.last_seen for m in self.members.values())
            return
        old = self.members.get(f.failure_id)
        self.members[f.failure_id] = f
        self.resolved += (f.state is FailureState.RESOLVED) - (old is not None and old.state is FailureState.RESOLVED)
        self.newest = max(self.newest, f.last_seen)


def _pci(f: Failure) -> str | None:
    if not f.pci_bus_id:
        return None
    bus = f.pci_bus_id.lower()
    return bus.split(":", 1)[1] if bus.count(":") == 2 else bus  # 00000000:9b:00.0 -> 9b:00.0


def _same_gpu(a: Failure, b: Failure) -> bool:
    """Whether two findings of one node may be about the same GPU: the same index, else the same
    PCI bus id; a node-wide finding (no index, no bus id) covers every GPU of the node; an index
    against a bus id only cannot be told apart (counted as the same: same node, same seconds)."""
    if a.gpu_index is not None and b.gpu_index is not None:
        return a.gpu_index == b.gpu_index
    pa, pb = _pci(a), _pci(b)
    if pa and pb:
        return pa.removesuffix(".0") == pb.removesuffix(".0")
    return True


class PendingStage:
    """Holds, folds, merges and emits candidate failures (see the module docstring).

    State only (the catalog's ``explain`` blocks and the engine are passed to each call), so it
    is written with the detector's snapshot (:mod:`gpuwarden.detector.snapshot`).
    """

    def __init__(self) -> None:
        self.held: dict[str, _Held] = {}
        self.latest: dict[str, Failure] = {}  # newest version of every candidate (held, out or folded)
        self.by_node: dict[str, set[str]] = {}
        self.published: dict[str, float] = {}  # ids whose "open" went out -> last_seen
        self.folded: dict[str, str] = {}  # candidate id -> the failure it joined
        self.extra: dict[str, list[Evidence]] = {}  # evidence folded into a failure
        self.member_of: dict[str, str] = {}  # GPU finding id -> its node-level failure id
        self.groups: dict[str, _Group] = {}
        self.clock = 0.0
        self._pruned_at = 0.0

    # -- the one way out -------------------------------------------------------------------
    def release(
        self,
        candidates: list[Failure],
        clock: float,
        explain: dict[str, Explain],
        ctx: StageContext,
        *,
        final: bool = False,
    ) -> list[Failure]:
        """What may be published now of ``candidates`` and of the candidates held before.

        Args:
            candidates: the rules' new candidate failures, in the order produced.
            clock: the event-time watermark, epoch s (never moves back).
            explain: rule id -> its ``explain`` block (:meth:`Catalog.explanations`).
            ctx: the engine (GPU counts, node-level rendering).
            final: decide every held candidate now (the end of a finite stream).

        Returns:
            the failures to publish, in order.
        """
        self.clock = max(self.clock, clock)
        out: list[Failure] = []
        for f in candidates:  # known first: a cause produced in the same step explains at once
            self.latest[f.failure_id] = f
            self.by_node.setdefault(f.node, set()).add(f.failure_id)
        for f in candidates:
            fid = f.failure_id
            if fid in self.member_of:
                out += self._group_update(self.member_of[fid], f, ctx)
            elif fid in self.folded:
                continue  # explained: its evidence is already on the cause
            elif fid in self.held:
                h = self.held[fid]
                if f.state is FailureState.RESOLVED:
                    h.resolved = f
                else:
                    self._reopen(fid, h, f)
            elif fid in self.published:
                out.append(self._out(f))
            elif f.state is FailureState.RESOLVED:
                continue  # never published: nothing to resolve
            elif f.rule_id in explain and (new := self._held_for(f, explain[f.rule_id], ctx)) is not None:
                self._hold(fid, new)
            else:
                out.append(self._out(f))
        for fid in self._due(final):
            if fid in self.held:  # a group decided earlier in this loop may have taken it
                out += self._decide(fid, explain, ctx)
        if self.clock - self._pruned_at >= PRUNE_EVERY_S:
            self._prune()
        return out

    # -- what is held: by deadline, and by rule and job ----------------------------------------
    # (a large job's fault holds thousands of candidates: a scan of every held one per release, that
    # is per input record, and per decision made the stage quadratic)
    def _deadlines(self) -> list[tuple[float, str]]:
        """A heap of ``(deadline, id)`` of the held candidates (entries of candidates no longer
        held, or held again with another deadline, are skipped when they come up). Kept in
        ``__dict__``: a snapshot from before it restores, and the heap is built from ``held``."""
        heap: list[tuple[float, str]] | None = self.__dict__.get("deadlines")
        if heap is None:
            heap = self.__dict__["deadlines"] = [(h.deadline, fid) for fid, h in self.held.items()]
            heapq.heapify(heap)
        return heap

    def _index(self) -> dict[tuple[str, str | None], dict[str, None]]:
        """(rule id, job id) -> the held candidates with them (insertion order); built from
        ``held`` for a snapshot from before it."""
        index: dict[tuple[str, str | None], dict[str, None]] | None = self.__dict__.get("held_index")
        if index is None:
            index = self.__dict__["held_index"] = {}
            for fid, h in self.held.items():
                index.setdefault((h.latest_open.rule_id, h.latest_open.job_id), {})[fid] = None
        return index

    @staticmethod
    def _held_for(f: Failure, ex: Explain, ctx: StageContext) -> _Held | None:
        """How a new candidate of a rule with ``ex`` is held: until ``first_seen + window_s`` for
        an explanation or an aggregation, and, first seen in its job's start-up (``startup_s``),
        until the start-up is over; None: it passes at once."""
        deadline = f.first_seen + ex.window_s if (ex.by or ex.aggregate) else -math.inf
        startup = False
        if ex.startup_s is not None:
            start = ctx.job_start(f.job_id)
            if start is not None and f.first_seen < start + ex.startup_s:
                deadline, startup = max(deadline, start + ex.startup_s), True
        return None if deadline == -math.inf else _Held(deadline, f, startup=startup)

    def _hold(self, fid: str, h: _Held) -> None:
        self.held[fid] = h
        heapq.heappush(self._deadlines(), (h.deadline, fid))
        self._index().setdefault((h.latest_open.rule_id, h.latest_open.job_id), {})[fid] = None

    def _unhold(self, fid: str) -> None:
        h = self.held.pop(fid)
        key = (h.latest_open.rule_id, h.latest_open.job_id)
        index = self._index()
        ids = index.get(key)
        if ids is not None:
            ids.pop(fid, None)
            if not ids:
                del index[key]

    def _reopen(self, fid: str, h: _Held, f: Failure) -> None:
        """A newer open version of a held candidate (its job may have become known)."""
        if f.job_id != h.latest_open.job_id:
            self._unhold(fid)
            h.latest_open, h.resolved = f, None
            self.held[fid] = h
            self._index().setdefault((f.rule_id, f.job_id), {})[fid] = None
            return
        h.latest_open, h.resolved = f, None

    def _peers(self, f: Failure) -> list[str]:
        """Held candidates of ``f``'s rule and job (``f`` among them when held)."""
        return list(self._index().get((f.rule_id, f.job_id), ()))

    def _due(self, final: bool) -> list[str]:
        """Ids of the held candidates to decide now, in (deadline, id) order: those whose deadline
        the clock passed; every one when ``final``."""
        if final:  # (the heap's entries of these are skipped once they come up)
            return [fid for _, fid in sorted((h.deadline, fid) for fid, h in self.held.items())]
        heap = self._deadlines()
        due: list[str] = []
        while heap and heap[0][0] <= self.clock:
            deadline, fid = heapq.heappop(heap)
            h = self.held.get(fid)
            if h is not None and h.deadline == deadline:
                due.append(fid)
        return due

    # -- deciding a held candidate -----------------------------------------------------------
    def _decide(self, fid: str, explain: dict[str, Explain], ctx: StageContext) -> list[Failure]:
        h = self.held[fid]
        f = h.latest_open
        ex = explain[f.rule_id]
        if h.startup and h.resolved is not None:
            self._unhold(fid)  # over within its job's start-up: the start-up explains it, nothing goes out
            return []
        if ex.aggregate == "job":
            grouped = self._aggregate_job(fid, ex, ctx)
            if grouped is not None:
                return grouped
        if ex.aggregate is not None:
            grouped = self._aggregate(fid, ex, ctx)
            if grouped is not None:
                return grouped
        cause = self._cause(f, ex) if ex.by else None
        self._unhold(fid)
        if cause is not None:
            if ex.answers:
                self._answered().setdefault(cause, set()).update(ex.answers)
            return self._fold(fid, cause)
        out = [self._out(f)]
        if h.resolved is not None:
            out.append(self._out(h.resolved))
        return out

    def _cause(self, f: Failure, ex: Explain) -> str | None:
        """The root failure id explaining ``f``, if any (the earliest such finding)."""
        by = set(ex.by)
        w = ex.window_s
        best: Failure | None = None
        for cid in self.by_node.get(f.node, ()):
            c = self.latest.get(cid)
            if c is None or cid == f.failure_id or c.rule_id not in by:
                continue
            if ex.scope == "gpu" and not _same_gpu(f, c):
                continue
            if not (c.first_seen - w <= f.first_seen <= c.last_seen + w):
                continue
            if best is None or (c.first_seen, c.failure_id) < (best.first_seen, best.failure_id):
                best = c
        return self._root(best.failure_id) if best is not None else None

    def _root(self, fid: str) -> str:
        seen = set()
        while True:
            nxt = self.folded.get(fid) or self.member_of.get(fid)
            if nxt is None or nxt in seen:
                return fid
            seen.add(fid)
            fid = nxt

    def _fold(self, fid: str, root: str) -> list[Failure]:
        """``fid`` joins ``root``: its evidence (and whatever was folded into it) rides on root."""
        f = self.latest[fid]
        self.folded[fid] = root
        note = Evidence(
            signal="explains",
            value=f"{f.pattern} ({f.rule_id})" + (f" GPU {f.gpu_index}" if f.gpu_index is not None else ""),
            unit=None,
            threshold=None,
            ts=f.first_seen,
            source=f.failure_id,
        )
        extra = self.extra.setdefault(root, [])
        extra += [note, *f.evidence[:2], *self.extra.pop(fid, [])]
        del extra[: -MAX_EVIDENCE // 2]
        if root in self.held:
            return []  # the cause is held too: it goes out with this evidence when decided
        if root in self.groups:
            grp = self.groups[root]
            return [self._out(grp.failure)] if grp.failure is not None else []
        cause = self.latest.get(root)
        return [self._out(cause)] if cause is not None and root in self.published else []

    # -- node-level aggregation ---------------------------------------------------------------
    def _aggregate(self, fid: str, ex: Explain, ctx: StageContext) -> list[Failure] | None:
        f = self.held[fid].latest_open
        w = ex.window_s
        gid = self._open_group(f, w, "node")  # an open group of this rule, node and job: join it
        if gid is not None:
            self._unhold(fid)
            return self._join(gid, [fid], ctx)
        peers = [
            pid
            for pid in self._peers(f)
            if (c := self.held[pid].latest_open).node == f.node
            and c.gpu_index is not None
            and abs(c.first_seen - f.first_seen) <= w
        ]
        gpus = {self.held[p].latest_open.gpu_index for p in peers}
        need = max(2, math.ceil(ex.share * max(1, ctx.gpus_in_job(f.node, f.job_id))))
        if len(gpus) < need:
            return None
        return self._new_group(peers, ctx, "node")

    def _aggregate_job(self, fid: str, ex: Explain, ctx: StageContext) -> list[Failure] | None:
        """``fid`` and the held candidates of its rule and job within the window as one job-level
        failure, when at least ``job_share`` of the job's nodes (two at least) each have at least
        ``share`` of their GPUs of the job among them; or joining the open job-level failure of the
        rule and job. None: neither (the caller tries a node-level group)."""
        f = self.held[fid].latest_open
        if f.job_id is None or f.gpu_index is None:
            return None
        w = ex.window_s
        peers = [
            pid
            for pid in self._peers(f)
            if (c := self.held[pid].latest_open).gpu_index is not None and abs(c.first_seen - f.first_seen) <= w
        ]
        by_node: dict[str, set[int]] = {}
        for p in peers:
            c = self.held[p].latest_open
            by_node.setdefault(c.node, set()).add(c.gpu_index)  # type: ignore[arg-type]
        job = f.job_id
        # the per-node share holds for joining too: a node with one idle GPU of eight stands apart
        full = {n for n, gpus in by_node.items() if len(gpus) >= math.ceil(ex.share * ctx.gpus_in_job(n, job))}
        gid = self._open_group(f, w, "job")  # the job's open job-level failure of this rule: join it
        if gid is not None:
            inside = full | {m.node for m in self.groups[gid].members.values()}
            if f.node not in inside:
                return None
            joining = [p for p in peers if self.held[p].latest_open.node in inside]
            for p in joining:
                self._unhold(p)
            return self._join(gid, joining, ctx)
        # nodes whose GPUs already went out as a node-level failure of this rule and job (their
        # candidates came earlier) count too, and the job-level failure takes them over
        earlier = [g for g in self._open_groups(f, w, "node") if self.groups[g].failure.node not in full]  # type: ignore[union-attr]
        nodes = full | {self.groups[g].failure.node for g in earlier}  # type: ignore[union-attr]
        need = max(2, math.ceil(ex.job_share * max(ctx.nodes_in_job(job), len(by_node), len(nodes))))
        if f.node not in full or len(nodes) < need:
            return None
        handed = [g for g in self._open_groups(f, w, "node") if g not in earlier] + earlier
        out = self._new_group([p for p in peers if self.held[p].latest_open.node in full], ctx, "job")
        if not handed or out[-1].state is not FailureState.OPEN:
            return out
        # its first version (just built) goes out with the members taken over, then their ends
        ended = self._hand_over(handed, out[-1].failure_id)
        return self._group_emit(out[-1].failure_id, ctx, force=True) + ended

    def _open_groups(self, f: Failure, w: float, scope: str) -> list[str]:
        """Every open group of ``scope`` with ``f``'s rule and job whose span is within ``w`` of
        ``f``'s first seen, whatever its node."""
        out = []
        for gid, grp in self.groups.items():
            g = grp.failure
            if (
                g is not None
                and grp.scope == scope
                and g.rule_id == f.rule_id
                and g.job_id == f.job_id
                and g.state is FailureState.OPEN
                and g.first_seen - w <= f.first_seen <= g.last_seen + w
            ):
                out.append(gid)
        return out

    def _hand_over(self, gids: list[str], job_gid: str) -> list[Failure]:
        """The node-level failures ``gids`` (published open) end, handed over to the new job-level
        failure ``job_gid``: their members are its members from now on (their later versions go
        to it), and each ends with a ``handed over`` evidence naming it, so one root cause and scope
        stays one open finding and every ``open`` published gets its end. Returns those ends."""
        jg = self.groups[job_gid]
        out: list[Failure] = []
        for gid in gids:
            grp = self.groups[gid]
            old = grp.failure
            assert old is not None
            for fid, m in grp.members.items():
                jg.put(m)
                self.member_of[fid] = job_gid
            note = Evidence(signal="handed over", value=f"job-level failure of job {old.job_id}", unit=None,
                            threshold=None, ts=jg.newest or old.last_seen, source=job_gid)  # fmt: skip
            ended = old.model_copy(
                update={
                    "state": FailureState.RESOLVED,
                    "last_seen": max(old.last_seen, jg.newest),
                    "evidence": [*old.evidence[-(MAX_EVIDENCE - 1) :], note],
                }
            )
            grp.failure, grp.members, grp.resolved = ended, {}, 0
            self.latest[gid] = ended
            if gid in self.published:
                out.append(self._out(ended))
        return out

    def _open_group(self, f: Failure, w: float, scope: str) -> str | None:
        """The open group of ``scope`` (``node``: also ``f``'s node) with ``f``'s rule and job
        whose span is within ``w`` of ``f``'s first seen."""
        for gid in self._open_groups(f, w, scope):
            g = self.groups[gid].failure
            if scope == "job" or (g is not None and g.node == f.node):
                return gid
        return None

    def _new_group(self, peers: list[str], ctx: StageContext, scope: str) -> list[Failure]:
        """A new node- or job-level failure of the held candidates ``peers`` (taken out of held)."""
        members = [self.held[p].latest_open for p in peers]
        resolved = {p: self.held[p].resolved for p in peers}
        for p in peers:
            self._unhold(p)
        group_f = ctx.aggregate(members, FailureState.OPEN, scope)
        gid = group_f.failure_id
        grp = self.groups[gid] = _Group(scope=scope, resolved=0)
        for m in members:
            grp.put(resolved[m.failure_id] or m)
            self.member_of[m.failure_id] = gid
        self.latest[gid] = group_f
        self.by_node.setdefault(group_f.node, set()).add(gid)
        return self._group_emit(gid, ctx, force=True)

    def _join(self, gid: str, fids: list[str], ctx: StageContext) -> list[Failure]:
        grp = self.groups[gid]
        for m in fids:
            grp.put(self.latest[m])
            self.member_of[m] = gid
        return self._group_emit(gid, ctx, force=True)

    def _group_update(self, gid: str, f: Failure, ctx: StageContext) -> list[Failure]:
        grp = self.groups.get(gid)
        if grp is None:
            return []
        grp.put(f)
        # a node-level group shows each member's end at once; a job-level one (thousands of
        # members, all resolved together when the job ends) at the throttle or when all are done
        force = f.state is FailureState.RESOLVED and grp.scope == "node"
        return self._group_emit(gid, ctx, force=force)

    def _group_emit(self, gid: str, ctx: StageContext, force: bool) -> list[Failure]:
        """The group's failure now, unless throttled (an update within 30 s of event time of the
        last one, not forced, not the end). A group whose first version would already be
        resolved (every member ended while held) publishes its open version first: no
        ``resolved`` goes out for an id whose ``open`` did not. A job-level failure keeps the
        ``node`` it was first published with (``failures`` is keyed by node)."""
        grp = self.groups[gid]
        if grp.failure is not None and grp.failure.state is FailureState.RESOLVED:
            return []  # the group's failure ended; late member versions change nothing
        if grp.resolved < 0:  # from an older snapshot: count once
            for m in list(grp.members.values()):
                grp.put(m)
        done = grp.resolved >= len(grp.members)
        if not force and not done and grp.newest - grp.last_emitted < 30.0:
            return []
        members = sorted(grp.members.values(), key=lambda m: (m.node, m.gpu_index if m.gpu_index is not None else -1))
        out: list[Failure] = []
        states = [FailureState.OPEN] if not done else [FailureState.RESOLVED]
        if done and gid not in self.published:
            states.insert(0, FailureState.OPEN)
        for state in states:
            group_f = ctx.aggregate(members, state, grp.scope)
            update: dict[str, object] = {}
            if group_f.failure_id != gid:
                update["failure_id"] = gid
            if grp.failure is not None and group_f.node != grp.failure.node:
                update["node"] = grp.failure.node
            if update:
                group_f = group_f.model_copy(update=update)
            grp.failure, grp.last_emitted = group_f, grp.newest
            self.latest[gid] = group_f
            out.append(self._out(group_f))
        return out

    # -- publishing ------------------------------------------------------------------------
    def _answered(self) -> dict[str, set[str]]:
        """Failure id -> beginnings of its ``cannot_determine`` entries that a finding folded into
        it settled (``Explain.answers``). Kept in ``__dict__`` so a snapshot from before it restores."""
        answered: dict[str, set[str]] = self.__dict__.setdefault("answered", {})
        return answered

    def _out(self, f: Failure) -> Failure:
        """``f`` as published: with the evidence folded into it, without what that evidence
        settled in its ``cannot_determine``; remembered as opened."""
        extra = self.extra.get(f.failure_id)
        if extra:
            have = {(e.signal, e.ts, str(e.value)) for e in f.evidence}
            add = [e for e in extra if (e.signal, e.ts, str(e.value)) not in have]
            keep = max(0, MAX_EVIDENCE - len(add))
            f = f.model_copy(update={"evidence": [*f.evidence[:keep], *add]})
        settled = self._answered().get(f.failure_id)
        if settled:
            left = [c for c in f.cannot_determine if not c.startswith(tuple(settled))]
            if len(left) != len(f.cannot_determine):
                f = f.model_copy(update={"cannot_determine": left})
        self.latest[f.failure_id] = f
        self.published[f.failure_id] = f.last_seen
        return f

    def open_ids(self) -> set[str]:
        """Ids of the failures published open and not (yet) published resolved."""
        return {
            fid for fid in self.published if (f := self.latest.get(fid)) is not None and f.state is FailureState.OPEN
        }

    def _prune(self) -> None:
        self._pruned_at = self.clock
        cut = self.clock - HORIZON_S
        old = [fid for fid, f in self.latest.items() if f.last_seen < cut and fid not in self.held]
        for fid in old:
            f = self.latest.pop(fid)
            self.published.pop(fid, None)
            self.folded.pop(fid, None)
            self.extra.pop(fid, None)
            self._answered().pop(fid, None)
            self.member_of.pop(fid, None)
            self.groups.pop(fid, None)
            ids = self.by_node.get(f.node)
            if ids is not None:
                ids.discard(fid)
                if not ids:
                    del self.by_node[f.node]
