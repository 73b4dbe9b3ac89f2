"""A group's rules over its own replicas: distinct_hosts and spread (issue 22).

Examples for each rule and its reason, then a property over random clusters with
brute force as the oracle: after a pass no node holds two replicas of a
distinct_hosts group, a do_not_schedule spread is within its max_skew, and a
replica is left pending only if every node is rejected by some filter of the full
chain (static, capacity, the group's own rules) on the pass's final state
(invariant 4), with invariants 1-3 intact.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from forge.core.invariants import violations
from forge.core.models import Job, Node, TaskGroup
from forge.core.placement import Binding, Cluster, explain_node
from forge.core.placement.topology import filters_for, topology_of
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from tests.strategies import groups, node_lists
from tests.strategies import options as any_options


def _nodes(n: int, cpu: int = 4000, zones: str = "abc") -> dict[str, Node]:
    return {
        f"n{i}": Node(id=f"n{i}", cpu=cpu, memory=8192, labels={"zone": zones[i % len(zones)]})
        for i in range(n)
    }


def _job(desired: int, job_id: str = "web", cpu: int = 500, **rules: Any) -> Job:
    return Job.model_validate(
        {
            "name": job_id,
            "groups": [
                {
                    "name": "api",
                    "scaling": {"max": 64, "desired": desired},
                    "tasks": [{"name": "t", "resources": {"cpu": cpu, "memory": 256}}],
                    **rules,
                }
            ],
        }
    )


def _plan(jobs: list[Job], nodes: dict[str, Node], **kw: Any) -> Plan:
    return reconcile(
        jobs={j.id: j for j in jobs},
        nodes=nodes,
        bindings=kw.pop("bindings", {}),
        pending={},
        failures={},
        now=0.0,
        **kw,
    )


def _on(plan: Plan, job: str = "web") -> Counter[str]:
    return Counter(b.node for b in plan.bindings.values() if b.job == job)


def _zones(plan: Plan, nodes: dict[str, Node], job: str = "web") -> Counter[str]:
    return Counter(nodes[b.node].labels["zone"] for b in plan.bindings.values() if b.job == job)


# -- distinct_hosts ------------------------------------------------------------------
def test_binpack_stacks_a_group_and_distinct_hosts_puts_each_replica_on_its_own_node() -> None:
    nodes = _nodes(6)
    assert max(_on(_plan([_job(4)], nodes)).values()) == 4  # the rule is what spreads them
    plan = _plan([_job(4, distinct_hosts=True)], nodes)
    assert len(plan.placed) == 4 and set(_on(plan).values()) == {1}


def test_distinct_hosts_leaves_the_replicas_past_the_node_count_pending_and_says_why() -> None:
    plan = _plan([_job(8, distinct_hosts=True)], _nodes(6))
    assert len(plan.placed) == 6 and set(_on(plan).values()) == {1}
    assert sorted(plan.pending) == ["web/api/6", "web/api/7"]
    assert plan.pending["web/api/6"].reasons == (
        "0/6 nodes available: 6 distinct hosts (holds a replica of the group)",
    )


def test_a_plain_group_of_the_same_shape_is_not_refused_by_a_distinct_hosts_refusal() -> None:
    """The rule must not leak into the equivalence class the plain group uses: its
    "no node" answer is the topology group's alone (invariant 4)."""
    plan = _plan([_job(5, "a-first", distinct_hosts=True), _job(3, "b-plain")], _nodes(3))
    assert len(_on(plan, "a-first")) == 3
    assert sum(_on(plan, "b-plain").values()) == 3


def test_two_distinct_hosts_groups_of_one_shape_each_get_every_node() -> None:
    """They share what the pass learnt about capacity (a node full for one is full
    for the other), never what one group's own rule said about a node."""
    plan = _plan([_job(3, "a", distinct_hosts=True), _job(3, "b", distinct_hosts=True)], _nodes(3))
    assert len(_on(plan, "a")) == 3 and len(_on(plan, "b")) == 3
    full = _nodes(3)
    full["n0"] = Node(id="n0", cpu=500, memory=8192, labels={"zone": "a"})  # one replica
    plan = _plan([_job(3, "a", distinct_hosts=True), _job(3, "b", distinct_hosts=True)], full)
    assert len(_on(plan, "a")) == 3 and sorted(_on(plan, "b")) == ["n1", "n2"]
    assert plan.pending["b/api/2"].reasons == (
        "0/3 nodes available: 2 distinct hosts (holds a replica of the group), 1 insufficient cpu",
    )


def test_distinct_hosts_counts_the_group_s_existing_replicas() -> None:
    nodes = _nodes(3)
    first = _plan([_job(2, distinct_hosts=True)], nodes)
    grown = _plan([_job(3, distinct_hosts=True)], nodes, bindings=first.bindings)
    assert set(_on(grown).values()) == {1} and len(_on(grown)) == 3


# -- spread --------------------------------------------------------------------------
def test_spread_by_zone_puts_two_replicas_in_each_of_three_zones() -> None:
    nodes = _nodes(6)
    assert len(_zones(_plan([_job(6)], nodes), nodes)) < 3  # binpack alone does not
    plan = _plan([_job(6, spread=[{"label": "zone"}])], nodes)
    assert _zones(plan, nodes) == {"a": 2, "b": 2, "c": 2}


def test_a_node_without_the_label_cannot_hold_a_do_not_schedule_replica() -> None:
    nodes = _nodes(2, zones="a")
    nodes["bare"] = Node(id="bare", cpu=64000, memory=65536)  # the best binpack fit
    plan = _plan([_job(4, spread=[{"label": "zone"}])], nodes)
    assert "bare" not in _on(plan) and len(plan.placed) == 4


def test_a_full_zone_keeps_the_others_within_max_skew_and_the_rest_waits_with_why() -> None:
    nodes = _nodes(3)
    nodes["n0"] = Node(id="n0", cpu=500, memory=8192, labels={"zone": "a"})  # one replica
    plan = _plan([_job(6, spread=[{"label": "zone", "max_skew": 1}])], nodes)
    assert _zones(plan, nodes) == {"a": 1, "b": 2, "c": 2}
    assert sorted(plan.pending) == ["web/api/5"]
    assert plan.pending["web/api/5"].reasons == (
        "0/3 nodes available: 2 spread on zone would pass max_skew, 1 insufficient cpu",
    )


def test_max_skew_2_allows_a_difference_of_two() -> None:
    nodes = _nodes(3)
    nodes["n0"] = Node(id="n0", cpu=500, memory=8192, labels={"zone": "a"})
    plan = _plan([_job(7, spread=[{"label": "zone", "max_skew": 2}])], nodes)
    assert _zones(plan, nodes) == {"a": 1, "b": 3, "c": 3}


def test_schedule_anyway_prefers_balance_but_places_past_the_skew() -> None:
    nodes = _nodes(3)
    nodes["n0"] = Node(id="n0", cpu=500, memory=8192, labels={"zone": "a"})
    rule = {"label": "zone", "when_unsatisfiable": "schedule_anyway"}
    plan = _plan([_job(7, spread=[rule])], nodes)
    assert not plan.pending and len(plan.placed) == 7
    zones = _zones(plan, nodes)
    assert zones["a"] == 1 and abs(zones["b"] - zones["c"]) <= 1


def test_spread_counts_only_the_replicas_of_the_group_s_current_version() -> None:
    """Two old-version replicas sit in zone a: the new ones spread as if they were
    not there (one in a, one in b), not both into b (kubernetes#98215)."""
    nodes = _nodes(2, zones="ab")
    job = _job(4, spread=[{"label": "zone"}])
    old = {
        f"web/api/{i}": Binding("web", "api", i, "n0", (), 500, 256, version="old") for i in (0, 1)
    }
    plan = _plan([job], nodes, bindings=old)
    new = list(plan.placed)
    assert len(new) == 2
    assert sorted(nodes[b.node].labels["zone"] for b in new) == ["a", "b"]


def test_with_the_rules_off_the_pass_places_as_before_them() -> None:
    nodes = _nodes(6)
    off = ReconcileOptions(topology=False)
    plain = _plan([_job(4)], nodes)
    ruled = _plan([_job(4, distinct_hosts=True, spread=[{"label": "zone"}])], nodes, options=off)
    assert sorted(b.node for b in plain.placed) == sorted(b.node for b in ruled.placed)


# -- the property --------------------------------------------------------------------
_RULES = st.fixed_dictionaries(
    {
        "distinct_hosts": st.booleans(),
        "spread": st.lists(
            st.fixed_dictionaries(
                {
                    "label": st.sampled_from(["zone", "disk"]),
                    "max_skew": st.integers(1, 2),
                    "when_unsatisfiable": st.sampled_from(["do_not_schedule", "schedule_anyway"]),
                }
            ),
            max_size=2,
            unique_by=lambda r: r["label"],
        ),
    }
)


@st.composite
def _worlds(draw: st.DrawFn) -> tuple[dict[str, Node], dict[str, Job]]:
    nodes = {n.id: n for n in draw(node_lists(1, 7))}
    jobs: dict[str, Job] = {}
    for i in range(draw(st.integers(1, 4))):
        g: TaskGroup = draw(groups("g", max_desired=8))
        data = g.model_dump()
        if draw(st.integers(0, 3)):  # most have rules of their own
            data.update(draw(_RULES))
        job = Job.model_validate({"id": f"j{i}", "name": f"j{i}", "groups": [data]})
        jobs[job.id] = job
    return nodes, jobs


@given(_worlds(), any_options())
def test_after_a_pass_the_rules_hold_and_whatever_fits_under_them_is_placed(
    world: tuple[dict[str, Node], dict[str, Job]], options: ReconcileOptions
) -> None:
    nodes, jobs = world
    options = options.model_copy(update={"preemption": False})
    plan = reconcile(
        jobs=jobs, nodes=nodes, bindings={}, pending={}, failures={}, now=0.0, options=options
    )
    bindings = list(plan.bindings.values())
    assert not violations(
        nodes.values(),
        [b.to_assignment() for b in bindings],
        desired=[w for j in jobs.values() for g in j.groups for w in _wids(j, g)],
    )
    cluster = Cluster(list(nodes.values()))
    for b in bindings:
        cluster.by_id[b.node].hold(b)
    for job in jobs.values():
        g = job.groups[0]
        mine = [b for b in bindings if b.job == job.id]
        if g.distinct_hosts:
            assert len({b.node for b in mine}) == len(mine)
        topo = topology_of(job.id, g, cluster.nodes, bindings)
        for i, rule in enumerate(g.spread):
            if rule.hard and topo.counts[i]:
                counts = topo.counts[i].values()
                assert max(counts) - min(counts) <= rule.max_skew
                assert all(rule.label in nodes[b.node].labels for b in mine)
        filters = filters_for(topo if g.topology else None)
        for wid, entry in plan.pending.items():
            if wid.startswith(f"{job.id}/") and entry.kind == "backoff":
                fits = [
                    a.id
                    for a in cluster.nodes
                    if explain_node(a, g.request(), g.constraints, filters) is None
                ]
                assert not fits, f"{wid} pending, yet fits {fits}"


def _wids(job: Job, g: TaskGroup) -> list[str]:
    return [f"{job.id}/{g.name}/{i}" for i in range(g.scaling.desired)]


@st.composite
def _one_rule_set(draw: st.DrawFn) -> tuple[dict[str, Node], dict[str, Job]]:
    """Plain and ruled groups that differ only in cpu (one set of static rules), so
    the searches without a class start from what the classes learnt (Placer._open)."""
    nodes = {
        f"n{i}": Node(
            id=f"n{i}",
            cpu=draw(st.integers(1, 6)) * 500,
            memory=8192,
            labels={"zone": draw(st.sampled_from("ab"))},
        )
        for i in range(draw(st.integers(1, 8)))
    }
    jobs: dict[str, Job] = {}
    for i in range(draw(st.integers(2, 6))):
        spread: dict[str, Any] = {"spread": [{"label": "zone"}]}
        plain: dict[str, Any] = {}
        rules = draw(st.sampled_from([plain, plain, {"distinct_hosts": True}, spread]))
        job = _job(draw(st.integers(1, 6)), f"j{i}", cpu=draw(st.integers(1, 4)) * 250, **rules)
        jobs[job.id] = job
    return nodes, jobs


@given(_one_rule_set(), st.sampled_from([1, 2, 8]), st.integers(0, 3))
def test_groups_of_one_rule_set_leave_nothing_pending_that_fits(
    world: tuple[dict[str, Node], dict[str, Job]], candidates: int, seed: int
) -> None:
    nodes, jobs = world
    options = ReconcileOptions(candidates=candidates, seed=seed, preemption=False)
    plan = reconcile(
        jobs=jobs, nodes=nodes, bindings={}, pending={}, failures={}, now=0.0, options=options
    )
    bindings = list(plan.bindings.values())
    cluster = Cluster(list(nodes.values()))
    for b in bindings:
        cluster.by_id[b.node].hold(b)
    for job in jobs.values():
        g = job.groups[0]
        topo = topology_of(job.id, g, cluster.nodes, bindings) if g.topology else None
        for wid in plan.pending:
            if wid.startswith(f"{job.id}/"):
                fits = [
                    a.id
                    for a in cluster.nodes
                    if explain_node(a, g.request(), g.constraints, filters_for(topo)) is None
                ]
                assert not fits, f"{wid} pending, yet fits {fits}"
