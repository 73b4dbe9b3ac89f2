"""The placement order carried from pass to pass (``Queue.order``) is the order a
full sort of the waiting groups gives: a pass that merges the changes into the
carried order plans exactly what a pass that sorts everything plans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.reconcile import Carry, ReconcileOptions
from tests import strategies as fs
from tests.core.sim import Sim, carried_pass, plan_key


@settings(max_examples=80, deadline=None)
@given(
    fs.worlds(max_nodes=5, max_jobs=6),
    fs.options(),
    st.lists(fs.events(), max_size=10),
    st.sampled_from([5, 40, 400]),
)
def test_a_carried_order_plans_what_sorting_every_pass_plans(
    world: fs.World, options: ReconcileOptions, events: list[fs.Event], budget: int
) -> None:
    options = options.model_copy(update={"max_work": budget})  # deferrals, pass after pass
    merged = Sim(nodes=dict(world.nodes), jobs=dict(world.jobs), options=options)
    sorted_ = Sim(nodes=dict(world.nodes), jobs=dict(world.jobs), options=options)
    carries: list[Carry | None] = [None, None]
    carried_orders = 0
    for step in range(len(events) + 4):
        a, b = carried_pass(merged, carries[0]), carried_pass(sorted_, carries[1])
        assert plan_key(a) == plan_key(b), f"pass {step} planned differently"
        assert a.carry is not None and b.carry is not None
        carried_orders += a.carry.queue is not None and a.carry.queue.order is not None
        if b.carry.queue is not None:
            b.carry.queue.order = None  # this one sorts every waiting group again
        carries = [a.carry, b.carry]
        if step < len(events):
            merged.apply(events[step])
            sorted_.apply(events[step])
        if step % 2 and merged.jobs:  # a priority change moves a job in the order
            jid = sorted(merged.jobs)[step % len(merged.jobs)]
            for sim in (merged, sorted_):
                job = sim.jobs[jid]
                sim.jobs[jid] = job.model_copy(update={"priority": 101 - job.priority})
    assert carried_orders >= 1  # the carried order was used
