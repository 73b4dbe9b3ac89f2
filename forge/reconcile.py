"""One reconcile pass as a pure function: desired + actual + now -> Plan.

Like Nomad's reconciler, this module decides *what* happens to each replica
(keep, release, place, wait) and leaves *where* to :mod:`forge.placement`. It
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

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from forge.models import (
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
from forge.placement import Binding, Cluster, Placer
from forge.placement.scorers import ALGORITHMS

__all__ = [
    "DEFAULT_GPU_RESERVE",
    "Algorithm",
    "FailureHistory",
    "PendingEntry",
    "Plan",
    "ReconcileOptions",
    "backoff_delay",
    "reconcile",
    "reschedule_delay",
]


Algorithm = Literal[
    "binpack",
    "spread",
    "fgd",
    "best-fit",
    "dot-product",
    "gpu-packing",
    "gpu-clustering",
    "random",
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
    seed: int = 0
    placement_version: int = Field(default=1, ge=1, le=2)
    gpu_reserve: int | None = Field(
        default=None, ge=0, le=1000, description="per mille; None: by placement_version"
    )

    @property
    def effective_gpu_reserve(self) -> int:
        if self.gpu_reserve is not None:
            return self.gpu_reserve
        return DEFAULT_GPU_RESERVE if self.placement_version >= 2 else 0


assert set(ALGORITHMS) == set(get_args(Algorithm))


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

    @property
    def changed(self) -> bool:
        return bool(self.placed or self.released)


DEFAULT_OPTIONS = ReconcileOptions()


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
) -> Plan:
    """Plan one pass. Inputs are not mutated; mapping iteration orders must be
    deterministic (the workflow builds its dicts deterministically)."""
    groups: dict[tuple[str, str], tuple[Job, TaskGroup, Request]] = {}
    for job in jobs.values():
        for g in job.groups:
            groups[(job.id, g.name)] = (job, g, g.request())

    cluster = Cluster(list(nodes.values()), gpu_reserve=options.effective_gpu_reserve)
    failed_set = set(failed)
    just_failed: set[str] = set()
    plan = Plan(bindings={})
    new_failures = dict(failures)

    # 1. release --------------------------------------------------------------------
    # The hot loop of a large cluster (one iteration per binding): per-group and
    # per-node facts are computed once, and the common case (a healthy binding on
    # a ready node, no GPUs) touches a handful of attributes.
    bound_per_group: dict[tuple[str, str], int] = {}
    node_ok: dict[tuple[str, tuple[str, str]], bool] = {}
    by_id = cluster.by_id
    ready = NodeState.READY
    failed_status = AssignmentStatus.FAILED
    for wid, b in bindings.items():
        key = (b.job, b.group)
        entry = groups.get(key)
        alloc = by_id.get(b.node)
        reason: str | None = None
        if entry is None:
            reason = "job stopped"
        elif b.ordinal >= entry[1].scaling.desired:
            reason = "scaled down"
        elif alloc is None:
            reason = "node removed"
        elif alloc.node.state is not ready:
            reason = "node lost" if alloc.node.state is NodeState.LOST else "node draining"
        elif b.status is failed_status or wid in failed_set:
            reason = "failed"
        else:
            req = entry[2]
            if (
                b.cpu != req.cpu
                or b.memory != req.memory
                or len(b.gpu_ids) != req.gpu
                or b.gpu_milli != req.gpu_milli
            ):
                reason = "spec changed"
            elif entry[1].constraints or req.gpu_models or req.gpu_memory:
                ok = node_ok.get((b.node, key))
                if ok is None:
                    ok = _still_fits_rules(alloc.node, entry[1], req, b.gpu_ids)
                    if not b.gpu_ids:  # the answer depends on the devices otherwise
                        node_ok[(b.node, key)] = ok
                if not ok:
                    reason = "constraints changed"
        if reason is None:
            assert alloc is not None
            if not b.gpu_ids:
                cpu_used = alloc.cpu_used + b.cpu
                mem_used = alloc.mem_used + b.memory
                fits = cpu_used <= alloc.node.cpu and mem_used <= alloc.node.memory
                if fits:
                    alloc.cpu_used = cpu_used
                    alloc.mem_used = mem_used
            else:
                fits = alloc.hold(b)
            if fits:
                plan.bindings[wid] = b
                bound_per_group[key] = bound_per_group.get(key, 0) + 1
                continue
            reason = "node capacity changed"
        plan.released.append((wid, reason))
        if reason == "failed":
            just_failed.add(wid)
            past = failures.get(wid, FailureHistory())
            window = entry[1].reschedule.interval if entry else 0.0
            times = (*tuple(t for t in past.times if t > now - window), now)
            new_failures[wid] = FailureHistory(times=times[-64:], last_node=b.node)

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
        reasons=("deferred to the next pass (per-pass placement limit)",),
    )
    backoff_entries: dict[tuple[int, str], PendingEntry] = {}
    for position, job in enumerate(ordered):
        if position == last_gpu_job + 1 and placer.reserving and not gpu_waiting:
            placer.lift_reservation()
        for g in job.groups:
            req = groups[(job.id, g.name)][2]
            constraints = g.constraints
            plan.desired += g.scaling.desired
            if bound_per_group.get((job.id, g.name), 0) == g.scaling.desired:
                continue  # all bound: nothing to place, nothing pending
            for ordinal in range(g.scaling.desired):
                wid = workload_id(job.id, g.name, ordinal)
                if wid in plan.bindings:
                    continue
                prev = pending.get(wid)
                hist = new_failures.get(wid)
                wait = _waiting(prev, hist, g.reschedule, wid in just_failed, now, capacity_freed)
                if wait is not None:
                    plan.pending[wid] = wait
                    gpu_waiting = gpu_waiting or waits_for_gpu(req, constraints)
                    continue
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
                    why = placer.why_not(req, constraints)
                    shared = backoff_entries.get((attempts, why))
                    if shared is None:
                        shared = backoff_entries[(attempts, why)] = PendingEntry(
                            kind="backoff",
                            attempts=attempts,
                            not_before=now + backoff_delay(attempts, options),
                            reasons=(why,),
                        )
                    plan.pending[wid] = shared
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
                )
                plan.bindings[wid] = b
                plan.placed.append(b)
                placed_count += 1

    if held_back and placer.reserving and not gpu_waiting:
        placer.lift_reservation()  # the last job was one asking GPUs, and all are bound
    # GPU placements after a refusal may also have freed reservation (the placer
    # re-admits those nodes), so the held-back replicas are tried once more anyway
    if held_back:
        for wid, job, g, ordinal, req in held_back:
            if placed_count >= options.max_placements:
                break  # they keep their backoff entries; capacity_changed wakes them
            hist = new_failures.get(wid)
            choice = placer.place(req, g.constraints, avoid=hist.last_node if hist else None)
            if choice is None:
                continue
            b = Binding(
                job.id, g.name, ordinal, choice.node.id, choice.gpu_ids, req.cpu, req.memory
            )
            plan.bindings[wid] = b
            plan.placed.append(b)
            del plan.pending[wid]
            placed_count += 1

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
    plan.next_wake = wake
    plan.released.sort()
    return plan


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
