"""Jobs share one object per distinct group spec (forge.core.sharing)."""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.models import Job
from forge.core.reconcile import Carry, ReconcileOptions
from forge.core.sharing import SharedGroups
from tests import strategies as fs
from tests.core.sim import Sim, carried_pass, plan_key
from tests.strategies import jobs


@settings(max_examples=60, deadline=None)
@given(st.lists(jobs(), min_size=1, max_size=8))
def test_a_shared_job_equals_the_job_and_equal_groups_are_one_object(specs: list[Job]) -> None:
    table = SharedGroups()
    out = [table.share(j) for j in specs]
    assert out == specs  # equal models: no decision can differ
    seen: dict[str, object] = {}
    for job in out:
        for g in job.groups:
            assert seen.setdefault(g.model_dump_json(), g) is g  # one object per spec


def test_copies_of_one_spec_share_its_groups_and_a_known_job_is_returned_as_it_is() -> None:
    base = Job.model_validate(
        {"name": "a", "groups": [{"name": "g", "tasks": [{"name": "t",
         "resources": {"cpu": 100, "memory": 64}}]}]}
    )  # fmt: skip
    copies = [Job.model_validate_json(base.model_dump_json()) for _ in range(3)]
    table = SharedGroups()
    first, *rest = (table.share(j) for j in copies)
    assert first is copies[0]  # the first of a spec is kept as it came
    assert all(j.groups[0] is first.groups[0] for j in rest)
    assert table.share(first) is first
    assert len(table) == 1


def _job(name: str, cpu: int) -> Job:
    task = {"name": "t", "resources": {"cpu": cpu, "memory": 64}}
    return Job.model_validate({"name": name, "groups": [{"name": "g", "tasks": [task]}]})


def test_past_its_limit_the_table_keeps_new_specs_as_they_came() -> None:
    table = SharedGroups(limit=1)
    a, b = (_job(n, cpu) for n, cpu in (("a", 100), ("b", 200)))
    assert table.share(a) is a and table.share(b) is b
    b2 = Job.model_validate_json(b.model_dump_json())
    assert table.share(b2) is b2  # b was never kept
    assert len(table) == 1


def test_shared_jobs_leave_the_collector_a_fraction_of_the_objects() -> None:
    """What the loop keeps per job: 2,000 jobs of one shape, parsed one by one."""
    text = Job.model_validate(
        {"name": "a", "groups": [{"name": "g", "tasks": [{"name": "t", "env": {"A": "1"},
         "resources": {"cpu": 100, "memory": 64}}]}]}
    ).model_dump_json()  # fmt: skip
    gc.collect()
    before = len(gc.get_objects())
    parsed = [Job.model_validate_json(text) for _ in range(2000)]
    apart = len(gc.get_objects()) - before
    table = SharedGroups()
    shared = [table.share(j) for j in parsed]
    del parsed
    gc.collect()
    kept = len(gc.get_objects()) - before
    assert len(shared) == 2000
    assert kept * 3 < apart, (kept, apart)


@settings(max_examples=60, deadline=None)
@given(fs.worlds(max_jobs=5), fs.options(), st.lists(fs.events(), max_size=8))
def test_shared_jobs_plan_exactly_what_separate_copies_plan(
    world: fs.World, options: ReconcileOptions, events: list[fs.Event]
) -> None:
    """The loop's state with shared groups plans as the state with a model per job
    did: pass after pass, carried (as the workflow hands each pass the last one's
    carry), through node and job events, with and without a work budget. The jobs
    come in as the loop gets them: each parsed on its own (no group shared yet)."""
    twins = {j.id: [Job.model_validate_json(j.model_dump_json()) for _ in range(3)]
             for j in world.jobs.values()}  # fmt: skip
    for jid, copies in list(twins.items()):  # more jobs of the same specs
        for k, copy in enumerate(copies[1:]):
            world.jobs[f"{jid}c{k}"] = copy.model_copy(update={"id": f"{jid}c{k}"})
    table = SharedGroups()
    apart = Sim(nodes=dict(world.nodes), jobs=dict(world.jobs), options=options)
    shared = Sim(
        nodes=dict(world.nodes),
        jobs={jid: table.share(j) for jid, j in world.jobs.items()},
        options=options,
    )
    carries: dict[int, Carry | None] = {id(apart): None, id(shared): None}
    for step in range(len(events) + 1):
        plans = []
        for sim in (apart, shared):
            plan = carried_pass(sim, carries[id(sim)])
            carries[id(sim)] = plan.carry
            plans.append(plan_key(plan))
        assert plans[0] == plans[1], f"pass {step} planned differently"
        if step < len(events):
            apart.apply(events[step])
            shared.apply(events[step])
            shared.jobs = {jid: table.share(j) for jid, j in shared.jobs.items()}
            if shared.jobs.keys() != apart.jobs.keys():  # pragma: no cover
                raise AssertionError("the event streams diverged")
