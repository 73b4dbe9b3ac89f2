"""Group versions: a digest of what a replica runs, and what changed between two."""

from __future__ import annotations

from typing import Any

from forge.core.models import Job, TaskGroup, UpdatePolicy
from forge.core.versions import describe_change, with_tasks_of


def group(**task: Any) -> TaskGroup:
    spec = {"name": "t", "resources": {"cpu": 100, "memory": 64}, **task}
    return TaskGroup.model_validate(
        {"name": "api", "scaling": {"max": 5, "desired": 3}, "tasks": [spec]}
    )


def test_the_version_changes_with_what_a_replica_runs_and_nothing_else() -> None:
    g = group(env={"A": "1"})
    assert g.version == group(env={"A": "1"}).version
    assert g.version != group(env={"A": "2"}).version
    assert g.version != group(command=["sleep", "1"]).version
    assert g.version != group(resources={"cpu": 200, "memory": 64}).version
    scaled = g.model_copy(update={"scaling": g.scaling.model_copy(update={"desired": 4})})
    assert scaled.version == g.version
    assert g.model_copy(update={"update": UpdatePolicy(max_parallel=2)}).version == g.version


def test_a_copy_with_new_tasks_has_their_version_not_the_cached_one() -> None:
    g = group()
    before = g.version
    other = group(env={"A": "1"})
    assert g.model_copy(update={"tasks": other.tasks}).version == other.version
    assert g.version == before


def test_a_group_without_an_update_policy_dumps_as_before_rolling_updates() -> None:
    g = group()
    assert "update" not in g.model_dump()
    assert "update" in group().model_copy(update={"update": UpdatePolicy()}).model_dump()


def test_describe_change_names_the_task_fields_that_differ() -> None:
    assert describe_change(None, group()) == "initial"
    assert describe_change(group(), group(env={"A": "1"})) == "t: env"
    assert (
        describe_change(group(), group(command=["x"], resources={"cpu": 1, "memory": 1}))
        == "t: command, resources"
    )
    two = TaskGroup.model_validate(
        {
            "name": "api",
            "tasks": [
                *group().model_dump()["tasks"],
                {**group().model_dump()["tasks"][0], "name": "u"},
            ],
        }
    )
    assert describe_change(group(), two) == "u: added"
    assert describe_change(two, group()) == "u: removed"


def test_a_revert_takes_the_old_tasks_and_keeps_todays_scaling() -> None:
    old = group()
    now = Job(
        name="web",
        groups=(
            group(env={"A": "1"}).model_copy(
                update={"scaling": old.scaling.model_copy(update={"desired": 5})}
            ),
        ),
    )
    reverted = with_tasks_of(now, "api", old)
    g = reverted.groups[0]
    assert g.version == old.version
    assert g.scaling.desired == 5
