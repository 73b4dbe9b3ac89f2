"""One reconcile pass as a pure function: desired + actual + now -> Plan.

Like Nomad's reconciler, this module decides *what* happens to each replica
(keep, release, place, wait) and leaves *where* to :mod:`forge.core.placement`. It
reads no clock (``now`` is a parameter), draws no unseeded randomness and iterates
only in deterministic orders, so the cluster workflow can run it as workflow code
and get the same plan on replay, on any machine.

The order of a pass:

1. **release** bindings that are no longer desired (job stopped, scaled down,
   spec changed), sit on a lost, draining, removed or shrunken node, or failed;
   rolling updates replace old versions in waves;
2. **place** missing replicas in priority order, then job id, group order,
   ordinal, skipping those still waiting out a backoff or a reschedule delay
   (within a priority, jobs that ask GPUs first), each replica of a job in a queue
   with a quota first **admitted** by its queue (forge.core.admitting); those the
   GPU reservation turned away are retried once it lifts, and those that found no
   node may **preempt** lower-priority replicas;
3. record who is **pending** and why, and when the pass must run again.

Like Nomad's ``Compute()``, :func:`reconcile` is a short driver over named phases,
each in its own module: the group index (:mod:`forge.core.groups`), release and the
carry (:mod:`forge.core.release`; the pass's release steps, drain and gang restarts
in :mod:`forge.core.releasing`), rolling updates (:mod:`forge.core.rolling`),
placement (:mod:`forge.core.placing`), who waits and how long
(:mod:`forge.core.waiting`: backoff, reschedule delays), preemption
(:mod:`forge.core.preempting`). The options and results live in
:mod:`forge.core.plan`; the names a caller needs are importable from here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from forge.core.admitting import Gate, gate
from forge.core.groups import (
    Bound,
    Group,
    GroupKey,
    groups_of,
    reschedule_window,
    still_desired,
    update_groups,
)
from forge.core.models import Job, Node, Request, TaskGroup
from forge.core.placement import Binding, Cluster, Placer
from forge.core.placing import Placing
from forge.core.plan import (
    DEFAULT_GPU_RESERVE,
    Algorithm,
    FailureHistory,
    PendingEntry,
    Plan,
    ReconcileOptions,
)
from forge.core.preempting import Phase, floor_of, waiters
from forge.core.queue import Queue, SortKey
from forge.core.quota import QueueSpec
from forge.core.release import Carry
from forge.core.releasing import Releasing
from forge.core.rolling import GroupRollout
from forge.core.visiting import Done, incomplete, ordered, to_visit
from forge.core.waiting import backoff_delay, defer_groups, reschedule_delay

__all__ = [
    "DEFAULT_GPU_RESERVE",
    "MAX_WORK",
    "PENDING_UNITS",
    "Algorithm",
    "Carry",
    "FailureHistory",
    "PendingEntry",
    "Plan",
    "ReconcileOptions",
    "backoff_delay",
    "reconcile",
    "reschedule_delay",
]


DEFAULT_OPTIONS = ReconcileOptions()
#: The work budget the cluster workflow gives a pass: ~0.4 s of planning on an idle
#: core (a unit costs ~1.3 us: a node checked or scored), leaving room under
#: Temporal's 2 s activation limit on a loaded machine.
MAX_WORK = 300_000
#: What a replica tried and left pending costs in that budget (measured: about eight
#: node checks' time), so a pass retrying 30,000 unplaceable replicas defers.
PENDING_UNITS = 8


def reconcile(
    *,
    jobs: Mapping[str, Job],
    nodes: Mapping[str, Node],
    bindings: Mapping[str, Binding],
    pending: Mapping[str, PendingEntry],
    failures: Mapping[str, FailureHistory],
    failed: Collection[str] = (),
    capacity_changed: bool = False,
    now: float,
    options: ReconcileOptions = DEFAULT_OPTIONS,
    carry: Carry | None = None,
    rollouts: Mapping[str, GroupRollout] = {},
    since: Mapping[str, float] = {},
    promoted: Mapping[str, None] = {},
    health: Mapping[str, bool] = {},
    jobs_changed: Collection[str] | None = None,
    done: Done | None = None,
    completed: Collection[str] = (),
    queues: Mapping[str, QueueSpec] = {},
) -> Plan:
    """Plan one pass. Inputs are not mutated (except ``carry``, which the pass
    updates and returns as ``plan.carry``; with a carry, ``bindings`` is ignored:
    the carry's are the current ones). Mapping iteration orders must be
    deterministic (the workflow builds its dicts deterministically).
    ``jobs_changed`` (with a carry): the ids of the jobs that may differ from the
    carry's pass; every other job must be the same object (None: compare all).
    ``done``: batch groups' completed ordinals, never placed again; ``completed``:
    the replicas that completed since the last pass (their ordinals already in ``done``),
    released without counting as failures (forge.core.kinds); ``queues``: quotas."""
    p = _Pass(jobs, nodes, pending, failures, failed, now, options, carry, jobs_changed)
    p.done, p.completed = done or {}, set(completed)
    p.failed |= p.completed  # released as failed ones are, but no failure
    p.release(bindings)
    p.drain()
    if options.rollouts:
        p.roll(rollouts, since, promoted, health if options.health_checks else None)
    if options.gangs:
        p.release_gangs()
    if options.topology and options.spread_down:
        p.spread_down()
    placing = p.place(capacity_changed or bool(p.plan.released), queues)
    preempted: set[GroupKey] = set()
    if placing.wanted and placing.placed < options.max_placements:
        preempted = p.preempt(placing)
    if placing.deferred or placing.tail:
        defer_groups(
            p.plan,
            placing.deferred,
            placing.tail,
            placing.tail_left,
            p.groups,
            pending,
            p.failures,
            p.just_failed,
            now,
            placing.capacity_freed,
        )
    p.settle(placing)
    return p.finish(preempted)


class _Pass(Releasing):
    """One pass's shared state; :func:`reconcile` runs its phases in order.

    With a carry, what did not change since its pass is reused: the group index and
    the placement queue are updated for the jobs that changed only (a steady pass
    over 50,000 jobs then costs what it places, not a walk over every job)."""

    def __init__(
        self,
        jobs: Mapping[str, Job],
        nodes: Mapping[str, Node],
        pending: Mapping[str, PendingEntry],
        failures: Mapping[str, FailureHistory],
        failed: Collection[str],
        now: float,
        options: ReconcileOptions,
        carry: Carry | None,
        jobs_changed: Collection[str] | None,
    ) -> None:
        self.jobs, self.nodes, self.pending, self.now = jobs, nodes, pending, now
        self.options, self.carry, self.jobs_changed = options, carry, jobs_changed
        self.given_failures = failures
        #: the failure histories as this pass leaves them (releases add to them)
        self.failures = dict(failures)
        self.failed = set(failed)
        self.completed: set[str] = set()
        self.done: Done = {}
        self.just_failed: set[str] = set()
        self.node_ok: dict[tuple[str, GroupKey], bool] = {}
        self.changed_jobs = carry.changed_jobs(jobs, jobs_changed) if carry is not None else []
        self.groups = self._index()
        self.release_work = 0
        if carry is None:
            reserve = options.effective_gpu_reserve
            self.cluster = Cluster(list(nodes.values()), gpu_reserve=reserve)
            self.plan = Plan(bindings={})
        else:
            self.cluster = carry.cluster
            # the reservation as a cluster built for this pass has it (a carry loaded
            # page by page starts without one; passes restore a lift when they end)
            self.cluster.reserve_gpus(options.effective_gpu_reserve)
            self.plan = Plan(bindings=carry.bindings)
        self.bound: Bound | dict[GroupKey, int] = {}
        self._workload: list[tuple[Request, float]] | None = None
        #: with budgets: replicas on draining nodes the release phase kept for the
        #: drain step, and the groups whose budget held something back this pass
        self.held: list[tuple[str, Binding]] | None = [] if options.disruption_budgets else None
        self.limited: set[GroupKey] = set()
        self.gate: Gate | None = None

    def _index(self) -> dict[GroupKey, Group]:
        carry, jobs = self.carry, self.jobs
        if carry is None or not (carry.groups or not jobs):
            return groups_of(jobs)
        if self.changed_jobs:
            if self.options.algorithm in ("fgd", "fgd2"):  # it reads the index's order
                return groups_of(jobs)
            update_groups(carry.groups, self.changed_jobs, carry.jobs, jobs)
        return carry.groups

    def _placer(self) -> Placer:
        options = self.options
        if self._workload is None:
            # fgd weighs nodes by the typical work: every desired replica, by shape
            fgd = options.algorithm in ("fgd", "fgd2")
            self._workload = (
                [(e.request, float(e.spec.scaling.desired)) for e in self.groups.values()]
                if fgd
                else []
            )
        return Placer(
            self.cluster,
            algorithm=options.algorithm,
            candidates=options.candidates,
            seed=options.seed,
            workload=self._workload,
        )

    def place(self, capacity_freed: bool, queues: Mapping[str, QueueSpec]) -> Placing:
        """2. Admit and place the missing replicas, in priority order
        (forge.core.admitting, forge.core.placing)."""
        options, carry, plan = self.options, self.carry, self.plan
        ledger = carry.ledger if carry is not None else None
        # after the releases: the gate charges what is still bound
        self.gate = gate(queues, plan, self.now, ledger, self.jobs, self.nodes, options.preemption)
        self.placer = self._placer()
        queue = carry.queue if carry is not None else None
        if queue is None:
            queue = Queue.build(self.jobs)
        elif self.changed_jobs:
            queue.update(self.changed_jobs, carry.jobs if carry is not None else {}, self.jobs)
        self.queue = queue
        plan.desired = queue.desired
        self.visit: list[tuple[SortKey, GroupKey]] = to_visit(
            self.groups, queue, self.changed_jobs, self.jobs, plan.dropped, self.bound, self.done
        )
        # The release phase cannot stop half-way (it accounts every binding), so it
        # is charged first; placement keeps at least a quarter of the budget so that
        # a pass always makes progress, however many bindings there are.
        work = options.max_work
        self.budget = work and max(work - self.release_work, work // 4)
        placing = Placing(
            plan=plan,
            groups=self.groups,
            placer=self.placer,
            pending=self.pending,
            failures=self.failures,
            just_failed=self.just_failed,
            bound=self.bound,
            options=options,
            now=self.now,
            capacity_freed=capacity_freed,
            budget=self.budget,
            parked=queue.parked,
            done=self.done,
            gate=self.gate,
        )
        placing.run(self.visit, queue.last_asking())
        self.stop: int | None = placing.stop
        return placing

    def preempt(self, placing: Placing) -> set[GroupKey]:
        """2b. Evict lower-priority replicas for those that found no node, then
        place what is unbound (forge.core.preempting); returns the victims' groups."""
        plan, carry, options, budget = self.plan, self.carry, self.options, self.budget
        bound = self.bound

        def bind(job: Job, g: TaskGroup, ordinal: int, b: Binding) -> None:
            plan.bindings[b.workload_id] = b
            plan.placed.append(b)

        phase = Phase(
            plan=plan,
            carry=carry,
            cluster=self.cluster,
            placer=self.placer,
            groups=self.groups,
            failures=self.failures,
            options=options,
            now=self.now,
            bound=lambda key: bound.get(key, 0),
            release=self._evicted,
            bind=bind,
            ledger=self.disruption_left if options.disruption_budgets else None,
            gate=self.gate,
        )
        phase.floor = carry.floor if carry is not None else floor_of(plan, self.groups)
        spent = self.placer.work + placing.visited
        phase.run(placing.wanted, max(budget - spent, 1) if budget else 0)
        placing.placed += len(plan.preemptions)
        if plan.preemptions:
            plan.freed = True
            left = max(budget - spent - phase.work, 1) if budget else 0
            room = options.max_placements - placing.placed
            # (the old branch, ``refill_waiting`` off, leaves the waiters their backoff)
            waiting = None
            if options.refill_waiting:
                waiting, walked = waiters(placing.waited, self.groups, self.pending, plan, left)
                placing.visited += walked
            placing.placed += phase.refill(placing.wanted, self._placer(), room, left, waiting)
        placing.visited += phase.work
        return phase.preempted_groups

    def _evicted(self, wid: str, b: Binding, reason: str) -> None:
        self.plan.released.append((wid, reason))
        self.plan.dropped.append(b)
        if self.options.disruption_budgets and isinstance(self.bound, dict):
            self.bound[(b.job, b.group)] -= 1  # (a carry's count follows its drop)

    def settle(self, placing: Placing) -> None:
        """3. Keep the failure histories still needed; when to wake; the pass's work."""
        plan, groups, now, options = self.plan, self.groups, self.now, self.options
        cooldown = options.preemption_cooldown
        # failure histories only for replicas that are still desired
        plan.failures = {
            w: h
            for w, h in self.failures.items()
            if still_desired(w, groups)
            and (
                (h.times and h.times[-1] > now - reschedule_window(w, groups))
                or h.cooling(now, cooldown)
                or h.fatal
            )
        }
        wake: float | None = now if plan.deferred or plan.freed else None
        for p in plan.pending.values():
            if p.kind not in ("deferred", "failed") and p.not_before > now:
                wake = p.not_before if wake is None else min(wake, p.not_before)
        if plan.rollouts is not None and plan.rollouts.wake is not None:
            wake = plan.rollouts.wake if wake is None else min(wake, plan.rollouts.wake)
        limited = self.limited
        if limited and any((b.job, b.group) in limited for b in plan.placed):
            # a group whose budget held a drain or a wave back got a replica bound
            # again: the next pass may let the next one go
            wake = now
            plan.again = True
        plan.next_wake = wake
        plan.released.sort()
        plan.work = self.placer.work + placing.visited + self.release_work
        # a lift holds for this pass only: the carry leaves with the reservation restored
        self.cluster.reserve_gpus(options.effective_gpu_reserve)

    def finish(self, preempted: set[GroupKey]) -> Plan:
        """Hand the next pass its carry: what this one left, indexed."""
        plan, groups, jobs, queue, carry = self.plan, self.groups, self.jobs, self.queue, self.carry
        fresh = self.gate.fresh if self.gate is not None else {}
        if carry is None:
            carry = Carry.build(jobs, self.nodes, self.cluster, plan.bindings, fresh)
            carry.draining = dict.fromkeys(plan.drain_held)
            queue.incomplete = incomplete(groups, carry.by_group, groups, self.done)
            queue.order, queue.visiting = None, []  # not in order: the next pass sorts them
        else:
            if self.jobs_changed is None:  # first: a placement is charged to its job's queue
                carry.jobs = dict(jobs)
            else:
                carry.take_jobs(jobs, self.changed_jobs)
            carry.ledger.fresh = fresh
            for b in plan.placed:
                carry.add(b.workload_id, b)
                carry.floor = min(carry.floor, groups[(b.job, b.group)].job.priority)
            for j in self.changed_jobs:  # a job's priority may have dropped
                if j in jobs:
                    carry.floor = min(carry.floor, jobs[j].priority)
            carry.nodes = dict(self.nodes)
            # Only the groups the pass got to can have been completed; those it
            # deferred whole are as incomplete as they were (and stay in order)
            stop = len(self.visit) if self.stop is None else self.stop
            keys = [k for _, k in self.visit[:stop]]
            keys.extend(sorted(preempted))  # the victims' groups now miss a replica
            queue.incomplete = incomplete(keys, carry.by_group, groups, self.done)
            queue.incomplete.update(k for _, k in self.visit[stop:])
            queue.order = ordered(queue, queue.incomplete, groups)
        carry.groups = groups
        carry.queue = queue
        carry.ledger.queued = self.gate.tally() if self.gate is not None else {}
        carry.ledger.fresh = {}
        if plan.rollouts is not None:
            # every group was looked at, or those that could have changed: from here
            # on only those (and the groups left with unstamped bindings) need be
            carry.versions_seen = True
            carry.roll_check = set(plan.rollouts.unstamped)
        else:
            carry.versions_seen = False  # what this pass placed records no version
        plan.carry = carry
        return plan
