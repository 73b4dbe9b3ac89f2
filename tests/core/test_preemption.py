"""Preemption: the victim search (forge.core.preemption) against brute force, and
the pass's phase (forge.core.preempting) through the simulated loop, whose every
pass is checked by tests/core/sim.py's invariants (check_preemptions)."""

from __future__ import annotations

import itertools
from unittest.mock import patch

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from forge.core import preemption
from forge.core.models import DisruptionBudget, Job, Node
from forge.core.placement import Binding, Cluster, NodeAlloc
from forge.core.preemption import Holder, Search, find
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from tests.builders import group, job, node
from tests.core.sim import Sim, sim

# -- the search, against brute force ---------------------------------------------------


@st.composite
def full_nodes(draw: st.DrawFn) -> tuple[Cluster, dict[str, list[Holder]]]:
    """A few nodes, each filled by replicas of random priorities and sizes."""
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from([0, 0, 2, 4]))
        nodes.append(node(f"n{i}", cpu=draw(st.sampled_from([2000, 4000])), memory=4096, gpus=gpus))
    cluster = Cluster(nodes)
    holders: dict[str, list[Holder]] = {}
    k = 0
    for a in cluster.nodes:
        held = holders.setdefault(a.id, [])
        for _ in range(draw(st.integers(0, 6))):
            cpu = draw(st.sampled_from([250, 500, 1000]))
            want_gpu = bool(a.node.gpus) and draw(st.booleans())
            gpu_ids: tuple[str, ...] = ()
            if want_gpu:
                free = [d.id for i, d in enumerate(a.node.gpus) if a.gpu_free[i]]
                if not free:
                    continue
                gpu_ids = (free[0],)
            b = Binding(f"j{k}", "g", 0, a.id, gpu_ids, cpu, 256)
            if a.hold(b):
                held.append(Holder(b.workload_id, b, draw(st.integers(1, 100))))
                k += 1
    return cluster, holders


def _state(a: NodeAlloc) -> tuple[object, ...]:
    return (a.cpu_used, a.mem_used, a.gpus_used, tuple(a.gpu_free), tuple(a.gpu_left))


def _fits_without(a: NodeAlloc, req_cpu: int, gone: list[Holder], gpu: int) -> bool:
    """Independent of NodeAlloc.fits: room on ``a`` once ``gone`` are evicted."""
    cpu = a.node.cpu - a.cpu_used + sum(h.binding.cpu for h in gone)
    mem = a.node.memory - a.mem_used + sum(h.binding.memory for h in gone)
    freed = {g for h in gone for g in h.binding.gpu_ids}
    free = sum(1 for i, d in enumerate(a.node.gpus) if a.gpu_free[i] or d.id in freed)
    return cpu >= req_cpu and mem >= 256 and free >= gpu


@settings(max_examples=300)
@given(
    full_nodes(),
    st.integers(11, 100),
    st.sampled_from([500, 1000, 2000]),
    st.sampled_from([0, 1]),
    st.integers(0, 7),
)
def test_the_search_is_valid_minimal_complete_and_leaves_nodes_as_they_were(
    world: tuple[Cluster, dict[str, list[Holder]]], priority: int, cpu: int, gpu: int, start: int
) -> None:
    cluster, holders = world
    # what the pass asks preemption for: a replica that fits nowhere as things are
    assume(not any(_fits_without(a, cpu, [], gpu) for a in cluster.nodes))
    req = group(cpu=cpu, memory=256, gpu=gpu).request()
    limit = priority - 10
    cooling = {hs[0].wid for hs in holders.values() if len(hs) > 2}  # some recently preempted
    search = Search(limit=limit, cooling=lambda w: w in cooling, budget=lambda g: None)
    before = {a.id: _state(a) for a in cluster.nodes}
    choice, work, _ = find(
        req, cluster.nodes, lambda n: holders[n], search, start=start, candidates=1000
    )
    assert {a.id: _state(a) for a in cluster.nodes} == before, "the simulation left a trace"
    assert work >= len(cluster.nodes) or choice is not None

    def allowed(a: NodeAlloc) -> list[Holder]:
        return [
            h
            for h in holders[a.id]
            if h.priority <= limit and h.wid not in cooling and (gpu or not h.binding.gpu_ids)
        ]

    if choice is None:
        # complete: no node has room even with every allowed victim gone
        for a in cluster.nodes:
            assert not _fits_without(a, cpu, allowed(a), gpu), f"{a.id} could have made room"
        return
    victims = list(choice.victims)
    assert all(v in allowed(choice.node) for v in victims), "a victim not allowed"
    assert _fits_without(choice.node, cpu, victims, gpu), "the victims do not make room"
    for v in victims:  # minimal: any one put back and it no longer fits
        assert not _fits_without(choice.node, cpu, [x for x in victims if x is not v], gpu)
    # best: no node offers a set with a lower highest victim (every subset, brute force)
    for a in cluster.nodes:
        cands = allowed(a)
        for r in range(len(cands) + 1):
            for subset in itertools.combinations(cands, r):
                if subset and _fits_without(a, cpu, list(subset), gpu):
                    assert max(h.priority for h in subset) >= choice.key[0], (
                        f"{a.id} could evict only up to priority "
                        f"{max(h.priority for h in subset)}, chose {choice.key[0]}"
                    )


def test_the_search_never_breaks_a_disruption_budget() -> None:
    cluster = Cluster([node("a", cpu=2000, memory=4096)])
    a = cluster.nodes[0]
    held = []
    for i in range(4):
        b = Binding("low", "g", i, "a", (), 500, 256)
        assert a.hold(b)
        held.append(Holder(b.workload_id, b, 10))
    req = group(cpu=1000, memory=256).request()
    for budget, fits in ((1, False), (2, True)):

        def left(g: tuple[str, str], n: int = budget) -> int | None:
            return n

        search = Search(limit=50, cooling=lambda w: False, budget=left)
        choice, _, _ = find(req, cluster.nodes, lambda n: held, search)
        assert (choice is not None) == fits
        if choice is not None:
            assert len(choice.victims) == 2


@st.composite
def same_shape_nodes(draw: st.DrawFn) -> tuple[Cluster, dict[str, list[Holder]]]:
    """Many full nodes whose replicas share a few priorities and sizes: the ties the
    search's shortcut (a node that cannot beat the best so far) must not misjudge."""
    nodes = [node(f"n{i}", cpu=4000, memory=4096) for i in range(draw(st.integers(2, 10)))]
    cluster = Cluster(nodes)
    holders: dict[str, list[Holder]] = {}
    for k, a in enumerate(cluster.nodes):
        held = holders.setdefault(a.id, [])
        for j in range(draw(st.integers(1, 8))):
            b = Binding(f"j{k}x{j}", "g", 0, a.id, (), draw(st.sampled_from([500, 1000])), 256)
            if a.hold(b):
                held.append(Holder(b.workload_id, b, draw(st.sampled_from([10, 20, 30]))))
    return cluster, holders


@settings(max_examples=300)
@given(same_shape_nodes(), st.sampled_from([1000, 1500, 2000, 3000]), st.integers(0, 9))
def test_the_shortcut_for_nodes_that_cannot_win_changes_no_choice(
    world: tuple[Cluster, dict[str, list[Holder]]], cpu: int, start: int
) -> None:
    """find with and without the shortcut: the same node, victims, work and next start."""
    cluster, holders = world
    req = group(cpu=cpu, memory=256).request()
    search = Search(limit=40, cooling=lambda w: False, budget=lambda g: None)
    got = find(req, cluster.nodes, lambda n: holders[n], search, start=start, candidates=4)
    with patch.object(preemption, "_cannot_beat", lambda *a: False):
        want = find(req, cluster.nodes, lambda n: holders[n], search, start=start, candidates=4)
    assert (got[0] is None) == (want[0] is None)
    if got[0] is not None and want[0] is not None:
        assert (got[0].node.id, got[0].victims) == (want[0].node.id, want[0].victims)
    assert got[1:] == want[1:]


# -- the phase, through the loop ---------------------------------------------------------
def _full(n: int = 4, per_node: int = 4, priority: int = 20) -> Sim:
    """``n`` nodes of 4 cores, each full of ``per_node`` 1-core replicas of one job."""
    s = sim(
        [node(f"n{i}", cpu=4000, memory=8192) for i in range(n)],
        [
            job(
                "batch",
                group("g", n * per_node, cpu=4000 // per_node, memory=512),
                priority=priority,
            )
        ],
    )
    s.settle()
    assert len(s.bindings) == n * per_node
    return s


def test_a_high_priority_job_on_a_full_cluster_preempts_the_fewest_lowest_victims() -> None:
    s = _full()
    s.jobs["urgent"] = job("urgent", group("g", 2, cpu=2000, memory=512), priority=90)
    s.now += 1
    plan = s.run_pass()
    assert sorted(b.workload_id for b in plan.placed) == ["urgent/g/0", "urgent/g/1"]
    assert len(plan.preemptions) == 2
    for p in plan.preemptions:
        assert len(p.victims) == 2  # two 1-core replicas make room for 2 cores, no more
        assert all(s.bindings[p.preemptor].node == p.node for _ in p.victims)
        for v in p.victims:
            e = plan.pending[v]
            assert e.reasons == (f"preempted by {p.preemptor} at 1970-01-01T00:00:01Z",)
            assert plan.failures[v].preempted_by == p.preemptor
    assert sorted(w for w, why in plan.released if why == "preempted") == sorted(
        v for p in plan.preemptions for v in p.victims
    )


def test_victims_are_at_least_min_gap_below_and_never_jobs_do_not_preempt() -> None:
    s = _full(priority=85)
    s.jobs["urgent"] = job("urgent", group("g", 1, cpu=2000, memory=512), priority=90)
    s.now += 1
    plan = s.run_pass()
    assert not plan.preemptions and "urgent/g/0" in plan.pending  # 5 points: not enough
    s.options = s.options.model_copy(update={"min_gap": 5})
    s.now += 10
    assert len(s.run_pass().preemptions) == 1
    never = _full()
    urgent = job("urgent", group("g", 1, cpu=2000, memory=512), priority=90)
    never.jobs["urgent"] = urgent.model_copy(update={"preemption": "never"})
    never.now += 1
    assert not never.run_pass().preemptions


def test_preemption_off_places_as_before() -> None:
    s = _full()
    s.options = s.options.model_copy(update={"preemption": False})
    s.jobs["urgent"] = job("urgent", group("g", 1, cpu=2000, memory=512), priority=90)
    s.now += 1
    plan = s.run_pass()
    assert not plan.preemptions and not plan.released and "urgent/g/0" in plan.pending


def test_no_cascade_a_victim_preempts_nothing_within_min_gap_of_its_preemptor() -> None:
    """A priority-90 job preempts a 60 (the 60 could take a 40's place: 20 points
    below it) but once preempted by 90 it may only take what is 10 below 90 - 10
    = 80... and below its own 60 - 10: so the 55 stays; the 40 may go."""
    s = sim(
        [node("a", cpu=2000, memory=8192), node("b", cpu=2000, memory=8192)],
        [
            job("mid", group("g", 1, cpu=2000, memory=512), priority=60),
            job("near", group("g", 1, cpu=2000, memory=512), priority=55),
        ],
    )
    s.settle()
    s.jobs["top"] = job("top", group("g", 1, cpu=2000, memory=512), priority=90)
    s.now += 1
    plan = s.run_pass()
    [p] = plan.preemptions
    assert p.victims == ("near/g/0",)  # the lower of the two
    assert plan.failures["near/g/0"].preempted_cap == 80
    s.now += 5
    again = s.run_pass()
    assert not again.preemptions  # 55 - 10 = 45: the 60 is out of its reach
    assert "near/g/0" in again.pending


def test_a_preempted_replica_is_not_preempted_again_within_the_cooldown() -> None:
    s = sim(
        [node("a", cpu=2000, memory=8192)],
        [job("low", group("g", 1, cpu=2000, memory=512), priority=10)],
    )
    s.settle()
    s.jobs["top"] = job("top", group("g", 1, cpu=2000, memory=512), priority=90)
    s.now += 1
    assert s.run_pass().preemptions
    # the top job goes; the low one takes the node back; a new high one arrives
    del s.jobs["top"]
    s.now += 2
    s.capacity_changed = True
    s.settle()
    assert "low/g/0" in s.bindings
    s.jobs["next"] = job("next", group("g", 1, cpu=2000, memory=512), priority=90)
    s.now += 10
    plan = s.run_pass()
    assert not plan.preemptions and "next/g/0" in plan.pending  # cooling down
    s.now += 600
    assert [p.victims for p in s.run_pass().preemptions] == [("low/g/0",)]


def test_a_disruption_budget_limits_victims_of_a_group_per_pass() -> None:
    s = _full(n=4, per_node=1)
    batch = s.jobs["batch"]
    g = batch.groups[0].model_copy(update={"disruption": DisruptionBudget(max_unavailable=1)})
    s.jobs["batch"] = batch.model_copy(update={"groups": (g,)})
    s.jobs["urgent"] = job("urgent", group("g", 3, cpu=4000, memory=512), priority=90)
    s.now += 1
    plan = s.run_pass()
    assert len(plan.preemptions) == 1  # one below desired at most
    s.now += 30
    plan = s.run_pass()
    assert not plan.preemptions  # the first victim is still pending: the budget is spent


def test_a_victim_that_fits_elsewhere_is_placed_in_the_same_pass() -> None:
    s = sim(
        [node("a", cpu=2000, memory=8192)],
        [job("low", group("g", 2, cpu=1000, memory=512), priority=10)],
    )
    s.settle()
    s.nodes["b"] = node("b", cpu=1000, memory=8192)  # joins after: empty
    s.capacity_changed = True
    s.jobs["top"] = job("top", group("g", 1, cpu=2000, memory=512), priority=90)
    s.now += 1
    plan = s.run_pass()
    [p] = plan.preemptions
    assert p.node == "a" and p.victims == ("low/g/0", "low/g/1")
    moved = [b for b in plan.placed if b.job == "low"]
    assert [b.node for b in moved] == ["b"]  # one victim fits on b: placed at once
    [left] = [v for v in p.victims if v != moved[0].workload_id]
    assert plan.pending[left].reasons[0].startswith("preempted by top/g/0 at ")


def _waiting_then_preempting() -> tuple[Sim, Plan]:
    """A node held by one low replica; ``wait`` (of the same priority: nothing to
    preempt) found no room and backs off; before its backoff is over a priority-90
    job preempts the low replica and takes a sliver of the node. Returns the sim
    before that pass and the pass's inputs' plan, unchecked."""
    s = sim(
        [node("a", cpu=4000, memory=4096)],
        [job("low", group("g", 1, cpu=1000, memory=4096), priority=10)],
    )
    s.settle()
    s.jobs["wait"] = job("wait", group("g", 2, cpu=500, memory=1024), priority=10)
    s.now += 1
    first = s.run_pass()
    assert not first.placed and not first.preemptions
    assert {w: e.not_before for w, e in first.pending.items()} == {
        "wait/g/0": s.now + 1,
        "wait/g/1": s.now + 1,
    }
    s.jobs["top"] = job("top", group("g", 1, cpu=500, memory=512), priority=90)
    return s, first


def test_room_a_preemption_frees_goes_to_replicas_waiting_out_a_backoff() -> None:
    """Invariant 4 (the reconcile state machine's counterexample, made small): the
    preemption leaves 3.5 cores and 3.5 GiB free on ``a``; the waiting replicas
    fit there and are placed in the same pass, not left to their backoff."""
    s, _ = _waiting_then_preempting()
    plan = s.run_pass()  # (checked: nothing left pending that a node can take)
    [p] = plan.preemptions
    assert (p.preemptor, p.node, p.victims) == ("top/g/0", "a", ("low/g/0",))
    assert sorted(b.workload_id for b in plan.placed) == ["top/g/0", "wait/g/0", "wait/g/1"]
    assert set(plan.pending) == {"low/g/0"}  # 1 GiB left: the victim waits
    assert plan.pending["low/g/0"].reasons[0].startswith("preempted by top/g/0 at ")


def test_runs_recorded_before_the_refill_patch_leave_the_waiting_replicas_their_backoff() -> None:
    """``refill_waiting`` off (a history recorded before preemption-refills-waiting)
    plans as before: the waiting replicas keep the entry they had, untried."""
    s, first = _waiting_then_preempting()
    old = s.options.model_copy(update={"refill_waiting": False})
    plan = reconcile(**{**s.inputs(), "options": old})
    assert [b.workload_id for b in plan.placed] == ["top/g/0"]
    assert plan.freed and plan.next_wake == s.now  # the next pass, at once, takes them
    for w in ("wait/g/0", "wait/g/1"):
        assert plan.pending[w] is first.pending[w]


def test_freed_room_goes_in_placement_order_waiting_or_refused() -> None:
    """A higher-priority replica waiting out its backoff gets the freed room before
    a lower-priority one refused in this very pass."""
    s, _ = _waiting_then_preempting()
    s.jobs["wait"] = s.jobs["wait"].model_copy(update={"priority": 30})
    s.jobs["later"] = job("later", group("g", 1, cpu=500, memory=2048), priority=20)
    s.jobs["top"] = job("top", group("g", 1, cpu=500, memory=1024), priority=90)
    plan = s.run_pass()
    # 4096 - 1024 (top) = 3072: both waiting 1 GiB replicas (priority 30) fit, the
    # 2 GiB one refused now (priority 20) no longer does
    assert sorted(b.workload_id for b in plan.placed) == ["top/g/0", "wait/g/0", "wait/g/1"]
    assert "later/g/0" in plan.pending


def test_the_plan_is_the_same_with_and_without_a_carry() -> None:
    """Sim.run_pass compares each pass with the carried one (check_carried); a
    mixed-priority cluster that preempts in several passes."""
    nodes = [node(f"n{i}", cpu=4000, memory=8192, gpus=i % 2 * 2) for i in range(6)]
    jobs = [
        job(f"j{p}", group("g", 6, cpu=1000 + 250 * (p % 3), memory=512, gpu=p % 2), priority=p)
        for p in (5, 20, 35, 50)
    ]
    s = sim(nodes, jobs)
    s.settle()
    for p in (70, 95):
        s.jobs[f"hi{p}"] = job(f"hi{p}", group("g", 3, cpu=2000, memory=512), priority=p)
        s.now += 1
        plan: Plan = s.run_pass()
        assert plan.preemptions


def test_nothing_to_preempt_costs_no_search() -> None:
    """A full cluster of one priority: replicas that fit nowhere look for victims
    in O(1) (the carry's priority floor), not a sweep of the nodes."""
    nodes: dict[str, Node] = {f"n{i}": node(f"n{i}", cpu=1000, memory=1024) for i in range(500)}
    jobs: dict[str, Job] = {"a": job("a", group("g", 500, cpu=1000, memory=512), priority=50)}
    first = reconcile(jobs=jobs, nodes=nodes, bindings={}, pending={}, failures={}, now=0.0)
    jobs = {**jobs, "b": job("b", group("g", 50, cpu=1000, memory=512), priority=50)}
    opts = ReconcileOptions()
    on = reconcile(
        jobs=jobs,
        nodes=nodes,
        bindings={},
        pending={},
        failures={},
        now=1.0,
        carry=first.carry,
        options=opts,
    )
    first_off = reconcile(
        jobs=dict(list(jobs.items())[:1]),
        nodes=nodes,
        bindings={},
        pending={},
        failures={},
        now=0.0,
    )
    off = reconcile(
        jobs=jobs,
        nodes=nodes,
        bindings={},
        pending={},
        failures={},
        now=1.0,
        carry=first_off.carry,
        options=opts.model_copy(update={"preemption": False}),
    )
    assert not on.preemptions and len(on.pending) == 50
    assert on.work == off.work
