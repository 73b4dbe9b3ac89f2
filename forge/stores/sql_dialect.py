"""The SQL both stores speak: one query text for SQLite and PostgreSQL, and the
assignment row layout.

Queries are written with ``?`` placeholders and two markers, ``{text}`` (read a JSON
column as text) and ``{jsonb}`` (write text into a JSON column); ``sql()`` renders
them for a dialect. A leaf of ``forge.stores.sql`` (the reads) and
``forge.stores.sql_writes`` (the writes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from typing import Any, Literal, LiteralString, Protocol

from forge.core.models import Assignment, AssignmentStatus

__all__ = [
    "ASSIGNMENT_COLUMNS",
    "ASSIGNMENT_UPSERT_SET",
    "Dialect",
    "Executor",
    "assignment_from_row",
    "gpu_ids_json",
    "sql",
]

Dialect = Literal["sqlite", "postgres"]


@cache
def sql(template: LiteralString, dialect: Dialect) -> LiteralString:
    """``template`` in ``dialect``: placeholders and JSON casts (see the module doc)."""
    if dialect == "sqlite":
        return template.replace("{text}", "").replace("{jsonb}", "")
    return template.replace("{text}", "::text").replace("{jsonb}", "::jsonb").replace("?", "%s")


class Executor(Protocol):
    """A ``sqlite3.Connection`` or a psycopg cursor inside a write transaction."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...
    def executemany(self, query: Any, params: Any, /) -> Any: ...


#: The columns an assignment is stored in, in ``assignment_from_row`` order.
ASSIGNMENT_COLUMNS = (
    "workload_id, job, grp, ordinal, node, gpu_ids{text}, cpu, memory, status, gpu_milli, version"
)

#: The ``DO UPDATE SET`` of an assignment upsert (every column but the key).
ASSIGNMENT_UPSERT_SET: LiteralString = (
    " ON CONFLICT (cluster, workload_id) DO UPDATE SET job = excluded.job,"
    " grp = excluded.grp, ordinal = excluded.ordinal, node = excluded.node,"
    " gpu_ids = excluded.gpu_ids, cpu = excluded.cpu, memory = excluded.memory,"
    " status = excluded.status, gpu_milli = excluded.gpu_milli, version = excluded.version"
)


def gpu_ids_json(a: Assignment) -> str:
    return json.dumps(list(a.gpu_ids)) if a.gpu_ids else "[]"


def assignment_from_row(row: Sequence[Any]) -> Assignment:
    workload, job, group, ordinal, node, gpu_ids, cpu, memory, status, milli, version = row
    return Assignment(
        workload_id=workload,
        job=job,
        group=group,
        ordinal=ordinal,
        node=node,
        gpu_ids=tuple(json.loads(gpu_ids)),
        cpu=cpu,
        memory=memory,
        status=AssignmentStatus(status),
        gpu_milli=milli,
        version=version,
    )
