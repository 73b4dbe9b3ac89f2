"""The reconcile pass's preemption phase: after placement, each replica that fit
nowhere (highest priority first) may evict lower-priority replicas
(:mod:`forge.core.preemption` chooses where and whom).

The victims are released with reason ``preempted`` and the preemptor is bound to
their node in the same plan, so the store gets both in one fenced delta. A victim
goes back to pending with its reason ("preempted by JOB/GROUP/N at T") and its own
backoff; its failure history records the preemption, which keeps it from being
preempted again within the cooldown and caps what it may preempt itself (no
cascades). Runs after every ordinary placement of the pass, so the placer's
"capacity only shrinks within a pass" never sees a node give capacity back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from forge.core.admitting import Gate
from forge.core.groups import GroupKey, Groups
from forge.core.models import Job, Request, TaskGroup, workload_id
from forge.core.placement import Binding, Cluster, NodeAlloc, Placer
from forge.core.plan import FailureHistory, PendingEntry, Plan, Preempted, ReconcileOptions
from forge.core.preemption import Holder, Preemption, Search, find
from forge.core.queue import sort_key
from forge.core.reclaiming import ByQueue, evictable, trade_victims
from forge.core.release import Carry

__all__ = ["PREEMPTED", "Phase", "Wanted", "floor_of", "waiters"]

#: How a victim's pending reason starts ("preempted by JOB/GROUP/N at T"); a victim
#: refused again keeps it before the placer's reason until it is bound.
PREEMPTED = "preempted by "


@dataclass(frozen=True, slots=True)
class Wanted:
    """A replica placement refused this pass, waiting to try preemption."""

    wid: str
    job: Job
    group: TaskGroup
    ordinal: int
    req: Request


@dataclass(slots=True)
class Phase:
    """One pass's preemption: what it may read and what it changes.

    ``bound``: a group's bound count before this pass's placements (so budgets
    err on the safe side); ``release`` records a released binding in the plan."""

    plan: Plan
    carry: Carry | None
    cluster: Cluster
    placer: Placer
    groups: Groups
    failures: dict[str, FailureHistory]
    options: ReconcileOptions
    now: float
    bound: Callable[[tuple[str, str]], int]
    release: Callable[[str, Binding, str], None]
    bind: Callable[[Job, TaskGroup, int, Binding], None]
    #: with budgets shared with drains and rollouts: what a group's budget lets go
    #: now, read live from the pass (forge.core.disruption); None: preemption counts
    #: its own evictions against the bound count before the pass's placements
    ledger: Callable[[tuple[str, str]], int | None] | None = None
    #: the admit stage: a queued replica refused within its nominal quota reclaims
    #: it from its cohort's borrowers, at any priority (forge.core.admitting)
    gate: Gate | None = None
    work: int = 0
    #: no bound replica's priority is below this (``Carry.floor``)
    floor: int = 1
    preempted_groups: set[tuple[str, str]] = field(default_factory=set)
    _holders: dict[str, list[Holder]] = field(default_factory=dict)
    _by_queue: ByQueue | None = None
    _by_node: dict[str, list[str]] | None = None
    _spent: dict[tuple[str, str], int] = field(default_factory=dict)
    _failed: set[tuple[int, int, int]] = field(default_factory=set)
    _start: int = 0
    _eligible: dict[tuple[int, int], list[NodeAlloc]] = field(default_factory=dict)
    _wanted: dict[str, Wanted] = field(default_factory=dict)

    def run(self, wanted: list[Wanted], work_left: int) -> None:
        """Try each wanted replica in order (the pass's placement order) until the
        work is spent; those left keep the pending entry placement gave them."""
        plan = self.plan
        todo = [w for w in wanted if w.job.preemption != "never"]
        while todo:
            # a preemption moves capacity: those that found nothing before the last
            # one are looked at again (each round binds at least one, so this ends)
            before_last: list[Wanted] = []
            since: list[Wanted] = []
            for w in todo:
                if work_left and self.work >= work_left:
                    return
                if w.wid in plan.bindings:
                    continue
                hist = self.failures.get(w.wid)
                limit = w.job.priority - self.options.min_gap
                if self.gate is not None and self.gate.limited(w.job):
                    limit = 100  # a reclaim: victims by queue, not by priority
                elif hist is not None and hist.preempted_cap:
                    limit = min(limit, hist.preempted_cap)
                if limit < self.floor:
                    continue  # nothing bound is low enough to be a victim
                key = (id(w.req), id(w.group.constraints), limit)
                if key not in self._failed and self._try(w, limit, key, work_left):
                    before_last += since
                    since = []
                else:  # (a class that found no node since capacity last moved: skipped)
                    since.append(w)
            todo = before_last

    def refill(
        self,
        wanted: list[Wanted],
        placer: Placer,
        room: int,
        work_left: int,
        waiters: list[Wanted] | None = None,
    ) -> int:
        """After preemptions: place what is still unbound, with a fresh ``placer``
        over the same cluster (a victim may fit elsewhere, the rest of a freed node
        may fit other pending work), in order, the victims after the replicas that
        found no node. At most ``room`` placements; returns how many were made.
        A victim of a group with ``distinct_hosts`` or ``spread`` waits for the next
        pass, whose place phase knows where its group's replicas are.

        ``waiters`` (option ``refill_waiting``): the replicas that waited out an
        earlier backoff this pass, untried; the freed room is theirs as much as the
        refused ones' (a release's freed room retries every backoff, forge.core.waiting),
        so they are merged with those in placement order. None: the room goes to the
        refused replicas and the victims only (runs recorded before the patch)."""
        order = [w for w in wanted if w.wid not in self.plan.bindings]
        if waiters:
            order = sorted(order + waiters, key=_placement_order)
        order += self._victims()
        if self.options.topology:  # a group with rules of its own waits for a pass
            order = [w for w in order if not w.group.topology]
        if self.options.gangs:  # so does a gang (placed together, never one by one)
            order = [w for w in order if not w.group.gang]
        if self.gate is not None:  # and a queued job's: its queue admits it, next pass
            order = [w for w in order if not self.gate.limited(w.job)]
        made = 0
        start = placer.work
        for w in order:
            if made >= room or (work_left and placer.work - start >= work_left):
                break
            hist = self.failures.get(w.wid)
            choice = placer.place(
                w.req, w.group.constraints, avoid=hist.last_node if hist else None
            )
            if choice is None:
                continue
            b = Binding(
                w.job.id,
                w.group.name,
                w.ordinal,
                choice.node.id,
                choice.gpu_ids,
                w.req.cpu,
                w.req.memory,
                gpu_milli=w.req.gpu_milli,
                version=w.group.version if self.options.rollouts else "",
            )
            self.bind(w.job, w.group, w.ordinal, b)
            self.plan.pending.pop(w.wid, None)
            made += 1
        self.work += placer.work - start
        return made

    def _victims(self) -> list[Wanted]:
        """This pass's victims as replicas to place, in placement order."""
        out = []
        for p in self.plan.preemptions:
            for wid in p.victims:
                job_id, group, ordinal = wid.rsplit("/", 2)
                entry = self.groups.get((job_id, group))
                if entry is not None:
                    job, g, req = entry
                    out.append((sort_key(job), wid))
                    self._wanted[wid] = Wanted(wid, job, g, int(ordinal), req)
        out.sort(key=lambda x: (x[0], x[1]))
        return [self._wanted[wid] for _, wid in out]

    def _try(self, w: Wanted, limit: int, key: tuple[int, int, int], work_left: int) -> bool:
        ekey = (id(w.req), id(w.group.constraints))
        nodes = self._eligible.get(ekey)
        if nodes is None:  # (the group's objects live as long as the pass)
            nodes = self._eligible[ekey] = self.placer.eligible(w.req, w.group.constraints)
        search = Search(limit=limit, cooling=self._cooling, budget=self._budget)
        left = max(1, work_left - self.work) if work_left else 0
        gate = self.gate if self.gate is not None and self.gate.limited(w.job) else None
        holders: Callable[[str], list[Holder]] = self._holders_of
        if gate is not None:  # a reclaim: of its cohort's borrowers only
            if self._by_queue is None:
                self._by_queue = ByQueue(self._holders_of, self.groups)
            claim, by_queue = gate.claim(w.job, w.req), self._by_queue
            holders = partial(evictable, gate, claim, by_queue, self.groups, self.cluster)
        # a claim's search reads each node's holders by queue: a node costs about
        # as many units as it holds replicas (the pass's mean), not one
        cost = 1 if gate is None else 1 + len(self.plan.bindings) // max(len(self.cluster.nodes), 1)
        choice, work, self._start = find(
            w.req, nodes, holders, search, start=self._start, work_left=left, node_cost=cost
        )
        self.work += work
        if choice is None:
            self._failed.add(key)
            return False
        extra = [] if gate is None else self._trade(w, gate, choice)
        if extra is None:
            return False  # its quota is not freed (another node may do)
        node, victims = choice.node, (*choice.victims, *extra)
        for v in victims:
            self._evict(v, w.wid)
        gpu_ids = node.allocate(w.req)
        b = Binding(
            w.job.id,
            w.group.name,
            w.ordinal,
            node.id,
            gpu_ids,
            w.req.cpu,
            w.req.memory,
            gpu_milli=w.req.gpu_milli,
            version=w.group.version if self.options.rollouts else "",
        )
        self.bind(w.job, w.group, w.ordinal, b)
        if gate is not None:
            gate.bound(w.job, b, node.node)
        self.plan.pending.pop(w.wid, None)
        self._holders.pop(node.id, None)
        if self._by_queue is not None:
            self._by_queue.drop(node.id)
        if victims:  # (none: an earlier preemption left room enough here)
            self.plan.preemptions.append(
                Preempted(w.wid, node.id, tuple(v.wid for v in victims), self.now)
            )
        self._failed.clear()  # capacity moved: other classes may find room now
        return True

    def _trade(self, w: Wanted, gate: Gate, choice: Preemption) -> list[Holder] | None:
        """The victims beside the node's a reclaim needs to free its quota ([]:
        none), or None (forge.core.reclaiming)."""
        skip = {v.wid for v in choice.victims} | {b.workload_id for b in self.plan.placed}
        return trade_victims(
            w.job, w.req, choice, gate, bindings=self.plan.bindings, groups=self.groups,
            cluster=self.cluster, skip=skip, cooling=self._cooling, budget=self._budget,
        )  # fmt: skip

    def _evict(self, v: Holder, by: str) -> None:
        b = v.binding
        self.cluster.by_id[b.node].unhold(b)
        if self.carry is not None:
            self.carry.drop(v.wid, b)
        else:
            del self.plan.bindings[v.wid]
        self.release(v.wid, b, "preempted")
        self._spent[v.group] = self._spent.get(v.group, 0) + 1
        self.preempted_groups.add(v.group)
        if self._by_node is not None:
            self._by_node[b.node].remove(v.wid)
        past = self.failures.get(v.wid, FailureHistory())
        # what the victim may preempt itself from now on: nothing within min_gap of
        # the priority that preempted it
        cap = self._priority_of(by) - self.options.min_gap
        self.failures[v.wid] = past.model_copy(
            update={"preempted_at": self.now, "preempted_by": by, "preempted_cap": max(cap, 0)}
        )
        when = datetime.fromtimestamp(self.now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.plan.pending[v.wid] = PendingEntry(
            kind="backoff",
            attempts=1,
            not_before=self.now + self.options.backoff_base,
            reasons=(f"{PREEMPTED}{by} at {when}",),
        )

    def _priority_of(self, wid: str) -> int:
        job_id, group, _ = wid.rsplit("/", 2)
        return self.groups[(job_id, group)].job.priority

    # -- what a search reads --------------------------------------------------------
    def _cooling(self, wid: str) -> bool:
        hist = self.failures.get(wid)
        return hist is not None and hist.cooling(self.now, self.options.preemption_cooldown)

    def _budget(self, key: tuple[str, str]) -> int | None:
        """Replicas of the group preemption may still take this pass (None: no
        budget): its allowance less what is unavailable already and what this pass
        preempted (with a ``ledger``: what it says, drains and waves counted)."""
        if self.ledger is not None:
            return self.ledger(key)
        entry = self.groups.get(key)
        if entry is None or entry.spec.disruption is None:
            return None
        desired = entry.spec.scaling.desired
        down = max(0, desired - self.bound(key))
        return entry.spec.disruption.allowed(desired) - down - self._spent.get(key, 0)

    def _holders_of(self, node_id: str) -> list[Holder]:
        """The replicas bound to a node before this pass placed (placements of this
        pass are not victims: they have not even started), with their priorities."""
        found = self._holders.get(node_id)
        if found is not None:
            return found
        bindings = self.plan.bindings
        if self.carry is not None:
            wids: Mapping[str, None] | list[str] = self.carry.by_node.get(node_id, {})
        else:
            if self._by_node is None:
                self._by_node = _index(bindings, {b.workload_id for b in self.plan.placed})
                self.work += len(bindings) // 16
            wids = self._by_node.get(node_id, [])
        out = []
        for wid in wids:
            b = bindings.get(wid)
            if b is None:
                continue
            entry = self.groups.get((b.job, b.group))
            # a gang's member is no victim: evicting one would leave the rest idle
            if entry is not None and not (entry.spec.gang and self.options.gangs):
                out.append(Holder(wid, b, entry.job.priority))
        self._holders[node_id] = out
        return out


def _placement_order(w: Wanted) -> tuple[tuple[int, bool, str], int, int]:
    """Where the place phase visits ``w``: its job's sort key, its group's place in
    the job, its ordinal."""
    names = [g.name for g in w.job.groups]
    return (sort_key(w.job), names.index(w.group.name), w.ordinal)


def _index(bindings: Mapping[str, Binding], skip: set[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for wid, b in bindings.items():
        if wid not in skip:
            out.setdefault(b.node, []).append(wid)
    return out


def waiters(
    waited: list[GroupKey],
    groups: Groups,
    given: Mapping[str, PendingEntry],
    plan: Plan,
    work_left: int = 0,
) -> tuple[list[Wanted], int]:
    """The replicas a pass left waiting out a backoff an earlier pass gave them (their
    entry kept as ``given``, untried), in placement order: the room a preemption
    frees may take them (:meth:`Phase.refill`). Walks only the ``waited`` groups, one
    unit of work per replica looked at, and (with a budget) no group once
    ``work_left`` units are spent: those after wait on. Returns them and the work."""
    out: list[Wanted] = []
    pending, bindings = plan.pending, plan.bindings
    walked = 0
    for key in waited:
        if work_left and walked >= work_left:
            break
        entry = groups.get(key)
        if entry is None:  # pragma: no cover - a visited group is indexed
            continue
        job, g, req = entry
        for ordinal in range(g.scaling.desired):
            wid = workload_id(job.id, g.name, ordinal)
            e = pending.get(wid)
            # kept as given (neither tried this pass nor a victim of it), unbound
            if (
                e is not None
                and e.kind == "backoff"
                and e is given.get(wid)
                and wid not in bindings
            ):
                out.append(Wanted(wid, job, g, ordinal, req))
        walked += g.scaling.desired
    return out, walked


def floor_of(plan: Plan, groups: Groups) -> int:
    """The lowest job priority among the bindings a pass kept (its placements are
    no victims): a pass without a carry walks its bindings anyway."""
    placed = {b.workload_id for b in plan.placed}
    prios = [
        groups[(b.job, b.group)].job.priority for w, b in plan.bindings.items() if w not in placed
    ]
    return min(prios, default=101)
