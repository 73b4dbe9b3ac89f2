"""What the SQLite and PostgreSQL stores share: the queries, the row mapping, and
every method whose SQL is the same in both dialects.

The two backends differ in how they connect, lock and batch (a write lock per file
against row locks and ``unnest``), not in what they store, so the reads, the row
layout and the simple upserts live here once and a fix lands in both. Queries are
written with ``?`` placeholders and two markers, ``{text}`` (read a JSON column
as text) and ``{jsonb}`` (write text into a JSON column); ``sql()`` renders them
for a dialect. A backend supplies ``_one`` / ``_all`` (one autocommit read) and
calls the ``*_rows`` helpers inside its own write transactions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any, Literal, LiteralString, Protocol

from forge.core.models import Assignment, AssignmentStatus, Job, Node, NodeState, TaskGroup
from forge.core.versions import describe_change
from forge.stores.base import (
    Delta,
    Fence,
    GroupVersion,
    JobChange,
    JobPage,
    ReplicaState,
    TaskReport,
    forgets_state,
    mean_usage,
    next_state,
)

__all__ = [
    "ASSIGNMENT_UPSERT_SET",
    "Dialect",
    "SqlReads",
    "assignment_from_row",
    "forget_states",
    "gpu_ids_json",
    "sql",
    "write_jobs",
    "write_nodes",
    "write_reports",
    "write_status",
]

Dialect = Literal["sqlite", "postgres"]


@cache
def sql(template: LiteralString, dialect: Dialect) -> LiteralString:
    """``template`` in ``dialect``: placeholders and JSON casts (see the module doc)."""
    if dialect == "sqlite":
        return template.replace("{text}", "").replace("{jsonb}", "")
    return template.replace("{text}", "::text").replace("{jsonb}", "::jsonb").replace("?", "%s")


class _Executor(Protocol):
    """A ``sqlite3.Connection`` or a psycopg cursor inside a write transaction."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...
    def executemany(self, query: Any, params: Any, /) -> Any: ...


#: The columns an assignment is stored in, in ``assignment_from_row`` order.
_ASSIGNMENT_COLUMNS = (
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


def _job(spec: str | None) -> Job | None:
    return Job.model_validate_json(spec) if spec is not None else None


class SqlReads:
    """The read side of the ``Store`` protocol, the same query in both dialects.

    Reads run outside any write transaction: SQLite's WAL and PostgreSQL's MVCC
    both give them a consistent snapshot per statement without blocking writers.
    """

    DIALECT: Dialect

    def _one(self, query: LiteralString, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        raise NotImplementedError

    def _all(self, query: LiteralString, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _q(self, template: LiteralString) -> LiteralString:
        return sql(template, self.DIALECT)

    # -- jobs ----------------------------------------------------------------------
    def get_job(self, cluster: str, job_id: str) -> Job | None:
        row = self._one(
            self._q("SELECT spec{text} FROM jobs WHERE cluster = ? AND job_id = ?"),
            (cluster, job_id),
        )
        return _job(row[0]) if row is not None else None

    def list_jobs(self, cluster: str) -> list[Job]:
        rows = self._all(
            self._q(
                "SELECT spec{text} FROM jobs WHERE cluster = ? AND spec IS NOT NULL ORDER BY job_id"
            ),
            (cluster,),
        )
        return [Job.model_validate_json(spec) for (spec,) in rows]

    def job_changes(self, cluster: str, since: int, limit: int = 500) -> JobPage:
        limit = max(limit, 0)
        rows = self._all(
            self._q(
                "SELECT revision, job_id, spec{text} FROM jobs WHERE cluster = ?"
                " AND revision > ? ORDER BY revision LIMIT ?"
            ),
            (cluster, since, limit + 1),
        )
        changes = [
            JobChange(revision=rev, job_id=job_id, job=_job(spec))
            for rev, job_id, spec in rows[:limit]
        ]
        return JobPage(
            changes=changes,
            revision=changes[-1].revision if changes else since,
            more=len(rows) > limit,
        )

    def revision(self, cluster: str) -> int:
        return self._counter(cluster, "revision")

    def _counter(self, cluster: str, column: Literal["revision", "report_seq"]) -> int:
        query = (
            "SELECT revision FROM clusters WHERE cluster = ?"
            if column == "revision"
            else "SELECT report_seq FROM clusters WHERE cluster = ?"
        )
        row = self._one(self._q(query), (cluster,))
        return int(row[0]) if row is not None else 0

    def group_versions(self, cluster: str, job_id: str) -> list[GroupVersion]:
        rows = self._all(
            self._q(
                "SELECT grp, number, version, revision, changed, spec{text} FROM group_versions"
                " WHERE cluster = ? AND job_id = ? ORDER BY grp, number"
            ),
            (cluster, job_id),
        )
        return [
            GroupVersion(
                job_id=job_id,
                group=g,
                number=n,
                version=v,
                revision=r,
                changed=ch,
                spec=TaskGroup.model_validate_json(spec),
            )
            for g, n, v, r, ch, spec in rows
        ]

    # -- actual state --------------------------------------------------------------
    def loop_status(self, cluster: str) -> str | None:
        row = self._one(self._q("SELECT doc FROM loop_status WHERE cluster = ?"), (cluster,))
        return str(row[0]) if row is not None else None

    def fence(self, cluster: str) -> Fence | None:
        row = self._one(
            self._q("SELECT generation, pass_no FROM fences WHERE cluster = ?"), (cluster,)
        )
        # PostgreSQL inserts the fence row before it first compares (to lock it)
        if row is None or row[0] is None:
            return None
        return Fence(int(row[0]), int(row[1]))

    def assignments(self, cluster: str, after: str = "", limit: int = 5000) -> list[Assignment]:
        rows = self._all(
            self._q(
                "SELECT " + _ASSIGNMENT_COLUMNS + " FROM assignments"
                " WHERE cluster = ? AND workload_id > ? ORDER BY workload_id LIMIT ?"
            ),
            (cluster, after, max(limit, 0)),
        )
        return [assignment_from_row(row) for row in rows]

    def nodes(self, cluster: str, after: str = "", limit: int = 5000) -> list[Node]:
        rows = self._all(
            self._q(
                "SELECT spec{text} FROM nodes WHERE cluster = ? AND id > ? ORDER BY id LIMIT ?"
            ),
            (cluster, after, max(limit, 0)),
        )
        return [Node.model_validate_json(spec) for (spec,) in rows]

    # -- liveness and task status --------------------------------------------------
    def expired_nodes(self, cluster: str, before: float, limit: int = 1000) -> list[str]:
        rows = self._all(
            self._q(
                "SELECT n.id FROM nodes n JOIN heartbeats h"
                " ON h.cluster = n.cluster AND h.node_id = n.id"
                " WHERE n.cluster = ? AND n.state <> ? AND h.at < ?"
                " ORDER BY n.id LIMIT ?"
            ),
            (cluster, NodeState.LOST.value, before, max(limit, 0)),
        )
        return [node_id for (node_id,) in rows]

    def reports_since(self, cluster: str, seq: int, limit: int = 1000) -> list[TaskReport]:
        rows = self._all(
            self._q(
                "SELECT seq, workload_id, status, cpu, memory, at, message, node, healthy"
                " FROM reports"
                " WHERE cluster = ? AND seq > ? ORDER BY seq LIMIT ?"
            ),
            (cluster, seq, max(limit, 0)),
        )
        return [
            TaskReport(
                seq=s,
                workload_id=w,
                status=st,
                cpu=c,
                memory=m,
                at=at,
                message=msg,
                node=n,
                healthy=None if h is None else bool(h),
            )
            for s, w, st, c, m, at, msg, n, h in rows
        ]

    def group_usage(self, cluster: str, since: float) -> dict[str, tuple[float, float]]:
        rows = self._all(
            self._q(
                "SELECT workload_id, cpu, memory FROM latest_usage WHERE cluster = ? AND at >= ?"
            ),
            (cluster, since),
        )
        return mean_usage(rows)

    def latest_usage(self, cluster: str, after: str = "", limit: int = 5000) -> list[TaskReport]:
        rows = self._all(
            self._q(
                "SELECT seq, workload_id, status, cpu, memory, at, message, node"
                " FROM latest_usage WHERE cluster = ? AND workload_id > ?"
                " ORDER BY workload_id LIMIT ?"
            ),
            (cluster, after, max(limit, 0)),
        )
        return [
            TaskReport(seq=s, workload_id=w, status=st, cpu=c, memory=m, at=at, message=msg, node=n)
            for s, w, st, c, m, at, msg, n in rows
        ]


# -- writes shared inside the backends' transactions -------------------------------------


def write_jobs(
    db: _Executor, dialect: Dialect, cluster: str, jobs: Sequence[Job], first: int
) -> None:
    """Upsert ``jobs`` with revisions ``first``, ``first + 1``, ... (already reserved)."""
    db.executemany(
        sql(
            "INSERT INTO jobs (cluster, job_id, revision, spec) VALUES (?, ?, ?, ?{jsonb})"
            " ON CONFLICT (cluster, job_id)"
            " DO UPDATE SET revision = excluded.revision, spec = excluded.spec",
            dialect,
        ),
        [(cluster, j.id, first + i, j.model_dump_json()) for i, j in enumerate(jobs)],
    )
    write_versions(db, dialect, cluster, jobs, first)


def write_versions(
    db: _Executor, dialect: Dialect, cluster: str, jobs: Sequence[Job], first: int
) -> None:
    """Number each group's new task-spec version (see ``Store.group_versions``)."""
    rows = []
    latest: dict[tuple[str, str], tuple[int, str, str]] = {}
    for i, job in enumerate(jobs):
        for g in job.groups:
            key = (job.id, g.name)
            last = latest.get(key)
            if last is None:
                found = db.execute(
                    sql(
                        "SELECT number, version, spec{text} FROM group_versions WHERE cluster = ?"
                        " AND job_id = ? AND grp = ? ORDER BY number DESC LIMIT 1",
                        dialect,
                    ),
                    (cluster, job.id, g.name),
                ).fetchone()
                last = (int(found[0]), str(found[1]), str(found[2])) if found else (0, "", "")
            if last[1] == g.version:
                continue
            old = TaskGroup.model_validate_json(last[2]) if last[2] else None
            spec = g.model_dump_json()
            rows.append(
                (
                    cluster,
                    job.id,
                    g.name,
                    last[0] + 1,
                    g.version,
                    first + i,
                    describe_change(old, g),
                    spec,
                )
            )
            latest[key] = (last[0] + 1, g.version, spec)
    if rows:
        db.executemany(
            sql(
                "INSERT INTO group_versions (cluster, job_id, grp, number, version, revision,"
                " changed, spec) VALUES (?, ?, ?, ?, ?, ?, ?, ?{jsonb})",
                dialect,
            ),
            rows,
        )


def write_nodes(db: _Executor, dialect: Dialect, cluster: str, nodes: Iterable[Node]) -> None:
    db.executemany(
        sql(
            "INSERT INTO nodes (cluster, id, spec, state) VALUES (?, ?, ?{jsonb}, ?)"
            " ON CONFLICT (cluster, id)"
            " DO UPDATE SET spec = excluded.spec, state = excluded.state",
            dialect,
        ),
        [(cluster, n.id, n.model_dump_json(), n.state.value) for n in nodes],
    )


def write_status(db: _Executor, dialect: Dialect, cluster: str, doc: str) -> None:
    db.execute(
        sql(
            "INSERT INTO loop_status (cluster, doc) VALUES (?, ?)"
            " ON CONFLICT (cluster) DO UPDATE SET doc = excluded.doc",
            dialect,
        ),
        (cluster, doc),
    )


def _states(
    db: _Executor, dialect: Dialect, cluster: str, workloads: list[str]
) -> dict[str, ReplicaState]:
    """The stored ``ReplicaState`` of ``workloads`` (absent: none known), one query."""
    if dialect == "sqlite":
        query: LiteralString = (
            "SELECT workload_id, status, node, healthy FROM report_state WHERE cluster = ?"
            " AND workload_id IN (SELECT value FROM json_each(?))"
        )
        param: object = json.dumps(workloads)
    else:
        query = (
            "SELECT workload_id, status, node, healthy FROM report_state WHERE cluster = %s"
            " AND workload_id = ANY(%s)"
        )
        param = workloads
    rows = db.execute(query, (cluster, param)).fetchall()
    return {w: (st, n, None if h is None else bool(h)) for w, st, n, h in rows}


def write_reports(
    db: _Executor,
    dialect: Dialect,
    cluster: str,
    reports: Sequence[TaskReport],
    reserve: Callable[[int], int],
) -> int:
    """Record ``reports`` (``Store.report``) inside the caller's write transaction.

    Each report is compared with its replica's stored state (``next_state``); only
    the decisions are inserted, numbered from what ``reserve(n)`` returns (it
    advances the cluster's report counter by ``n`` and returns the last number; by
    0: the current one). Every report carrying usage is folded into
    ``latest_usage``. Returns the reports sequence after the batch."""
    states = _states(db, dialect, cluster, sorted({r.workload_id for r in reports}))
    changed: dict[str, ReplicaState] = {}
    decided: list[int] = []
    for i, r in enumerate(reports):
        state = next_state(states.get(r.workload_id), r)
        if state is not None:
            states[r.workload_id] = changed[r.workload_id] = state
            decided.append(i)
    last = reserve(len(decided))
    seqs = {i: seq for seq, i in enumerate(decided, last - len(decided) + 1)}
    if decided:
        db.executemany(
            sql(
                "INSERT INTO reports (cluster, seq, workload_id, status, cpu, memory, at,"
                " message, node, healthy) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                dialect,
            ),
            [
                (
                    cluster,
                    seqs[i],
                    r.workload_id,
                    r.status,
                    r.cpu,
                    r.memory,
                    r.at,
                    r.message,
                    r.node,
                    r.healthy,
                )
                for i, r in ((i, reports[i]) for i in decided)
            ],
        )
        db.executemany(
            sql(
                "INSERT INTO report_state (cluster, workload_id, status, node, healthy)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (cluster, workload_id) DO UPDATE SET"
                " status = excluded.status, node = excluded.node, healthy = excluded.healthy",
                dialect,
            ),
            [(cluster, w, st, n, h) for w, (st, n, h) in sorted(changed.items())],
        )
    usage = [
        (cluster, r.workload_id, seqs.get(i, 0), r.cpu, r.memory, r.at, r.status, r.message, r.node)
        for i, r in enumerate(reports)
        if r.cpu is not None or r.memory is not None
    ]
    if usage:
        # Only reports that carry usage feed group_usage; ">=" lets the later of two
        # reports with the same timestamp win (rows go in order).
        db.executemany(
            sql(
                "INSERT INTO latest_usage (cluster, workload_id, seq, cpu, memory, at,"
                " status, message, node) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (cluster, workload_id)"
                " DO UPDATE SET seq = excluded.seq, cpu = excluded.cpu,"
                " memory = excluded.memory, at = excluded.at, status = excluded.status,"
                " message = excluded.message, node = excluded.node"
                " WHERE excluded.at >= latest_usage.at",
                dialect,
            ),
            usage,
        )
    return last


def forget_states(db: _Executor, dialect: Dialect, cluster: str, delta: Delta) -> None:
    """Inside ``apply_delta``: drop the state of the replicas ``delta`` releases or
    binds pending (``forgets_state``), so their next report is a decision."""
    gone = forgets_state(delta)
    if gone:
        db.executemany(
            sql("DELETE FROM report_state WHERE cluster = ? AND workload_id = ?", dialect),
            [(cluster, w) for w in gone],
        )
