"""forge.loaders: user files become models, or one InputError that names the problems."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import pydantic
import pytest

from forge.core.models import Job, NodeState, ScalingPolicy
from forge.loaders import (
    GPU_MEMORY_MIB,
    MAX_ERROR_LINES,
    MAX_INPUT_BYTES,
    InputError,
    format_validation_error,
    load_jobs,
    load_nodes,
    parse_jobs,
    parse_nodes,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

WEB_YAML = """\
name: web            # id: optional, defaults to name
priority: 50
groups:
  - name: api
    scaling: {min: 1, max: 10, desired: 3}
    tasks:
      - name: server
        command: ["python", "-m", "http.server", "8080"]
        resources: {cpu: 500, memory: 256}          # millicores, MiB
  - name: train
    scaling: {min: 0, max: 4, desired: 1}
    tasks:
      - name: trainer
        resources: {cpu: 4000, memory: 16384, gpu: {count: 1, memory: 16000, \
models: [V100M32, A100]}}
"""


def job_dict(name: str = "web", **task_resources: object) -> dict[str, object]:
    resources: dict[str, object] = {"cpu": 500, "memory": 256, **task_resources}
    return {
        "name": name,
        "groups": [{"name": "api", "tasks": [{"name": "server", "resources": resources}]}],
    }


def jobs_error(text: str, fmt: str = "yaml", source: str = "jobs/web.yaml") -> str:
    with pytest.raises(InputError) as info:
        parse_jobs(text, fmt=fmt, source=source)
    return str(info.value)


def nodes_error(text: str, fmt: str = "yaml", source: str = "nodes.yaml") -> str:
    with pytest.raises(InputError) as info:
        parse_nodes(text, fmt=fmt, source=source)
    return str(info.value)


# ------------------------------------------------------------------------ examples


def test_the_examples_load() -> None:
    (web,) = load_jobs(EXAMPLES / "web.yaml")
    (train,) = load_jobs(EXAMPLES / "train.yaml")
    (evaluation,) = load_jobs(EXAMPLES / "eval.yaml")
    (nightly,) = load_jobs(EXAMPLES / "nightly.yaml")
    assert nightly.schedule is not None and nightly.schedule.timezone == "Europe/Berlin"
    nodes = load_nodes(EXAMPLES / "nodes.yaml")
    assert (evaluation.type, train.type) == ("batch", "batch")
    assert [g.name for g in web.groups] == ["api", "train"]
    assert any(g.request().gpu > 0 for g in train.groups)
    assert 3 <= len(nodes) <= 4
    assert any(n.gpus and n.labels for n in nodes)


def test_the_example_yaml_loads_with_id_defaulting_to_name() -> None:
    (job,) = parse_jobs(WEB_YAML, fmt="yaml", source="web.yaml")
    assert job.id == job.name == "web"
    assert job.priority == 50
    api, train = job.groups
    assert api.scaling == ScalingPolicy(min=1, max=10, desired=3)
    assert api.tasks[0].command == ("python", "-m", "http.server", "8080")
    assert (api.tasks[0].resources.cpu, api.tasks[0].resources.memory) == (500, 256)
    gpu = train.tasks[0].resources.gpu
    assert (gpu.count, gpu.memory, gpu.models) == (1, 16000, ("V100M32", "A100"))


def test_the_example_file_is_the_documented_shape() -> None:
    assert (EXAMPLES / "web.yaml").read_text() == WEB_YAML


def test_json_gives_the_same_job_as_yaml() -> None:
    (from_yaml,) = parse_jobs(WEB_YAML, fmt="yaml", source="web.yaml")
    text = json.dumps(from_yaml.model_dump(mode="json"))
    assert parse_jobs(text, fmt="json", source="web.json") == [from_yaml]


def test_an_explicit_id_is_kept() -> None:
    (job,) = parse_jobs(json.dumps({**job_dict(), "id": "web-2"}), fmt="json", source="j.json")
    assert (job.id, job.name) == ("web-2", "web")


def test_a_list_and_a_multi_document_stream_both_give_every_job() -> None:
    listed = parse_jobs(json.dumps([job_dict("a"), job_dict("b")]), fmt="json", source="j.json")
    stream = "\n---\n".join(json.dumps(job_dict(n)) for n in "abc") + "\n---\n"
    streamed = parse_jobs(stream, fmt="yaml", source="j.yaml")
    assert [j.id for j in listed] == ["a", "b"]
    assert [j.id for j in streamed] == ["a", "b", "c"]


def test_a_yaml_date_is_read_as_the_text_written() -> None:
    text = json.dumps(job_dict("x")).replace('"x"', "2024-01-02")
    (job,) = parse_jobs(text, fmt="yaml", source="j.yaml")
    assert job.name == "2024-01-02"


# ------------------------------------------------------------- bad job input names the field


BAD_JOBS = {
    "zero cpu": (
        job_dict(cpu=0),
        "jobs/web.yaml: groups.0.tasks.0.resources.cpu: Input should be greater than 0",
    ),
    "negative cpu": (
        job_dict(cpu=-5),
        "jobs/web.yaml: groups.0.tasks.0.resources.cpu: Input should be greater than",
    ),
    "non-numeric cpu": (
        job_dict(cpu="abc"),
        "jobs/web.yaml: groups.0.tasks.0.resources.cpu: Input should be a valid integer, got 'abc'",
    ),
    "numeric string is not coerced": (
        job_dict(cpu="500"),
        "groups.0.tasks.0.resources.cpu: Input should be a valid integer, got '500'",
    ),
    "unknown field": (
        job_dict(cpuu=500),
        "groups.0.tasks.0.resources.cpuu: unknown field; did you mean 'cpu'?",
    ),
    "name with a slash": (
        job_dict("web/api"),
        "jobs/web.yaml: name: must be 1-63 of A-Z a-z 0-9 . _ - (starting with a letter or "
        "digit), got 'web/api'",
    ),
    "name with a control character": (job_dict("web\x01"), "got 'web\\x01'"),
    "priority out of range": ({**job_dict(), "priority": 0}, "priority: Input should be"),
}


@pytest.mark.parametrize("fmt", ["yaml", "json"])
@pytest.mark.parametrize("case", sorted(BAD_JOBS))
def test_each_bad_field_is_named_by_its_dotted_path(case: str, fmt: str) -> None:
    data, expected = BAD_JOBS[case]
    # JSON is valid YAML, so one text serves both parsers.
    assert expected in jobs_error(json.dumps(data), fmt=fmt)


def with_group(**group: object) -> str:
    job = job_dict()
    groups = job["groups"]
    assert isinstance(groups, list)
    groups[0].update(group)
    return json.dumps(job)


def test_min_above_max_is_named() -> None:
    message = jobs_error(with_group(scaling={"min": 5, "max": 2, "desired": 3}))
    assert message == "jobs/web.yaml: groups.0.scaling: min (5) must be <= max (2)"


def test_desired_outside_bounds_is_named() -> None:
    message = jobs_error(with_group(scaling={"min": 1, "max": 3, "desired": 9}))
    assert "groups.0.scaling: desired (9) must be within [min, max] = [1, 3]" in message


def test_duplicate_group_names_are_named() -> None:
    job = job_dict()
    groups = job["groups"]
    assert isinstance(groups, list)
    job["groups"] = groups * 2
    assert jobs_error(json.dumps(job)) == "jobs/web.yaml: duplicate group names: api"


def test_a_bad_name_is_reported_once_when_the_id_defaults_to_it() -> None:
    message = jobs_error(json.dumps(job_dict("web api")))
    assert message.splitlines() == [
        "jobs/web.yaml: name: must be 1-63 of A-Z a-z 0-9 . _ - (starting with a letter or "
        "digit), got 'web api'"
    ]


def test_a_list_where_a_mapping_is_expected_is_named() -> None:
    message = jobs_error("name: web\ngroups: {name: api}\n")
    assert message == "jobs/web.yaml: groups: Input should be a list, got a mapping"


def test_a_group_without_tasks_is_named() -> None:
    assert "groups.0.tasks: List should have at least 1 item, not 0" in jobs_error(
        with_group(tasks=[])
    )


def test_failed_items_do_not_also_report_their_list_as_too_short() -> None:
    message = jobs_error(with_group(tasks=[{"name": "t", "resources": {"cpu": 0, "memory": 1}}]))
    assert message.splitlines() == [
        "jobs/web.yaml: groups.0.tasks.0.resources.cpu: Input should be greater than 0"
    ]


def test_every_error_is_listed_and_the_list_is_capped() -> None:
    few = jobs_error(json.dumps(job_dict(cpu=-1, memory=-1)))
    assert few.count("\n") == 1 and "resources.cpu" in few and "resources.memory" in few
    many = [job_dict(f"j{i}", cpu=-1) for i in range(MAX_ERROR_LINES + 5)]
    lines = jobs_error(json.dumps(many)).splitlines()
    assert len(lines) == MAX_ERROR_LINES + 1
    assert lines[-1] == "jobs/web.yaml: ... and 5 more"


def test_errors_in_a_list_of_jobs_name_the_job() -> None:
    bad = job_dict("train")
    groups = bad["groups"]
    assert isinstance(groups, list)
    groups[0]["scaling"] = {"min": 2, "max": 1, "desired": 1}
    message = jobs_error(json.dumps([job_dict("web"), bad]), source="web.yaml")
    assert message == "web.yaml: [1] (name=train) groups.0.scaling: min (2) must be <= max (1)"


def test_duplicate_job_ids_are_an_error() -> None:
    message = jobs_error(json.dumps([job_dict("web"), job_dict("api"), job_dict("web")]))
    assert "[2] (name=web) id: duplicate job id 'web' (also [0] (name=web))" in message


def test_duplicate_ids_across_yaml_documents_are_an_error() -> None:
    assert "duplicate job id 'web'" in jobs_error(f"{WEB_YAML}---\n{WEB_YAML}")


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n", "---\n...\n", "null"])
def test_an_empty_file_is_an_error(text: str) -> None:
    assert jobs_error(text) == "jobs/web.yaml: file is empty"


def test_an_empty_list_is_an_error() -> None:
    assert jobs_error("[]") == "jobs/web.yaml: contains no jobs"


@pytest.mark.parametrize("text", ["42", "just text", '"a string"'])
def test_a_top_level_that_is_not_a_mapping_is_an_error(text: str) -> None:
    assert "expected a job (a mapping) or a list of jobs, got" in jobs_error(text)


def test_a_list_item_that_is_not_a_mapping_is_an_error() -> None:
    message = jobs_error(json.dumps([job_dict(), "web"]))
    assert message == "jobs/web.yaml: [1]: expected a job (a mapping), got str 'web'"


def test_a_yaml_syntax_error_gives_its_line() -> None:
    message = jobs_error("name: web\ngroups:\n  - name: [api\n    tasks: {\n")
    assert message.startswith("jobs/web.yaml: line ")
    assert "invalid YAML" in message


def test_a_yaml_indentation_error_gives_its_line() -> None:
    assert jobs_error("name: web\n  priority: 5\n").startswith("jobs/web.yaml: line 2, column")


def test_a_json_syntax_error_gives_its_line() -> None:
    message = jobs_error('{\n  "name": "web",\n  "priority": 5,\n}', fmt="json", source="w.json")
    assert message.startswith("w.json: line 4, column 1: invalid JSON")


def test_a_duplicate_key_is_an_error_not_a_silent_override() -> None:
    message = jobs_error("name: web\npriority: 5\npriority: 50\n")
    assert "line 3" in message and "duplicate key 'priority' (first on line 2)" in message
    json_message = jobs_error('{"name": "a", "name": "b"}', fmt="json")
    assert "duplicate key 'name'" in json_message


def test_yaml_merge_keys_may_override() -> None:
    text = """\
name: web
groups:
  - name: api
    tasks:
      - name: server
        resources: &small {cpu: 500, memory: 256}
      - name: sidecar
        resources: {<<: *small, cpu: 100}
"""
    (job,) = parse_jobs(text, fmt="yaml", source="w.yaml")
    assert job.groups[0].tasks[1].resources.cpu == 100


def test_python_object_tags_are_refused() -> None:
    assert "invalid YAML" in jobs_error("!!python/object/apply:os.system ['true']\n")


def test_yaml_alias_bombs_are_refused() -> None:
    lines = ['a0: ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = "\n".join(line.replace(": [", f": &a{n} [", 1) for n, line in enumerate(lines))
    assert "more than" in jobs_error(text)


def test_a_non_string_key_is_refused() -> None:
    assert jobs_error("name: web\n1: x\n") == "jobs/web.yaml: key 1 must be a string (quote it)"
    nested = jobs_error("name: web\ngroups: [{name: a, yes: 1}]\n")
    assert nested == "jobs/web.yaml: groups.0: key True must be a string (quote it)"


def test_nan_is_not_json() -> None:
    assert "NaN" in jobs_error('{"name": NaN}', fmt="json")


def test_an_unknown_format_names_the_supported_ones() -> None:
    assert "yaml, json, csv" in jobs_error("name: web", fmt="toml")


def test_a_wrong_extension_names_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "web.txt"
    path.write_text(WEB_YAML)
    with pytest.raises(InputError) as info:
        load_jobs(path)
    assert str(info.value).startswith(f"{path}: unsupported file type")
    assert ".yaml, .yml, .json, .csv" in str(info.value)


def test_extensions_are_case_insensitive(tmp_path: Path) -> None:
    path = tmp_path / "WEB.YML"
    path.write_text(WEB_YAML)
    assert load_jobs(path)[0].id == "web"


def test_an_oversize_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)  # sparse: no 16 MiB write
    with pytest.raises(InputError, match="16 MiB limit"):
        load_jobs(path)


def test_oversize_text_is_refused() -> None:
    assert "16 MiB limit" in jobs_error("#" * (MAX_INPUT_BYTES + 1))


def test_a_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_jobs(tmp_path / "nope.yaml")


def test_non_utf8_bytes_are_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "web.yaml"
    path.write_bytes(b"name: w\xffb\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_jobs(path)


def test_a_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "web.json"
    path.write_text("\ufeff" + json.dumps(job_dict()), encoding="utf-8")
    assert load_jobs(path)[0].id == "web"


def test_format_validation_error_renders_dotted_paths() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        Job.model_validate_json(json.dumps(job_dict(cpu=0, bogus=1)))
    assert format_validation_error(info.value, "x.json").splitlines() == [
        "x.json: groups.0.tasks.0.resources.cpu: Input should be greater than 0",
        "x.json: groups.0.tasks.0.resources.bogus: unknown field; expected one of: cpu, gpu, "
        "memory",
    ]


def test_control_characters_in_keys_are_escaped_in_messages() -> None:
    message = jobs_error(json.dumps({**job_dict(), "evil\x1b[2J": 1}))
    assert "\x1b" not in message and "'evil\\x1b[2J': unknown field" in message


# ----------------------------------------------------------------------------- nodes


NODE = {"id": "n1", "cpu": 8000, "memory": 16384}


def test_nodes_load_from_a_list_a_nodes_mapping_or_one_node() -> None:
    listed = parse_nodes(json.dumps([NODE]), fmt="json", source="n.json")
    wrapped = parse_nodes(json.dumps({"nodes": [NODE]}), fmt="yaml", source="n.yaml")
    single = parse_nodes(json.dumps(NODE), fmt="yaml", source="n.yaml")
    assert listed == wrapped == single
    assert listed[0].state is NodeState.READY


def test_the_long_gpu_form_and_state_load() -> None:
    node = {**NODE, "state": "draining", "gpus": [{"id": "g0", "model": "T4", "memory": 15000}]}
    (loaded,) = parse_nodes(json.dumps([node]), fmt="json", source="n.json")
    assert loaded.state is NodeState.DRAINING
    assert [(g.id, g.model, g.memory) for g in loaded.gpus] == [("g0", "T4", 15000)]


@pytest.mark.parametrize("key", ["gpus", "gpu"])
def test_the_short_gpu_form_expands_to_devices(key: str) -> None:
    (node,) = parse_nodes(
        json.dumps([{**NODE, key: {"model": "V100M32", "count": 3}}]), fmt="yaml", source="n"
    )
    assert [(g.id, g.model, g.memory) for g in node.gpus] == [
        (f"gpu{i}", "V100M32", GPU_MEMORY_MIB["V100M32"]) for i in range(3)
    ]


def test_the_short_gpu_form_takes_an_explicit_memory() -> None:
    text = json.dumps([{**NODE, "gpu": {"model": "A100", "count": 2, "memory": 40960}}])
    (node,) = parse_nodes(text, fmt="yaml", source="n")
    assert {g.memory for g in node.gpus} == {40960}


def test_the_short_gpu_form_needs_memory_for_an_unknown_model() -> None:
    message = nodes_error(json.dumps([{**NODE, "gpus": {"model": "A100", "count": 2}}]))
    assert "nodes.yaml: [0] (id=n1) gpus.memory: required for GPU model 'A100'" in message


def test_bad_short_gpu_forms_name_the_field() -> None:
    too_many = nodes_error(json.dumps([{**NODE, "gpu": {"model": "T4", "count": 1000}}]))
    assert "gpu.count: Input should be less than or equal to 64" in too_many
    typo = nodes_error(json.dumps([{**NODE, "gpu": {"model": "T4", "cont": 2}}]))
    assert "gpu.cont: unknown field; did you mean 'count'?" in typo
    both = nodes_error(json.dumps([{**NODE, "gpu": {"model": "T4"}, "gpus": []}]))
    assert "give either gpu or gpus" in both


def test_bad_nodes_name_the_field() -> None:
    message = nodes_error(json.dumps([{**NODE, "cpu": -1, "state": "up"}]))
    assert "[0] (id=n1) cpu: Input should be greater than or equal to 0" in message
    assert "[0] (id=n1) state: Input should be 'ready', 'draining' or 'lost', got 'up'" in message


def test_duplicate_node_ids_are_an_error() -> None:
    assert "duplicate node id 'n1'" in nodes_error(json.dumps([NODE, NODE]))


def test_an_empty_node_list_is_an_error() -> None:
    assert nodes_error("nodes: []") == "nodes.yaml: contains no nodes"


def test_unknown_keys_beside_nodes_are_an_error() -> None:
    assert "unknown key(s) beside 'nodes': cluster" in nodes_error("nodes: []\ncluster: x\n")


# ------------------------------------------------------------------- CSV (the trace)


def test_the_node_csv_loads_in_the_trace_format() -> None:
    nodes = load_nodes(FIXTURES / "trace_nodes.csv")
    by_id = {n.id: n for n in nodes}
    assert [n.id for n in nodes] == [f"openb-node-000{i}" for i in range(6)]
    cpu_only = by_id["openb-node-0000"]
    assert (cpu_only.cpu, cpu_only.memory, cpu_only.gpus, cpu_only.labels) == (
        32000,
        262144,
        (),
        {},
    )
    g2 = by_id["openb-node-0001"]
    assert [g.id for g in g2.gpus] == [f"gpu{i}" for i in range(8)]
    assert {(g.model, g.memory) for g in g2.gpus} == {("G2", GPU_MEMORY_MIB["G2"])}
    assert g2.labels == {"gpu-model": "G2"}
    assert by_id["openb-node-0003"].gpus[0].memory == 32768
    assert by_id["openb-node-0004"].gpus[0].memory == GPU_MEMORY_MIB["A10"]
    assert by_id["openb-node-0005"].gpus[0].memory == 16384  # unknown model: the default


def test_the_pod_csv_loads_as_one_job_per_pod_in_arrival_order() -> None:
    jobs = load_jobs(FIXTURES / "trace_pods.csv")
    # creation_time 0, 100, 100, 200, 300: the tie keeps file order (0001 before 0003).
    assert [j.id for j in jobs] == [f"openb-pod-000{i}" for i in (4, 1, 3, 2, 0)]
    first = jobs[0]
    assert first.name == first.id and first.priority == 50
    (group,) = first.groups
    (task,) = group.tasks
    assert (group.name, task.name) == ("main", "main")
    assert group.scaling == ScalingPolicy(min=1, max=1, desired=1)
    assert (task.resources.cpu, task.resources.memory) == (88000, 327680)
    assert task.resources.gpu.count == 8
    assert task.resources.gpu.models == ("V100M16", "V100M32")  # deduplicated, in order


def test_pod_csv_maps_gpu_milli_to_a_share_and_zero_memory_to_one() -> None:
    by_id = {j.id: j for j in load_jobs(FIXTURES / "trace_pods.csv")}
    shared = by_id["openb-pod-0001"].groups[0].tasks[0].resources
    assert (shared.gpu.count, shared.gpu.milli, shared.gpu.models) == (1, 460, ())
    assert by_id["openb-pod-0001"].groups[0].request().gpu_milli == 460
    assert by_id["openb-pod-0002"].groups[0].tasks[0].resources.gpu.count == 0
    assert by_id["openb-pod-0003"].groups[0].tasks[0].resources.memory == 1


def test_a_pod_csv_without_creation_time_keeps_file_order() -> None:
    jobs = load_jobs(FIXTURES / "trace_pods_multigpu.csv")
    assert [j.id for j in jobs] == ["openb-pod-0000", "openb-pod-0001", "openb-pod-0002"]
    assert [j.groups[0].tasks[0].resources.gpu.count for j in jobs] == [1, 4, 0]


def test_pods_sharing_a_shape_are_still_distinct_jobs() -> None:
    text = "name,cpu_milli,memory_mib,num_gpu\na,1000,1024,1\nb,1000,1024,1\n"
    a, b = parse_jobs(text, fmt="csv", source="p.csv")
    assert (a.id, b.id) == ("a", "b") and a.groups == b.groups


POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_spec,creation_time\n"


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("p,abc,1024,1,,0", "p.csv: line 2, column cpu_milli: expected a whole number, got 'abc'"),
        ("p,-5,1024,1,,0", "p.csv: line 2, column cpu_milli: Input should be greater than"),
        ("p,1000,1.5,1,,0", "line 2, column memory_mib: expected a whole number, got '1.5'"),
        ("p,1000,1024,99,,0", "line 2, column num_gpu: Input should be less than or equal to 64"),
        ("p,1000,1024,1,T4|bad model,0", "line 2, column gpu_spec: must be 1-63 of"),
        ("p/q,1000,1024,1,,0", "line 2, column name: must be 1-63 of"),
        ("p,1000,1024,1,,soon", "line 2, column creation_time: expected seconds"),
        ("p,1000,1024,1", "p.csv: line 2: expected 6 fields, got 4"),
    ],
)
def test_bad_pod_rows_name_the_line_and_column(row: str, expected: str) -> None:
    message = jobs_error(POD_HEADER + row + "\n", fmt="csv", source="p.csv")
    assert expected in message


def test_a_bad_pod_name_is_reported_once() -> None:
    message = jobs_error(POD_HEADER + "a b,1,1,0,,0\n", fmt="csv", source="p.csv")
    assert message.count("\n") == 0 and "column name" in message


def test_every_bad_pod_row_is_reported() -> None:
    text = POD_HEADER + "a,x,1,0,,0\nb,1,1,0,,0\nc,1,y,0,,0\n"
    lines = jobs_error(text, fmt="csv", source="p.csv").splitlines()
    assert [line.split(",")[0] for line in lines] == ["p.csv: line 2", "p.csv: line 4"]


def test_duplicate_pod_names_are_an_error() -> None:
    message = jobs_error(POD_HEADER + "a,1,1,0,,0\na,1,1,0,,0\n", fmt="csv", source="p.csv")
    assert "line 3, column name: duplicate job id 'a' (first on line 2)" in message


def test_a_pod_csv_header_is_checked() -> None:
    missing = jobs_error("name,cpu_milli,memory_mib\na,1,1\n", fmt="csv", source="p.csv")
    assert missing.startswith("p.csv: line 1: missing column(s) num_gpu")
    typo = jobs_error(POD_HEADER.replace("creation_time", "creation_tme"), fmt="csv")
    assert "unknown column(s) creation_tme" in typo


def test_a_node_list_loaded_as_jobs_says_what_it_looks_like() -> None:
    with pytest.raises(InputError, match="this looks like a node list"):
        load_jobs(FIXTURES / "trace_nodes.csv")
    with pytest.raises(InputError, match="this looks like a pod list"):
        load_nodes(FIXTURES / "trace_pods.csv")


def test_a_header_only_csv_has_no_jobs() -> None:
    assert "contains no jobs" in jobs_error(POD_HEADER, fmt="csv")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("n,1000,1024,-1,T4", "line 2, column gpu: must be between 0 and 64, got -1"),
        ("n,1000,1024,100000000,T4", "line 2, column gpu: must be between 0 and 64"),
        ("n,1000,1024,2,", "line 2, column model: required when gpu is 2"),
        ("n,1000,x,0,", "line 2, column memory_mib: expected a whole number, got 'x'"),
        ("n n,1000,1024,0,", "line 2, column sn: must be 1-63 of"),
        ("n,1000,1024,1,T 4", "line 2, column model: must be 1-63 of"),
    ],
)
def test_bad_node_rows_name_the_line_and_column(row: str, expected: str) -> None:
    header = "sn,cpu_milli,memory_mib,gpu,model\n"
    assert expected in nodes_error(header + row + "\n", fmt="csv", source="n.csv")


def test_duplicate_node_rows_are_an_error() -> None:
    text = "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,0,\nn,1,1,0,\n"
    assert "line 3, column sn: duplicate node id 'n'" in nodes_error(text, fmt="csv")


# ----------------------------------------------------------- the real Alibaba trace


def trace_dir() -> Path:
    """The trace beside the repository (../shared/data/...), or FORGE_TRACE_DIR.

    A missing trace fails these tests: a silent skip would let CI pass without ever
    loading the real data. Set FORGE_TRACE_DIR=none to skip them on purpose.
    """
    configured = os.environ.get("FORGE_TRACE_DIR")
    if configured == "none":
        pytest.skip("FORGE_TRACE_DIR=none")
    path = Path(configured) if configured else REPO.parent / "shared/data/alibaba-gpu-v2023"
    if not path.is_dir():
        pytest.fail(f"trace directory {path} is missing (set FORGE_TRACE_DIR, or 'none' to skip)")
    return path


def test_the_real_node_list_loads() -> None:
    nodes = load_nodes(trace_dir() / "openb_node_list_all_node.csv")
    assert len(nodes) == 1523
    assert sum(len(n.gpus) for n in nodes) == 6212
    assert {g.model for n in nodes for g in n.gpus} <= set(GPU_MEMORY_MIB)


@pytest.mark.parametrize(
    ("name", "count"),
    [("default", 8152), ("gpushare100", 8152), ("gpuspec33", 8152), ("multigpu50", 9061)],
)
def test_the_real_pod_lists_load_in_arrival_order(name: str, count: int) -> None:
    started = time.perf_counter()
    jobs = load_jobs(trace_dir() / f"openb_pod_list_{name}.csv")
    elapsed = time.perf_counter() - started
    assert len(jobs) == count
    assert len({j.id for j in jobs}) == count
    with (trace_dir() / f"openb_pod_list_{name}.csv").open(newline="") as f:
        created = {row["name"]: row.get("creation_time") for row in csv.DictReader(f)}
    if name != "multigpu50":  # the only list without creation_time
        times = [int(created[j.id] or "") for j in jobs]
        assert times == sorted(times)
    # Measured ~0.15 s; the bound only catches an accidental quadratic, not noise.
    assert elapsed < 5


def test_the_real_default_pod_list_has_the_documented_shape() -> None:
    jobs = load_jobs(trace_dir() / "openb_pod_list_default.csv")
    gpus = [j.groups[0].tasks[0].resources.gpu.count for j in jobs]
    assert {n: gpus.count(n) for n in set(gpus)} == {0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}
    zero_memory = next(j for j in jobs if j.id == "openb-pod-1523")
    assert zero_memory.groups[0].tasks[0].resources.memory == 1
