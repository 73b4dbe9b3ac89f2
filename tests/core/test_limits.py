"""Every limit in docs/limits.md holds at its documented number, exactly.

The numbers below are written out from docs/limits.md, not imported: a test that
computed its boundary from ``MAX_GROUPS`` would move with the constant and pass
however far it was raised. Each field test is a Hypothesis property ("a value is
accepted iff it lies within the documented range") with the boundaries pinned by
``@example``: 0, -1, the limit and the limit + 1 (for counts and lengths: 0, 1, the
limit and the limit + 1), so no seed can miss them.
``test_the_documented_numbers_are_the_ones_in_docs_limits_md`` keeps this table and
the document in step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from forge.client.limits import ForgeError
from forge.client.limits import batches as _batches
from forge.client.limits import check_size as _check_size
from forge.core.models import Job, Node
from forge.loaders import InputError, load_jobs, parse_jobs
from forge.wire import contract as c

DOCS = (Path(__file__).parents[2] / "docs" / "limits.md").read_text()

KIB = 1024
MIB = 1024 * KIB
YEAR = 365 * 24 * 3600

# -- the documented numbers ------------------------------------------------------------
CPU = 10_000_000  # "1 .. 10,000,000 millicores"
MEMORY = 2**30  # "1 .. 2^30 MiB"
GPUS = 64  # "0 .. 64 whole devices"
GPU_MODELS = 32  # "32 names"
GROUPS = 64  # "1 .. 64"
TASKS = 64  # "1 .. 64"
REPLICAS = 100_000  # "0 .. 100,000"
PRIORITY = 100  # "1 .. 100"
NAME = 63  # "1-63 of A-Z a-z 0-9 . _ -"
ARGS = 256  # "256 items each"
ENV = 256  # "256 variables"
STRING = 4096  # "4,096 characters"
CONSTRAINTS = 64  # "64 / 64; label 1-253 characters"
CONSTRAINT_VALUES = 64
SPREAD_RULES = 8  # "8, labels unique"
CONSTRAINT_LABEL = 253
ATTEMPTS = 1000  # "0 .. 1,000"
JOB_BYTES = 128 * KIB  # "128 KiB"
NODE_GPUS = 64  # "64, ids unique"
LABELS = 64  # "64 (MAX_LABELS), key 1-253 characters, value up to 4,096"
LABEL_KEY = 253
INPUT_BYTES = 16 * MIB  # "16 MiB"
VALUES = 2_000_000  # "2,000,000"
ERROR_LINES = 20  # "20"
NODES_PER_SIGNAL = 500
JOBS_PER_UPDATE = 1000
WORKLOADS_PER_UPDATE = 1000
BATCH_BYTES = 1 * MIB  # "1 MiB"
REQUEST_BYTES = 1 * MIB + 64 * KIB  # "1 MiB + 64 KiB"
ASSIGNMENTS_PAGE = 10_000
PENDING_SHOWN = 200


@pytest.mark.parametrize(
    "phrase",
    [
        "1 .. 10,000,000 millicores",
        "1 .. 2^30 MiB",
        "0 .. 64 whole devices",
        "| GPU models per task | 32 names |",
        "| groups per job | 1 .. 64, names unique | `MAX_GROUPS` |",
        "| tasks per group | 1 .. 64, names unique | `MAX_TASKS` |",
        "0 .. 100,000, `min <= desired <= max`",
        "| priority | 1 .. 100 |",
        "1-63 of `A-Z a-z 0-9 . _ -`",
        "| `command`, `args` | 256 items each | `MAX_ARGS` |",
        "| `env` | 256 variables",
        "| 4,096 characters | `MAX_STRING` |",
        "| 64 / 64; label 1-253 characters |",
        "| spread rules per group (`spread`) | 8, labels unique; `max_skew` 1 .. 100,000 |",
        "0 .. 1,000; 0 .. 1 year in seconds",
        "**128 KiB** | `MAX_JOB_BYTES` |",
        "| GPU devices | 64, ids unique |",
        "| labels | 64 (`MAX_LABELS`), key 1-253 characters, value up to 4,096",
        "| 16 MiB | `MAX_INPUT_BYTES` |",
        "| 2,000,000 | `MAX_VALUES` |",
        "| 20 | `MAX_ERROR_LINES` |",
        "| 500 | `MAX_NODES_PER_SIGNAL` |",
        "| 1,000 | `MAX_JOBS_PER_UPDATE` |",
        "| 1,000 | `MAX_WORKLOADS_PER_UPDATE` |",
        "| 1 MiB | `MAX_BATCH_BYTES` |",
        "| 1 MiB + 64 KiB | `forge.client.client.MAX_REQUEST_BYTES` |",
        "| `assignments` query page | 10,000 |",
        "| 200 (the rest counted in `pending_truncated`) | `PENDING_SHOWN` |",
        "| accepted updates per run | 1,000 | `max_updates_per_run` |",
        "| history events per run | 20,000 | `max_history_events` |",
        "| history bytes per run | 8 MiB | `max_history_bytes` |",
        "| 10,000,000 | `max_replay_cost` |",
        "| 2.5 s | `max_replay_seconds` |",
        "| backoff entries carried to the next run | 10,000 | `carry_backoff_limit` |",
        "| 5,000 / 10,000 / 5,000 | `job_page`, `snapshot_page`, `report_page` |",
    ],
)
def test_the_documented_numbers_are_the_ones_in_docs_limits_md(phrase: str) -> None:
    assert phrase in DOCS, f"docs/limits.md no longer says {phrase!r}: update this test with it"


# -- builders ------------------------------------------------------------------------------
def task(**over: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"name": "t", "resources": {"cpu": 100, "memory": 64}}
    t.update(over)
    return t


def group(**over: Any) -> dict[str, Any]:
    g: dict[str, Any] = {"name": "g", "tasks": [task()]}
    g.update(over)
    return g


def job(**over: Any) -> dict[str, Any]:
    j: dict[str, Any] = {"name": "j", "groups": [group()]}
    j.update(over)
    return j


def node(**over: Any) -> dict[str, Any]:
    n: dict[str, Any] = {"id": "n", "cpu": 1000, "memory": 1024}
    n.update(over)
    return n


def resources(**over: Any) -> dict[str, Any]:
    return job(groups=[group(tasks=[task(resources={"cpu": 100, "memory": 64, **over})])])


def gpu(**over: Any) -> dict[str, Any]:
    return resources(gpu=over)


def accepted(doc: dict[str, Any], model: type[BaseModel] = Job) -> bool:
    try:
        model.model_validate(doc)
    except ValidationError:
        return False
    return True


def edges(limit: int, low: int = 0) -> st.SearchStrategy[int]:
    """Mostly near the edges, sometimes anywhere."""
    return st.one_of(
        st.integers(low - 3, low + 3),
        st.integers(limit - 3, limit + 3),
        st.integers(-(2**40), 2**40),
    )


# -- integer fields ------------------------------------------------------------------------
INT_FIELDS: dict[str, tuple[Callable[[int], dict[str, Any]], type[BaseModel], int, int]] = {
    # name: (document with the value, model, lowest accepted, highest accepted)
    "task cpu": (lambda v: resources(cpu=v), Job, 1, CPU),
    "task memory": (lambda v: resources(memory=v), Job, 1, MEMORY),
    "gpu count": (lambda v: gpu(count=v), Job, 0, GPUS),
    "gpu memory": (lambda v: gpu(memory=v), Job, 0, MEMORY),
    "scaling.min": (
        lambda v: job(groups=[group(scaling={"min": v, "max": REPLICAS, "desired": REPLICAS})]),
        Job,
        0,
        REPLICAS,
    ),
    "scaling.max": (
        lambda v: job(groups=[group(scaling={"min": 0, "max": v, "desired": 0})]),
        Job,
        0,
        REPLICAS,
    ),
    "scaling.desired": (
        lambda v: job(groups=[group(scaling={"min": 0, "max": max(v, 0), "desired": v})]),
        Job,
        0,
        REPLICAS,
    ),
    "priority": (lambda v: job(priority=v), Job, 1, PRIORITY),
    "reschedule attempts": (
        lambda v: job(groups=[group(reschedule={"attempts": v})]),
        Job,
        0,
        ATTEMPTS,
    ),
    "autoscale step": (lambda v: job(groups=[group(autoscale={"step": v})]), Job, 1, REPLICAS),
    "node cpu": (lambda v: node(cpu=v), Node, 0, CPU),
    "node memory": (lambda v: node(memory=v), Node, 0, MEMORY),
    "gpu device memory": (
        lambda v: node(gpus=[{"id": "g0", "model": "A100", "memory": v}]),
        Node,
        0,
        MEMORY,
    ),
}


@pytest.mark.parametrize("field", sorted(INT_FIELDS))
@given(value=st.data())
@example(value=0)
@example(value=-1)
@example(value="limit")
@example(value="limit+1")
@example(value="low-1")
def test_an_integer_field_accepts_exactly_its_documented_range(field: str, value: Any) -> None:
    build, model, low, high = INT_FIELDS[field]
    if isinstance(value, st.DataObject):
        v = value.draw(edges(high, low), label="value")
    else:
        v = {"limit": high, "limit+1": high + 1, "low-1": low - 1}.get(value, value)
    assert accepted(build(v), model) == (low <= v <= high), (field, v)


FLOAT_FIELDS: dict[str, Callable[[float], dict[str, Any]]] = {
    "reschedule interval": lambda v: job(groups=[group(reschedule={"interval": v})]),
    "reschedule max_delay": lambda v: job(
        groups=[group(reschedule={"delay": 0.0, "max_delay": v})]
    ),
    "reschedule delay": lambda v: job(groups=[group(reschedule={"delay": v, "max_delay": YEAR})]),
    "autoscale cooldown": lambda v: job(groups=[group(autoscale={"cooldown": v})]),
    "autoscale stabilization_window": lambda v: job(
        groups=[group(autoscale={"stabilization_window": v})]
    ),
}


@pytest.mark.parametrize("field", sorted(FLOAT_FIELDS))
@given(v=st.floats(-2 * YEAR, 2 * YEAR, allow_nan=False))
@example(v=0.0)
@example(v=-1.0)
@example(v=float(YEAR))
@example(v=float(YEAR + 1))
def test_a_duration_is_accepted_from_0_to_one_year(field: str, v: float) -> None:
    assert accepted(FLOAT_FIELDS[field](v)) == (0 <= v <= YEAR), (field, v)


def test_the_autoscale_interval_is_1_s_to_one_year() -> None:
    for v, ok in ((0.0, False), (-1.0, False), (0.999, False), (1.0, True), (YEAR, True)):
        assert accepted(job(groups=[group(autoscale={"interval": float(v)})])) == ok, v
    assert not accepted(job(groups=[group(autoscale={"interval": float(YEAR + 1)})]))


FRACTIONS: dict[str, tuple[Callable[[float], dict[str, Any]], bool, bool]] = {
    # name: (document, 0 accepted, 1 accepted)
    "scale_up": (
        lambda v: job(groups=[group(autoscale={"scale_up": v, "scale_down": 0.0})]),
        False,
        True,
    ),
    "scale_down": (
        lambda v: job(groups=[group(autoscale={"scale_down": v, "scale_up": 1.0})]),
        True,
        False,
    ),
    "target": (
        lambda v: job(groups=[group(autoscale={"policy": "target", "target": v})]),
        False,
        True,
    ),
    "tolerance": (lambda v: job(groups=[group(autoscale={"tolerance": v})]), True, False),
}


@pytest.mark.parametrize("field", sorted(FRACTIONS))
@given(v=st.floats(-2.0, 2.0, allow_nan=False))
@example(v=0.0)
@example(v=-1.0)
@example(v=1.0)
@example(v=1.0 + 2**-40)
@example(v=2**-40)
def test_an_autoscale_fraction_lies_within_0_and_1(field: str, v: float) -> None:
    build, zero_ok, one_ok = FRACTIONS[field]
    inside = (0 < v < 1) or (v == 0 and zero_ok) or (v == 1 and one_ok)
    assert accepted(build(v)) == inside, (field, v)


# -- counts ----------------------------------------------------------------------------
COUNT_FIELDS: dict[str, tuple[Callable[[int], dict[str, Any]], type[BaseModel], int, int]] = {
    "groups per job": (
        lambda n: job(groups=[group(name=f"g{i}") for i in range(n)]),
        Job,
        1,
        GROUPS,
    ),
    "tasks per group": (
        lambda n: job(groups=[group(tasks=[task(name=f"t{i}") for i in range(n)])]),
        Job,
        1,
        TASKS,
    ),
    "node labels": (lambda n: node(labels={f"k{i}": "v" for i in range(n)}), Node, 0, LABELS),
    "node gpu devices": (
        lambda n: node(gpus=[{"id": f"g{i}", "model": "A100", "memory": 1} for i in range(n)]),
        Node,
        0,
        NODE_GPUS,
    ),
    "env variables": (
        lambda n: job(groups=[group(tasks=[task(env={f"E{i}": "v" for i in range(n)})])]),
        Job,
        0,
        ENV,
    ),
    "args": (lambda n: job(groups=[group(tasks=[task(args=["a"] * n)])]), Job, 0, ARGS),
    "command": (lambda n: job(groups=[group(tasks=[task(command=["a"] * n)])]), Job, 0, ARGS),
    "gpu models": (lambda n: gpu(count=1, models=[f"m{i}" for i in range(n)]), Job, 0, GPU_MODELS),
    "constraints per group": (
        lambda n: job(groups=[group(constraints=[{"label": "zone", "values": ["a"]}] * n)]),
        Job,
        0,
        CONSTRAINTS,
    ),
    "spread rules per group": (
        lambda n: job(groups=[group(spread=[{"label": f"l{i}"} for i in range(n)])]),
        Job,
        0,
        SPREAD_RULES,
    ),
    "values per constraint": (
        lambda n: job(
            groups=[
                group(
                    constraints=[{"label": "z", "op": "in", "values": [f"v{i}" for i in range(n)]}]
                )
            ]
        ),
        Job,
        1,
        CONSTRAINT_VALUES,
    ),
}


@pytest.mark.parametrize("field", sorted(COUNT_FIELDS))
@given(n=st.one_of(st.integers(0, 4), st.integers(60, 70), st.integers(250, 260)))
@example(n=0)
@example(n=1)
@example(n=-1)  # stands for "the limit"
@example(n=-2)  # stands for "the limit + 1"
def test_a_list_accepts_exactly_its_documented_number_of_items(field: str, n: int) -> None:
    build, model, low, high = COUNT_FIELDS[field]
    n = {-1: high, -2: high + 1}.get(n, n)
    assert accepted(build(n), model) == (low <= n <= high), (field, n)


# -- string lengths ----------------------------------------------------------------------
STRING_FIELDS: dict[str, tuple[Callable[[str], dict[str, Any]], type[BaseModel], int, int]] = {
    "job name": (lambda s: job(name=s), Job, 1, NAME),
    "group name": (lambda s: job(groups=[group(name=s)]), Job, 1, NAME),
    "task name": (lambda s: job(groups=[group(tasks=[task(name=s)])]), Job, 1, NAME),
    "gpu model name": (lambda s: gpu(count=1, models=[s]), Job, 1, NAME),
    "node id": (lambda s: node(id=s), Node, 1, NAME),
    "gpu device id": (
        lambda s: node(gpus=[{"id": s, "model": "A100", "memory": 1}]),
        Node,
        1,
        NAME,
    ),
    "arg": (lambda s: job(groups=[group(tasks=[task(args=[s])])]), Job, 0, STRING),
    "command item": (lambda s: job(groups=[group(tasks=[task(command=[s])])]), Job, 0, STRING),
    "env value": (lambda s: job(groups=[group(tasks=[task(env={"E": s})])]), Job, 0, STRING),
    "constraint value": (
        lambda s: job(groups=[group(constraints=[{"label": "z", "values": [s]}])]),
        Job,
        0,
        STRING,
    ),
    "constraint label": (
        lambda s: job(groups=[group(constraints=[{"label": s, "op": "exists"}])]),
        Job,
        1,
        CONSTRAINT_LABEL,
    ),
    "node label key": (lambda s: node(labels={s: "v"}), Node, 1, LABEL_KEY),
    "node label value": (lambda s: node(labels={"k": s}), Node, 0, STRING),
}


@pytest.mark.parametrize("field", sorted(STRING_FIELDS))
@given(n=st.one_of(st.integers(0, 3), st.integers(60, 66), st.integers(250, 256)))
@example(n=0)
@example(n=1)
@example(n=-1)  # the limit
@example(n=-2)  # the limit + 1
def test_a_string_accepts_exactly_its_documented_length(field: str, n: int) -> None:
    build, model, low, high = STRING_FIELDS[field]
    n = {-1: high, -2: high + 1}.get(n, n)
    assert accepted(build("a" * n), model) == (low <= n <= high), (field, n)


# -- the whole job, as JSON ---------------------------------------------------------------
def job_of_size(size: int) -> dict[str, Any]:
    """A job (every field within its own limit) whose JSON is exactly ``size`` bytes:
    args of plain ``x`` (no escaping), each adding its length + 2 quotes (+ 1 comma)."""
    total = len(Job.model_validate(job()).model_dump_json())  # with "args": []
    args: list[str] = []
    while size - total > STRING + 3:
        total += STRING + (3 if args else 2)
        args.append("x" * STRING)
    args.append("x" * (size - total - (3 if args else 2)))
    return job(groups=[group(tasks=[task(args=args)])])


@pytest.mark.parametrize(("size", "ok"), [(JOB_BYTES, True), (JOB_BYTES + 1, False)])
def test_a_job_of_exactly_128_kib_is_accepted_and_one_byte_more_is_refused(
    size: int, ok: bool
) -> None:
    doc = job_of_size(size)
    if ok:
        assert len(Job.model_validate(doc).model_dump_json()) == JOB_BYTES
    else:
        with pytest.raises(ValidationError, match="the limit is 128 KiB"):
            Job.model_validate(doc)


# -- messages to the workflow -------------------------------------------------------------
def _node_doc(i: int) -> dict[str, Any]:
    return node(id=f"n{i}")


@pytest.mark.parametrize(
    ("model", "field", "limit", "item"),
    [
        (c.RegisterNodes, "nodes", NODES_PER_SIGNAL, _node_doc),
        (c.SubmitJobs, "jobs", JOBS_PER_UPDATE, lambda i: job(name=f"j{i}")),
        (c.ReportFailed, "workload_ids", WORKLOADS_PER_UPDATE, lambda i: f"j/g/{i}"),
    ],
    ids=["nodes per signal", "jobs per update", "workloads per update"],
)
def test_a_message_carries_at_most_its_documented_number_of_items(
    model: type[BaseModel], field: str, limit: int, item: Callable[[int], Any]
) -> None:
    for n, ok in ((0, False), (1, True), (limit, True), (limit + 1, False)):
        assert accepted({field: [item(i) for i in range(n)]}, model) == ok, (field, n)


def test_an_assignments_page_is_at_most_10000() -> None:
    for n, ok in ((0, False), (1, True), (ASSIGNMENTS_PAGE, True), (ASSIGNMENTS_PAGE + 1, False)):
        assert accepted({"limit": n}, c.AssignmentsQuery) == ok, n


def test_the_status_query_lists_at_most_200_pending_replicas() -> None:
    from forge.wire.views import PENDING_SHOWN as shown

    assert shown == PENDING_SHOWN


def test_the_run_limits_default_to_their_documented_values() -> None:
    o = c.ClusterOptions()
    assert (o.max_updates_per_run, o.max_history_events, o.max_history_bytes) == (
        1000,
        20_000,
        8 * MIB,
    )
    assert (o.max_replay_cost, o.carry_backoff_limit) == (10_000_000, 10_000)
    assert o.max_replay_seconds == 2.5
    assert (o.job_page, o.snapshot_page, o.report_page) == (5000, 10_000, 5000)
    assert o.max_passes_per_run == 0


class _Blob(BaseModel):
    s: str


def _nodes_of_total(total: int, count: int) -> list[Node]:
    """``count`` nodes whose JSON adds up to exactly ``total`` bytes."""
    out: list[Node] = []
    for i in range(count):
        share = (
            total // count if i < count - 1 else total - sum(len(n.model_dump_json()) for n in out)
        )
        base = Node.model_validate(node(id=f"n{i}", labels={}))
        labels: dict[str, str] = {}
        while True:
            probe = base.model_copy(update={"labels": labels})
            room = share - len(probe.model_dump_json())
            if room <= STRING + 16:
                break
            labels[f"k{len(labels):03d}"] = "x" * STRING
        key = f"k{len(labels):03d}"
        labels[key] = ""
        room = share - len(base.model_copy(update={"labels": labels}).model_dump_json())
        labels[key] = "x" * room
        n = Node.model_validate({**node(id=f"n{i}"), "labels": labels})
        assert len(n.model_dump_json()) == share
        out.append(n)
    return out


@pytest.mark.parametrize(("total", "batches"), [(BATCH_BYTES, 1), (BATCH_BYTES + 1, 2)])
def test_the_client_cuts_batches_at_exactly_1_mib(total: int, batches: int) -> None:
    nodes = _nodes_of_total(total, 5)
    assert sum(len(n.model_dump_json()) for n in nodes) == total
    assert len(_batches(nodes, NODES_PER_SIGNAL)) == batches


def test_the_client_cuts_batches_at_the_documented_count() -> None:
    nodes = [Node.model_validate(node(id=f"n{i}")) for i in range(2 * NODES_PER_SIGNAL + 1)]
    assert [len(b) for b in _batches(nodes, c.MAX_NODES_PER_SIGNAL)] == [500, 500, 1]


def test_the_client_sends_a_request_of_1_mib_plus_64_kib_and_refuses_one_byte_more() -> None:
    overhead = len(_Blob(s="").model_dump_json())
    _check_size("x", _Blob(s="x" * (REQUEST_BYTES - overhead)))
    with pytest.raises(ForgeError, match="at most 1,088 KiB"):
        _check_size("x", _Blob(s="x" * (REQUEST_BYTES - overhead + 1)))


# -- files -------------------------------------------------------------------------------
def test_a_file_of_exactly_16_mib_is_read_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    text = json.dumps(job())
    f = tmp_path / "job.json"
    f.write_text(text + " " * (INPUT_BYTES - len(text)))
    assert f.stat().st_size == INPUT_BYTES
    assert [j.name for j in load_jobs(f)] == ["j"]
    with f.open("a") as out:
        out.write(" ")
    with pytest.raises(InputError, match="larger than the 16 MiB limit"):
        load_jobs(f)


@pytest.mark.parametrize(("values", "refused"), [(VALUES, False), (VALUES + 1, True)])
def test_a_document_of_2_million_values_is_walked_and_one_more_is_refused(
    values: int, refused: bool
) -> None:
    # a list of jobs: the root list is one value, each job 7 ({name, groups: [g]}
    # with g = {name, tasks: [t]} ...); pad with a list of zeros under one job key
    doc: list[Any] = [{"name": "j", "x": []}]
    counted = 1 + 1 + 1 + 1  # root list, the job, its name, its x list
    doc[0]["x"] = [0] * (values - counted)
    with pytest.raises(InputError) as raised:
        parse_jobs(json.dumps(doc), fmt="json", source="f.json")
    assert ("more than 2,000,000 values" in str(raised.value)) == refused, str(raised.value)[:300]


@pytest.mark.parametrize(("problems", "more"), [(ERROR_LINES, 0), (ERROR_LINES + 1, 1)])
def test_at_most_20_problems_are_listed_per_file(problems: int, more: int) -> None:
    text = json.dumps([{"name": f"j{i}", "groups": []} for i in range(problems)])
    with pytest.raises(InputError) as raised:
        parse_jobs(text, fmt="json", source="f.json")
    lines = str(raised.value).splitlines()
    assert len([line for line in lines if "more" not in line]) == ERROR_LINES
    assert (f"f.json: ... and {more} more" in lines) == bool(more)
    assert re.search(r"\[19\]", str(raised.value))


@pytest.mark.parametrize(("skew", "ok"), [(0, False), (1, True), (100_000, True), (100_001, False)])
def test_max_skew_is_1_to_100_000(skew: int, ok: bool) -> None:
    spec = job(groups=[group(spread=[{"label": "zone", "max_skew": skew}])])
    if ok:
        Job.model_validate(spec)
    else:
        with pytest.raises(ValidationError):
            Job.model_validate(spec)
