"""The release phase of a pass: which bindings stay, which go and why, and the
carry that lets the next pass re-check only what changed.

A binding is released when it is no longer desired (job stopped, scaled down,
spec changed), sits on a lost, draining, removed or shrunken node, or failed;
the kept ones are held in the pass's :class:`Cluster`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from forge.core.groups import Group, Groups, groups_of
from forge.core.models import AssignmentStatus, Job, Node, NodeState, Request, TaskGroup
from forge.core.placement import Binding, Cluster, NodeAlloc
from forge.core.queue import Queue
from forge.core.quota import DEFAULT_QUEUE, Ledger, Usage

__all__ = [
    "DRAINING",
    "Carry",
    "Release",
    "release_all",
]


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
    #: the groups of ``jobs`` (groups_of), reused by a pass whose jobs are these
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    rolling: bool = False  # loaded bindings of a changed spec are kept for the rollout
    #: which groups the next pass looks at, and the order's GPU boundary
    #: (forge.core.queue), kept up to date with ``jobs``; None: built by the next pass
    queue: Queue | None = None
    #: rolling updates: every binding's version has been compared with its group's
    #: (a pass looked at all groups, or loading did), so a pass need look only at
    #: ``roll_check``, the groups of changed jobs and the groups rolling now
    versions_seen: bool = False
    roll_check: set[tuple[str, str]] = field(default_factory=set)
    #: no binding's job priority is below this (101: no binding): a replica that
    #: may preempt only below it has no victim anywhere, found without a search.
    #: It may be lower than the true minimum (releases do not raise it), never higher.
    floor: int = 101
    #: replicas the last pass held on draining nodes (their groups' disruption
    #: budgets were spent): the next pass checks them again
    draining: dict[str, None] = field(default_factory=dict)
    #: what queued jobs' bindings hold against their queues (forge.core.quota)
    ledger: Ledger = field(default_factory=Ledger)

    @classmethod
    def start(
        cls, jobs: Mapping[str, Job], nodes: Mapping[str, Node], *, rolling: bool = False
    ) -> Carry:
        """An empty carry to :meth:`absorb` loaded bindings into, page by page, so
        a new run never checks every binding in one activation."""
        carry = cls(dict(jobs), dict(nodes), Cluster(list(nodes.values())), {}, {}, {})
        carry.groups = groups_of(jobs)
        carry.rolling = carry.versions_seen = rolling
        return carry

    def absorb(self, wid: str, b: Binding) -> None:
        """Hold a loaded binding, checked as a pass without a carry would (in the
        same order: the store's), or keep it for the next pass to release."""
        alloc = self.cluster.by_id.get(b.node)
        entry = self.groups.get((b.job, b.group))
        if self.rolling and entry is not None and b.version != entry.spec.version:
            self.roll_check.add((b.job, b.group))  # off its version, or none recorded
        reason = _reason(wid, b, entry, alloc, set(), {}, self.rolling)
        if reason is None:
            assert alloc is not None
            if alloc.hold(b):
                self.add(wid, b)
                assert entry is not None
                self.floor = min(self.floor, entry.job.priority)
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
        fresh: dict[str, Usage] | None = None,
    ) -> Carry:
        by_node: dict[str, dict[str, None]] = {}
        by_group: dict[tuple[str, str], dict[str, None]] = {}
        for wid, b in bindings.items():
            by_node.setdefault(b.node, {})[wid] = None
            by_group.setdefault((b.job, b.group), {})[wid] = None
        made = cls(dict(jobs), dict(nodes), cluster, bindings, by_node, by_group)
        if any(j.queue != DEFAULT_QUEUE for j in jobs.values()):
            made.ledger.fresh = fresh or {}  # what the admit stage computed
            for wid, b in bindings.items():
                made.charge(wid, b)
        made.floor = min((jobs[j].priority for j, _ in by_group if j in jobs), default=101)
        return made

    def add(self, wid: str, b: Binding) -> None:
        self.bindings[wid] = b
        self.by_node.setdefault(b.node, {})[wid] = None
        self.by_group.setdefault((b.job, b.group), {})[wid] = None
        self.charge(wid, b)

    def charge(self, wid: str, b: Binding) -> None:
        """Count a binding of a queued job against its queue."""
        job = self.jobs.get(b.job)
        if job is not None and job.queue != DEFAULT_QUEUE:
            self.ledger.hold(wid, job.queue, b, self.cluster.by_id[b.node].node)

    def drop(self, wid: str, b: Binding) -> None:
        del self.bindings[wid]
        self.ledger.drop(wid)
        self.by_node[b.node].pop(wid, None)
        self.by_group[(b.job, b.group)].pop(wid, None)

    def changed_jobs(
        self, jobs: Mapping[str, Job], hint: Collection[str] | None = None
    ) -> list[str]:
        """Ids of the jobs added, stopped or replaced since the carry's pass, sorted.
        ``hint``: the ids that may have changed (the caller knows what it loaded);
        every other job must be the object the carry's pass planned with. Without
        it, every job is compared."""
        old = self.jobs
        ids: Iterable[str] = jobs.keys() | old.keys() if hint is None else set(hint)
        return sorted(j for j in ids if jobs.get(j) is not old.get(j))

    def take_jobs(self, jobs: Mapping[str, Job], changed: list[str]) -> None:
        """Bring ``self.jobs`` to ``jobs``, which differ only in ``changed``."""
        mine = self.jobs
        for job_id in changed:
            job = jobs.get(job_id)
            if job is None:
                mine.pop(job_id, None)
            else:
                mine[job_id] = job


Release = Callable[[str, Binding, str], None]
#: A binding's reason to go when its node drains.
DRAINING = "node draining"
#: Bindings on draining nodes held back for the drain step (a list the pass gives;
#: None: every binding on a draining node is released at once, as before budgets).
Held = list[tuple[str, Binding]] | None


def _holds(reason: str | None, wid: str, b: Binding, entry: Group | None, failed: set[str]) -> bool:
    """A replica of a group with a disruption budget, fine but on a draining node:
    kept for now, and released by the drain step as the budget lets."""
    return (
        reason == DRAINING
        and entry is not None
        and entry.spec.disruption is not None
        and b.status is not AssignmentStatus.FAILED
        and wid not in failed
    )


def _reason(
    wid: str,
    b: Binding,
    entry: Group | None,
    alloc: NodeAlloc | None,
    failed: set[str],
    node_ok: dict[tuple[str, tuple[str, str]], bool],
    rolling: bool = False,
    budgets: bool = False,
) -> str | None:
    """Why a binding must go (before its capacity is counted), or None to keep it.
    ``rolling``: a changed spec is the rollout's business (forge.core.rolling)."""
    if entry is None:
        return "job stopped"
    if b.ordinal >= entry.spec.scaling.desired:
        return "scaled down"
    if alloc is None:
        return "node removed"
    state = alloc.node.state
    is_failed = b.status is AssignmentStatus.FAILED or wid in failed
    if state is not NodeState.READY:
        if state is NodeState.LOST:
            return "node lost"
        # with budgets a failed replica on a draining node is a failure (its
        # reschedule policy counts it), never a drain the budget could hold back
        return "failed" if budgets and is_failed else DRAINING
    if is_failed:
        return "failed"
    req = entry.request
    if not rolling and (
        b.cpu != req.cpu
        or b.memory != req.memory
        or len(b.gpu_ids) != req.gpu
        or b.gpu_milli != req.gpu_milli
    ):
        return "spec changed"
    if entry.spec.constraints or req.gpu_models or req.gpu_memory:
        key = (b.node, (b.job, b.group))
        ok = node_ok.get(key)
        if ok is None:
            ok = _still_fits_rules(alloc.node, entry.spec, req, b.gpu_ids)
            if not b.gpu_ids:  # the answer depends on the devices otherwise
                node_ok[key] = ok
        if not ok:
            return "constraints changed"
    return None


def release_all(
    kept: dict[str, Binding],
    bindings: Mapping[str, Binding],
    groups: Groups,
    cluster: Cluster,
    failed: set[str],
    node_ok: dict[tuple[str, tuple[str, str]], bool],
    release: Release,
    rolling: bool = False,
    held: Held = None,
) -> dict[tuple[str, str], int]:
    """Check every binding, in order, holding the kept ones (a pass without a carry)
    and adding them to ``kept`` (the plan's bindings); those of budgeted groups on
    draining nodes are kept and listed in ``held`` (when given).

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
            and b.ordinal < entry.spec.scaling.desired
            and alloc.node.state is ready
            and b.status is not failed_status
            and wid not in failed
            and b.cpu == entry.request.cpu
            and b.memory == entry.request.memory
            and not entry.request.gpu
            and not entry.spec.constraints
        ):
            reason = None  # the common case, decided without a call
        else:
            reason = _reason(wid, b, entry, alloc, failed, node_ok, rolling, held is not None)
            if held is not None and _holds(reason, wid, b, entry, failed):
                held.append((wid, b))
                reason = None
        if reason is None:
            assert alloc is not None
            if alloc.hold(b):
                kept[wid] = b
                bound_per_group[key] = bound_per_group.get(key, 0) + 1
                continue
            reason = "node capacity changed"
            if held and held[-1][0] == wid:
                held.pop()
        release(wid, b, reason)
    return bound_per_group


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
