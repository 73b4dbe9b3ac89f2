"""One reconcile pass as a pure function: desired + actual + now -> Plan.

Like Nomad's reconciler, this module decides *what* happens to each replica
(keep, release, place, wait) and leaves *where* to :mod:`forge.core.placement`. It
reads no clock (``now`` is a parameter), draws no unseeded randomness and iterates
only in deterministic orders, so the cluster workflow can run it as workflow code
and get the same plan on replay, on any machine.

The order of a pass:

1. **release** bindings that are no longer desired (job stopped, scaled down,
   spec changed), sit on a lost, draining, removed or shrunken node, or failed;
2. **place** missing replicas in priority order, then job id, group order,
   ordinal, skipping those still waiting out a backoff or a reschedule delay
   (placement version 2: within a priority, jobs that ask GPUs first);
3. record who is **pending** and why, and when the pass must run again.

Backoff: a replica that found no node waits ``base * 2**(attempts-1)`` seconds
(1, 2, 4 ... capped at 300 by default). A pass that frees or adds capacity
(a release, or a node joining: ``capacity_changed``) makes every backed-off
replica eligible at once, like Kubernetes' queueing hints moving pods out of the
unschedulable queue or Nomad unblocking blocked evaluations: waiting out a timer
while a node sits idle would break "everything that fits is placed".

Failed replicas follow their group's reschedule policy: at most ``attempts``
reschedules per ``interval``, each after a delay grown by the policy's delay
function, and the next placement avoids the node it failed on when another fits.

The options and results live in :mod:`forge.core.plan`, the release phase and the
carry in :mod:`forge.core.release`; all are importable from here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from forge.core.models import (
    Constraint,
    DelayFunction,
    Job,
    Node,
    Request,
    ReschedulePolicy,
    TaskGroup,
    workload_id,
)
from forge.core.placement import Binding, Choice, Cluster, Diagnosis, Placer, diagnosis_text
from forge.core.plan import (
    DEFAULT_GPU_RESERVE,
    Algorithm,
    FailureHistory,
    PendingEntry,
    Plan,
    ReconcileOptions,
)
from forge.core.preempting import Phase, Wanted
from forge.core.queue import Queue, SortKey, sort_key
from forge.core.release import (
    Carry,
    Groups,
    groups_of,
    release_all,
    release_changed,
    update_groups,
)
from forge.core.rolling import GroupRollout, plan_rollouts

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
#: Work units one binding costs the release phase (a node check costs one).
RELEASE_UNITS = 2
#: The work budget the cluster workflow gives a pass: ~0.4 s of planning on an idle
#: core (a unit costs ~1.3 us: a node checked or scored), leaving room under
#: Temporal's 2 s activation limit on a loaded machine.
MAX_WORK = 300_000
#: What a replica tried and left pending costs in that budget (measured: about eight
#: node checks' time), so a pass retrying 30,000 unplaceable replicas defers.
PENDING_UNITS = 8


def backoff_delay(attempts: int, options: ReconcileOptions) -> float:
    """1, 2, 4, ... seconds (for base 1), capped."""
    if attempts <= 0:
        return 0.0
    exp = min(attempts - 1, 62)
    return float(min(options.backoff_cap, options.backoff_base * (2**exp)))


def reschedule_delay(policy: ReschedulePolicy, reschedules: int) -> float:
    """Delay before the n-th reschedule (n >= 1) under a group's policy."""
    n = max(1, reschedules)
    if policy.delay_function is DelayFunction.CONSTANT:
        d = policy.delay
    elif policy.delay_function is DelayFunction.EXPONENTIAL:
        d = policy.delay * (2 ** min(n - 1, 62))
    else:
        a, b = 1, 1
        for _ in range(min(n - 1, 90)):
            a, b = b, a + b
        d = policy.delay * a
    return float(min(d, policy.max_delay))


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
) -> Plan:
    """Plan one pass. Inputs are not mutated (except ``carry``, which the pass
    updates and returns as ``plan.carry``; with a carry, ``bindings`` is ignored:
    the carry's are the current ones). Mapping iteration orders must be
    deterministic (the workflow builds its dicts deterministically).
    ``jobs_changed`` (with a carry): the ids of the jobs that may differ from the
    carry's pass; every other job must be the same object (None: compare all)."""
    # With a carry, what did not change since its pass is reused: the group index
    # and the placement queue are updated for the jobs that changed only (a steady
    # pass over 50,000 jobs then costs what it places, not a walk over every job).
    changed_jobs = carry.changed_jobs(jobs, jobs_changed) if carry is not None else []
    if carry is not None and (carry.groups or not jobs):
        groups = carry.groups
        if changed_jobs:
            if options.algorithm in ("fgd", "fgd2"):  # it reads the index's order
                groups = groups_of(jobs)
            else:
                update_groups(groups, changed_jobs, carry.jobs, jobs)
    else:
        groups = groups_of(jobs)
    failed_set = set(failed)
    just_failed: set[str] = set()
    new_failures = dict(failures)
    node_ok: dict[tuple[str, tuple[str, str]], bool] = {}

    def release(wid: str, b: Binding, reason: str) -> None:
        plan.released.append((wid, reason))
        plan.dropped.append(b)
        if reason == "failed":
            entry = groups.get((b.job, b.group))
            just_failed.add(wid)
            past = failures.get(wid, FailureHistory())
            window = entry[1].reschedule.interval if entry else 0.0
            times = (*tuple(t for t in past.times if t > now - window), now)
            new_failures[wid] = FailureHistory(times=times[-64:], last_node=b.node)

    # 1. release --------------------------------------------------------------------
    if carry is None:
        cluster = Cluster(list(nodes.values()), gpu_reserve=options.effective_gpu_reserve)
        plan = Plan(bindings={})
        checked = len(bindings)
        bound_per_group: _Bound | dict[tuple[str, str], int] = release_all(
            plan, bindings, groups, cluster, failed_set, node_ok, release, options.rollouts
        )
    else:
        cluster = carry.cluster
        # the reservation as a cluster built for this pass has it (a carry loaded
        # page by page starts without one; passes restore a lift when they end)
        cluster.reserve_gpus(options.effective_gpu_reserve)
        plan = Plan(bindings=carry.bindings)
        checked = release_changed(
            carry, jobs, nodes, groups, changed_jobs, failed_set, node_ok, release, options.rollouts
        )
        bound_per_group = _Bound(carry.by_group)

    # 1b. rolling updates: old versions replaced in waves (forge.core.rolling) -------
    if options.rollouts:
        pairs = zip(plan.released, plan.dropped, strict=True)
        failed_now = {w: b for (w, why), b in pairs if why == "failed"}
        # A group with no binding has no replica off its version; one with bindings
        # all compared with their group's version before (versions_seen), whose job
        # did not change, has none either: neither needs looking at (beside the
        # groups rolling now, which plan_rollouts adds).
        if carry is not None and carry.versions_seen:
            only = set(carry.roll_check)
            only.update((j, g.name) for j in changed_jobs if j in jobs for g in jobs[j].groups)
        else:
            only = {k for k, n in bound_per_group.items() if n}  # every bound group
        plan.rollouts = plan_rollouts(
            groups=groups,
            bindings=plan.bindings,
            rollouts=rollouts,
            since=since,
            failed=failed_now,
            promoted=promoted,
            health=health if options.health_checks else None,
            now=now,
            only=only,
        )
        for wid in plan.rollouts.stop:
            b = plan.bindings[wid]
            cluster.by_id[b.node].unhold(b)
            if carry is not None:
                carry.drop(wid, b)  # (the group's bound count with it)
            else:
                del plan.bindings[wid]
                assert isinstance(bound_per_group, dict)
                bound_per_group[(b.job, b.group)] -= 1
            release(wid, b, "rollout")

    capacity_freed = capacity_changed or bool(plan.released)
    workload: list[tuple[Request, float]] = []
    if options.algorithm in ("fgd", "fgd2"):
        # the typical work: every desired replica of the jobs held, by shape
        workload = [(r, float(g.scaling.desired)) for _, g, r in groups.values()]
    placer = Placer(
        cluster,
        algorithm=options.algorithm,
        candidates=options.candidates,
        seed=options.seed,
        version=options.placement_version,
        workload=workload,
    )

    # 2. place, in priority order ----------------------------------------------------
    version = options.placement_version
    queue = carry.queue if carry is not None else None
    if queue is None or queue.version != version:
        queue = Queue.build(jobs, version)
    elif changed_jobs:
        queue.update(changed_jobs, carry.jobs if carry is not None else {}, jobs)
    plan.desired = queue.desired
    visit = _to_visit(groups, queue, changed_jobs, jobs, plan.dropped, bound_per_group, version)
    last_asking = queue.last_asking()
    # The reservation keeps GPU nodes for GPU work that is waiting. Once the last
    # job asking GPUs has had its turn and no GPU replica is left unbound, there
    # is none: the rest of the pass may use all the cpu and memory (else a tight
    # cluster whose GPUs are not all wanted would leave work pending for nothing).
    lift_checked = not placer.reserving  # the boundary is checked once, as a walk would
    gpu_waiting = False  # a GPU replica of this pass that some node could take is unbound

    # per class and pass: a pending class's answers do not change within the pass
    # (could_ever_fit looks at total capacity; a diagnosis is formatted once). Keyed
    # by identity: a group's request and constraints, and a class's diagnosis, are
    # one object each for the whole pass (held by ``groups`` and the placer).
    ever_fits: dict[tuple[int, int], bool] = {}
    texts: dict[int, tuple[Diagnosis, str]] = {}

    def waits_for_gpu(req: Request, constraints: tuple[Constraint, ...]) -> bool:
        if not (req.gpu and placer.reserving):
            return False
        key = (id(req), id(constraints))
        fits = ever_fits.get(key)
        if fits is None:
            fits = ever_fits[key] = placer.could_ever_fit(req, constraints)
        return fits

    # replicas without GPUs refused while the reservation held: tried again if it is
    # lifted later in the pass, so nothing is left pending that fits (invariant 4)
    held_back: list[tuple[str, Job, TaskGroup, int, Request]] = []
    # replicas that found no node, in placement order: preemption may make room
    wanted: list[Wanted] = []
    placed_count = 0
    deferred = PendingEntry(
        kind="deferred",
        not_before=now,
        reasons=("deferred to the next pass (per-pass placement or work limit)",),
    )
    backoff_entries: dict[tuple[int, str], PendingEntry] = {}
    # With a work budget (the workflow's, under a patch), a pass that reaches a limit
    # stops looking at replicas one by one: the groups it did not get to are
    # deferred whole, so the pass's cost stays bounded by the budget, not by how
    # much is pending.
    release_work = RELEASE_UNITS * checked
    # The release phase cannot stop half-way (it accounts every binding), so it is
    # charged first; placement keeps at least a quarter of the budget so that a
    # pass always makes progress, however many bindings there are.
    budget = options.max_work and max(options.max_work - release_work, options.max_work // 4)
    visited = 0
    stopped = False
    deferred_groups: list[tuple[str, str, int]] = []  # (job, group, replicas left unbound)
    for order, key in visit:
        if not lift_checked and (last_asking is None or order > last_asking):
            # past the last job asking GPUs (a walk over every job checks there once)
            lift_checked = True
            if placer.reserving and not gpu_waiting:
                placer.lift_reservation()
        job, g, req = groups[key]
        constraints = g.constraints
        bound = bound_per_group.get(key, 0)
        if stopped:
            deferred_groups.append((job.id, g.name, g.scaling.desired - bound))
            continue
        waiting = 0
        for ordinal in range(g.scaling.desired):
            wid = workload_id(job.id, g.name, ordinal)
            if wid in plan.bindings:
                continue
            visited += 1
            prev = pending.get(wid)
            hist = new_failures.get(wid)
            wait = _waiting(prev, hist, g.reschedule, wid in just_failed, now, capacity_freed)
            if wait is not None:
                plan.pending[wid] = wait
                waiting += 1
                gpu_waiting = gpu_waiting or waits_for_gpu(req, constraints)
                continue
            if budget and (
                placed_count >= options.max_placements or placer.work + visited >= budget
            ):
                stopped = True
                gpu_waiting = gpu_waiting or waits_for_gpu(req, constraints)
                # this group's replicas from here on; those before are settled
                deferred_groups.append((job.id, g.name, g.scaling.desired - bound - waiting))
                break
            if placed_count >= options.max_placements:
                plan.deferred += 1
                plan.pending[wid] = deferred  # one shared instance: 100k of them are cheap
                gpu_waiting = gpu_waiting or waits_for_gpu(req, constraints)
                continue
            avoid = hist.last_node if hist else None
            choice = placer.place(req, constraints, avoid=avoid)
            if choice is None:
                if not req.gpu and placer.reserving:
                    held_back.append((wid, job, g, ordinal, req))
                if options.preemption:
                    wanted.append(Wanted(wid, job, g, ordinal, req))
                attempts = (prev.attempts if prev and prev.kind == "backoff" else 0) + 1
                diagnosis = placer.why_not(req, constraints)
                said = texts.get(id(diagnosis))
                if said is None:  # (the diagnosis is kept with its text: alive)
                    said = texts[id(diagnosis)] = (diagnosis, diagnosis_text(diagnosis))
                why = said[1]
                shared = backoff_entries.get((attempts, why))
                if shared is None:
                    shared = backoff_entries[(attempts, why)] = PendingEntry(
                        kind="backoff",
                        attempts=attempts,
                        not_before=now + backoff_delay(attempts, options),
                        reasons=(why,),
                    )
                plan.pending[wid] = shared
                waiting += 1
                visited += options.pending_units - 1  # (one was counted above)
                gpu_waiting = gpu_waiting or waits_for_gpu(req, constraints)
                continue
            b = _binding(job, g, ordinal, choice, req, options)
            plan.bindings[wid] = b
            plan.placed.append(b)
            placed_count += 1
            bound += 1
    if held_back and placer.reserving and not gpu_waiting:
        placer.lift_reservation()  # the last job was one asking GPUs, and all are bound
    # GPU placements after a refusal may also have freed reservation (the placer
    # re-admits those nodes), so the held-back replicas are tried once more anyway
    for wid, job, g, ordinal, req in held_back:
        if placed_count >= options.max_placements:
            break  # they keep their backoff entries; capacity_changed wakes them
        hist = new_failures.get(wid)
        choice = placer.place(req, g.constraints, avoid=hist.last_node if hist else None)
        if choice is None:
            continue
        b = _binding(job, g, ordinal, choice, req, options)
        plan.bindings[wid] = b
        plan.placed.append(b)
        del plan.pending[wid]
        placed_count += 1
    preempted: set[tuple[str, str]] = set()
    if wanted and placed_count < options.max_placements:
        phase = _preemption(plan, carry, cluster, placer, groups, new_failures, options, now)
        phase.floor = carry.floor if carry is not None else _floor(plan, groups)
        phase.bound = lambda key: bound_per_group.get(key, 0)
        left = budget - placer.work - visited if budget else 0
        phase.run(wanted, max(left, 1) if budget else 0)
        placed_count += len(plan.preemptions)
        if plan.preemptions:
            again = Placer(
                cluster,
                algorithm=options.algorithm,
                candidates=options.candidates,
                seed=options.seed,
                version=options.placement_version,
                workload=workload,
            )
            left = budget - placer.work - visited - phase.work if budget else 0
            room = options.max_placements - placed_count
            placed_count += phase.refill(wanted, again, room, max(left, 1) if budget else 0)
        visited += phase.work
        preempted = phase.preempted_groups
    if deferred_groups:
        _defer_groups(
            plan, deferred_groups, groups, pending, new_failures, just_failed, now, capacity_freed
        )

    # failure histories only for replicas that are still desired
    cooldown = options.preemption_cooldown
    plan.failures = {
        w: h
        for w, h in new_failures.items()
        if _still_desired(w, groups)
        and ((h.times and h.times[-1] > now - _window(w, groups)) or h.cooling(now, cooldown))
    }

    # 3. when to wake ------------------------------------------------------------------
    wake: float | None = now if plan.deferred else None
    for p in plan.pending.values():
        if p.kind != "deferred" and p.not_before > now:
            wake = p.not_before if wake is None else min(wake, p.not_before)
    if plan.rollouts is not None and plan.rollouts.wake is not None:
        wake = plan.rollouts.wake if wake is None else min(wake, plan.rollouts.wake)
    plan.next_wake = wake
    plan.released.sort()
    plan.work = placer.work + visited + release_work
    # a lift holds for this pass only: the carry leaves with the reservation restored
    cluster.reserve_gpus(options.effective_gpu_reserve)
    if carry is None:
        carry = Carry.build(jobs, nodes, cluster, plan.bindings)
        queue.incomplete = _incomplete(groups, carry.by_group, groups)
        preempted = set()
    else:
        for b in plan.placed:
            carry.add(b.workload_id, b)
            carry.floor = min(carry.floor, groups[(b.job, b.group)][0].priority)
        for j in changed_jobs:  # a job's priority may have dropped
            if j in jobs:
                carry.floor = min(carry.floor, jobs[j].priority)
        if jobs_changed is None:
            carry.jobs = dict(jobs)
        else:
            carry.take_jobs(jobs, changed_jobs)
        carry.nodes = dict(nodes)
        keys = [k for _, k in visit]
        keys.extend(sorted(preempted))  # the victims' groups now miss a replica
        queue.incomplete = _incomplete(keys, carry.by_group, groups)
    carry.groups = groups
    carry.queue = queue
    if plan.rollouts is not None:
        # every group was looked at, or those that could have changed: from here
        # on only those (and the groups left with unstamped bindings) need be
        carry.versions_seen = True
        carry.roll_check = set(plan.rollouts.unstamped)
    else:
        carry.versions_seen = False  # what this pass placed records no version
    plan.carry = carry
    return plan


class _Bound:
    """A carried pass's bound count per group, read from the carry's index (which
    the release phase and rollout stops keep current) instead of copied whole."""

    __slots__ = ("by_group",)

    def __init__(self, by_group: Mapping[tuple[str, str], Mapping[str, None]]) -> None:
        self.by_group = by_group

    def get(self, key: tuple[str, str], default: int = 0) -> int:
        held = self.by_group.get(key)
        return len(held) if held else default

    def items(self) -> Iterable[tuple[tuple[str, str], int]]:
        return ((k, len(v)) for k, v in self.by_group.items())


def _to_visit(
    groups: Groups,
    queue: Queue,
    changed_jobs: list[str],
    jobs: Mapping[str, Job],
    dropped: list[Binding],
    bound: _Bound | dict[tuple[str, str], int],
    version: int,
) -> list[tuple[SortKey, tuple[str, str]]]:
    """The groups this pass may place into, in placement order (job sort key, then
    the group's place in its job): those left incomplete by the last pass, those of
    changed jobs and those that lost a binding now, less the ones fully bound. A
    walk over every job in order would place into exactly these, in this order."""
    if queue.incomplete is None:
        keys: set[tuple[str, str]] = set(groups)
    else:
        keys = set(queue.incomplete)
        keys.update((j, g.name) for j in changed_jobs if j in jobs for g in jobs[j].groups)
        keys.update((b.job, b.group) for b in dropped)
    out = []
    for key in keys:
        entry = groups.get(key)
        if entry is None:
            continue
        job, g, _ = entry
        if bound.get(key, 0) >= g.scaling.desired:
            continue
        names = [x.name for x in job.groups]
        out.append((sort_key(job, version), names.index(g.name), key))
    out.sort()
    return [(order, key) for order, _, key in out]


def _incomplete(
    keys: Iterable[tuple[str, str]],
    by_group: Mapping[tuple[str, str], Mapping[str, None]],
    groups: Groups,
) -> set[tuple[str, str]]:
    """The groups among ``keys`` with fewer bindings than replicas desired."""
    out = set()
    for key in keys:
        entry = groups.get(key)
        if entry is not None and len(by_group.get(key) or ()) < entry[1].scaling.desired:
            out.add(key)
    return out


def _defer_groups(
    plan: Plan,
    deferred: list[tuple[str, str, int]],
    groups: Mapping[tuple[str, str], tuple[Job, TaskGroup, Request]],
    pending: Mapping[str, PendingEntry],
    failures: Mapping[str, FailureHistory],
    just_failed: set[str],
    now: float,
    capacity_freed: bool,
) -> None:
    """Leave the unbound replicas of ``deferred`` groups for the next pass, in
    O(groups + pending) rather than one step per replica: they are counted, not
    listed (a missing replica without an entry is simply tried next time), their
    earlier entries (backoff attempts, reschedule delays) are kept, and one that
    failed in this very pass still gets its reschedule policy applied."""
    keys = {(job_id, group) for job_id, group, _ in deferred}
    kept = 0
    # the entries a one-by-one pass would have kept: the same rule, _waiting
    for wid in sorted(just_failed) + [w for w in pending if w not in just_failed]:
        if wid in plan.pending or wid in plan.bindings:
            continue
        job_id, group, ordinal = wid.rsplit("/", 2)
        entry = groups.get((job_id, group))
        if (job_id, group) not in keys or entry is None:
            continue
        policy = entry[1].reschedule
        wait = _waiting(
            pending.get(wid), failures.get(wid), policy, wid in just_failed, now, capacity_freed
        )
        if wait is not None and int(ordinal) < entry[1].scaling.desired:
            plan.pending[wid] = wait
            kept += 1
    plan.deferred += sum(n for _, _, n in deferred) - kept


def _waiting(
    prev: PendingEntry | None,
    hist: FailureHistory | None,
    policy: ReschedulePolicy,
    just_failed: bool,
    now: float,
    capacity_freed: bool,
) -> PendingEntry | None:
    """The entry to keep when this replica must not be tried in this pass."""
    if just_failed and hist is not None:
        # it failed in this very pass: apply the reschedule policy
        recent = [t for t in hist.times if t > now - policy.interval]
        if not policy.unlimited and len(recent) > policy.attempts:
            return PendingEntry(
                kind="exhausted",
                attempts=len(recent),
                not_before=recent[0] + policy.interval,
                reasons=(
                    f"failed {len(recent)} times within {policy.interval:g}s; "
                    f"reschedule attempts ({policy.attempts}) exhausted",
                ),
            )
        delay = reschedule_delay(policy, len(recent))
        if delay <= 0:
            # no delay: try it in this very pass (a "reschedule" entry with
            # not_before == now would never be woken: wake times are > now)
            return None
        return PendingEntry(
            kind="reschedule",
            attempts=len(recent),
            not_before=now + delay,
            reasons=(f"failed on {hist.last_node}; rescheduling in {delay:g}s",),
        )
    if prev is None or now >= prev.not_before:
        return None
    if prev.kind == "backoff" and capacity_freed:
        return None
    return prev


def _still_desired(
    wid: str, groups: Mapping[tuple[str, str], tuple[Job, TaskGroup, Request]]
) -> bool:
    job, group, ordinal = wid.rsplit("/", 2)
    entry = groups.get((job, group))
    return entry is not None and int(ordinal) < entry[1].scaling.desired


def _window(wid: str, groups: Mapping[tuple[str, str], tuple[Job, TaskGroup, Request]]) -> float:
    job, group, _ = wid.rsplit("/", 2)
    return groups[(job, group)][1].reschedule.interval


def _floor(plan: Plan, groups: Groups) -> int:
    """The lowest job priority among the bindings a pass kept (its placements are
    no victims): a pass without a carry walks its bindings anyway."""
    placed = {b.workload_id for b in plan.placed}
    prios = [
        groups[(b.job, b.group)][0].priority for w, b in plan.bindings.items() if w not in placed
    ]
    return min(prios, default=101)


def _preemption(
    plan: Plan,
    carry: Carry | None,
    cluster: Cluster,
    placer: Placer,
    groups: Groups,
    failures: dict[str, FailureHistory],
    options: ReconcileOptions,
    now: float,
) -> Phase:
    """The pass's preemption phase (forge.core.preempting), wired to the plan."""

    def release(wid: str, b: Binding, reason: str) -> None:
        plan.released.append((wid, reason))
        plan.dropped.append(b)

    def bind(job: Job, g: TaskGroup, ordinal: int, b: Binding) -> None:
        plan.bindings[b.workload_id] = b
        plan.placed.append(b)

    return Phase(
        plan=plan,
        carry=carry,
        cluster=cluster,
        placer=placer,
        groups=groups,
        failures=failures,
        options=options,
        now=now,
        bound=lambda key: 0,
        release=release,
        bind=bind,
    )


def _binding(
    job: Job, g: TaskGroup, ordinal: int, choice: Choice, req: Request, options: ReconcileOptions
) -> Binding:
    """The binding a placement makes (with rollouts on, recording the group version)."""
    return Binding(
        job.id,
        g.name,
        ordinal,
        choice.node.id,
        choice.gpu_ids,
        req.cpu,
        req.memory,
        gpu_milli=req.gpu_milli,
        version=g.version if options.rollouts else "",
    )
