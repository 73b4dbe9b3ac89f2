"""Gangs (issue 22): a group with ``gang: true`` is bound all together or not at
all, in priority order, and a lost member takes the rest with it
(``on_member_loss: restart_all``) so that it is placed again together.

Examples, then a property over random clusters with brute force as the oracle:
after a pass every gang is wholly bound or holds nothing, a gang is left pending
only if its identical members cannot all fit on what the pass left (the most
copies of one request each node can hold, counted by allocating on a copy), and
every other replica left pending fits no node (invariant 4); invariants 1-3 hold.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from forge.core.invariants import violations
from forge.core.models import Job, Node, NodeState, TaskGroup
from forge.core.placement import Cluster, NodeAlloc, explain_node
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from tests.strategies import groups, node_lists
from tests.strategies import options as any_options


def _gpu_nodes(n: int) -> dict[str, Node]:
    return {
        f"g{i}": Node.model_validate(
            {
                "id": f"g{i}",
                "cpu": 8000,
                "memory": 32768,
                "gpus": [{"id": f"gpu{j}", "model": "A100", "memory": 40960} for j in range(4)],
            }
        )
        for i in range(n)
    }


def _job(name: str, n: int, *, gpu: int = 2, priority: int = 50, **rules: Any) -> Job:
    return Job.model_validate(
        {
            "name": name,
            "priority": priority,
            "groups": [
                {
                    "name": "w",
                    "scaling": {"max": 32, "desired": n},
                    "tasks": [
                        {
                            "name": "t",
                            "resources": {"cpu": 1000, "memory": 1024, "gpu": {"count": gpu}},
                        }
                    ],
                    **rules,
                }
            ],
        }
    )


def _pass(jobs: list[Job], nodes: dict[str, Node], **kw: Any) -> Plan:
    return reconcile(
        jobs={j.id: j for j in jobs},
        nodes=nodes,
        bindings=kw.pop("bindings", {}),
        pending=kw.pop("pending", {}),
        failures=kw.pop("failures", {}),
        now=kw.pop("now", 0.0),
        **kw,
    )


def _bound(plan: Plan, job: str) -> list[str]:
    return sorted(w for w, b in plan.bindings.items() if b.job == job)


def test_two_gangs_needing_60_percent_each_give_one_running_gang_and_one_holding_nothing() -> None:
    nodes = _gpu_nodes(3)  # 12 GPUs; each gang asks 8
    plan = _pass([_job("a", 4, gang=True), _job("b", 4, gang=True)], nodes)
    assert len(_bound(plan, "a")) == 4 and _bound(plan, "b") == []
    assert plan.pending["b/w/0"].reasons == (
        "gang: 2 of 4 fit; 0/3 nodes available: 3 insufficient gpu",
    )
    assert {w for w in plan.pending} == {f"b/w/{i}" for i in range(4)}


def test_without_gang_the_second_job_half_starts() -> None:
    plan = _pass([_job("a", 4), _job("b", 4)], _gpu_nodes(3))
    assert len(_bound(plan, "b")) == 2  # what gang: true is for


def test_gangs_are_planned_in_priority_order() -> None:
    plan = _pass(
        [_job("a", 4, gang=True, priority=10), _job("b", 4, gang=True, priority=90)],
        _gpu_nodes(3),
    )
    assert _bound(plan, "a") == [] and len(_bound(plan, "b")) == 4


def test_a_gang_that_does_not_fit_leaves_its_capacity_to_smaller_work() -> None:
    nodes = _gpu_nodes(1)
    plan = _pass([_job("big", 3, gang=True, priority=90), _job("small", 2, gpu=1)], nodes)
    assert _bound(plan, "big") == [] and len(_bound(plan, "small")) == 2


def test_scaling_a_gang_up_adds_the_new_replicas_as_one_gang() -> None:
    nodes = _gpu_nodes(2)  # 8 GPUs: 2 running workers + room for 2 more, not 3
    first = _pass([_job("a", 2, gang=True)], nodes)
    up5 = _pass([_job("a", 5, gang=True)], nodes, bindings=first.bindings)
    assert _bound(up5, "a") == ["a/w/0", "a/w/1"]  # the old stay, no new one half-starts
    assert up5.pending["a/w/2"].reasons[0].startswith("gang: 2 of 3 fit")
    up4 = _pass([_job("a", 4, gang=True)], nodes, bindings=first.bindings)
    assert len(_bound(up4, "a")) == 4


def test_a_failed_member_releases_the_whole_gang_which_returns_together() -> None:
    nodes = _gpu_nodes(3)
    job = _job("a", 3, gang=True)
    first = _pass([job], nodes)
    after = _pass([job], nodes, bindings=first.bindings, failed=["a/w/0"], now=1.0)
    assert sorted(after.released) == [
        ("a/w/0", "failed"),
        ("a/w/1", "gang member lost"),
        ("a/w/2", "gang member lost"),
    ]
    assert _bound(after, "a") == []  # the failed one waits its delay; the gang with it
    wake = after.pending["a/w/0"].not_before
    assert {e.not_before for e in after.pending.values()} == {wake}
    back = _pass(
        [job],
        nodes,
        bindings=after.bindings,
        pending=after.pending,
        failures=after.failures,
        now=wake,
    )
    assert len(_bound(back, "a")) == 3


def test_a_lost_node_moves_the_whole_gang_in_the_same_pass() -> None:
    nodes = _gpu_nodes(3)
    job = _job("a", 2, gang=True, gpu=4)  # one worker per node
    first = _pass([job], nodes)
    gone = first.bindings["a/w/0"].node
    nodes[gone] = nodes[gone].model_copy(update={"state": NodeState.LOST})
    after = _pass([job], nodes, bindings=first.bindings, now=1.0)
    assert ("a/w/1", "gang member lost") in after.released
    assert len(_bound(after, "a")) == 2 and gone not in {b.node for b in after.placed}


def test_on_member_loss_keep_leaves_the_other_members_running() -> None:
    nodes = _gpu_nodes(3)
    job = _job("a", 3, gang=True, on_member_loss="keep")
    first = _pass([job], nodes)
    after = _pass([job], nodes, bindings=first.bindings, failed=["a/w/0"], now=1.0)
    assert after.released == [("a/w/0", "failed")]
    assert _bound(after, "a") == ["a/w/1", "a/w/2"]


def test_a_gang_member_is_never_preempted_and_a_gang_never_preempts() -> None:
    nodes = _gpu_nodes(1)
    low_gang = _pass([_job("low", 2, gang=True, priority=10)], nodes)
    high = _pass(
        [_job("low", 2, gang=True, priority=10), _job("high", 1, gpu=4, priority=90)],
        nodes,
        bindings=low_gang.bindings,
    )
    assert not high.preemptions and len(_bound(high, "low")) == 2
    low_plain = _pass([_job("low", 2, priority=10)], nodes)
    gang_high = _pass(
        [_job("low", 2, priority=10), _job("high", 1, gpu=4, priority=90, gang=True)],
        nodes,
        bindings=low_plain.bindings,
    )
    assert not gang_high.preemptions and _bound(gang_high, "high") == []


def test_with_gangs_off_the_pass_places_member_by_member_as_before() -> None:
    off = ReconcileOptions(gangs=False)
    plan = _pass([_job("a", 4, gang=True), _job("b", 4, gang=True)], _gpu_nodes(3), options=off)
    assert len(_bound(plan, "b")) == 2


# -- the property --------------------------------------------------------------------
@st.composite
def _worlds(draw: st.DrawFn) -> tuple[dict[str, Node], dict[str, Job]]:
    nodes = {n.id: n for n in draw(node_lists(1, 6))}
    jobs: dict[str, Job] = {}
    for i in range(draw(st.integers(1, 4))):
        g: TaskGroup = draw(groups("g", max_desired=5))
        data = g.model_dump()
        if draw(st.integers(0, 2)):
            data["gang"] = True
            data["distinct_hosts"] = draw(st.booleans())
        job = Job.model_validate(
            {
                "id": f"j{i}",
                "name": f"j{i}",
                "priority": draw(st.sampled_from([10, 50])),
                "groups": [data],
            }
        )
        jobs[job.id] = job
    return nodes, jobs


def _room(node: NodeAlloc, g: TaskGroup, cap: int) -> int:
    """How many replicas of the group the node could still take, at most ``cap``."""
    req = g.request()
    if explain_node(node, req, g.constraints) is not None:
        return 0
    copy = replace(node, gpu_free=list(node.gpu_free), gpu_left=list(node.gpu_left))
    n = 0
    while n < cap and copy.fits(req):
        copy.allocate(req)
        n += 1
    return n


@given(_worlds(), any_options())
def test_after_a_pass_each_gang_is_all_or_nothing_and_pending_only_if_it_cannot_fit(
    world: tuple[dict[str, Node], dict[str, Job]], options: ReconcileOptions
) -> None:
    nodes, jobs = world
    options = options.model_copy(update={"preemption": False})
    plan = reconcile(
        jobs=jobs, nodes=nodes, bindings={}, pending={}, failures={}, now=0.0, options=options
    )
    bindings = list(plan.bindings.values())
    desired = [f"{j.id}/g/{i}" for j in jobs.values() for i in range(j.groups[0].scaling.desired)]
    assert not violations(nodes.values(), [b.to_assignment() for b in bindings], desired=desired)
    cluster = Cluster(list(nodes.values()))
    for b in bindings:
        cluster.by_id[b.node].hold(b)
    for job in jobs.values():
        g = job.groups[0]
        mine = [b for b in bindings if b.job == job.id]
        refused = [
            w for w, e in plan.pending.items() if w.startswith(f"{job.id}/") and e.kind == "backoff"
        ]
        if g.gang:
            assert len(mine) in (0, g.scaling.desired), "a gang is all bound or none"
            if g.distinct_hosts:
                assert len({b.node for b in mine}) == len(mine)
            if refused and len(refused) <= options.max_placements:
                cap = 1 if g.distinct_hosts else len(refused)
                room = sum(_room(n, g, cap) for n in cluster.nodes)
                assert room < len(refused), f"gang {job.id} pending, yet {room} fit"
            continue
        for wid in refused:
            fits = [a.id for a in cluster.nodes if _room(a, g, 1)]
            assert not fits, f"{wid} pending, yet fits {fits}"


@given(
    _worlds(),
    st.lists(
        st.tuples(st.integers(0, 9), st.lists(st.integers(0, 40), max_size=3)),
        min_size=1,
        max_size=4,
    ),
)
def test_every_pass_leaves_each_gang_whole_or_empty_through_node_loss_and_failures(
    world: tuple[dict[str, Node], dict[str, Job]], steps: list[tuple[int, list[int]]]
) -> None:
    """Each step loses a node (by index, if any is left) and fails some bound
    replicas (by index); a restart_all gang is all bound or holds nothing after every
    pass, and a lost node holds nothing."""
    nodes, jobs = world
    options = ReconcileOptions(preemption=False)
    plan = reconcile(
        jobs=jobs, nodes=nodes, bindings={}, pending={}, failures={}, now=0.0, options=options
    )
    now = 0.0
    for lose, fail in steps:
        ready = sorted(n for n, spec in nodes.items() if spec.state is NodeState.READY)
        if ready:
            gone = ready[lose % len(ready)]
            nodes[gone] = nodes[gone].model_copy(update={"state": NodeState.LOST})
        bound = sorted(plan.bindings)
        failed = sorted({bound[i % len(bound)] for i in fail}) if bound else []
        now += 400.0  # past every reschedule delay and backoff of the strategies
        plan = reconcile(
            jobs=jobs,
            nodes=nodes,
            bindings=plan.bindings,
            pending=plan.pending,
            failures=plan.failures,
            failed=failed,
            now=now,
            options=options,
        )
        lost = {n for n, spec in nodes.items() if spec.state is NodeState.LOST}
        assert not [b for b in plan.bindings.values() if b.node in lost]
        for job in jobs.values():
            g = job.groups[0]
            mine = [b for b in plan.bindings.values() if b.job == job.id]
            if g.gang:
                assert len(mine) in (0, g.scaling.desired), f"{job.id}: {len(mine)} bound"
            if g.distinct_hosts:
                assert len({b.node for b in mine}) == len(mine)


def test_a_gang_the_gpu_reservation_turned_away_is_placed_once_it_lifts() -> None:
    """Placement version 2: free GPUs reserve the node's cpu from work without GPUs.
    The gang (placed first, by priority) is refused while a GPU job is still to
    come; once that one is bound nothing needs the reservation, and the gang is
    tried again, whole, in the same pass (invariant 4)."""
    nodes = _gpu_nodes(1)
    gang = _job("cpu-gang", 2, gpu=0, priority=90, gang=True)
    gpu = _job("gpu-one", 1, gpu=1, priority=50)
    v2 = ReconcileOptions(preemption=False)
    plan = _pass([gang, gpu], nodes, options=v2)
    assert len(_bound(plan, "gpu-one")) == 1
    assert len(_bound(plan, "cpu-gang")) == 2 and not plan.pending


def test_a_distinct_hosts_replica_the_reservation_turned_away_is_placed_once_it_lifts() -> None:
    nodes = _gpu_nodes(2)
    apart = _job("apart", 2, gpu=0, priority=90, distinct_hosts=True)
    gpu = _job("gpu-one", 1, gpu=1, priority=50)
    v2 = ReconcileOptions(preemption=False)
    plan = _pass([apart, gpu], nodes, options=v2)
    assert sorted(b.node for b in plan.bindings.values() if b.job == "apart") == ["g0", "g1"]
    assert not plan.pending


def test_a_rolling_update_replaces_a_gang_whole_on_the_new_version() -> None:
    """A gang runs one version: the update's first wave releases every member and
    the gang is placed again together on the new one (not one member at a time)."""
    nodes = {f"n{i}": Node(id=f"n{i}", cpu=4000, memory=8192) for i in range(4)}

    def job(command: str) -> Job:
        return Job.model_validate(
            {
                "name": "t",
                "groups": [
                    {
                        "name": "w",
                        "gang": True,
                        "scaling": {"max": 8, "desired": 3},
                        "tasks": [
                            {
                                "name": "x",
                                "command": [command],
                                "resources": {"cpu": 1000, "memory": 512},
                            }
                        ],
                    }
                ],
            }
        )

    rolling = ReconcileOptions(rollouts=True, preemption=False)
    old = _pass([job("a")], nodes, options=rolling)
    new = _pass([job("b")], nodes, bindings=old.bindings, options=rolling, now=1.0)
    assert sorted(why for _, why in new.released) == [
        "gang member lost",
        "gang member lost",
        "rollout",
    ]
    version = job("b").groups[0].version
    assert sorted(b.version for b in new.bindings.values()) == [version] * 3
