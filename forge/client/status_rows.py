"""``forge status`` straight from an SQLite store's rows: no pydantic model built, no
store module imported.

At 1,000 nodes and 10,000 bindings the ordinary read (:mod:`forge.client.reads`)
spends most of its time importing and validating models (``forge.core.models``,
``forge.wire.contract``, the store), far more than reading the rows. A status only
needs the published status document, each node's capacity and state, and each
binding's node, request and GPU ids; this module reads those with ``sqlite3`` and
``json`` and returns objects with the attributes :mod:`forge.render` reads, the
same numbers :func:`forge.wire.views.node_views` computes (``hold`` is
:meth:`forge.core.placement.state.NodeAlloc.hold` over plain data: a binding that no
longer fits its node is not counted as allocated).

:func:`read` answers None when it cannot vouch for the answer (a PostgreSQL or
memory store, a schema it does not know, agents' usage reports to show), and the
caller takes the ordinary path. ``tests/cli/test_status_rows.py`` checks that both
paths print the same text and JSON.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forge.core.limits import GPU_MILLI

if TYPE_CHECKING:
    from forge.wire.queues import QueueView

__all__ = ["SCHEMA_VERSION", "Rows", "read", "sqlite_file"]

#: The store schema these queries are written for (``forge.stores.migrations.
#: LATEST_VERSION``; a test keeps them equal): any other version, older or newer,
#: takes the ordinary path, which migrates or refuses.
SCHEMA_VERSION = 11  # (8 reports.exit_code, 9 latest_usage.gpu, 10 queues, 11 an index: unread)

#: :meth:`forge.wire.contract.Summary.empty`, as JSON (before the first pass).
_EMPTY_SUMMARY: dict[str, Any] = {
    "desired": 0,
    "bound": 0,
    "pending": 0,
    "nodes": 0,
    "jobs": 0,
    "passes": 0,
    "generation": 0,
    "last_pass_at": None,
    "last_pass": "nothing published yet",
}


@dataclass(frozen=True, slots=True)
class Summary:
    desired: int
    bound: int
    pending: int
    nodes: int
    jobs: int
    passes: int
    last_pass: str
    doc: dict[str, Any]

    def model_dump(self) -> dict[str, Any]:
        return dict(self.doc)


@dataclass(frozen=True, slots=True)
class Resource:
    capacity: int
    allocated: int


@dataclass(frozen=True, slots=True)
class Gpus:
    total: int
    allocated: int


@dataclass(frozen=True, slots=True)
class NodeRow:
    id: str
    state: str
    cpu: Resource
    memory: Resource
    gpus: Gpus
    replicas: int


@dataclass(frozen=True, slots=True)
class Pending:
    workload_id: str
    reasons: list[str]


@dataclass(frozen=True, slots=True)
class Binding:
    """A binding as ``forge status`` lists it (the attributes of
    :class:`forge.wire.contract.AssignmentView`)."""

    workload_id: str
    node: str
    gpu_ids: list[str]
    status: str


@dataclass(slots=True)
class Rows:
    """A status as :func:`forge.render.status_text` and ``status_json`` read it (the
    attributes of :class:`forge.wire.contract.StatusView`), and every binding."""

    summary: Summary
    nodes: list[NodeRow]
    pending: list[Pending]
    pending_truncated: int
    notices: list[str]
    preemptions: int
    resets: int = 0
    last_reset: str = ""
    assignments: list[Binding] = field(default_factory=list)
    queues: list[QueueView] = field(default_factory=list)


def sqlite_file(url: str) -> str | None:
    """The database file of a ``sqlite:`` URL, as :func:`forge.stores.sqlite.sqlite_path`
    reads it; None for any other URL (or one it would refuse)."""
    if not url.startswith("sqlite:"):
        return None
    path = url[len("sqlite:") :]
    if path.startswith("//"):
        path = path[2:]
    path = path.split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return path


def read(url: str, cluster: str, *, bindings: bool = False) -> Rows | None:
    """The cluster's status from the SQLite store at ``url``, or None: not an SQLite
    URL, no such file, or rows this reader does not know (take the ordinary path).
    ``bindings``: also every binding (``Rows.assignments``), for ``--json`` and ``-a``."""
    path = sqlite_file(url)
    if path is None or not os.path.isfile(path):
        return None
    try:  # read-only: a reader must never create or migrate the worker's store
        uri = Path(path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=5.0)
    except sqlite3.Error:
        return None
    try:
        return _read(conn, cluster, bindings)
    except (sqlite3.Error, ValueError, KeyError, TypeError):
        return None  # a document of another shape: the ordinary path says what is wrong
    finally:
        conn.close()


def _read(conn: sqlite3.Connection, cluster: str, with_bindings: bool) -> Rows | None:
    (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    if version != SCHEMA_VERSION:
        return None
    if conn.execute("SELECT 1 FROM latest_usage WHERE cluster = ? LIMIT 1", (cluster,)).fetchone():
        return None  # agents report usage: the ordinary path shows it
    row = conn.execute("SELECT doc FROM loop_status WHERE cluster = ?", (cluster,)).fetchone()
    doc: dict[str, Any] = json.loads(row[0]) if row is not None else {}
    specs = conn.execute("SELECT spec FROM nodes WHERE cluster = ?", (cluster,)).fetchall()
    allocs = {a.id: a for a in sorted((_Alloc(json.loads(s)) for (s,) in specs), key=_by_id)}
    # What each node holds, summed by the database. A node whose bindings hold GPUs,
    # or whose sums exceed its capacity (a binding that no longer fits is not
    # counted), is accounted binding by binding, in workload order, as NodeAlloc does.
    counts: dict[str, int] = {}
    one_by_one: set[str] = set()
    for node, n, cpu, memory, gpus in conn.execute(
        "SELECT node, COUNT(*), SUM(cpu), SUM(memory), SUM(gpu_ids <> '[]')"
        " FROM assignments WHERE cluster = ? GROUP BY node",
        (cluster,),
    ):
        counts[node] = n
        a = allocs.get(node)
        if a is None:
            continue
        if gpus or cpu > a.cpu or memory > a.memory:
            one_by_one.add(node)
        else:
            a.cpu_used, a.mem_used = cpu, memory
    found: list[Binding] = []
    if one_by_one or with_bindings:
        query = (
            "SELECT workload_id, node, gpu_ids, status, cpu, memory, gpu_milli"
            " FROM assignments WHERE cluster = ?"
        )
        args: tuple[str, ...] = (cluster,)
        if not with_bindings:  # only the nodes accounted one by one
            query += " AND node IN (SELECT value FROM json_each(?))"
            args += (json.dumps(sorted(one_by_one)),)
        rows = conn.execute(query + " ORDER BY workload_id", args)
        for w, node, g, st, cpu, memory, milli in rows:
            if node in one_by_one or with_bindings:
                gpu_ids = json.loads(g) if g != "[]" else []
                if node in one_by_one:
                    allocs[node].hold(gpu_ids, cpu, memory, milli)
                if with_bindings:
                    found.append(Binding(w, node, gpu_ids, st))
    summary = doc["summary"] if doc else dict(_EMPTY_SUMMARY)
    return Rows(
        summary=Summary(
            desired=summary["desired"],
            bound=summary["bound"],
            pending=summary["pending"],
            nodes=summary["nodes"],
            jobs=summary["jobs"],
            passes=summary["passes"],
            last_pass=summary["last_pass"],
            doc=summary,
        ),
        nodes=[
            NodeRow(
                id=a.id,
                state=a.state,
                cpu=Resource(a.cpu, a.cpu_used),
                memory=Resource(a.memory, a.mem_used),
                gpus=Gpus(len(a.gpu_ids), a.gpus_used),
                replicas=counts.get(a.id, 0),
            )
            for a in allocs.values()
        ],
        pending=[Pending(p["workload_id"], list(p["reasons"])) for p in doc.get("pending", [])],
        pending_truncated=int(doc.get("pending_truncated", 0)),
        notices=list(doc.get("notices", [])),
        preemptions=int(doc.get("preemptions", 0)),
        resets=int(doc.get("resets", 0)),
        last_reset=str(doc.get("last_reset", "")),
        assignments=found,
        queues=_queues(doc.get("queues", [])),
    )


def _queues(raw: list[Any]) -> list[QueueView]:
    """The published queues (a cluster without queues imports no model for them)."""
    if not raw:
        return []
    from forge.wire.queues import QueueView

    return [QueueView.model_validate(v) for v in raw]


def _by_id(a: _Alloc) -> str:
    return a.id


class _Alloc:
    """:class:`forge.core.placement.state.NodeAlloc`'s accounting of held bindings."""

    __slots__ = (
        "cpu",
        "cpu_used",
        "gpu_free",
        "gpu_ids",
        "gpu_left",
        "gpus_used",
        "id",
        "mem_used",
        "memory",
        "state",
    )

    def __init__(self, spec: dict[str, Any]) -> None:
        self.id = str(spec["id"])
        self.state = str(spec.get("state", "ready"))
        self.cpu = int(spec["cpu"])
        self.memory = int(spec["memory"])
        self.gpu_ids = [str(g["id"]) for g in spec.get("gpus", ())]
        self.gpu_free = [True] * len(self.gpu_ids)
        self.gpu_left = [GPU_MILLI] * len(self.gpu_ids)
        self.cpu_used = self.mem_used = self.gpus_used = 0

    def hold(self, gpu_ids: list[str], cpu: int, memory: int, gpu_milli: int) -> None:
        """:meth:`forge.core.placement.state.NodeAlloc.hold`: account a binding, or
        nothing when it does not fit any more."""
        if self.cpu_used + cpu > self.cpu or self.mem_used + memory > self.memory:
            return
        milli = gpu_milli if gpu_milli else GPU_MILLI
        if gpu_milli and len(gpu_ids) != 1:
            return
        idx: list[int] = []
        for gid in gpu_ids:
            i = self.gpu_ids.index(gid) if gid in self.gpu_ids else None
            if i is None or self.gpu_left[i] < milli or i in idx:
                return
            idx.append(i)
        for i in idx:
            if self.gpu_free[i]:
                self.gpu_free[i] = False
                self.gpus_used += 1
            self.gpu_left[i] -= milli
        self.cpu_used += cpu
        self.mem_used += memory
