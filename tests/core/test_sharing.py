"""Jobs share one object per distinct group spec (forge.core.sharing)."""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.models import Job
from forge.core.sharing import SharedGroups
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
