"""Reading user files (jobs, nodes) into models, with errors a user can act on.

Every problem with a user's file becomes one :class:`InputError` whose message
names the file and each bad field as a dotted path (or a CSV line and column), so
the CLI can print ``str(err)`` and exit 2 without a traceback. All problems of a
file are reported at once (capped), because fixing a file one error per run is
miserable.

Formats are chosen by file extension:

- ``.yaml`` / ``.yml`` / ``.json`` -- jobs: one job mapping, a list of jobs, or (YAML)
  a multi-document stream; nodes: a list of nodes, ``{nodes: [...]}``, or one node.
  Nodes may use a short GPU form, ``gpus: {model: T4, count: 2}`` (or ``gpu:``),
  expanded into devices ``gpu0..gpuN-1``.
- ``.csv`` -- the Alibaba GPU trace (cluster-trace-gpu-v2023): node lists
  (``sn,cpu_milli,memory_mib,gpu,model``) and pod lists
  (``name,cpu_milli,memory_mib,num_gpu,...``), so the scheduler can be driven by a
  real production cluster.

Why YAML/JSON data is validated through pydantic's JSON mode: the models are strict,
and strict *Python* validation rejects a list for a tuple field, while strict *JSON*
validation takes arrays for tuples and strings for enums yet still refuses ``"500"``
for an int. So parsed documents are re-serialised (cheap at job-file sizes) and
validated with ``model_validate_json``; CSV rows are built as tuples in code and
validated with ``model_validate`` directly, which is faster.
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import io
import json
import os
import re
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field

from forge.core import models
from forge.core.models import GPU_MILLI, MAX_GPUS, MAX_MEMORY, NAME_PATTERN, Job, Node, TaskGroup
from forge.errors import InvalidInput

try:  # libyaml's parser is ~10x faster; fall back to pure Python if it is missing.
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

__all__ = [
    "DEFAULT_GPU_MEMORY_MIB",
    "GPU_MEMORY_MIB",
    "MAX_ERROR_LINES",
    "MAX_INPUT_BYTES",
    "MAX_VALUES",
    "SUPPORTED_EXTENSIONS",
    "InputError",
    "format_validation_error",
    "load_jobs",
    "load_nodes",
    "parse_jobs",
    "parse_nodes",
]

#: Files above this size are refused before parsing: a job or node file this big is
#: a mistake (or an attack), and parsing it would take memory and minutes.
MAX_INPUT_BYTES = 16 * 1024 * 1024
#: A parsed document may hold at most this many values (after YAML aliases are
#: expanded), so a "billion laughs" file of nested aliases cannot eat the machine.
MAX_VALUES = 2_000_000
#: An error message lists at most this many problems, then "... and N more".
MAX_ERROR_LINES = 20

_EXTENSIONS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".csv": "csv"}
SUPPORTED_EXTENSIONS: tuple[str, ...] = tuple(_EXTENSIONS)
_FORMATS = ("yaml", "json", "csv")

#: Memory per device (MiB) for the GPU models of the Alibaba trace, which lists only a
#: model name per node. P100/T4/V100M16/V100M32 are the public sizes (the trace's
#: V100M16/V100M32 are the 16 and 32 GiB V100s). A10 is not in the trace README but
#: two nodes of the node list have one: the NVIDIA A10 has 24 GiB. G2 and G3 are
#: anonymised in the trace and their memory is unknown: 24576 and 32768 are
#: assumptions (a mid-size and a large datacentre card), not published facts.
GPU_MEMORY_MIB: dict[str, int] = {
    "P100": 16384,
    "T4": 16384,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G2": 24576,  # assumption: unknown in the trace README
    "G3": 32768,  # assumption: unknown in the trace README
}
#: Used for a trace model missing from GPU_MEMORY_MIB: a trace row must still load
#: (it is real data), and 16 GiB is the most common size in the trace. Human-written
#: node files get no such default: an unknown model there needs an explicit memory.
DEFAULT_GPU_MEMORY_MIB = 16384

_GPU_LABEL = "gpu-model"
_TRACE_PRIORITY = 50

_INT_RE = re.compile(r"-?[0-9]{1,30}")
_SECONDS_RE = re.compile(r"[0-9]{1,30}(\.[0-9]{1,30})?")

_M = TypeVar("_M", bound=BaseModel)


class InputError(InvalidInput):
    """Bad user input. ``str(err)`` is the whole message, one problem per line, each
    starting with the file name; the CLI prints it to stderr as it is and exits 2."""

    prefixed = False


# --------------------------------------------------------------------------- public


def load_jobs(path: str | Path) -> list[Job]:
    """Read a job file (YAML, JSON, or an Alibaba pod-list CSV) into jobs."""
    source, fmt, text = _read(path)
    return parse_jobs(text, fmt=fmt, source=source)


def load_nodes(path: str | Path) -> list[Node]:
    """Read a node file (YAML, JSON, or an Alibaba node-list CSV) into nodes."""
    source, fmt, text = _read(path)
    return parse_nodes(text, fmt=fmt, source=source)


def parse_jobs(text: str, *, fmt: str, source: str) -> list[Job]:
    """Parse job text in ``fmt`` ("yaml" | "json" | "csv"); ``source`` names it in errors.

    Job ids must be unique within the text. CSV jobs come back in arrival order
    (creation_time, then row order) when the trace gives creation times.
    """
    text = _prepare(text, fmt, source)
    if fmt == "csv":
        return _parse_pod_csv(text, source)
    items, many = _job_items(_documents(text, fmt, source), source)
    return _validate_items(items, many, source, Job, "job", "name", "id", lambda d: d)


def parse_nodes(text: str, *, fmt: str, source: str) -> list[Node]:
    """Parse node text in ``fmt`` ("yaml" | "json" | "csv"); ``source`` names it in errors.

    Node ids must be unique within the text.
    """
    text = _prepare(text, fmt, source)
    if fmt == "csv":
        return _parse_node_csv(text, source)
    items, many = _node_items(_documents(text, fmt, source), source)
    return _validate_items(items, many, source, Node, "node", "id", "id", _expand_gpu_shorthand)


def format_validation_error(err: pydantic.ValidationError, source: str) -> str:
    """Render every error of ``err`` as ``"<source>: <dotted.path>: <message>"`` lines.

    At most MAX_ERROR_LINES lines, then ``"... and N more"``. Follow-on errors pydantic
    adds (a list "too short" only because its items failed) are dropped, unknown
    fields get a "did you mean" from the model's field names, and type errors show
    the offending value.
    """
    errors = _Errors(source)
    for loc, msg in _describe(err):
        errors.add("", _dotted(loc), msg)
    return errors.render()


# --------------------------------------------------------------------- reading text


def _read(path: str | Path) -> tuple[str, str, str]:
    """(source name, format, text) of a file, refusing bad extensions and big files."""
    source = os.fspath(path)
    suffix = Path(source).suffix
    fmt = _EXTENSIONS.get(suffix.lower())
    if fmt is None:
        kind = f"extension {suffix!r}" if suffix else "no extension"
        raise InputError(
            f"{source}: unsupported file type ({kind}); "
            f"supported extensions: {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    try:
        with open(source, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_INPUT_BYTES:
                raise InputError(_too_big(source))
            data = f.read(MAX_INPUT_BYTES + 1)  # the file may grow after fstat
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{source}: is a directory, not a file") from None
    except PermissionError:
        raise InputError(f"{source}: permission denied") from None
    except OSError as e:
        raise InputError(f"{source}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(_too_big(source))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{source}: not UTF-8 text (bad byte at offset {e.start})") from None
    return source, fmt, text


def _too_big(source: str) -> str:
    return f"{source}: file is larger than the {MAX_INPUT_BYTES // (1024 * 1024)} MiB limit"


def _prepare(text: str, fmt: str, source: str) -> str:
    """Check the format name and size, drop a byte-order mark, refuse empty text."""
    if fmt not in _FORMATS:
        raise InputError(f"{source}: unsupported format {fmt!r}; supported: {', '.join(_FORMATS)}")
    # len(text) <= bytes <= 4 * len(text): encode only when it can matter.
    if len(text) > MAX_INPUT_BYTES // 4 and len(text.encode("utf-8")) > MAX_INPUT_BYTES:
        raise InputError(_too_big(source))
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise InputError(f"{source}: file is empty")
    return text


# --------------------------------------------------------------------- YAML / JSON


class _UniqueKeyLoader(_SafeLoader):
    """``yaml.safe_load``'s loader (same safe constructors, no Python objects) that
    also refuses duplicate mapping keys: plain PyYAML keeps the last one silently,
    so ``{cpu: 500, cpu: 5000}`` would be a setting that quietly does nothing."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Hashable, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` keys may legitimately be overridden
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    continue  # the base class reports unhashable keys
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first on line {seen[key].line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _documents(text: str, fmt: str, source: str) -> list[object]:
    """The non-empty top-level documents of YAML or JSON text."""
    try:
        docs = _load_yaml(text, source) if fmt == "yaml" else [_load_json(text, source)]
    except RecursionError:
        raise InputError(f"{source}: nested too deeply") from None
    docs = [d for d in docs if d is not None]
    if not docs:
        raise InputError(f"{source}: file is empty")
    for doc in docs:
        _check_tree(doc, source)
    return docs


def _load_yaml(text: str, source: str) -> list[object]:
    # Equivalent to yaml.safe_load_all with the duplicate-key check added.
    loader = _UniqueKeyLoader(text)
    try:
        docs: list[object] = []
        while loader.check_data():  # type: ignore[no-untyped-call]  # untyped in the stubs
            docs.append(loader.get_data())
        return docs
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = e.problem or e.context or "syntax error"
        raise InputError(f"{source}: {where}invalid YAML: {what}") from None
    except yaml.reader.ReaderError as e:
        raise InputError(
            f"{source}: invalid YAML: character {chr(e.character)!r} at offset {e.position} "
            f"is not allowed ({e.reason})"
        ) from None
    except yaml.YAMLError as e:
        raise InputError(f"{source}: invalid YAML: {e}") from None
    finally:
        loader.dispose()


class _JsonProblem(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _JsonProblem(f"duplicate key {key!r} in an object")
        result[key] = value
    return result


def _no_constant(name: str) -> float:
    raise _JsonProblem(f"{name} is not a number JSON allows")


def _load_json(text: str, source: str) -> object:
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{source}: line {e.lineno}, column {e.colno}: invalid JSON: {e.msg}"
        ) from None
    except _JsonProblem as e:
        raise InputError(f"{source}: invalid JSON: {e}") from None


_SCALARS = (str, int, float, bool, type(None), dt.date)  # dt.datetime is a dt.date


def _check_tree(doc: object, source: str) -> None:
    """Refuse values JSON cannot carry and trees that explode through YAML aliases."""
    count = 0
    stack: list[tuple[object, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        value, loc = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise InputError(
                f"{source}: more than {MAX_VALUES:,} values (are YAML aliases nested too deep?)"
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    where = f"{_dotted(loc)}: " if loc else ""
                    raise InputError(f"{source}: {where}key {key!r} must be a string (quote it)")
                stack.append((item, (*loc, key)))
        elif isinstance(value, list):
            stack.extend((item, (*loc, i)) for i, item in enumerate(value))
        elif not isinstance(value, _SCALARS):
            where = f"{_dotted(loc)}: " if loc else ""
            raise InputError(f"{source}: {where}unsupported value of type {type(value).__name__}")


def _json_default(value: object) -> object:
    # YAML reads an unquoted 2024-01-01 as a date; the user wrote the text, so pass it on.
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"unsupported value of type {type(value).__name__}")  # pragma: no cover


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {_short_repr(value)}"


def _job_items(docs: list[object], source: str) -> tuple[list[object], bool]:
    """Jobs of the documents, and whether the file held a collection (one or more)."""
    if len(docs) == 1 and isinstance(docs[0], dict):
        return [docs[0]], False
    items: list[object] = []
    for n, doc in enumerate(docs, 1):
        if isinstance(doc, list):
            items.extend(doc)
        elif isinstance(doc, dict):
            items.append(doc)
        else:
            where = f"document {n}: " if len(docs) > 1 else ""
            raise InputError(
                f"{source}: {where}expected a job (a mapping) or a list of jobs, got {_kind(doc)}"
            )
    if not items:
        raise InputError(f"{source}: contains no jobs")
    return items, True


def _node_items(docs: list[object], source: str) -> tuple[list[object], bool]:
    """Nodes of the documents: a list, ``{nodes: [...]}``, one node, or a YAML stream."""
    items: list[object] = []
    for n, doc in enumerate(docs, 1):
        where = f"document {n}: " if len(docs) > 1 else ""
        if isinstance(doc, dict) and "nodes" in doc:
            extra = sorted(k for k in doc if k != "nodes")
            if extra:
                raise InputError(
                    f"{source}: {where}unknown key(s) beside 'nodes': {', '.join(extra)}"
                )
            doc = doc["nodes"]
            if not isinstance(doc, list):
                raise InputError(f"{source}: {where}nodes: expected a list, got {_kind(doc)}")
        if isinstance(doc, list):
            items.extend(doc)
        elif isinstance(doc, dict):
            items.append(doc)
        else:
            raise InputError(
                f"{source}: {where}expected a list of nodes (or {{nodes: [...]}}), got {_kind(doc)}"
            )
    if not items:
        raise InputError(f"{source}: contains no nodes")
    single = len(docs) == 1 and isinstance(docs[0], dict) and "nodes" not in docs[0]
    return items, not single


def _validate_items(
    items: Sequence[object],
    many: bool,
    source: str,
    model: type[_M],
    what: str,
    label_key: str,
    id_attr: str,
    expand: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[_M]:
    """Validate every item, gathering all problems (and duplicate ids) into one error."""
    errors = _Errors(source)
    results: list[_M] = []
    first: dict[str, str] = {}
    for i, item in enumerate(items):
        label = _item_label(i, item, label_key) if many else ""
        if not isinstance(item, dict):
            errors.add(label, "", f"expected a {what} (a mapping), got {_kind(item)}")
            continue
        try:
            data = expand(item)
            value = model.model_validate_json(json.dumps(data, default=_json_default))
        except _ItemProblems as e:
            for where, msg in e.problems:
                errors.add(label, where, msg)
            continue
        except pydantic.ValidationError as e:
            # An id defaulted from the name repeats every name error: report the name only.
            derived = id_attr != label_key and not item.get(id_attr)
            for loc, msg in _describe(e):
                if not (derived and loc == (id_attr,)):
                    errors.add(label, _dotted(loc), msg)
            continue
        key = str(getattr(value, id_attr))
        if key in first:
            errors.add(label, id_attr, f"duplicate {what} id {key!r} (also {first[key]})")
        else:
            first[key] = label or f"[{i}]"
            results.append(value)
    errors.raise_if_any()
    return results


def _item_label(index: int, item: object, key: str) -> str:
    value = item.get(key) if isinstance(item, dict) else None
    if isinstance(value, str):
        return f"[{index}] ({key}={_show_name(value)})"
    return f"[{index}]"


# ------------------------------------------------------------- node GPU short form


class _GpuShorthand(BaseModel):
    """``gpus: {model: V100M32, count: 8}``: N identical devices, for humans."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    model: Annotated[str, Field(pattern=NAME_PATTERN)]
    count: int = Field(default=1, ge=0, le=MAX_GPUS)
    memory: int | None = Field(default=None, ge=0, le=MAX_MEMORY, description="MiB per GPU")


class _ItemProblems(Exception):
    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__(problems)
        self.problems = problems


def _expand_gpu_shorthand(node: dict[str, Any]) -> dict[str, Any]:
    """Turn ``gpu: {...}`` / ``gpus: {...}`` into the model's list of GpuDevice."""
    if "gpu" in node and "gpus" in node:
        raise _ItemProblems([("gpu", "give either gpu or gpus, not both")])
    key = "gpu" if "gpu" in node else "gpus"
    short = node.get(key)
    if key == "gpus" and not isinstance(short, dict):
        return node  # the long form (or a type error the model reports)
    if not isinstance(short, dict):
        msg = f"expected {{model, count, memory}}, got {_kind(short)}; use gpus: [...] for devices"
        raise _ItemProblems([("gpu", msg)])
    try:
        spec = _GpuShorthand.model_validate_json(json.dumps(short, default=_json_default))
    except pydantic.ValidationError as e:
        raise _ItemProblems([(_dotted(loc), msg) for loc, msg in _describe(e, (key,))]) from None
    memory = spec.memory if spec.memory is not None else GPU_MEMORY_MIB.get(spec.model)
    if memory is None:
        known = ", ".join(sorted(GPU_MEMORY_MIB))
        msg = f"required for GPU model {spec.model!r} (memory is known only for {known})"
        raise _ItemProblems([(f"{key}.memory", msg)])
    expanded = {k: v for k, v in node.items() if k != key}
    expanded["gpus"] = [
        {"id": f"gpu{i}", "model": spec.model, "memory": memory} for i in range(spec.count)
    ]
    return expanded


# --------------------------------------------------------------- CSV (Alibaba trace)

_NODE_REQUIRED = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu")
# Accepted and ignored, except gpu_milli (a GPU share), gpu_spec (allowed models) and
# creation_time (arrival order). Forge has no notion of QoS class or of a pod's
# recorded phase and times; the trace is replayed as demand.
_POD_OPTIONAL = (
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)

# Where a model error points back to a CSV column (longest matching loc prefix wins).
_NODE_COLUMNS: dict[tuple[str | int, ...], str] = {
    ("id",): "sn",
    ("cpu",): "cpu_milli",
    ("memory",): "memory_mib",
    ("gpus",): "gpu",
    ("gpus", 0, "model"): "model",
    ("labels",): "model",
}
_TASK = ("groups", 0, "tasks", 0, "resources")
_POD_COLUMNS: dict[tuple[str | int, ...], str] = {
    ("id",): "name",
    ("name",): "name",
    ("groups", 0, "tasks", 0, "name"): "name",
    (*_TASK, "cpu"): "cpu_milli",
    (*_TASK, "memory"): "memory_mib",
    (*_TASK, "gpu", "count"): "num_gpu",
    (*_TASK, "gpu", "milli"): "gpu_milli",
    (*_TASK, "gpu", "models"): "gpu_spec",
}


class _CsvTable:
    """A CSV file's header (checked) and its rows with their line numbers."""

    def __init__(
        self,
        text: str,
        source: str,
        required: Sequence[str],
        optional: Sequence[str],
        other: tuple[Sequence[str], str],
    ) -> None:
        self.source = source
        self._reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        try:
            header = next(self._reader, None)
        except csv.Error as e:
            raise InputError(f"{source}: line 1: invalid CSV header: {e}") from None
        if not header or not any(h.strip() for h in header):
            raise InputError(f"{source}: line 1: missing CSV header")
        self.header = [h.strip() for h in header]
        known = (*required, *optional)
        problems = []
        missing = [c for c in required if c not in self.header]
        if missing:
            problems.append(f"missing column(s) {', '.join(missing)}")
        unknown = [c for c in self.header if c not in known]
        if unknown:
            problems.append(f"unknown column(s) {', '.join(map(_show_name, unknown))}")
        dupes = sorted({c for c in self.header if self.header.count(c) > 1})
        if dupes:
            problems.append(f"duplicate column(s) {', '.join(dupes)}")
        if problems and set(other[0]) <= set(self.header):
            problems.append(f"this looks like {other[1]}")
        if problems:
            expected = ",".join(required) + (
                f" then any of {','.join(optional)}" if optional else ""
            )
            raise InputError(f"{source}: line 1: {'; '.join(problems)} (expected {expected})")
        self.index = {c: i for i, c in enumerate(self.header)}

    def rows(self, errors: _Errors) -> Iterator[tuple[int, list[str]]]:
        width = len(self.header)
        while True:
            try:
                row = next(self._reader)
            except StopIteration:
                return
            except csv.Error as e:
                errors.add(f"line {self._reader.line_num}", "", f"invalid CSV: {e}")
                errors.raise_if_any()  # the reader cannot resync after a broken quote
                return  # pragma: no cover - raise_if_any raised
            line = self._reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            if len(row) != width:
                errors.add(f"line {line}", "", f"expected {width} fields, got {len(row)}")
                continue
            yield line, row


class _Row:
    """One CSV row: typed cells, with problems recorded against line and column."""

    def __init__(self, table: _CsvTable, line: int, row: list[str], errors: _Errors) -> None:
        self.table, self.line, self.row, self.errors = table, line, row, errors
        self.ok = True

    def has(self, column: str) -> bool:
        return column in self.table.index

    def text(self, column: str) -> str:
        return self.row[self.table.index[column]].strip()

    def integer(self, column: str) -> int:
        text = self.text(column)
        if not _INT_RE.fullmatch(text):
            self.fail(column, f"expected a whole number, got {_short_repr(text)}")
            return 0
        return int(text)

    def seconds(self, column: str) -> float:
        text = self.text(column)
        if not _SECONDS_RE.fullmatch(text):
            self.fail(column, f"expected seconds (a number >= 0), got {_short_repr(text)}")
            return 0.0
        return float(text)

    def fail(self, column: str | None, msg: str) -> None:
        where = f"line {self.line}, column {column}" if column else f"line {self.line}"
        self.errors.add(where, "", msg)
        self.ok = False

    def model_errors(
        self,
        err: pydantic.ValidationError,
        columns: dict[tuple[str | int, ...], str],
        prefix: tuple[str | int, ...] = (),
    ) -> None:
        seen = set()
        for loc, msg in _describe(err, prefix):
            key = tuple(0 if isinstance(p, int) else p for p in loc)  # any row of a list
            column = next(
                (columns[key[:n]] for n in range(len(key), 0, -1) if key[:n] in columns), None
            )
            text = msg if column else f"{_dotted(loc) or '(row)'}: {msg}"
            if (column, text) not in seen:  # id and name are one column: say it once
                seen.add((column, text))
                self.fail(column, text)


def _parse_node_csv(text: str, source: str) -> list[Node]:
    """Alibaba node list: one Node per row, ``gpu`` devices of one ``model``."""
    table = _CsvTable(text, source, _NODE_REQUIRED, (), (_POD_REQUIRED, "a pod list (jobs)"))
    errors = _Errors(source)
    nodes: list[Node] = []
    first: dict[str, int] = {}
    for line, cells in table.rows(errors):
        row = _Row(table, line, cells, errors)
        sn, model = row.text("sn"), row.text("model")
        cpu, memory, count = row.integer("cpu_milli"), row.integer("memory_mib"), row.integer("gpu")
        if not 0 <= count <= MAX_GPUS:  # checked before building `count` devices
            row.fail("gpu", f"must be between 0 and {MAX_GPUS}, got {count}")
        elif count and not model:
            row.fail("model", f"required when gpu is {count}")
        if not row.ok:
            continue
        # The trace gives only a model name per node, so device memory comes from the
        # table (or the default for a model it does not know; the row is real data).
        gpu_memory = GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
        data = {
            "id": sn,
            "cpu": cpu,
            "memory": memory,
            "gpus": tuple(
                {"id": f"gpu{i}", "model": model, "memory": gpu_memory} for i in range(count)
            ),
            "labels": {_GPU_LABEL: model} if count else {},
        }
        try:
            node = Node.model_validate(data)
        except pydantic.ValidationError as e:
            row.model_errors(e, _NODE_COLUMNS)
            continue
        if node.id in first:
            row.fail("sn", f"duplicate node id {node.id!r} (first on line {first[node.id]})")
            continue
        first[node.id] = line
        nodes.append(node)
    errors.raise_if_any()
    if not nodes:
        raise InputError(f"{source}: contains no nodes")
    return nodes


def _parse_pod_csv(text: str, source: str) -> list[Job]:
    """Alibaba pod list: each pod one Job with one group "main" of one task "main"."""
    table = _CsvTable(text, source, _POD_REQUIRED, _POD_OPTIONAL, (_NODE_REQUIRED, "a node list"))
    errors = _Errors(source)
    timed = "creation_time" in table.index
    keyed: list[tuple[float, int, Job]] = []
    first: dict[str, int] = {}
    # Pods repeat a few hundred request shapes (112 in the 8,152-pod default list).
    # Groups are immutable, so one validated group per shape is shared by its jobs:
    # validation is most of the load time, and this cuts it several-fold.
    shapes: dict[tuple[int, int, int, int, tuple[str, ...]], TaskGroup] = {}
    for line, cells in table.rows(errors):
        row = _Row(table, line, cells, errors)
        name = row.text("name")
        cpu, memory, gpus = (
            row.integer("cpu_milli"),
            row.integer("memory_mib"),
            row.integer("num_gpu"),
        )
        created = row.seconds("creation_time") if timed else 0.0
        milli = row.integer("gpu_milli") if row.has("gpu_milli") and row.text("gpu_milli") else 0
        if not row.ok:
            continue
        # The models require cpu > 0 and memory > 0, but the real trace has a pod with
        # memory_mib 0 (openb-pod-1523 in the default, gpuspec33 and multigpu50 lists).
        # It is real demand, so it loads as the smallest request: 1 millicore / 1 MiB.
        cpu, memory = cpu or 1, memory or 1
        # gpu_spec lists the allowed models, '|'-separated; the trace repeats some
        # ("V100M16|V100M32|V100M32"), so keep each once, in order. Empty = any model.
        spec = row.text("gpu_spec") if row.has("gpu_spec") else ""
        allowed = tuple(dict.fromkeys(m for m in (p.strip() for p in spec.split("|")) if m))
        # A one-GPU pod with gpu_milli below 1000 asks that share of one device
        # (several share it); otherwise num_gpu whole devices (the trace's gpu_milli
        # is 1000 for them, or above it: the FGD paper clips those to a device).
        share = milli if gpus == 1 and 0 < milli < GPU_MILLI else 0
        shape = (cpu, memory, gpus, share, allowed)
        group = shapes.get(shape)
        if group is None:
            try:
                group = TaskGroup.model_validate(_pod_group(cpu, memory, gpus, allowed, share))
            except pydantic.ValidationError as e:
                row.model_errors(e, _POD_COLUMNS, prefix=("groups", 0))
                continue
            shapes[shape] = group
        try:
            job = Job.model_validate(
                # id defaults to name (so a bad name is reported once, not as id too)
                {"name": name, "priority": _TRACE_PRIORITY, "groups": (group,)}
            )
        except pydantic.ValidationError as e:
            row.model_errors(e, _POD_COLUMNS)
            continue
        if job.id in first:
            row.fail("name", f"duplicate job id {job.id!r} (first on line {first[job.id]})")
            continue
        first[job.id] = line
        keyed.append((created, line, job))
    errors.raise_if_any()
    if not keyed:
        raise InputError(f"{source}: contains no jobs")
    if timed:  # arrival order; ties keep file order (line numbers grow with rows)
        keyed.sort(key=lambda k: (k[0], k[1]))
    return [job for _, _, job in keyed]


def _pod_group(
    cpu: int, memory: int, gpus: int, allowed: tuple[str, ...], milli: int = 0
) -> dict[str, Any]:
    gpu: dict[str, Any] = {"count": gpus, "models": allowed}
    if milli:
        gpu["milli"] = milli
    resources = {"cpu": cpu, "memory": memory, "gpu": gpu}
    return {
        "name": "main",
        "scaling": {"min": 1, "max": 1, "desired": 1},
        "tasks": ({"name": "main", "resources": resources},),
    }


# ------------------------------------------------------------------ error messages


class _Errors:
    """Problem lines of one file, capped at MAX_ERROR_LINES when rendered."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []
        self.count = 0

    def add(self, item: str, where: str, msg: str) -> None:
        self.count += 1
        if len(self.lines) < MAX_ERROR_LINES:
            subject = " ".join(p for p in (item, where) if p)
            self.lines.append(
                f"{self.source}: {subject}: {msg}" if subject else f"{self.source}: {msg}"
            )

    def render(self) -> str:
        more = self.count - len(self.lines)
        tail = [f"{self.source}: ... and {more} more"] if more > 0 else []
        return "\n".join(self.lines + tail)

    def raise_if_any(self) -> None:
        if self.count:
            raise InputError(self.render())


_NAME_RULE = "must be 1-63 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"
# Errors whose message is clearer with the offending value appended.
_SHOW_INPUT = {"enum", "literal_error", "string_pattern_mismatch"}


def _describe(
    err: pydantic.ValidationError, prefix: tuple[str | int, ...] = ()
) -> list[tuple[tuple[str | int, ...], str]]:
    """(prefix + loc, message) for each error worth showing, messages made actionable."""
    root = _model_named(err.title)
    out: list[tuple[tuple[str | int, ...], str]] = []
    for e in err.errors(include_url=False):
        kind, loc, msg, value = e["type"], tuple(e["loc"]), e["msg"], e.get("input")
        ctx = e.get("ctx") or {}
        if (
            kind == "too_short"
            and isinstance(value, list | tuple)
            and len(value) >= int(ctx.get("min_length", 0))
        ):
            continue  # pydantic's echo of failed items: the list was long enough
        if kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif kind in ("too_short", "too_long"):  # users write lists; they see no tuples
            msg = msg.replace("Tuple should", "List should").replace(" after validation", "")
        elif kind in ("tuple_type", "list_type"):  # "array" in JSON mode, "tuple" in Python
            msg = f"Input should be a list, got {_got(value)}"
        elif kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
            msg = f"{_NAME_RULE}, got {_got(value)}"
        elif kind == "extra_forbidden":
            msg = _unknown_field(root, loc)
        elif kind.endswith(("_type", "_parsing")) or kind in _SHOW_INPUT:
            msg = f"{msg}, got {_got(value)}"
        out.append(((*prefix, *loc), msg))
    return out


def _got(value: object) -> str:
    return _kind(value) if isinstance(value, dict | list) else _short_repr(value)


def _model_named(title: str) -> type[BaseModel] | None:
    found = getattr(models, title, None) or (_GpuShorthand if title == "_GpuShorthand" else None)
    return found if isinstance(found, type) and issubclass(found, BaseModel) else None


def _unknown_field(root: type[BaseModel] | None, loc: tuple[str | int, ...]) -> str:
    """ "unknown field", with the closest real field name of that model when one exists."""
    model = root
    for part in loc[:-1]:
        if model is None:
            break
        if isinstance(part, str):
            field = model.model_fields.get(part)
            model = _model_in(field.annotation) if field is not None else None
    if model is None or not loc or not isinstance(loc[-1], str):
        return "unknown field"
    fields = sorted(model.model_fields)
    close = difflib.get_close_matches(loc[-1], fields, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    return f"unknown field; expected one of: {', '.join(fields)}"


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The model inside an annotation such as ``tuple[TaskGroup, ...]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _dotted(loc: Sequence[str | int]) -> str:
    return ".".join(_show_name(p) if isinstance(p, str) else str(p) for p in loc)


def _show_name(text: str) -> str:
    """A user-supplied name as is when harmless, else quoted (no raw control chars)."""
    if text and len(text) <= 64 and text.isprintable() and not any(c.isspace() for c in text):
        return text
    return _short_repr(text)


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
