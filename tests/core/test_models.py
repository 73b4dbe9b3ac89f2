"""The vocabulary: strict, closed models whose errors name the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from forge.core.models import (
    Assignment,
    Constraint,
    GpuDevice,
    GpuRequest,
    Job,
    Node,
    ReschedulePolicy,
    Resources,
    ScalingPolicy,
    Task,
    TaskGroup,
)


def issue_job() -> dict[str, Any]:
    """The job file shape users write (examples/train.yaml), as YAML would load it."""
    return {
        "name": "train",
        "priority": 70,
        "groups": [
            {
                "name": "workers",
                "scaling": {"min": 1, "max": 4, "desired": 2},
                "constraints": [{"label": "gpu-model", "op": "in", "values": ["V100M32", "A100"]}],
                "reschedule": {
                    "attempts": 5,
                    "delay": 30,
                    "delay_function": "exponential",
                    "max_delay": 600,
                },
                "tasks": [
                    {
                        "name": "worker",
                        "command": ["python", "train.py"],
                        "args": ["--epochs", "10"],
                        "env": {"NCCL_DEBUG": "INFO"},
                        "resources": {
                            "cpu": 8000,
                            "memory": 32768,
                            "gpu": {"count": 2, "memory": 30000, "models": ["V100M32", "A100"]},
                        },
                    }
                ],
            },
            {
                "name": "tensorboard",
                "scaling": {"min": 0, "max": 1, "desired": 1},
                "autoscale": {"policy": "threshold", "scale_up": 0.8, "scale_down": 0.3},
                "tasks": [
                    {
                        "name": "board",
                        "command": ["tensorboard", "--logdir", "/runs", "--port", "6006"],
                        "resources": {"cpu": 500, "memory": 1024},
                    }
                ],
            },
        ],
    }


def errors(data: dict[str, Any], model: type[Job] | type[Node] = Job) -> list[tuple[Any, str]]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [(e["loc"], e["msg"]) for e in info.value.errors()]


def locs(data: dict[str, Any], model: type[Job] | type[Node] = Job) -> set[tuple[Any, ...]]:
    return {loc for loc, _ in errors(data, model)}


def task(name: str = "t", **resources: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"cpu": 500, "memory": 256, **resources}}


def job_with(**group: Any) -> dict[str, Any]:
    return {"name": "web", "groups": [{"name": "api", "tasks": [task()], **group}]}


# -- the shape users write -----------------------------------------------------------
def test_the_issue_job_validates() -> None:
    job = Job.model_validate(issue_job())
    assert job.id == job.name == "train" and job.priority == 70
    workers, board = job.groups
    assert workers.scaling == ScalingPolicy(min=1, max=4, desired=2)
    assert workers.constraints == (
        Constraint(label="gpu-model", op="in", values=("V100M32", "A100")),
    )
    assert workers.reschedule.delay == 30.0 and workers.reschedule.max_delay == 600.0
    worker = workers.tasks[0]
    assert worker.command == ("python", "train.py") and worker.args == ("--epochs", "10")
    assert worker.resources.gpu == GpuRequest(count=2, memory=30000, models=("V100M32", "A100"))
    assert board.autoscale is not None and board.reschedule == ReschedulePolicy()
    # round-trips through JSON (what crosses the Temporal boundary)
    assert Job.model_validate_json(job.model_dump_json()) == job
    assert Job.model_validate(json.loads(job.model_dump_json())) == job


def test_id_defaults_to_name_and_an_explicit_id_is_kept() -> None:
    assert Job.model_validate(job_with()).id == "web"
    assert Job.model_validate({**job_with(), "id": ""}).id == "web"
    assert Job.model_validate({**job_with(), "id": "web-2"}).id == "web-2"


def test_a_non_string_id_is_an_error_not_the_name() -> None:
    """Regression: any falsy id (0, False) silently became the name."""
    assert locs({**job_with(), "id": 0}) == {("id",)}
    assert locs({**job_with(), "id": False}) == {("id",)}


def test_defaults() -> None:
    job = Job.model_validate(job_with())
    g = job.groups[0]
    assert job.priority == 50
    assert g.scaling == ScalingPolicy(min=0, max=1, desired=1)
    assert g.reschedule == ReschedulePolicy(attempts=3, interval=3600, delay=15, max_delay=300)
    assert g.tasks[0].resources.gpu == GpuRequest()


# -- strictness ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"cpu": "500"}, ("groups", 0, "tasks", 0, "resources", "cpu")),
        ({"memory": "256"}, ("groups", 0, "tasks", 0, "resources", "memory")),
        ({"cpu": 500.0}, ("groups", 0, "tasks", 0, "resources", "cpu")),
        ({"cpu": True}, ("groups", 0, "tasks", 0, "resources", "cpu")),
        ({"cpu": 0}, ("groups", 0, "tasks", 0, "resources", "cpu")),
        ({"cpu": -1}, ("groups", 0, "tasks", 0, "resources", "cpu")),
        ({"gpu": {"count": True}}, ("groups", 0, "tasks", 0, "resources", "gpu", "count")),
        ({"gpu": {"count": "1"}}, ("groups", 0, "tasks", 0, "resources", "gpu", "count")),
    ],
)
def test_numbers_are_strict(patch: dict[str, Any], loc: tuple[Any, ...]) -> None:
    data = {"name": "web", "groups": [{"name": "api", "tasks": [task(**patch)]}]}
    assert loc in locs(data)


def test_bools_and_strings_are_not_ints() -> None:
    assert ("priority",) in locs({**job_with(), "priority": True})
    assert ("priority",) in locs({**job_with(), "priority": "50"})
    assert ("groups", 0, "scaling", "desired") in locs(job_with(scaling={"desired": True}))
    assert ("groups", 0, "reschedule", "unlimited") in locs(job_with(reschedule={"unlimited": 1}))
    assert ("groups", 0, "reschedule", "delay") in locs(job_with(reschedule={"delay": "15"}))


def test_lists_fill_tuple_fields_and_ints_fill_seconds() -> None:
    g = Job.model_validate(job_with(reschedule={"delay": 5, "max_delay": 10})).groups[0]
    assert g.reschedule.delay == 5.0 and isinstance(g.reschedule.delay, float)
    t = Task.model_validate(
        {
            "name": "t",
            "command": ["a", "b"],
            "args": [],
            "resources": {"cpu": 1, "memory": 1, "gpu": {"count": 1, "models": ["A100"]}},
        }
    )
    assert t.command == ("a", "b") and t.resources.gpu.models == ("A100",)


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"min": 3, "max": 1, "desired": 2}, "min (3) must be <= max (1)"),
        ({"min": 1, "max": 3, "desired": 5}, "desired (5) must be within [min, max] = [1, 3]"),
        ({"min": 2, "max": 3, "desired": 1}, "desired (1) must be within"),
    ],
)
def test_scaling_bounds(scaling: dict[str, int], message: str) -> None:
    errs = errors(job_with(scaling=scaling))
    assert any(loc == ("groups", 0, "scaling") and message in msg for loc, msg in errs), errs


def test_duplicate_groups_and_tasks_are_rejected() -> None:
    data = job_with()
    data["groups"].append(copy.deepcopy(data["groups"][0]))
    assert any("duplicate group names: api" in m for _, m in errors(data))
    errs = errors(job_with(tasks=[task("x"), task("y"), task("x")]))
    assert any(loc == ("groups", 0) and "duplicate task names: x" in m for loc, m in errs)


def test_unknown_fields_are_rejected_where_they_are() -> None:
    assert ("prioity",) in locs({**job_with(), "prioity": 10})
    assert ("groups", 0, "replicas") in locs(job_with(replicas=3))
    assert ("groups", 0, "tasks", 0, "resources", "gpus") in locs(
        {"name": "web", "groups": [{"name": "api", "tasks": [task(gpus=1)]}]}
    )
    assert ("gpu",) in locs({"id": "n", "cpu": 1, "memory": 1, "gpu": []}, Node)


@pytest.mark.parametrize("bad", ["a/b", "", "a b", "a\nb", "a\x00b", "-a", "x" * 64, "é"])
def test_bad_names_are_rejected_with_the_field(bad: str) -> None:
    assert ("name",) in locs({**job_with(), "name": bad})
    assert ("groups", 0, "name") in locs(
        {"name": "web", "groups": [{"name": bad, "tasks": [task()]}]}
    )
    assert ("groups", 0, "tasks", 0, "name") in locs(
        {"name": "web", "groups": [{"name": "api", "tasks": [task(bad)]}]}
    )
    assert ("id",) in locs({"id": bad, "cpu": 1, "memory": 1}, Node)
    assert ("gpus", 0, "id") in locs(
        {"id": "n", "cpu": 1, "memory": 1, "gpus": [{"id": bad, "model": "A", "memory": 1}]}, Node
    )


def test_good_names() -> None:
    for name in ("a", "A.b_c-1", "0", "x" * 63):
        assert Job.model_validate({**job_with(), "name": name}).id == name


def test_env_names_and_label_values() -> None:
    data = {"name": "web", "groups": [{"name": "api", "tasks": [{**task(), "env": {"1BAD": "x"}}]}]}
    assert any("env name '1BAD'" in m for _, m in errors(data))
    assert any(
        "label value" in m
        for _, m in errors({"id": "n", "cpu": 1, "memory": 1, "labels": {"zone": "a\x07"}}, Node)
    )
    assert any(
        "label name" in m
        for _, m in errors({"id": "n", "cpu": 1, "memory": 1, "labels": {"zo\nne": "a"}}, Node)
    )


def test_constraint_arity() -> None:
    with pytest.raises(ValidationError, match="exactly one value"):
        Constraint(label="zone", op="=", values=("a", "b"))
    with pytest.raises(ValidationError, match="at least one value"):
        Constraint(label="zone", op="in")
    with pytest.raises(ValidationError, match="takes no values"):
        Constraint(label="zone", op="exists", values=("a",))
    assert Constraint(label="zone", op="not_in", values=("a",)).matches({})
    assert not Constraint(label="zone", op="in", values=("a",)).matches({"zone": "b"})


def test_reschedule_and_autoscale_policies_are_checked() -> None:
    assert any(
        "max_delay" in m for _, m in errors(job_with(reschedule={"delay": 10, "max_delay": 5}))
    )
    assert any(
        "scale_down" in m
        for _, m in errors(job_with(autoscale={"scale_up": 0.5, "scale_down": 0.6}))
    )
    assert ("groups", 0, "reschedule", "delay_function") in locs(
        job_with(reschedule={"delay_function": "linear"})
    )


# -- nodes -------------------------------------------------------------------------------
def test_node_duplicate_gpu_ids_are_rejected() -> None:
    gpu = {"id": "gpu0", "model": "A100", "memory": 40960}
    errs = errors({"id": "n", "cpu": 1, "memory": 1, "gpus": [gpu, gpu]}, Node)
    assert any("duplicate gpu ids: gpu0" in m for _, m in errs)


def test_node_from_plain_data() -> None:
    n = Node.model_validate(
        {
            "id": "gpu-a100-1",
            "cpu": 128000,
            "memory": 1048576,
            "labels": {"zone": "b"},
            "gpus": [{"id": f"gpu{i}", "model": "A100", "memory": 40960} for i in range(4)],
            "state": "draining",
        }
    )
    assert n.state == "draining" and len(n.gpus) == 4
    assert n.gpus[0] == GpuDevice(id="gpu0", model="A100", memory=40960)
    assert ("state",) in locs({"id": "n", "cpu": 1, "memory": 1, "state": "gone"}, Node)
    assert ("cpu",) in locs({"id": "n", "cpu": "1", "memory": 1}, Node)


def test_integer_gpu_ids_are_read_as_their_decimal_string() -> None:
    raw = '{"id": "n", "cpu": 1, "memory": 1, "gpus": [{"id": 0, "model": "A100", "memory": 1}]}'
    assert Node.model_validate_json(raw).gpus[0].id == "0"
    assert GpuDevice.model_validate({"id": 12, "model": "A100", "memory": 1}).id == "12"
    assert GpuDevice.model_validate({"id": "gpu0", "model": "A100", "memory": 1}).id == "gpu0"
    dumped = Node.model_validate_json(raw).model_dump(mode="json")
    assert dumped["gpus"][0]["id"] == "0"  # stored and sent as a string from then on


@pytest.mark.parametrize("bad", [True, False, 0.0, 1.5, -1, None, [0]])
def test_gpu_ids_that_are_not_strings_or_integers_are_refused(bad: object) -> None:
    gpu = {"id": bad, "model": "A100", "memory": 1}
    assert ("gpus", 0, "id") in locs({"id": "n", "cpu": 1, "memory": 1, "gpus": [gpu]}, Node)
    with pytest.raises(ValidationError):
        GpuDevice.model_validate_json(json.dumps(gpu))


def test_integer_ids_of_the_same_device_are_duplicates() -> None:
    gpus = [{"id": 0, "model": "A100", "memory": 1}, {"id": "0", "model": "A100", "memory": 1}]
    errs = errors({"id": "n", "cpu": 1, "memory": 1, "gpus": gpus}, Node)
    assert any("duplicate gpu ids: 0" in m for _, m in errs)


def test_an_integer_node_id_is_read_as_a_string_and_true_is_not() -> None:
    assert Node.model_validate_json('{"id": 7, "cpu": 1, "memory": 1}').id == "7"
    assert ("id",) in locs({"id": True, "cpu": 1, "memory": 1}, Node)


def test_assignment_gpu_ids_from_a_store_row_accept_integers() -> None:
    a = Assignment.model_validate(
        {
            "workload_id": "j/g/0",
            "job": "j",
            "group": "g",
            "ordinal": 0,
            "node": "n",
            "gpu_ids": [0, "1"],
            "cpu": 1,
            "memory": 1,
        }
    )
    assert a.gpu_ids == ("0", "1")


# -- schema ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", [Job, Node, Assignment, TaskGroup])
def test_json_schema_export(
    model: type[Job] | type[Node] | type[Assignment] | type[TaskGroup],
) -> None:
    schema = model.model_json_schema()
    json.dumps(schema)  # serialisable
    assert schema["type"] == "object"
    assert schema.get("additionalProperties") is False
    assert set(schema["properties"]) == set(model.model_fields)


def test_job_schema_names_limits_and_units() -> None:
    schema = Job.model_json_schema()
    assert set(schema["required"]) == {"name", "groups"}
    defs = schema["$defs"]
    assert defs["Resources"]["properties"]["cpu"]["description"] == "millicores"
    assert "pattern" in schema["properties"]["name"]


# -- derived request ---------------------------------------------------------------------
def _task(
    name: str,
    cpu: int,
    memory: int,
    gpu: int = 0,
    gpu_memory: int = 0,
    models: tuple[str, ...] = (),
) -> Task:
    return Task(
        name=name,
        resources=Resources(
            cpu=cpu, memory=memory, gpu=GpuRequest(count=gpu, memory=gpu_memory, models=models)
        ),
    )


def test_request_sums_tasks() -> None:
    g = TaskGroup(
        name="g",
        tasks=(
            _task("a", 500, 256, gpu=1, gpu_memory=16000, models=("A100", "H100")),
            _task("b", 1500, 1024, gpu=2, gpu_memory=40000, models=("H100", "A100", "T4")),
            _task("c", 1, 1),
        ),
    )
    r = g.request()
    assert (r.cpu, r.memory, r.gpu) == (2001, 1281, 3)
    assert r.gpu_memory == 40000  # the largest: every device must satisfy every task
    assert r.gpu_models == ("A100", "H100")  # the intersection, sorted


def test_request_without_model_rules_allows_any_model() -> None:
    g = TaskGroup(name="g", tasks=(_task("a", 1, 1, gpu=1), _task("b", 1, 1)))
    assert g.request().gpu_models == ()


def test_request_models_intersect_across_all_tasks() -> None:
    """Regression: an empty intersection became () (= any model), and a third task
    then reset it to its own list."""
    g = TaskGroup(
        name="g",
        tasks=(
            _task("a", 1, 1, gpu=1, models=("A100", "H100")),
            _task("b", 1, 1, gpu=1, models=("H100", "T4")),
            _task("c", 1, 1, gpu=1, models=("H100", "A100")),
        ),
    )
    assert g.request().gpu_models == ("H100",)
    with pytest.raises(ValidationError, match="no model in common"):
        TaskGroup(
            name="g",
            tasks=(
                _task("a", 1, 1, gpu=1, models=("A100",)),
                _task("b", 1, 1, gpu=1, models=("H100",)),
            ),
        )


def test_with_desired_widens_bounds() -> None:
    job = Job.model_validate(job_with(scaling={"min": 1, "max": 3, "desired": 2}))
    assert job.with_desired("api", 5).groups[0].scaling == ScalingPolicy(min=1, max=5, desired=5)
    assert job.with_desired("api", 0).groups[0].scaling == ScalingPolicy(min=0, max=3, desired=0)
    assert job.group("api") is not None and job.group("nope") is None


def test_assignment_id_must_match() -> None:
    row = {
        "workload_id": "j/g/0",
        "job": "j",
        "group": "g",
        "ordinal": 0,
        "node": "n",
        "cpu": 1,
        "memory": 1,
        "gpu_ids": ["gpu0"],
    }
    assert Assignment.model_validate(row).gpu_ids == ("gpu0",)
    with pytest.raises(ValidationError, match="does not match"):
        Assignment.model_validate({**row, "workload_id": "j/g/1"})


def test_a_copied_group_with_new_tasks_asks_for_the_new_request() -> None:
    """request() is cached on the group; a copy with other tasks must not keep it."""
    from forge.core.models import Resources, Task, TaskGroup

    g = TaskGroup(name="a", tasks=(Task(name="t", resources=Resources(cpu=1, memory=1)),))
    assert g.request().cpu == 1
    bigger = (Task(name="t", resources=Resources(cpu=5, memory=7)),)
    h = g.model_copy(update={"tasks": bigger})
    assert (h.request().cpu, h.request().memory) == (5, 7)
    assert g.request().cpu == 1


def _group_with(**rules: Any) -> dict[str, Any]:
    return {
        "name": "api",
        "tasks": [{"name": "t", "resources": {"cpu": 100, "memory": 64}}],
        **rules,
    }


def test_distinct_hosts_and_spread_are_left_out_of_a_dump_at_their_defaults() -> None:
    """A job that does not use them dumps byte for byte as before them (digests and
    recorded histories depend on it); one that does keeps them through a round trip."""
    plain = Job.model_validate({"name": "w", "groups": [_group_with()]})
    dumped = plain.model_dump_json()
    assert "distinct_hosts" not in dumped and "spread" not in dumped
    ruled = Job.model_validate(
        {"name": "w", "groups": [_group_with(distinct_hosts=True, spread=[{"label": "zone"}])]}
    )
    again = Job.model_validate_json(ruled.model_dump_json())
    assert again == ruled and again.groups[0].spread[0].max_skew == 1
    assert again.groups[0].spread[0].when_unsatisfiable == "do_not_schedule"
    props = Job.model_json_schema()["$defs"]["TaskGroup"]["properties"]
    assert {"distinct_hosts", "spread"} <= set(props)


@pytest.mark.parametrize(
    "spread",
    [
        [{"label": "zone"}, {"label": "zone", "max_skew": 2}],
        [{"label": "zone", "max_skew": 0}],
        [{"label": "zone", "when_unsatisfiable": "sometimes"}],
        [{"label": ""}],
        [{"label": "zone", "max_skew": "1"}],
    ],
)
def test_a_bad_spread_rule_is_refused(spread: list[dict[str, Any]]) -> None:
    with pytest.raises(ValidationError):
        Job.model_validate({"name": "w", "groups": [_group_with(spread=spread)]})
