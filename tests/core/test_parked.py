"""Parked groups (``forge.core.queue.Parked``): a carried pass takes the entries of a
group whose every unbound replica waits out a delay without walking its replicas,
and plans exactly what a pass that walks them plans, budgets included."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.models import NodeState
from forge.core.placing import Placing
from forge.core.reconcile import Carry, ReconcileOptions, reconcile
from tests import strategies as fs
from tests.builders import group, job, node
from tests.core.sim import Sim, carried_pass, plan_key


@settings(max_examples=100, deadline=None)
@given(
    fs.worlds(max_nodes=5, max_jobs=6),
    fs.options(),
    st.lists(fs.events(), max_size=10),
    st.sampled_from([0, 5, 40, 400]),
)
def test_a_pass_that_takes_parked_groups_plans_what_walking_them_plans(
    world: fs.World, options: ReconcileOptions, events: list[fs.Event], budget: int
) -> None:
    options = options.model_copy(update={"max_work": budget})
    parking = Sim(nodes=dict(world.nodes), jobs=dict(world.jobs), options=options)
    walking = Sim(nodes=dict(world.nodes), jobs=dict(world.jobs), options=options)
    carries: list[Carry | None] = [None, None]
    for step in range(len(events) + 4):
        a, b = carried_pass(parking, carries[0]), carried_pass(walking, carries[1])
        assert plan_key(a) == plan_key(b), f"pass {step} planned differently"
        assert a.work == b.work, f"pass {step} counted other work"
        assert a.carry is not None and b.carry is not None
        assert b.carry.queue is not None
        b.carry.queue.parked.clear()  # this one walks every waiting replica again
        carries = [a.carry, b.carry]
        if step < len(events):
            parking.apply(events[step])
            walking.apply(events[step])


def _gpu_backlog() -> Sim:
    """Two GPU nodes taken by the first job; a second GPU job waits in backoff
    ahead of CPU work, pass after pass."""
    nodes = {f"h{i}": node(f"h{i}", 8000, 16384, gpus=1) for i in range(2)}
    nodes.update({f"c{i}": node(f"c{i}", 8000, 16384) for i in range(2)})
    jobs = {
        "a": job("a", group(desired=2, gpu=1), priority=90),
        "b": job("b", group(desired=6, gpu=1), priority=90),
        "c": job("c", group(desired=4, cpu=500), priority=10),
    }
    return Sim(nodes=nodes, jobs=jobs, options=ReconcileOptions(max_work=400))


def _count_parked(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    taken: list[bool] = []
    real = Placing._still_parked

    def spy(self: Placing, *args: Any) -> bool:
        out = real(self, *args)
        taken.append(out)
        return out

    monkeypatch.setattr(Placing, "_still_parked", spy)
    return taken


def test_a_waiting_group_is_walked_once_then_taken_whole_until_its_delay_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = _count_parked(monkeypatch)
    sim = _gpu_backlog()
    first = carried_pass(sim, None)
    assert len(first.placed) == 2 + 4  # a's two GPU replicas, c's four
    assert sum(1 for w in first.pending if w.startswith("b/")) == 6
    sim.now += 0.1  # inside every backoff: b's replicas wait, walked once more
    second = carried_pass(sim, first.carry)
    assert True not in taken
    sim.now += 0.1
    third = carried_pass(sim, second.carry)
    assert taken[-1] is True, "the waiting group was walked again"
    assert third.pending == second.pending  # the same entries, taken whole
    assert [w for w in third.pending] == [w for w in second.pending]  # in the same order
    taken.clear()
    sim.now = min(e.not_before for e in third.pending.values())  # the first delay ends
    fourth = carried_pass(sim, third.carry)
    assert taken == [False], "a group whose delay ended was taken whole"
    assert fourth.pending != third.pending


def test_freed_capacity_or_a_changed_job_unparks_a_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = _count_parked(monkeypatch)
    sim = _gpu_backlog()
    carry = carried_pass(sim, None).carry
    sim.now += 0.1
    carry = carried_pass(sim, carry).carry  # b parked
    taken.clear()
    sim.now += 0.1
    sim.capacity_changed = True  # e.g. a node joined: backed-off replicas retry now
    sim.nodes["h2"] = node("h2", 8000, 16384, gpus=1)
    plan = reconcile(**sim.inputs(), carry=carry)
    assert taken == [False]
    assert sum(1 for b in plan.placed if b.job == "b") == 1
    taken.clear()
    sim.bindings, sim.pending, sim.failures = plan.bindings, plan.pending, plan.failures
    sim.capacity_changed = False
    sim.now += 0.1
    carry = carried_pass(sim, plan.carry).carry  # b's five left parked again
    sim.now += 0.1
    carry = carried_pass(sim, carry).carry
    assert taken[-1] is True
    sim.jobs["b"] = job("b", group(desired=3, gpu=1), priority=90)
    sim.now += 0.1
    carried_pass(sim, carry)
    assert taken[-1] is False, "a changed job's group was taken whole"


def test_a_replica_of_a_parked_group_released_by_a_node_loss_is_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group's other replicas still wait with their entries, but one more is
    unbound now: the group is walked, and the released replica gets its try."""
    taken = _count_parked(monkeypatch)
    nodes = {f"h{i}": node(f"h{i}", 8000, 16384, gpus=1) for i in range(2)}
    sim = Sim(nodes=nodes, jobs={"b": job("b", group(desired=4, gpu=1))})
    carry = carried_pass(sim, None).carry  # two bound, two refused
    for _ in range(2):
        sim.now += 0.1
        carry = carried_pass(sim, carry).carry  # walked (parks), then taken whole
    assert taken[-1] is True
    lost = next(w for w, b in sim.bindings.items() if b.node == "h0")
    sim.nodes["h0"] = node("h0", 8000, 16384, gpus=1, state=NodeState.LOST)
    sim.now += 0.1
    plan = carried_pass(sim, carry)
    assert taken[-1] is False, "a group with a replica just released was taken whole"
    assert lost not in plan.bindings and lost in plan.pending


def test_a_replica_released_beside_replicas_waiting_a_reschedule_delay_is_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Freed capacity does not end a reschedule delay, so only the group's bound
    count tells the pass that one more replica is unbound now."""
    taken = _count_parked(monkeypatch)
    nodes = {f"n{i}": node(f"n{i}", 8000, 16384) for i in range(2)}
    sim = Sim(nodes=nodes, jobs={"b": job("b", group(desired=3, cpu=1000))})
    carry = carried_pass(sim, None).carry  # all three bound
    kept, *failed = sorted(sim.bindings)
    sim.failed = set(failed)  # two fail: released, each waits its reschedule delay
    sim.now += 0.1
    carry = carried_pass(sim, carry).carry
    assert {sim.pending[w].kind for w in failed} == {"reschedule"}
    sim.now += 0.1
    carry = carried_pass(sim, carry).carry
    assert taken[-1] is True  # the two waiting replicas, taken whole
    on = sim.bindings[kept].node
    sim.nodes[on] = node(on, 8000, 16384, state=NodeState.LOST)
    sim.now += 0.1
    plan = carried_pass(sim, carry)
    assert taken[-1] is False, "a group with a replica just released was taken whole"
    assert kept in plan.bindings and plan.bindings[kept].node != on
    assert all(plan.pending[w].kind == "reschedule" for w in failed)
