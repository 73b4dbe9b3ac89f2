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
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from forge.core.models import (
    AssignmentStatus,
    Constraint,
    DelayFunction,
    Job,
    Node,
    NodeState,
    Request,
    ReschedulePolicy,
    TaskGroup,
    workload_id,
)
from forge.core.placement import Binding, Cluster, NodeAlloc, Placer
from forge.core.placement.scorers import Algorithm
from forge.core.rolling import GroupRollout, RolloutPlan, plan_rollouts

__all__ = [
    "DEFAULT_GPU_RESERVE",
    "DEFAULT_MAX_WORK",
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


#: The GPU reservation of placement version 2, per mille of each free GPU's share
#: of its node's cpu and memory. bench/gpu_placement.py measured 0-1000: 250-1000
#: all meet the original on every figure; 1000 strands the fewest GPUs and keeps
#: a node added for a pending GPU job whole for it (README "Benchmarks").
DEFAULT_GPU_RESERVE = 1000


class ReconcileOptions(BaseModel):
    """How a pass places. Every field that changes placement choices defaults to the
    behaviour old workflow histories were made with: the workflow turns new
    behaviour on under ``workflow.patched`` so replay never diverges.

    ``placement_version`` 2: work that asks no GPU may use a GPU node's cpu and
    memory only beyond its free GPUs' reservation (``gpu_reserve`` per mille of
    each free GPU's share; :data:`DEFAULT_GPU_RESERVE` unless set), and binpack /
    spread drop the GpuPreserve preference the reservation replaces.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: Algorithm = "binpack"
    candidates: int = Field(default=8, ge=0, description="nodes scored per replica; 0 = all")
    backoff_base: float = Field(default=1.0, gt=0)
    backoff_cap: float = Field(default=300.0, gt=0)
    max_placements: int = Field(
        default=20_000, ge=1, description="placements per pass; the rest go next pass"
    )
    max_work: int = Field(
        default=0,
        ge=0,
        description="node checks and scores per pass before the rest is deferred to the "
        "next pass (0 = no limit); the workflow sets it, so one pass stays far inside "
        "Temporal's 2 s activation limit whatever the cluster",
    )
    seed: int = 0
    placement_version: int = Field(default=1, ge=1, le=2)
    gpu_reserve: int | None = Field(
        default=None, ge=0, le=1000, description="per mille; None: by placement_version"
    )
    rollouts: bool = Field(
        default=False,
        description="rolling updates (forge.core.rolling): a changed task spec replaces "
        "replicas in waves instead of releasing them all; placements record their version",
    )

    @property
    def effective_gpu_reserve(self) -> int:
        if self.gpu_reserve is not None:
            return self.gpu_reserve
        return DEFAULT_GPU_RESERVE if self.placement_version >= 2 else 0


class PendingEntry(BaseModel):
    """Why a desired replica is unbound and when it may be tried again.

    kind: ``backoff`` (no node fit), ``reschedule`` (failed; waiting the policy's
    delay), ``exhausted`` (failed too often within the policy's interval).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["backoff", "reschedule", "exhausted", "deferred"] = "backoff"
    attempts: int = 0
    not_before: float = 0.0
    reasons: tuple[str, ...] = ()


class FailureHistory(BaseModel):
    """Recent failures of one replica, for its group's reschedule policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    times: tuple[float, ...] = ()
    last_node: str = ""


@dataclass(slots=True)
class Plan:
    """The outcome of a pass. ``bindings`` is the complete new actual state."""

    bindings: dict[str, Binding]
    placed: list[Binding] = field(default_factory=list)
    released: list[tuple[str, str]] = field(default_factory=list)  # (workload id, reason)
    pending: dict[str, PendingEntry] = field(default_factory=dict)
    failures: dict[str, FailureHistory] = field(default_factory=dict)
    next_wake: float | None = None
    deferred: int = 0
    desired: int = 0
    work: int = 0  # node checks and scores the pass spent (bounded by max_work)
    dropped: list[Binding] = field(default_factory=list)  # the bindings ``released`` names
    carry: Carry | None = None  # hand it to the next pass (see Carry)
    rollouts: RolloutPlan | None = None  # with options.rollouts: what rolling decided

    @property
    def changed(self) -> bool:
        return bool(self.placed or self.released)


@dataclass(slots=True)
class Carry:
    """What a pass leaves the next, so the next need not walk every binding.

    The nodes' allocations and the bindings, indexed by node and by group, as the
    pass left them, with the job and node objects it planned against. The next pass
    compares those objects with its inputs *by identity* (the workflow replaces an
    object when it changes, and keeps it otherwise) and re-checks only the bindings
    of changed groups, changed nodes and failed replicas: a steady pass over 300,000
    bindings costs what changed, not 300,000 checks. Reconcile updates a carry in
    place, and its ``bindings`` is the plan's; the caller hands ``plan.carry`` to the
    next pass, or None to start over (then every binding is checked, as a pass
    without a carry always does).
    """

    jobs: dict[str, Job]
    nodes: dict[str, Node]
    cluster: Cluster
    bindings: dict[str, Binding]
    by_node: dict[str, dict[str, None]]
    by_group: dict[tuple[str, str], dict[str, None]]
    # bindings a load found invalid (with why): the next pass releases them
    stale: list[tuple[str, Binding, str]] = field(default_factory=list)
    groups: dict[tuple[str, str], tuple[Job, TaskGroup, Request]] = field(default_factory=dict)
    rolling: bool = False  # loaded bindings of a changed spec are kept for the rollout

    @classmethod
    def start(
        cls, jobs: Mapping[str, Job], nodes: Mapping[str, Node], *, rolling: bool = False
    ) -> Carry:
        """An empty carry to :meth:`absorb` loaded bindings into, page by page, so
        a new run never checks every binding in one activation."""
        carry = cls(dict(jobs), dict(nodes), Cluster(list(nodes.values())), {}, {}, {})
        carry.groups = _groups(jobs)
        carry.rolling = rolling
        return carry

    def absorb(self, wid: str, b: Binding) -> None:
        """Hold a loaded binding, checked as a pass without a carry would (in the
        same order: the store's), or keep it for the next pass to release."""
        alloc = self.cluster.by_id.get(b.node)
        entry = self.groups.get((b.job, b.group))
        reason = _reason(wid, b, entry, alloc, set(), {}, self.rolling)
        if reason is None:
            assert alloc is not None
            if alloc.hold(b):
                self.add(wid, b)
                return
            reason = "node capacity changed"
        self.stale.append((wid, b, reason))

    @classmethod
    def build(
        cls,
        jobs: Mapping[str, Job],
        nodes: Mapping[str, Node],
        cluster: Cluster,
        bindings: dict[str, Binding],
    ) -> Carry:
        by_node: dict[str, dict[str, None]] = {}
        by_group: dict[tuple[str, str], dict[str, None]] = {}
        for wid, b in bindings.items():
            by_node.setdefault(b.node, {})[wid] = None
            by_group.setdefault((b.job, b.group), {})[wid] = None
        return cls(dict(jobs), dict(nodes), cluster, bindings, by_node, by_group)

    def add(self, wid: str, b: Binding) -> None:
        self.bindings[wid] = b
        self.by_node.setdefault(b.node, {})[wid] = None
        self.by_group.setdefault((b.job, b.group), {})[wid] = None

    def drop(self, wid: str, b: Binding) -> None:
        del self.bindings[wid]
        self.by_node[b.node].pop(wid, None)
        self.by_group[(b.job, b.group)].pop(wid, None)


DEFAULT_OPTIONS = ReconcileOptions()
#: Work units one binding costs the release phase (a node check costs one).
RELEASE_UNITS = 2
#: The budget the cluster workflow gives a pass: about 0.3 s of planning on a slow
#: core, a small part of Temporal's 2 s activation limit.
DEFAULT_MAX_WORK = 800_000


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
) -> Plan:
    """Plan one pass. Inputs are not mutated (except ``carry``, which the pass
    updates and returns as ``plan.carry``; with a carry, ``bindings`` is ignored:
    the carry's are the current ones). Mapping iteration orders must be
    deterministic (the workflow builds its dicts deterministically)."""
    groups = _groups(jobs)
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
    if options.placement_version >= 2:
        # the GPU reservation changes within a pass (lifted, re-admitted nodes):
        # placement version 2 starts from the bindings every pass
        carry = None
    if carry is None:
        cluster = Cluster(list(nodes.values()), gpu_reserve=options.effective_gpu_reserve)
        plan = Plan(bindings={})
        checked = len(bindings)
        bound_per_group = _release_all(
            plan, bindings, groups, cluster, failed_set, node_ok, release, options.rollouts
        )
    else:
        cluster = carry.cluster
        plan = Plan(bindings=carry.bindings)
        checked = _release_changed(
            carry, jobs, nodes, groups, failed_set, node_ok, release, options.rollouts
        )
        bound_per_group = {k: len(v) for k, v in carry.by_group.items() if v}

    # 1b. rolling updates: old versions replaced in waves (forge.core.rolling) -------
    if options.rollouts:
        pairs = zip(plan.released, plan.dropped, strict=True)
        failed_now = {w: b for (w, why), b in pairs if why == "failed"}
        plan.rollouts = plan_rollouts(
            groups=groups,
            bindings=plan.bindings,
            rollouts=rollouts,
            since=since,
            failed=failed_now,
            promoted=promoted,
            now=now,
        )
        for wid in plan.rollouts.stop:
            b = plan.bindings[wid]
            cluster.by_id[b.node].unhold(b)
            if carry is not None:
                carry.drop(wid, b)
            else:
                del plan.bindings[wid]
            bound_per_group[(b.job, b.group)] -= 1
            release(wid, b, "rollout")

    capacity_freed = capacity_changed or bool(plan.released)
    workload: list[tuple[Request, float]] = []
    if options.algorithm == "fgd":
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
    def asks_gpu(j: Job) -> bool:
        return any(groups[(j.id, g.name)][2].gpu for g in j.groups)

    if options.placement_version >= 2:
        # within one priority, jobs that ask GPUs first: they can only use GPU
        # nodes, and work without GPUs then fills what they leave there (beyond
        # the reservation of the GPUs still free) before it opens another node
        ordered = sorted(jobs.values(), key=lambda j: (-j.priority, not asks_gpu(j), j.id))
    else:
        ordered = sorted(jobs.values(), key=lambda j: (-j.priority, j.id))
    # The reservation keeps GPU nodes for GPU work that is waiting. Once the last
    # job asking GPUs has had its turn and no GPU replica is left unbound, there
    # is none: the rest of the pass may use all the cpu and memory (else a tight
    # cluster whose GPUs are not all wanted would leave work pending for nothing).
    last_gpu_job = -1
    if placer.reserving:
        last_gpu_job = max((i for i, j in enumerate(ordered) if asks_gpu(j)), default=-1)
    gpu_waiting = False  # a GPU replica of this pass that some node could take is unbound

    def waits_for_gpu(req: Request, constraints: tuple[Constraint, ...]) -> bool:
        return bool(req.gpu) and placer.reserving and placer.could_ever_fit(req, constraints)

    # replicas without GPUs refused while the reservation held: tried again if it is
    # lifted later in the pass, so nothing is left pending that fits (invariant 4)
    held_back: list[tuple[str, Job, TaskGroup, int, Request]] = []
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
    for position, job in enumerate(ordered):
        if position == last_gpu_job + 1 and placer.reserving and not gpu_waiting:
            placer.lift_reservation()
        for g in job.groups:
            req = groups[(job.id, g.name)][2]
            constraints = g.constraints
            plan.desired += g.scaling.desired
            bound = bound_per_group.get((job.id, g.name), 0)
            if bound == g.scaling.desired:
                continue  # all bound: nothing to place, nothing pending
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
                    attempts = (prev.attempts if prev and prev.kind == "backoff" else 0) + 1
                    why = str(placer.why_not(req, constraints))
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
                    gpu_waiting = gpu_waiting or waits_for_gpu(req, constraints)
                    continue
                b = Binding(
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
        b = Binding(
            job.id,
            g.name,
            ordinal,
            choice.node.id,
            choice.gpu_ids,
            req.cpu,
            req.memory,
            version=g.version if options.rollouts else "",
        )
        plan.bindings[wid] = b
        plan.placed.append(b)
        del plan.pending[wid]
        placed_count += 1
    if deferred_groups:
        _defer_groups(
            plan, deferred_groups, groups, pending, new_failures, just_failed, now, capacity_freed
        )

    # failure histories only for replicas that are still desired
    plan.failures = {
        w: h
        for w, h in new_failures.items()
        if _still_desired(w, groups) and (h.times and h.times[-1] > now - _window(w, groups))
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
    if carry is None:
        carry = Carry.build(jobs, nodes, cluster, plan.bindings)
    else:
        for b in plan.placed:
            carry.add(b.workload_id, b)
        carry.jobs = dict(jobs)
        carry.nodes = dict(nodes)
    plan.carry = carry
    return plan


def _groups(jobs: Mapping[str, Job]) -> dict[tuple[str, str], tuple[Job, TaskGroup, Request]]:
    return {(job.id, g.name): (job, g, g.request()) for job in jobs.values() for g in job.groups}


_Release = Callable[[str, Binding, str], None]
_Groups = Mapping[tuple[str, str], tuple[Job, TaskGroup, Request]]


def _reason(
    wid: str,
    b: Binding,
    entry: tuple[Job, TaskGroup, Request] | None,
    alloc: NodeAlloc | None,
    failed: set[str],
    node_ok: dict[tuple[str, tuple[str, str]], bool],
    rolling: bool = False,
) -> str | None:
    """Why a binding must go (before its capacity is counted), or None to keep it.
    ``rolling``: a changed spec is the rollout's business (forge.core.rolling)."""
    if entry is None:
        return "job stopped"
    if b.ordinal >= entry[1].scaling.desired:
        return "scaled down"
    if alloc is None:
        return "node removed"
    state = alloc.node.state
    if state is not NodeState.READY:
        return "node lost" if state is NodeState.LOST else "node draining"
    if b.status is AssignmentStatus.FAILED or wid in failed:
        return "failed"
    req = entry[2]
    if not rolling and (
        b.cpu != req.cpu
        or b.memory != req.memory
        or len(b.gpu_ids) != req.gpu
        or b.gpu_milli != req.gpu_milli
    ):
        return "spec changed"
    if entry[1].constraints or req.gpu_models or req.gpu_memory:
        key = (b.node, (b.job, b.group))
        ok = node_ok.get(key)
        if ok is None:
            ok = _still_fits_rules(alloc.node, entry[1], req, b.gpu_ids)
            if not b.gpu_ids:  # the answer depends on the devices otherwise
                node_ok[key] = ok
        if not ok:
            return "constraints changed"
    return None


def _release_all(
    plan: Plan,
    bindings: Mapping[str, Binding],
    groups: _Groups,
    cluster: Cluster,
    failed: set[str],
    node_ok: dict[tuple[str, tuple[str, str]], bool],
    release: _Release,
    rolling: bool = False,
) -> dict[tuple[str, str], int]:
    """Check every binding, in order, holding the kept ones (a pass without a carry).

    The hot loop of a large cluster's first pass: the common case (a healthy binding
    on a ready node, no GPUs) touches a handful of attributes."""
    bound_per_group: dict[tuple[str, str], int] = {}
    by_id = cluster.by_id
    ready = NodeState.READY
    failed_status = AssignmentStatus.FAILED
    for wid, b in bindings.items():
        key = (b.job, b.group)
        entry = groups.get(key)
        alloc = by_id.get(b.node)
        if (
            entry is not None
            and alloc is not None
            and not b.gpu_ids
            and b.ordinal < entry[1].scaling.desired
            and alloc.node.state is ready
            and b.status is not failed_status
            and wid not in failed
            and b.cpu == entry[2].cpu
            and b.memory == entry[2].memory
            and not entry[2].gpu
            and not entry[1].constraints
        ):
            reason = None  # the common case, decided without a call
        else:
            reason = _reason(wid, b, entry, alloc, failed, node_ok, rolling)
        if reason is None:
            assert alloc is not None
            if alloc.hold(b):
                plan.bindings[wid] = b
                bound_per_group[key] = bound_per_group.get(key, 0) + 1
                continue
            reason = "node capacity changed"
        release(wid, b, reason)
    return bound_per_group


def _release_changed(
    carry: Carry,
    jobs: Mapping[str, Job],
    nodes: Mapping[str, Node],
    groups: _Groups,
    failed: set[str],
    node_ok: dict[tuple[str, tuple[str, str]], bool],
    release: _Release,
    rolling: bool = False,
) -> int:
    """Re-check only what may have changed since the carry's pass: the bindings on
    nodes whose object changed (re-held from empty, in binding order, as a full pass
    would), and those of changed groups and of failed replicas. Returns how many
    bindings were checked."""
    checked = len(carry.stale)
    for wid, b, why in carry.stale:  # found invalid when loaded
        release(wid, b, why)
    carry.stale = []
    carry.groups = {}
    old_nodes, old_jobs = carry.nodes, carry.jobs
    changed_nodes = sorted(
        n for n in nodes.keys() | old_nodes.keys() if nodes.get(n) is not old_nodes.get(n)
    )
    changed_jobs = sorted(
        j for j in jobs.keys() | old_jobs.keys() if jobs.get(j) is not old_jobs.get(j)
    )
    cluster = carry.cluster
    if changed_nodes:
        cluster.refresh(dict(nodes), set(changed_nodes))
    on_changed = set(changed_nodes)
    for node_id in changed_nodes:
        alloc = cluster.by_id.get(node_id)
        for wid in list(carry.by_node.get(node_id, ())):
            b = carry.bindings[wid]
            checked += 1
            reason = _reason(wid, b, groups.get((b.job, b.group)), alloc, failed, node_ok, rolling)
            if reason is None:
                assert alloc is not None
                if alloc.hold(b):
                    continue
                reason = "node capacity changed"
            carry.drop(wid, b)
            release(wid, b, reason)
    candidates: dict[str, None] = {}
    for job_id in changed_jobs:
        for job in (old_jobs.get(job_id), jobs.get(job_id)):
            for g in job.groups if job is not None else ():
                candidates.update(carry.by_group.get((job_id, g.name), {}))
    for wid in sorted(failed):
        candidates[wid] = None
    for wid in candidates:
        held = carry.bindings.get(wid)
        if held is None or held.node in on_changed:
            continue  # gone already, or decided with its node above
        checked += 1
        alloc = cluster.by_id[held.node]
        entry = groups.get((held.job, held.group))
        reason = _reason(wid, held, entry, alloc, failed, node_ok, rolling)
        if reason is None:
            continue  # still held, unchanged
        alloc.unhold(held)
        carry.drop(wid, held)
        release(wid, held, reason)
    return checked


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


def _still_fits_rules(node: Node, g: TaskGroup, req: Request, gpu_ids: tuple[str, ...]) -> bool:
    """Does a binding still satisfy its group's label constraints and GPU rules
    (they may have changed since it was placed)?"""
    if not all(c.matches(node.labels) for c in g.constraints):
        return False
    if gpu_ids and (req.gpu_models or req.gpu_memory):
        devices = {d.id: d for d in node.gpus}
        for gid in gpu_ids:
            d = devices.get(gid)
            if d is None or (req.gpu_models and d.model not in req.gpu_models):
                return False
            if d.memory < req.gpu_memory:
                return False
    return True


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
