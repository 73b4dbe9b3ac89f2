"""Bad input everywhere: every way in refuses it with a message that names the
field, and nothing of it reaches history, the store or the cluster's state.

- ``forge job validate`` / ``job run`` / ``node add`` / ``plan``: exit 2 with the
  dotted path of the bad field, before any connection.
- The workflow, sent *raw* payloads through the Temporal client's untyped API (a
  spec that fails the models cannot even be built with ``forge.client.client``): the
  update fails naming the field, no update event enters history, the store has no
  such job, and the workflow keeps running and answering queries.
- Signals cannot be validated: a payload that does not decode is dropped by the
  SDK with an error log, and one naming an unknown node is ignored with a log
  line; the workflow keeps running either way.
- Size: the job-size limit (MAX_JOB_BYTES), the batch limit (MAX_BATCH_BYTES), the
  client's request limit and the loader's file limit, each named in its message.

Bad specs are generated with Hypothesis by mutating a valid spec in one place.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import string
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest
import pytest_asyncio
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from forge import cli
from forge.client.client import MAX_REQUEST_BYTES, ForgeClient, ForgeError
from forge.core.models import (
    MAX_BATCH_BYTES,
    MAX_CPU,
    MAX_JOB_BYTES,
    MAX_MEMORY,
    MAX_REPLICAS,
    Job,
    Node,
    _json_bound,
)
from forge.errors import InvalidInput, NotFound
from forge.loaders import MAX_INPUT_BYTES, InputError, load_nodes, parse_jobs
from forge.stores import Store
from forge.wire import contract as c
from forge.wire.codec import data_converter
from tests.workflow.harness import cluster, job, node

# ------------------------------------------------------------------ the valid spec

BASE: dict[str, Any] = {
    "name": "web",
    "priority": 50,
    "groups": [
        {
            "name": "api",
            "scaling": {"min": 1, "max": 10, "desired": 3},
            "tasks": [
                {
                    "name": "server",
                    "command": ["python", "-m", "http.server"],
                    "args": ["8080"],
                    "env": {"PORT": "8080"},
                    "resources": {"cpu": 500, "memory": 256},
                }
            ],
        },
        {
            "name": "train",
            "scaling": {"min": 0, "max": 4, "desired": 1},
            "constraints": [{"label": "zone", "op": "in", "values": ["a", "b"]}],
            "tasks": [
                {"name": "prep", "resources": {"cpu": 1000, "memory": 1024}},
                {
                    "name": "trainer",
                    "resources": {"cpu": 4000, "memory": 16384, "gpu": {"count": 1}},
                },
            ],
        },
    ],
}


def test_the_base_spec_is_valid() -> None:
    (spec,) = parse_jobs(json.dumps(BASE), fmt="json", source="base")
    assert spec.id == "web" and len(spec.groups) == 2


# --------------------------------------------------------- bad specs (strategies)


@dataclass(frozen=True)
class Bad:
    """A spec broken in one place, and what its error must say."""

    doc: Any  # a job mapping, or a list of jobs
    path: str  # the dotted path of the bad field ("" for the job as a whole)
    words: str = ""  # a phrase the message must contain
    kind: str = ""


CONTROL = [chr(i) for i in (*range(0, 32), 127)]
_group_task = st.sampled_from([(0, 0), (1, 0), (1, 1)])


def _non_int() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(0, 10**6).map(str),  # "500": no silent coercion
        st.sampled_from(["abc", "", "1e3", "0x10", "500m", "1Gi"]),
        st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)),
        st.sampled_from([1.0, 2.0, 1e6]),  # integral floats are still not ints
        st.booleans(),
        st.none(),
        st.lists(st.integers(), max_size=2),
        st.just({"value": 1}),
    )


def _bad_name() -> st.SearchStrategy[str]:
    letters = st.text(string.ascii_lowercase, min_size=1, max_size=6)
    return st.one_of(
        st.just(""),
        st.tuples(letters, letters).map("/".join),
        st.tuples(letters, st.sampled_from(CONTROL), letters).map("".join),
        letters.map(lambda s: s + "\n"),
        st.sampled_from([" web", "web ", "a b", "wéb", "-web", ".web", "_web", "a\tb"]),
        st.integers(64, 300).map(lambda n: "x" * n),
    )


@st.composite
def bad_resources(draw: st.DrawFn) -> Bad:
    doc = copy.deepcopy(BASE)
    g, t = draw(_group_task)
    res = doc["groups"][g]["tasks"][t]["resources"]
    field = draw(st.sampled_from(["cpu", "memory", "gpu.count", "gpu.memory"]))
    limit = {"cpu": MAX_CPU, "memory": MAX_MEMORY, "gpu.count": 64, "gpu.memory": MAX_MEMORY}
    value = draw(
        st.one_of(
            st.integers(max_value=-1),
            st.integers(limit[field] + 1, 2**70),
            _non_int(),
            *([st.just(0)] if field in ("cpu", "memory") else []),
        )
    )
    if field.startswith("gpu."):
        res.setdefault("gpu", {})[field[4:]] = value
    else:
        res[field] = value
    return Bad(doc, f"groups.{g}.tasks.{t}.resources.{field}", kind=f"resources.{field}")


@st.composite
def bad_scaling(draw: st.DrawFn) -> Bad:
    doc = copy.deepcopy(BASE)
    g = draw(st.integers(0, 1))
    scaling = doc["groups"][g]["scaling"]
    how = draw(st.sampled_from(["min>max", "desired-outside", "field"]))
    if how == "min>max":
        hi = draw(st.integers(0, 1000))
        lo = draw(st.integers(hi + 1, hi + 1000))
        scaling.update(min=lo, max=hi, desired=lo)
        return Bad(doc, f"groups.{g}.scaling", f"min ({lo}) must be <= max ({hi})", how)
    if how == "desired-outside":
        lo = draw(st.integers(0, 100))
        hi = draw(st.integers(lo, lo + 100))
        desired = draw(
            st.one_of(st.integers(hi + 1, MAX_REPLICAS), st.integers(0, lo - 1))
            if lo
            else st.integers(hi + 1, MAX_REPLICAS)
        )
        scaling.update(min=lo, max=hi, desired=desired)
        return Bad(doc, f"groups.{g}.scaling", f"desired ({desired}) must be within", how)
    field = draw(st.sampled_from(["min", "max", "desired"]))
    scaling[field] = draw(
        st.one_of(st.integers(max_value=-1), st.integers(MAX_REPLICAS + 1, 2**64), _non_int())
    )
    return Bad(doc, f"groups.{g}.scaling.{field}", kind=f"scaling.{field}")


@st.composite
def bad_names(draw: st.DrawFn) -> Bad:
    doc = copy.deepcopy(BASE)
    name = draw(_bad_name())
    where = draw(st.sampled_from(["job", "group", "task", "gpu-model"]))
    g, t = draw(_group_task)
    if where == "job":
        doc["name"] = name
        return Bad(doc, "name", "must be 1-63", "job name")
    if where == "group":
        doc["groups"][g]["name"] = name
        return Bad(doc, f"groups.{g}.name", "must be 1-63", "group name")
    if where == "task":
        doc["groups"][g]["tasks"][t]["name"] = name
        return Bad(doc, f"groups.{g}.tasks.{t}.name", "must be 1-63", "task name")
    doc["groups"][g]["tasks"][t]["resources"]["gpu"] = {"count": 1, "models": [name]}
    return Bad(doc, f"groups.{g}.tasks.{t}.resources.gpu.models.0", "must be 1-63", "gpu model")


@st.composite
def bad_structure(draw: st.DrawFn) -> Bad:
    doc = copy.deepcopy(BASE)
    how = draw(
        st.sampled_from(
            ["dup-groups", "no-groups", "no-tasks", "dup-tasks", "priority", "env", "constraint"]
        )
    )
    g, t = draw(_group_task)
    if how == "dup-groups":
        doc["groups"][1]["name"] = doc["groups"][0]["name"]
        return Bad(doc, "", "duplicate group names: api", how)
    if how == "no-groups":
        doc["groups"] = draw(st.sampled_from([[], None, {}]))
        return Bad(doc, "groups", kind=how)
    if how == "no-tasks":
        doc["groups"][g]["tasks"] = []
        return Bad(doc, f"groups.{g}.tasks", "at least 1 item", how)
    if how == "dup-tasks":
        doc["groups"][1]["tasks"][1]["name"] = "prep"
        return Bad(doc, "groups.1", "duplicate task names: prep", how)
    if how == "priority":
        doc["priority"] = draw(st.one_of(st.integers(max_value=0), st.integers(101), _non_int()))
        return Bad(doc, "priority", kind=how)
    if how == "env":
        key = draw(st.sampled_from(["1BAD", "A-B", "", "A B", "A\nB", "é"]))
        doc["groups"][g]["tasks"][t]["env"] = {key: "x"}
        return Bad(doc, f"groups.{g}.tasks.{t}.env", "is not a valid variable name", how)
    doc["groups"][1]["constraints"] = [{"label": "zone", "op": draw(_bad_op())}]
    return Bad(doc, "groups.1.constraints.0.op", kind=how)


def _bad_op() -> st.SearchStrategy[str]:
    return st.sampled_from(["==", "IN", "contains", "", "~"])


@st.composite
def unknown_fields(draw: st.DrawFn) -> Bad:
    doc = copy.deepcopy(BASE)
    g, t = draw(_group_task)
    targets: dict[str, tuple[dict[str, Any], set[str]]] = {
        "": (doc, {"id", "name", "priority", "groups"}),
        f"groups.{g}": (doc["groups"][g], {"name", "tasks", "scaling", "constraints"}),
        f"groups.{g}.tasks.{t}": (
            doc["groups"][g]["tasks"][t],
            {"name", "command", "args", "env", "resources"},
        ),
        f"groups.{g}.tasks.{t}.resources": (
            doc["groups"][g]["tasks"][t]["resources"],
            {"cpu", "memory", "gpu"},
        ),
        f"groups.{g}.scaling": (doc["groups"][g]["scaling"], {"min", "max", "desired"}),
    }
    where = draw(st.sampled_from(sorted(targets)))
    target, known = targets[where]
    key = draw(
        st.one_of(
            st.sampled_from(["replicas", "cpus", "Memory", "image", "gpus", "count"]),
            st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True),
        ).filter(lambda k: k not in known | {"reschedule", "autoscale"})
    )
    target[key] = draw(st.one_of(st.integers(), st.text(max_size=5), st.booleans()))
    path = f"{where}.{key}" if where else key
    return Bad(doc, path, "unknown field", "unknown field")


@st.composite
def oversized_fields(draw: st.DrawFn) -> Bad:
    """Fields past their own limits: megabytes of args, env or command."""
    doc = copy.deepcopy(BASE)
    task = doc["groups"][0]["tasks"][0]
    how = draw(st.sampled_from(["many-args", "long-arg", "many-env", "long-env"]))
    if how == "many-args":
        task["args"] = ["x" * 64] * draw(st.integers(257, 20_000))  # up to 1.3 MB
        return Bad(doc, "groups.0.tasks.0.args", "at most 256", how)
    if how == "long-arg":
        task["args"] = ["y" * draw(st.integers(4097, 5 * 1024 * 1024))]  # up to 5 MB
        return Bad(doc, "groups.0.tasks.0.args.0", "at most 4096", how)
    if how == "many-env":
        task["env"] = {f"V{i}": "v" for i in range(draw(st.integers(257, 5000)))}
        return Bad(doc, "groups.0.tasks.0.env", "at most 256", how)
    task["env"] = {"BIG": "z" * draw(st.integers(4097, 1 << 20))}
    return Bad(doc, "groups.0.tasks.0.env.BIG", "at most 4096", how)


@st.composite
def bad_kinds(draw: st.DrawFn) -> Bad:
    """Fields of a kind of work where they cannot work (issue 32): a batch job's
    scaling, autoscaling and rolling update, a schedule, a job type."""
    doc = copy.deepcopy(BASE)
    g = draw(st.integers(0, 1))
    group, name = doc["groups"][g], doc["groups"][g]["name"]
    kinds = ["parallelism", "autoscale", "update", "cron", "timezone", "on-a-service", "type"]
    how = draw(st.sampled_from(kinds))
    doc["type"] = "batch"
    if how == "parallelism":
        group["scaling"]["parallelism"] = draw(st.integers(-(2**31), 0))
        return Bad(doc, f"groups.{g}.scaling.parallelism", kind=how)
    if how in ("autoscale", "update"):
        group[how] = {"policy": "target"} if how == "autoscale" else {}
        return Bad(doc, "", f"groups.{g}.{how} ({name}): a batch job", how)
    if how == "cron":
        hour = draw(st.integers(24, 99))
        doc["schedule"] = {"cron": f"0 {hour} * * *"}
        return Bad(doc, "schedule.cron", f"hour '{hour}'", how)
    if how == "timezone":
        zone = draw(st.sampled_from(["Moon/Base", "UTC+25"]))
        doc["schedule"] = {"cron": "@daily", "timezone": zone}
        return Bad(doc, "schedule.timezone", "unknown time zone", how)
    if how == "on-a-service":
        doc["type"] = "service"
        doc["schedule"] = {"cron": "@daily"}
        return Bad(doc, "", "schedule: only a batch job", how)
    doc["type"] = draw(st.sampled_from(["cron", "daemon", "Batch", ""]))
    return Bad(doc, "type", kind=how)


def bad_jobs() -> st.SearchStrategy[Bad]:
    return st.one_of(
        bad_resources(), bad_scaling(), bad_names(), bad_structure(), unknown_fields(), bad_kinds()
    )


@st.composite
def colliding_ids(draw: st.DrawFn) -> Bad:
    """Two jobs of one file with the same id: by name, or an explicit id."""
    a = copy.deepcopy(BASE)
    b = copy.deepcopy(BASE)
    if draw(st.booleans()):
        b["name"] = "other"
        b["id"] = "web"
    return Bad([a, b], "id", "duplicate job id 'web'", "colliding ids")


def too_big_job(size: int = 2 * MAX_JOB_BYTES, seed: int = 0) -> dict[str, Any]:
    """A job within every field limit whose JSON is about ``size`` bytes, of random
    letters (so compression cannot hide it)."""
    rnd = random.Random(seed)
    per_task = 200 * 1024
    tasks = []
    for i in range(max(1, size // per_task)):
        args = ["".join(rnd.choices(string.ascii_letters, k=4000)) for _ in range(per_task // 4000)]
        tasks.append({"name": f"t{i}", "args": args, "resources": {"cpu": 1, "memory": 1}})
    return {"name": f"big{seed}", "groups": [{"name": "g", "tasks": tasks}]}


def sized_job(name: str, size: int, seed: int = 0) -> Job:
    """A valid job of about ``size`` bytes of JSON (random letters)."""
    rnd = random.Random(seed)
    args = ["".join(rnd.choices(string.ascii_letters, k=1000)) for _ in range(size // 1000)]
    task = {"name": "t", "args": args, "resources": {"cpu": 10, "memory": 16}}
    return Job.model_validate({"name": name, "groups": [{"name": "main", "tasks": [task]}]})


# ------------------------------------------------------------------------ the CLI


def forge(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(path: Path, doc: Any, fmt: str) -> Path:
    file = path.with_suffix(f".{fmt}")
    if fmt == "json":
        file.write_text(json.dumps(doc))
    else:
        file.write_text(yaml.safe_dump(doc, allow_unicode=False, width=10**9))
    return file


def assert_names(err: str, file: Path, bad: Bad) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(f"{file}: ")]
    assert lines, err
    if bad.path:
        assert any(f" {bad.path}: " in f" {line[len(str(file)) + 2 :]}" for line in lines), (
            f"{bad.kind}: no line names {bad.path!r}:\n{err}"
        )
    if bad.words:
        assert bad.words in err, f"{bad.kind}: {bad.words!r} not in:\n{err}"


_cli_settings = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad") / "spec"


@_cli_settings
@given(bad=st.one_of(bad_jobs(), colliding_ids()), fmt=st.sampled_from(["yaml", "json"]))
def test_job_validate_refuses_each_bad_spec_naming_the_field(
    capsys: pytest.CaptureFixture[str], work: Path, bad: Bad, fmt: str
) -> None:
    file = write(work, bad.doc, fmt)
    code, out, err = forge(capsys, "job", "validate", str(file))
    assert code == 2, (bad.kind, out, err)
    assert out == ""
    assert_names(err, file, bad)


@pytest.mark.parametrize(
    ("update", "names"),
    [
        ({"max_parallel": 0}, "groups.0.update.max_parallel"),
        ({"canary": 4}, "update.canary (4) exceeds scaling.desired (3)"),
        ({"min_healthy_time": 60.0, "healthy_deadline": 30.0}, "update.min_healthy_time (60s)"),
        ({"stagger": -1.0}, "groups.0.update.stagger"),
        ({"max_paralel": 2}, "groups.0.update.max_paralel"),
    ],
)
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_an_update_policy_that_cannot_work_is_refused_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, update: dict[str, Any], names: str, fmt: str
) -> None:
    doc = copy.deepcopy(BASE)
    doc["groups"][0]["update"] = update
    file = write(tmp_path / "spec", doc, fmt)
    code, out, err = forge(capsys, "job", "validate", str(file))
    assert (code, out) == (2, ""), err
    assert names in err


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "FORGE_GPU_MILLI", "FORGE_PORT_HTTP"])
def test_a_task_setting_a_variable_forge_sets_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    doc = copy.deepcopy(BASE)
    doc["groups"][0]["tasks"][0]["env"] = {"PORT": "8080", name: "0"}
    file = write(tmp_path / "spec", doc, "yaml")
    code, out, err = forge(capsys, "job", "validate", str(file))
    assert (code, out) == (2, ""), err
    assert f"groups.0.tasks.0.env.{name}: {name} is set by Forge" in err


@settings(_cli_settings, max_examples=12)
@given(bad=oversized_fields())
def test_job_validate_refuses_oversized_fields_naming_the_limit(
    capsys: pytest.CaptureFixture[str], work: Path, bad: Bad
) -> None:
    file = write(work, bad.doc, "json")
    code, _, err = forge(capsys, "job", "validate", str(file))
    assert code == 2
    assert_names(err, file, bad)


def test_a_job_over_the_size_limit_is_refused_with_the_limit_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = too_big_job(3 * 1024 * 1024)  # every field within its limit, 3 MB in all
    file = write(tmp_path / "big", doc, "json")
    code, _, err = forge(capsys, "job", "validate", str(file))
    assert code == 2
    assert f"the limit is {MAX_JOB_BYTES // 1024} KiB" in err and str(file) in err
    # job run refuses it the same way, before connecting (nothing listens on port 1)
    code, _, err = forge(capsys, "job", "run", str(file), "--address", "127.0.0.1:1")
    assert code == 2 and f"the limit is {MAX_JOB_BYTES // 1024} KiB" in err


def test_a_file_over_the_input_limit_is_refused_before_parsing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    file = tmp_path / "huge.yaml"
    with file.open("wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)
    code, _, err = forge(capsys, "job", "validate", str(file))
    assert code == 2 and f"larger than the {MAX_INPUT_BYTES // 2**20} MiB limit" in err
    code, _, err = forge(capsys, "node", "add", "--file", str(file), "--address", "127.0.0.1:1")
    assert code == 2 and "MiB limit" in err


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.text(max_size=300), max_size=40),
    env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), st.text()),
    values=st.lists(st.text(max_size=50), min_size=1, max_size=5),
)
def test_the_cheap_size_bound_never_underestimates(
    texts: list[str], env: dict[str, str], values: list[str]
) -> None:
    """The job-size check serialises a job only when a cheap bound exceeds the
    limit; the bound must hold for any text (escapes, non-ASCII, control chars)."""
    spec = Job.model_validate(
        {
            "name": "j",
            "groups": [
                {
                    "name": "g",
                    "constraints": [{"label": 'k\n"é', "op": "in", "values": values}],
                    "tasks": [
                        {
                            "name": "t",
                            "command": texts[:3],
                            "args": texts,
                            "env": env,
                            "resources": {"cpu": 1, "memory": 1, "gpu": {"models": ["A100"]}},
                        }
                    ],
                }
            ],
        }
    )
    assert _json_bound(spec) >= len(spec.model_dump_json())


# ---------------------------------------------------------------------- node specs

NODE_FLAGS = ("--address", "127.0.0.1:1")  # never reached: input is checked first


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--id", "n1", "--cpu", "-1", "--memory", "1"], "--cpu"),
        (["--id", "n1", "--cpu", "abc", "--memory", "1"], "--cpu"),
        (["--id", "n1", "--cpu", "1", "--memory", "1.5"], "--memory"),
        (["--id", "n1", "--cpu", str(MAX_CPU + 1), "--memory", "1"], "cpu"),
        (["--id", "n1", "--cpu", "1", "--memory", str(MAX_MEMORY + 1)], "memory"),
        (["--id", "a/b", "--cpu", "1", "--memory", "1"], "--id"),
        (["--id", "", "--cpu", "1", "--memory", "1"], "--id"),
        (["--id", "n\x01", "--cpu", "1", "--memory", "1"], "--id"),
        (["--id", "n1\n", "--cpu", "1", "--memory", "1"], "--id"),
        (["--id", "n1", "--cpu", "1", "--memory", "1", "--gpu", "A100:0"], "--gpu"),
        (["--id", "n1", "--cpu", "1", "--memory", "1", "--gpu", "A100:lots"], "--gpu"),
        (["--id", "n1", "--cpu", "1", "--memory", "1", "--gpu", "Mystery"], "--gpu"),
        (["--id", "n1", "--cpu", "1", "--memory", "1", "--label", "zone"], "--label"),
        (["--id", "n1", "--cpu", "1", "--memory", "1", "--label", "=a"], "--label"),
        (["--id", "n1", "--cpu", "1", "--memory", "1", "--label", "k=\x07"], "--label"),
        (
            ["--id", "n1", "--cpu", "1", "--memory", "1", "--label", "k=a", "--label", "k=b"],
            "given twice",
        ),
        (["--cpu", "1", "--memory", "1"], "--id"),
    ],
)
def test_node_add_refuses_bad_values_before_connecting(
    capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    code, _, err = forge(capsys, "node", "add", *flags, *NODE_FLAGS)
    assert code == 2, err
    assert named in err and "Traceback" not in err
    assert "cannot connect" not in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["job", "scale", "web", "main", "-1"], "COUNT"),
        (["job", "scale", "web", "main", str(MAX_REPLICAS + 1)], "COUNT"),
        (["job", "scale", "web", "main", "three"], "COUNT"),
        (["job", "scale", "a/b", "main", "1"], "JOB"),
        (["job", "scale", "web", "ma in", "1"], "GROUP"),
        (["job", "stop", "web\n"], "JOB"),
        (["node", "drain", "a b"], "ID"),
        (["node", "remove", ""], "ID"),
        (["node", "lost", "x" * 64], "ID"),
        (["status", "--cluster", "a/b"], "--cluster"),
    ],
)
def test_other_commands_refuse_bad_names_and_counts_before_connecting(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    code, _, err = forge(capsys, *argv, *NODE_FLAGS)
    assert code == 2, err
    assert named in err and "cannot connect" not in err


BASE_NODES: list[dict[str, Any]] = [
    {"id": "n1", "cpu": 4000, "memory": 8192, "labels": {"zone": "a"}},
    {
        "id": "n2",
        "cpu": 8000,
        "memory": 16384,
        "gpus": [{"id": "gpu0", "model": "A100", "memory": 40960}],
    },
]


@st.composite
def bad_node_files(draw: st.DrawFn) -> Bad:
    doc = copy.deepcopy(BASE_NODES)
    i = draw(st.integers(0, 1))
    how = draw(
        st.sampled_from(["cpu", "memory", "id", "dup-id", "unknown", "gpu", "label", "gpus"])
    )
    if how in ("cpu", "memory"):
        limit = MAX_CPU if how == "cpu" else MAX_MEMORY
        doc[i][how] = draw(
            st.one_of(st.integers(max_value=-1), st.integers(limit + 1, 2**70), _non_int())
        )
        return Bad(doc, how, kind=how)
    if how == "id":
        doc[i]["id"] = draw(_bad_name())
        return Bad(doc, "id", "must be 1-63", how)
    if how == "dup-id":
        doc[1]["id"] = "n1"
        return Bad(doc, "id", "duplicate node id 'n1'", how)
    if how == "unknown":
        doc[i][draw(st.sampled_from(["gpu_count", "capacity", "cpus", "zone"]))] = 1
        return Bad(doc, "", "unknown", how)
    if how == "gpu":
        doc[1]["gpus"].append({"id": "gpu0", "model": "A100", "memory": 40960})
        return Bad(doc, "", "duplicate gpu ids: gpu0", how)
    if how == "gpus":
        doc[1]["gpus"] = [{"id": f"g{k}", "model": "T4", "memory": 1} for k in range(65)]
        return Bad(doc, "gpus", "at most 64", how)
    doc[0]["labels"] = {"zone": "a" + draw(st.sampled_from(CONTROL)) + "b"}
    return Bad(doc, "", "control characters", how)


@settings(_cli_settings, max_examples=60)
@given(bad=bad_node_files(), fmt=st.sampled_from(["yaml", "json"]))
def test_node_files_with_bad_values_are_refused_by_node_add_and_plan(
    capsys: pytest.CaptureFixture[str], work: Path, bad: Bad, fmt: str
) -> None:
    file = write(work.with_name("nodes"), bad.doc, fmt)
    with pytest.raises(InputError) as raised:
        load_nodes(file)
    assert str(file) in str(raised.value)
    if bad.path:
        assert f"{bad.path}: " in str(raised.value), (bad.kind, str(raised.value))
    if bad.words:
        assert bad.words in str(raised.value), (bad.kind, str(raised.value))
    code, _, err = forge(capsys, "node", "add", "--file", str(file), *NODE_FLAGS)
    assert code == 2 and str(raised.value) in err
    jobs = write(work.with_name("jobs"), BASE, "json")
    code, out, err = forge(capsys, "plan", "--nodes", str(file), "--jobs", str(jobs))
    assert code == 2 and out == "" and str(raised.value) in err


# ------------------------------------------------------------ the workflow, raw


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def skipping_env(test_server_bin: str) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=test_server_bin, data_converter=data_converter()
    )
    try:
        yield env
    finally:
        await env.shutdown()


#: Events a refused update may leave on the time-skipping test server: the workflow
#: task that ran the validator (the real server drops that speculative task too).
_TASK_EVENTS = {
    "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED",
    "EVENT_TYPE_WORKFLOW_TASK_STARTED",
    "EVENT_TYPE_WORKFLOW_TASK_COMPLETED",
}


@dataclass
class Snapshot:
    events: list[str]
    jobs: dict[str, Job]
    nodes: int
    summary: c.Summary


async def snapshot(fc: ForgeClient, store: Store) -> Snapshot:
    history = await fc.handle().fetch_history()
    status = await fc.status()
    return Snapshot(
        events=[EventType.Name(e.event_type) for e in history.events],
        jobs={j.id: j for j in store.list_jobs(fc.cluster)},
        nodes=len(store.nodes(fc.cluster)),
        summary=status.summary,
    )


async def assert_untouched(fc: ForgeClient, store: Store, before: Snapshot) -> None:
    """Nothing but workflow-task events reached history, the store holds what it
    held, and the workflow is running and answers a query."""
    after = await snapshot(fc, store)
    assert after.events[: len(before.events)] == before.events
    added = set(after.events[len(before.events) :])
    assert added <= _TASK_EVENTS, added - _TASK_EVENTS
    assert after.jobs == before.jobs
    assert after.nodes == before.nodes
    assert (after.summary.jobs, after.summary.nodes, after.summary.bound) == (
        before.summary.jobs,
        before.summary.nodes,
        before.summary.bound,
    )
    desc = await fc.handle().describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING


def failure_text(err: BaseException) -> str:
    """The messages of a failure and all its causes."""
    parts: list[str] = []
    seen: BaseException | None = err
    while seen is not None:
        parts.append(str(getattr(seen, "message", "") or seen))
        seen = getattr(seen, "cause", None) or seen.__cause__
    return "\n".join(parts)


def collect(strategy: st.SearchStrategy[Bad], n: int) -> list[Bad]:
    """``n`` examples drawn by Hypothesis (no shrinking: they are sent to a server)."""
    out: list[Bad] = []

    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None)
    @given(strategy)
    def draw(bad: Bad) -> None:
        out.append(bad)

    draw()
    return out


@pytest_asyncio.fixture(loop_scope="session")
async def live(skipping_env: WorkflowEnvironment) -> AsyncIterator[tuple[ForgeClient, Store]]:
    """A running cluster with one node and one bound job."""
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1")])
        await fc.submit_job(job("web", replicas=1))
        yield fc, store


def _update_path(bad: Bad) -> str:
    """Where pydantic puts the bad field inside a SubmitJob request."""
    return "job" if not bad.path else f"job.{bad.path}"


async def test_raw_bad_specs_are_refused_by_the_workflow_with_nothing_written(
    live: tuple[ForgeClient, Store],
) -> None:
    fc, store = live
    handle = fc.handle()
    bads = collect(bad_jobs(), 40) + collect(oversized_fields(), 4)
    before = await snapshot(fc, store)
    for bad in bads:
        with pytest.raises(WorkflowUpdateFailedError) as raised:
            await handle.execute_update(c.UPDATE_SUBMIT_JOB, {"job": bad.doc, "wait": False})
        text = failure_text(raised.value)
        # the validator answers a plain client with the field errors, non-retryable
        cause = raised.value.cause
        assert isinstance(cause, ApplicationError) and cause.non_retryable, text
        assert cause.type == "InvalidInput", text
        assert text.splitlines()[1].startswith("SubmitJob: "), text
        assert _update_path(bad) in text, (bad.kind, text)
    await assert_untouched(fc, store, before)
    assert (await fc.status()).summary.bound == 1


async def test_raw_size_and_batch_violations_are_refused(
    live: tuple[ForgeClient, Store],
) -> None:
    fc, store = live
    handle = fc.handle()
    before = await snapshot(fc, store)
    # a job past MAX_JOB_BYTES (every field within its own limit)
    with pytest.raises(WorkflowUpdateFailedError) as raised:
        await handle.execute_update(c.UPDATE_SUBMIT_JOB, {"job": too_big_job(300 * 1024)})
    assert f"the limit is {MAX_JOB_BYTES // 1024} KiB" in failure_text(raised.value)
    # a batch past MAX_BATCH_BYTES of jobs each within MAX_JOB_BYTES
    jobs = [sized_job(f"s{i}", 120 * 1024, seed=i).model_dump(mode="json") for i in range(10)]
    with pytest.raises(WorkflowUpdateFailedError) as raised:
        await handle.execute_update(c.UPDATE_SUBMIT_JOBS, {"jobs": jobs})
    assert f"the limit is {MAX_BATCH_BYTES // 1024} KiB" in failure_text(raised.value)
    # colliding ids in one batch
    spec = job("dup").model_dump(mode="json")
    with pytest.raises(WorkflowUpdateFailedError) as raised:
        await handle.execute_update(c.UPDATE_SUBMIT_JOBS, {"jobs": [spec, spec]})
    assert "job ids repeated in one batch: dup" in failure_text(raised.value)
    # too many jobs or nodes in one message
    with pytest.raises(WorkflowUpdateFailedError) as raised:
        await handle.execute_update(
            c.UPDATE_SUBMIT_JOBS,
            {
                "jobs": [
                    job(f"m{i}").model_dump(mode="json") for i in range(c.MAX_JOBS_PER_UPDATE + 1)
                ]
            },
        )
    text = failure_text(raised.value)
    assert "jobs" in text and f"{c.MAX_JOBS_PER_UPDATE}" in text
    await assert_untouched(fc, store, before)


async def test_raw_jobs_setting_a_variable_forge_sets_are_refused(
    live: tuple[ForgeClient, Store],
) -> None:
    """What a plain-JSON client (the temporal CLI, another language) sends is held
    to the task contract too: the variable is named and nothing is written."""
    fc, store = live
    handle = fc.handle()
    before = await snapshot(fc, store)
    spec = job("gpu").model_dump(mode="json")
    spec["groups"][0]["tasks"][0]["env"] = {"CUDA_VISIBLE_DEVICES": "0"}
    for update, payload in [
        (c.UPDATE_SUBMIT_JOB, {"job": spec, "wait": False}),
        (c.UPDATE_SUBMIT_JOBS, {"jobs": [job("ok").model_dump(mode="json"), spec]}),
    ]:
        with pytest.raises(WorkflowUpdateFailedError) as raised:
            await handle.execute_update(update, payload)
        cause = raised.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput"
        text = failure_text(raised.value)
        assert "job gpu: groups.0.tasks.0.env.CUDA_VISIBLE_DEVICES" in text, text
    await assert_untouched(fc, store, before)


@pytest.mark.parametrize(
    ("update", "payload", "message"),
    [
        (c.UPDATE_DRAIN_NODE, {"node_id": "ghost"}, "unknown node 'ghost'"),
        (c.UPDATE_REPORT_FAILED, {"workload_ids": ["web/main/99"]}, "not bound: web/main/99"),
        (c.UPDATE_REPORT_FAILED, {"workload_ids": ["nope"]}, "not bound: nope"),
        (c.UPDATE_SCALE, {"job_id": "nope", "group": "main", "count": 3}, "unknown job 'nope'"),
        (c.UPDATE_SCALE, {"job_id": "web", "group": "nope", "count": 3}, "has no group 'nope'"),
        (c.UPDATE_STOP_JOB, {"job_id": "nope"}, "unknown job 'nope'"),
        (c.UPDATE_STOP_JOB, {"job_id": "web/main"}, "unknown job 'web/main'"),
        # shapes the models refuse
        (c.UPDATE_SCALE, {"job_id": "web", "group": "main", "count": -1}, "count"),
        (c.UPDATE_SCALE, {"job_id": "web", "group": "main", "count": 10**9}, "count"),
        (c.UPDATE_SCALE, {"job_id": "web", "group": "main", "count": [3]}, "count"),
        (c.UPDATE_SCALE, {"job_id": "web", "group": "main"}, "count"),
        (c.UPDATE_REPORT_FAILED, {"workload_ids": []}, "workload_ids"),
        (c.UPDATE_REPORT_FAILED, {"workload_ids": ["x"] * 1001}, "workload_ids"),
        (c.UPDATE_DRAIN_NODE, {"node": "n1"}, "node_id"),
        (c.UPDATE_DRAIN_NODE, "n1", "DrainNode"),
        ("no_such_update", {}, "expected but not found"),
    ],
)
async def test_updates_naming_unknown_things_are_refused_with_nothing_in_history(
    live: tuple[ForgeClient, Store], update: str, payload: Any, message: str
) -> None:
    fc, store = live
    before = await snapshot(fc, store)
    with pytest.raises(WorkflowUpdateFailedError) as raised:
        await fc.handle().execute_update(update, payload)
    assert message in failure_text(raised.value)
    # what a plain client matches on: a name that does not exist is NotFound, any
    # other refusal InvalidInput; both non-retryable
    cause = raised.value.cause
    if message.startswith(("unknown", "has no group")):
        assert isinstance(cause, ApplicationError) and cause.type == "NotFound"
        assert cause.non_retryable
    elif message.startswith("not bound"):
        assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput"
        assert cause.non_retryable
    await assert_untouched(fc, store, before)


async def test_the_client_refuses_unknown_things_as_bad_input(
    live: tuple[ForgeClient, Store],
) -> None:
    fc, store = live
    before = await snapshot(fc, store)
    calls: list[tuple[Callable[[], Any], type[ForgeError]]] = [
        (lambda: fc.drain_node("ghost"), NotFound),
        (lambda: fc.report_failed(["web/main/7"]), InvalidInput),
        (lambda: fc.scale("nope", "main", 1), NotFound),
        (lambda: fc.scale("web", "nope", 1), NotFound),
        (lambda: fc.stop_job("nope"), NotFound),
    ]
    for call, kind in calls:
        with pytest.raises(ForgeError) as raised:
            await call()
        assert type(raised.value) is kind and raised.value.bad_input
        assert isinstance(raised.value.__cause__, WorkflowUpdateFailedError)
    await assert_untouched(fc, store, before)


async def test_the_client_refuses_an_oversized_request_before_sending(
    live: tuple[ForgeClient, Store],
) -> None:
    """Requests whose fields have no length limit (workload and node ids) are
    refused by forge.client.client, as bad input naming the limit, before anything is
    sent; a job that skipped validation (``model_construct``) cannot even be put
    in a request."""
    fc, store = live
    before = await snapshot(fc, store)
    huge_id = "x" * (MAX_REQUEST_BYTES + 1)
    calls: list[Callable[[], Any]] = [
        lambda: fc.report_failed([huge_id]),
        lambda: fc.report_failed(["web/main/0" + "0" * 2000] * 1000),
        lambda: fc.drain_node(huge_id),
        lambda: fc.remove_node(huge_id),
        lambda: fc.node_lost(huge_id),
    ]
    for call in calls:
        with pytest.raises(ForgeError, match=f"at most {MAX_REQUEST_BYTES // 1024:,} KiB") as e:
            await call()
        assert e.value.bad_input
    base = job("huge")
    task = (
        base.groups[0]
        .tasks[0]
        .model_construct(**{**dict(base.groups[0].tasks[0]), "args": ("a" * 4000,) * 600})
    )
    group = base.groups[0].model_construct(**{**dict(base.groups[0]), "tasks": (task,)})
    huge = Job.model_construct(**{**dict(base), "groups": (group,)})
    for submit in (lambda: fc.submit_job(huge), lambda: fc.submit_jobs([huge, huge])):
        with pytest.raises(pydantic.ValidationError, match=f"limit is {MAX_JOB_BYTES // 1024} KiB"):
            await submit()
    await assert_untouched(fc, store, before)


async def test_many_large_jobs_are_batched_by_size_and_the_workflow_stays_healthy(
    live: tuple[ForgeClient, Store],
) -> None:
    """16 jobs of 100 KiB of random text (1.6 MB): more than one update or one
    store write may carry. The client sends them in batches of at most
    MAX_BATCH_BYTES (two concurrent updates), and the workflow queues at most that
    much for one store write (the second update waits for the first write): every
    job is stored, and no workflow task fails. The writes are local activities
    (their input is not in history): each one's job count is read from the store
    revision its recorded result gives."""
    fc, store = live
    jobs = [sized_job(f"large{i:02d}", 100 * 1024, seed=i) for i in range(16)]
    assert sum(len(j.model_dump_json()) for j in jobs) > 1.5 * MAX_BATCH_BYTES
    largest = max(len(j.model_dump_json()) for j in jobs)
    revision = store.revision(fc.cluster)
    results = await fc.submit_jobs(jobs)
    assert [r.job_id for r in results] == [j.id for j in jobs]
    status = await _settled(fc, lambda s: s.summary.bound == 17)
    assert status.summary.jobs == 17
    stored = {j.id: j for j in store.list_jobs(fc.cluster)}
    assert all(stored[j.id] == j for j in jobs)

    history = await fc.handle().fetch_history()
    types = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in types
    codec = data_converter().payload_codec
    assert codec is not None
    counts = []  # jobs per write, from the revisions the local writes returned
    for e in history.events:
        attrs = e.activity_task_scheduled_event_attributes
        assert attrs.activity_type.name != "forge.write_jobs", "a write was not local"
        marker = e.marker_recorded_event_attributes
        if marker.marker_name != "core_local_activity" or "result" not in marker.details:
            continue
        (info,) = await codec.decode(list(marker.details["data"].payloads))
        if json.loads(info.data)["activity_type"] != "forge.write_jobs":
            continue
        (result,) = await codec.decode(list(marker.details["result"].payloads))
        now = json.loads(result.data)["revision"]
        if now > revision:
            counts.append(now - revision)
            revision = now
    assert sum(counts) == len(jobs), counts
    assert len(counts) >= 2, counts  # the 1.6 MB went to the store in more than one write
    assert max(counts) * largest <= MAX_BATCH_BYTES + 64 * 1024, counts


# ------------------------------------------------------------------------ signals


async def test_signals_naming_unknown_nodes_are_ignored_and_logged(
    live: tuple[ForgeClient, Store], caplog: pytest.LogCaptureFixture
) -> None:
    fc, store = live
    before = await snapshot(fc, store)
    caplog.set_level(logging.INFO, logger="temporalio.workflow")
    await fc.remove_node("ghost")
    await fc.node_lost("ghost/1")
    await fc.handle().signal(c.SIGNAL_NODE_LOST, c.NodeRef(node_id="\x00" * 3))
    after = await _settled(fc, lambda s: _logged(caplog, "unknown node \x00\x00\x00"))
    assert after.summary.nodes == before.summary.nodes
    assert after.summary.bound == before.summary.bound
    assert [n.state for n in after.nodes] == ["ready"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("ignoring remove for unknown node ghost" in m for m in messages), messages
    assert any("ignoring lost for unknown node ghost/1" in m for m in messages), messages
    assert (await fc.handle().describe()).status == WorkflowExecutionStatus.RUNNING


_MANY = [node(f"y{i}").model_dump(mode="json") for i in range(501)]


@pytest.mark.parametrize(
    ("signal", "args", "problem"),
    [
        (c.SIGNAL_REGISTER_NODE, [{"nodes": [{"id": "x"}]}], "node x: cpu: Field required"),
        (
            c.SIGNAL_REGISTER_NODE,
            [{"nodes": [{"id": "x/y", "cpu": 1, "memory": 1}]}],
            "node [0]: id",
        ),
        (c.SIGNAL_REGISTER_NODE, [{"nodes": [{"id": "x", "cpu": -1, "memory": 1}]}], "node x: cpu"),
        (
            c.SIGNAL_REGISTER_NODE,
            [{"nodes": [{"id": "x", "cpu": "1", "memory": 1}]}],
            "node x: cpu",
        ),
        (c.SIGNAL_REGISTER_NODE, [{"nodes": []}], "nodes: List should have at least 1"),
        (c.SIGNAL_REGISTER_NODE, [{"nodes": _MANY}], "nodes: List should have at most 500"),
        (
            c.SIGNAL_REGISTER_NODE,
            [{"nodes": [{"id": "x", "cpu": 1, "memory": 1, "os": "l"}]}],
            "node x: os: Extra inputs",
        ),
        (c.SIGNAL_REGISTER_NODE, ["garbage"], "(payload): Input should be an object"),
        (c.SIGNAL_REGISTER_NODE, [None], "(payload): Input should be an object"),
        (c.SIGNAL_REGISTER_NODE, [], "expected one argument, got 0"),
        (c.SIGNAL_REGISTER_NODE, [{"nodes": []}, {"nodes": []}], "expected one argument, got 2"),
        (c.SIGNAL_REMOVE_NODE, [{"nodeid": "n1"}], "node_id: Field required"),
        (c.SIGNAL_REMOVE_NODE, [42], "(payload)"),
        (c.SIGNAL_REMOVE_NODE, [], "expected one argument, got 0"),
        (c.SIGNAL_NODE_LOST, [{"node_id": ["n1"]}], "node_id: Input should be a valid string"),
        (c.SIGNAL_NODE_LOST, [None], "(payload)"),
        ("no_such_signal", [{"a": 1}], None),
    ],
)
async def test_a_malformed_signal_is_dropped_with_a_warning_and_the_workflow_carries_on(
    live: tuple[ForgeClient, Store],
    caplog: pytest.LogCaptureFixture,
    signal: str,
    args: list[Any],
    problem: str | None,
) -> None:
    """A signal cannot be refused: one whose payload is not what the contract says
    (missing, null, two of them, wrong shape) is dropped with a warning naming the
    problem. Before the handlers validated their payload themselves, a null or a
    missing payload raised in the handler and failed the workflow task for ever.
    A bad node in a batch is dropped by itself (named by id and field; the rest of
    the batch registers: tests/workflow/test_inputs.py); a bad envelope drops it all."""
    fc, store = live
    caplog.set_level(logging.WARNING, logger="temporalio.workflow")
    before = await snapshot(fc, store)
    await fc.handle().signal(signal, args=args)
    # a valid signal after it is still applied, in order
    await fc.register_nodes([node("late")])
    status = await _settled(fc, lambda s: s.summary.nodes == before.summary.nodes + 1)
    assert {n.id for n in status.nodes} == {"n1", "late"}
    assert status.summary.bound == before.summary.bound
    history = await fc.handle().fetch_history()
    types = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in types
    assert (await fc.handle().describe()).status == WorkflowExecutionStatus.RUNNING
    if problem is not None:  # an unknown signal name is buffered by the SDK, unread
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"dropping {signal} signal" in m and problem in m for m in warned), warned
    await fc.remove_node("late")
    await _settled(fc, lambda s: s.summary.nodes == before.summary.nodes)


async def _settled(fc: ForgeClient, check: Callable[[c.StatusView], bool]) -> c.StatusView:
    """Status once ``check`` holds."""
    for _ in range(400):
        status = await fc.status()
        if check(status):
            return status
        await asyncio.sleep(0.025)
    raise AssertionError(f"not reached: {status.summary}")


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


async def test_an_oversized_signal_is_refused_by_the_server_not_the_workflow(
    live: tuple[ForgeClient, Store],
) -> None:
    """Nodes of 64 labels of 4 KiB of random text: 500 of them (the per-signal
    count limit) are ~140 MB. forge.client.client splits by size; a raw signal that big is
    refused by the server (gRPC/blob limit) and never reaches the workflow."""
    fc, store = live
    rnd = random.Random(5)

    def big_node(i: int) -> dict[str, Any]:
        labels = {f"k{j}": "".join(rnd.choices(string.ascii_letters, k=4096)) for j in range(64)}
        return {"id": f"fat{i}", "cpu": 1000, "memory": 1024, "labels": labels}

    raw = [big_node(i) for i in range(40)]  # ~10.6 MB
    before = await snapshot(fc, store)
    with pytest.raises(RPCError):
        await fc.handle().signal(c.SIGNAL_REGISTER_NODE, {"nodes": raw})
    await assert_untouched(fc, store, before)
    # the client sends six of them (1.6 MB) in signals of at most MAX_BATCH_BYTES each
    nodes = [Node.model_validate(n) for n in raw[:6]]
    assert await fc.register_nodes(nodes) == 6
    status = await _settled(fc, lambda s: s.summary.nodes == before.summary.nodes + 6)
    assert {n.id for n in status.nodes} >= {n.id for n in nodes}
    for n in nodes:
        await fc.remove_node(n.id)
    await _settled(fc, lambda s: s.summary.nodes == before.summary.nodes)
