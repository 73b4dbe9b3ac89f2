"""The Alibaba GPU trace (cluster-trace-gpu-v2023) as job and node files: node
lists (``sn,cpu_milli,memory_mib,gpu,model``) and pod lists
(``name,cpu_milli,memory_mib,num_gpu,...``), so the scheduler can be driven by a
real production cluster. Rows are built as tuples in code and validated with
``model_validate`` directly (faster than the documents' JSON round trip)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pydantic

from forge.core.models import GPU_MILLI, MAX_GPUS, Job, Node, TaskGroup
from forge.loaders.errors import (
    InputError,
    _describe,
    _dotted,
    _Errors,
    _short_repr,
    _show_name,
)

__all__ = ["DEFAULT_GPU_MEMORY_MIB", "GPU_MEMORY_MIB", "parse_node_csv", "parse_pod_csv"]


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


def parse_node_csv(text: str, source: str) -> list[Node]:
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


def parse_pod_csv(text: str, source: str) -> list[Job]:
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
