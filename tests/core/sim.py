"""``Sim``: the cluster workflow played in a test, and the invariant checks every
pass it runs is held to.

It applies events to its inputs, calls ``reconcile`` and replaces its state with
the plan's; each pass is checked against invariants 1-5 and 7 (docs/invariants.md)
(:func:`check_plan`). Shared by the reconcile suites (tests/core/test_reconcile.py,
test_preemption, test_queue_order, test_sharing, test_placement_v2_carry), which
build their inputs with :mod:`tests.builders`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from forge.core.models import (
    AssignmentStatus,
    Constraint,
    Job,
    Node,
    NodeState,
    Request,
    TaskGroup,
)
from forge.core.placement import Binding, Cluster
from forge.core.reconcile import (
    Carry,
    FailureHistory,
    PendingEntry,
    Plan,
    ReconcileOptions,
    reconcile,
)
from tests import strategies as fs

T = TypeVar("T")

# Why a binding may be released in the simulation: nodes never shrink and specs
# never change there, so "node capacity changed" / "spec changed" would be a bug.
SIM_RELEASE_REASONS = {
    "job stopped",
    "scaled down",
    "node removed",
    "node lost",
    "node draining",
    "failed",
    "preempted",
}


# -- brute force -------------------------------------------------------------------
@dataclass
class Usage:
    cpu: int = 0
    memory: int = 0
    gpu_ids: list[str] = field(default_factory=list)


def usage(bindings: Iterable[Binding]) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    for b in bindings:
        u = out.setdefault(b.node, Usage())
        u.cpu += b.cpu
        u.memory += b.memory
        u.gpu_ids.extend(b.gpu_ids)
    return out


def can_take(node: Node, used: Usage, req: Request, constraints: Iterable[Constraint]) -> bool:
    """Independent of forge.core.placement: could this node take the replica now?"""
    if node.state is not NodeState.READY:
        return False
    if not all(c.matches(node.labels) for c in constraints):
        return False
    if node.cpu - used.cpu < req.cpu or node.memory - used.memory < req.memory:
        return False
    if req.gpu:
        free = [
            d
            for d in node.gpus
            if d.id not in used.gpu_ids
            and (not req.gpu_models or d.model in req.gpu_models)
            and d.memory >= req.gpu_memory
        ]
        return len(free) >= req.gpu
    return True


def split(wid: str) -> tuple[str, str, int]:
    job, group, ordinal = wid.rsplit("/", 2)
    return job, group, int(ordinal)


def desired_ids(jobs: Mapping[str, Job]) -> set[str]:
    return {
        f"{j.id}/{g.name}/{i}"
        for j in jobs.values()
        for g in j.groups
        for i in range(g.scaling.desired)
    }


def group_of(jobs: Mapping[str, Job], wid: str) -> TaskGroup:
    job, group, _ = split(wid)
    g = jobs[job].group(group)
    assert g is not None
    return g


def btuple(b: Binding) -> tuple[Any, ...]:
    return (b.job, b.group, b.ordinal, b.node, b.gpu_ids, b.cpu, b.memory, b.status)


def carried_pass(sim: Sim, carry: Carry | None) -> Plan:
    """One pass of ``sim`` with ``carry`` (None: one built as a new run loads it,
    each binding absorbed), its plan made the simulation's state."""
    if carry is None:
        carry = Carry.start(sim.jobs, sim.nodes)
        for wid, b in sim.bindings.items():
            carry.absorb(wid, b)
    plan = reconcile(**sim.inputs(), carry=carry)
    sim.bindings, sim.pending, sim.failures = plan.bindings, plan.pending, plan.failures
    sim.failed, sim.capacity_changed = set(), False
    return plan


def plan_key(plan: Plan) -> tuple[Any, ...]:
    return (
        sorted((w, btuple(b)) for w, b in plan.bindings.items()),
        [btuple(b) for b in plan.placed],
        plan.released,
        sorted(plan.pending.items()),
        sorted(plan.failures.items()),
        plan.next_wake,
        plan.deferred,
        plan.desired,
        [(p.preemptor, p.node, p.victims, p.at) for p in plan.preemptions],
        plan.freed,
    )


def shuffled(m: Mapping[str, T], rnd: random.Random) -> dict[str, T]:
    items = list(m.items())
    rnd.shuffle(items)
    return dict(items)


# -- the harness ---------------------------------------------------------------------
@dataclass
class Sim:
    """The cluster workflow's state and loop, minus Temporal."""

    nodes: dict[str, Node]
    jobs: dict[str, Job]
    #: no GPU reservation: the invariant checks below are independent of
    #: forge.core.placement and do not model it (tests/strategies.py ``options``)
    options: ReconcileOptions = field(default_factory=lambda: ReconcileOptions(gpu_reserve=0))
    now: float = 1000.0
    bindings: dict[str, Binding] = field(default_factory=dict)
    pending: dict[str, PendingEntry] = field(default_factory=dict)
    failures: dict[str, FailureHistory] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    capacity_changed: bool = True
    fresh: int = 0
    plans: list[Plan] = field(default_factory=list)
    carry: Carry | None = None  # what the workflow hands each pass: checked against full

    # events --------------------------------------------------------------------
    def _pick(self, keys: Iterable[str], index: int) -> str | None:
        ordered = sorted(keys)
        return ordered[index % len(ordered)] if ordered else None

    def _set_state(self, index: int, state: NodeState) -> None:
        nid = self._pick(self.nodes, index)
        if nid is not None:
            self.nodes[nid] = self.nodes[nid].model_copy(update={"state": state})

    def apply(self, event: fs.Event) -> None:
        if isinstance(event, fs.NodeLost):
            self._set_state(event.index, NodeState.LOST)
        elif isinstance(event, fs.NodeDrained):
            self._set_state(event.index, NodeState.DRAINING)
        elif isinstance(event, fs.NodeRecovered):
            nid = self._pick(self.nodes, event.index)
            if nid is not None and self.nodes[nid].state is not NodeState.READY:
                self._set_state(event.index, NodeState.READY)
                self.capacity_changed = True
        elif isinstance(event, fs.NodeRemoved):
            nid = self._pick(self.nodes, event.index)
            if nid is not None:
                del self.nodes[nid]
        elif isinstance(event, fs.NodeAdded):
            self.fresh += 1
            nid = f"x{self.fresh}"
            self.nodes[nid] = event.node.model_copy(update={"id": nid})
            self.capacity_changed = True
        elif isinstance(event, fs.Scale):
            jid = self._pick(self.jobs, event.job_index)
            if jid is not None:
                job = self.jobs[jid]
                g = job.groups[event.group_index % len(job.groups)]
                self.jobs[jid] = job.with_desired(g.name, event.desired)
        elif isinstance(event, fs.JobStop):
            jid = self._pick(self.jobs, event.index)
            if jid is not None:
                del self.jobs[jid]
        elif isinstance(event, fs.JobSubmit):
            self.fresh += 1
            jid = f"y{self.fresh}"
            self.jobs[jid] = event.job.model_copy(update={"id": jid, "name": jid})
        elif isinstance(event, fs.ReplicaFailed):
            wid = self._pick(self.bindings, event.index)
            if wid is not None:
                self.failed.add(wid)
        elif isinstance(event, fs.Advance):
            self.now += event.seconds
        else:  # pragma: no cover
            raise AssertionError(event)

    # passes --------------------------------------------------------------------
    def inputs(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "nodes": self.nodes,
            "bindings": self.bindings,
            "pending": self.pending,
            "failures": self.failures,
            "failed": sorted(w for w in self.failed if w in self.bindings),
            "capacity_changed": self.capacity_changed,
            "now": self.now,
            "options": self.options,
        }

    def run_pass(
        self,
        rnd: random.Random | None = None,
        *,
        failed: Iterable[str] = (),
        capacity_changed: bool = False,
        sim_checks: bool = True,
    ) -> Plan:
        self.failed.update(failed)
        self.capacity_changed |= capacity_changed
        inputs = self.inputs()
        before = {w: btuple(b) for w, b in self.bindings.items()}
        plan = reconcile(**inputs)
        assert {w: btuple(b) for w, b in self.bindings.items()} == before, "inputs mutated"
        check_plan(inputs, plan, sim_checks=sim_checks)
        self.check_carried(inputs, plan)
        check_determinism(inputs, plan, rnd or random.Random(0))
        check_fixed_point(inputs, plan)
        self.bindings, self.pending, self.failures = plan.bindings, plan.pending, plan.failures
        self.failed = set()
        self.capacity_changed = plan.freed  # as the workflow's commit does
        self.plans.append(plan)
        return plan

    def check_carried(self, inputs: Mapping[str, Any], plan: Plan) -> None:
        """The workflow's way (a carry from the previous pass, only changes
        re-checked) plans exactly what a pass over every binding plans."""
        if inputs["options"].max_work:
            self.carry = None  # the budget counts checked bindings: the plans may differ
            return
        if any(b.status is AssignmentStatus.FAILED for b in inputs["bindings"].values()):
            # a failed status is only ever read from the store, by a new run, which
            # has no carry yet
            self.carry = None
        carry = self.carry
        if carry is None:  # as a new run loads it: each binding checked as it arrives
            carry = Carry.start(inputs["jobs"], inputs["nodes"])
            for wid, b in inputs["bindings"].items():
                carry.absorb(wid, b)
        carried = reconcile(**inputs, carry=carry)
        assert plan_key(carried) == plan_key(plan), "a carried pass planned differently"
        assert carried.carry is not None
        fresh = Cluster(list(inputs["nodes"].values()))
        for b in carried.bindings.values():
            assert fresh.by_id[b.node].hold(b)
        kept = {
            a.id: (a.cpu_used, a.mem_used, a.gpus_used, tuple(a.gpu_free))
            for a in carried.carry.cluster.nodes
        }
        assert kept == {
            a.id: (a.cpu_used, a.mem_used, a.gpus_used, tuple(a.gpu_free)) for a in fresh.nodes
        }, "the carried allocations drifted from the bindings"
        self.carry = carried.carry

    def settle(self, passes: int = 10) -> Plan:
        """Passes at the same time until one changes nothing."""
        for _ in range(passes):
            plan = self.run_pass()
            if not plan.changed and not plan.deferred:
                return plan
        raise AssertionError("no fixed point")

    def used(self, node: str) -> Usage:
        return usage(self.bindings.values()).get(node, Usage())


# -- invariants ------------------------------------------------------------------------
def check_plan(inputs: Mapping[str, Any], plan: Plan, *, sim_checks: bool = True) -> None:
    jobs: Mapping[str, Job] = inputs["jobs"]
    nodes: Mapping[str, Node] = inputs["nodes"]
    old: Mapping[str, Binding] = inputs["bindings"]
    now: float = inputs["now"]
    options: ReconcileOptions = inputs["options"]
    new = plan.bindings

    # (3) each replica bound at most once; bound is a subset of desired
    for w, b in new.items():
        assert b.workload_id == w
    desired = desired_ids(jobs)
    assert set(new) <= desired, set(new) - desired
    assert plan.desired == len(desired)
    assert not set(new) & set(plan.pending), "bound and pending"
    # a pass that ran out of its work budget counts the replicas it did not get to
    # (they are tried next pass) instead of listing them
    unlisted = desired - set(new) - set(plan.pending)
    listed = sum(e.kind == "deferred" for e in plan.pending.values())
    assert len(unlisted) + listed == plan.deferred, "a desired replica neither bound nor pending"
    if unlisted:
        assert options.max_work, "replicas left unlisted without a work budget"
        placement_budget = max(options.max_work - 2 * len(old), options.max_work // 4)
        assert (
            plan.work - 2 * len(old) >= placement_budget
            or len(plan.placed) >= options.max_placements
        )
    released = [w for w, _ in plan.released]
    assert len(released) == len(set(released)), "released twice"
    assert set(released) <= set(old)
    placed = [b.workload_id for b in plan.placed]
    assert len(placed) == len(set(placed)), "placed twice"
    kept = set(old) - set(released)
    assert not kept & set(placed), "placed while still bound"
    assert set(new) == kept | set(placed)
    for w in kept:
        assert btuple(new[w]) == btuple(old[w]), "a kept binding changed"
    for b in plan.placed:
        assert new[b.workload_id] is b
        req = group_of(jobs, b.workload_id).request()
        assert (b.cpu, b.memory, len(b.gpu_ids)) == (req.cpu, req.memory, req.gpu)

    # (1) capacity and (2) exact GPU ids
    held: Counter[tuple[str, str]] = Counter()
    for nid, u in usage(new.values()).items():
        assert nid in nodes, f"bound to unknown node {nid}"
        node = nodes[nid]
        assert u.cpu <= node.cpu and u.memory <= node.memory, f"{nid} over capacity"
        assert len(u.gpu_ids) <= len(node.gpus)
        assert set(u.gpu_ids) <= {d.id for d in node.gpus}
        held.update((nid, g) for g in u.gpu_ids)
    assert all(n == 1 for n in held.values()), "a GPU held twice"
    for b in plan.placed:
        req = group_of(jobs, b.workload_id).request()
        devices = {d.id: d for d in nodes[b.node].gpus}
        for g in b.gpu_ids:
            assert devices[g].memory >= req.gpu_memory
            assert not req.gpu_models or devices[g].model in req.gpu_models
    before = {(b.node, g) for b in old.values() for g in b.gpu_ids}
    freed = {(old[w].node, g) for w in released for g in old[w].gpu_ids}
    taken = {(b.node, g) for b in plan.placed for g in b.gpu_ids}
    assert not taken & (before - freed), "placed onto a GPU that was not freed"
    assert set(held) == (before - freed) | taken, "released GPU ids != freed GPU ids"

    # (5) lost / draining / removed nodes hold nothing
    for b in new.values():
        assert nodes[b.node].state is NodeState.READY, f"{b.workload_id} on a {b.node} not ready"

    # (4) everything that fits is placed
    final = usage(new.values())
    limit_hit = len(plan.placed) >= options.max_placements
    if options.max_work:
        assert not listed, "a budgeted pass lists no deferred entries"
    for w, e in plan.pending.items():
        assert e.reasons, f"{w} pending without a reason"
        if e.kind == "deferred":
            assert limit_hit and e.not_before == now
            continue
        assert e.not_before > now, f"{w} {e.kind} not tried though due"
        if e.kind == "backoff" and not (limit_hit and plan.preemptions):
            # (a preemption after the pass's last placement frees room it cannot use)
            grp = group_of(jobs, w)
            want = grp.request()
            for nid, n in nodes.items():
                assert not can_take(n, final.get(nid, Usage()), want, grp.constraints), (
                    f"{w} left pending but {nid} can take it"
                )

    check_preemptions(inputs, plan, final)

    # next wake: the earliest future not_before (now when some were deferred)
    future = [e.not_before for e in plan.pending.values() if e.kind != "deferred"]
    expect = now if plan.deferred or plan.freed else (min(future) if future else None)
    assert plan.next_wake == expect
    assert set(plan.failures) <= desired

    if sim_checks:
        # nodes never shrink and specs never change in the simulation
        failed = set(inputs["failed"])
        for _, reason in plan.released:
            assert reason in SIM_RELEASE_REASONS, reason
        for w, b in old.items():
            host = nodes.get(b.node)
            must_keep = (
                w in desired
                and host is not None
                and host.state is NodeState.READY
                and w not in failed
                and b.status is not AssignmentStatus.FAILED
            )
            victim = (w, "preempted") in plan.released
            assert not must_keep or w in kept or victim, f"{w} released for no reason"


def check_preemptions(inputs: Mapping[str, Any], plan: Plan, final: Mapping[str, Usage]) -> None:
    """Preemption's rules, from the plan alone: every victim released for exactly
    one preemptor that is bound to the victims' node; each victim at least
    ``min_gap`` below its preemptor and within the preemptor's own cap (a replica
    preempted before may not preempt within min_gap of what preempted it), none
    preempted again within the cooldown, no preemptor of a ``never`` job; and
    (invariant 4 with preemption) a replica this pass left pending for want of a
    node could not have run anywhere even by evicting every allowed victim."""
    jobs: Mapping[str, Job] = inputs["jobs"]
    nodes: Mapping[str, Node] = inputs["nodes"]
    old: Mapping[str, Binding] = inputs["bindings"]
    failures: Mapping[str, FailureHistory] = inputs["failures"]
    options: ReconcileOptions = inputs["options"]
    now: float = inputs["now"]
    victims = [w for w, why in plan.released if why == "preempted"]
    if not options.preemption:
        assert not victims and not plan.preemptions
        return
    named = [v for p in plan.preemptions for v in p.victims]
    assert sorted(named) == sorted(victims), "a victim without its preemptor, or twice"
    placed = {b.workload_id: b for b in plan.placed}

    def cap(wid: str) -> int:
        hist = failures.get(wid)
        limit = jobs[split(wid)[0]].priority - options.min_gap
        return min(limit, hist.preempted_cap) if hist and hist.preempted_cap else limit

    def cooling(wid: str) -> bool:
        hist = failures.get(wid)
        return hist is not None and hist.cooling(now, options.preemption_cooldown)

    for p in plan.preemptions:
        assert jobs[split(p.preemptor)[0]].preemption != "never"
        assert p.preemptor in placed and placed[p.preemptor].node == p.node
        for v in p.victims:
            assert old[v].node == p.node, "a victim on another node"
            assert jobs[split(v)[0]].priority <= cap(p.preemptor), "victim too important"
            assert not cooling(v), f"{v} preempted again within the cooldown"
            assert plan.pending.get(v) is None or plan.pending[v].reasons[0].startswith(
                f"preempted by {p.preemptor} at "
            )
            assert plan.failures[v].preempted_by == p.preemptor
    if options.max_work or len(plan.placed) >= options.max_placements:
        return  # a pass that ran out of budget tries the rest next time
    kept = {w: b for w, b in old.items() if w in plan.bindings and w not in placed}
    for w, e in plan.pending.items():
        if e.kind != "backoff" or e is inputs["pending"].get(w) or w in victims:
            continue  # waited out an earlier verdict, or preempted (tried next pass)
        job = jobs[split(w)[0]]
        if job.preemption == "never" or cap(w) < 1:
            continue
        grp = group_of(jobs, w)
        want = grp.request()
        for nid, n in nodes.items():
            used = final.get(nid, Usage())
            out = [
                b
                for v, b in kept.items()
                if b.node == nid
                and jobs[b.job].priority <= cap(w)
                and not cooling(v)
                and group_of(jobs, v).disruption is None  # (a budget may hold it)
                and (want.gpu or not b.gpu_ids)  # cpu work never evicts GPU work
            ]
            left = Usage(
                used.cpu - sum(b.cpu for b in out),
                used.memory - sum(b.memory for b in out),
                [g for g in used.gpu_ids if g not in {x for b in out for x in b.gpu_ids}],
            )
            assert not can_take(n, left, want, grp.constraints), (
                f"{w} left pending but evicting {len(out)} replicas on {nid} makes room"
            )


def check_determinism(inputs: Mapping[str, Any], plan: Plan, rnd: random.Random) -> None:
    """(7) the same inputs give the same plan, whatever the dicts' order."""
    again = reconcile(**inputs)
    assert plan_key(again) == plan_key(plan)
    reordered = {
        **inputs,
        "jobs": shuffled(inputs["jobs"], rnd),
        "nodes": shuffled(inputs["nodes"], rnd),
        "bindings": shuffled(inputs["bindings"], rnd),
        "pending": shuffled(inputs["pending"], rnd),
        "failures": shuffled(inputs["failures"], rnd),
        "failed": list(reversed(inputs["failed"])),
    }
    assert plan_key(reconcile(**reordered)) == plan_key(plan)


def check_fixed_point(inputs: Mapping[str, Any], plan: Plan) -> None:
    """A second pass at the same time with nothing new changes nothing (unless the
    first left work for it: deferred replicas, or room its preemptions freed)."""
    if plan.deferred or plan.freed:
        return
    second = reconcile(
        **{
            **inputs,
            "bindings": plan.bindings,
            "pending": plan.pending,
            "failures": plan.failures,
            "failed": [],
            "capacity_changed": False,
        }
    )
    assert not second.placed and not second.released
    assert second.pending == plan.pending
    assert second.failures == plan.failures
    assert second.next_wake == plan.next_wake


# -- properties ------------------------------------------------------------------------


def sim(nodes: Iterable[Node], jobs: Iterable[Job], **options: Any) -> Sim:
    return Sim(
        nodes={n.id: n for n in nodes},
        jobs={j.id: j for j in jobs},
        options=ReconcileOptions(**{"gpu_reserve": 0, **options}),
        now=0.0,
    )


def on(s: Sim) -> dict[str, str]:
    return {w: b.node for w, b in s.bindings.items()}
