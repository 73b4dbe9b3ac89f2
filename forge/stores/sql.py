"""What the SQLite and PostgreSQL stores share: the queries, the row mapping, and
every method whose SQL is the same in both dialects.

The two backends differ in how they connect, lock and batch (a write lock per file
against row locks and ``unnest``), not in what they store, so the reads, the row
layout and the simple upserts live here once and a fix lands in both. Queries are
written with ``?`` placeholders and two markers, ``{text}`` (read a JSON column
as text) and ``{jsonb}`` (write text into a JSON column); ``sql()`` renders them
for a dialect. A backend supplies ``_one`` / ``_all`` (one autocommit read) and
calls the ``write_*`` helpers inside its own write transactions.

Three modules, this one the surface: ``forge.stores.sql_dialect`` (``sql()``, the
assignment row), ``forge.stores.sql_writes`` (the writes, re-exported here) and the
reads below (``SqlReads``).
"""

from __future__ import annotations

import json
from typing import Any, Literal, LiteralString

from forge.core.models import Assignment, Job, Node, NodeState, TaskGroup
from forge.core.quota import QueueSpec
from forge.stores.base import (
    AssignmentRow,
    Fence,
    GroupUsage,
    GroupVersion,
    JobChange,
    JobPage,
    SpecPage,
    TaskReport,
    mean_usage,
)
from forge.stores.sql_dialect import (
    ASSIGNMENT_COLUMNS,
    ASSIGNMENT_UPSERT_SET,
    Dialect,
    assignment_from_row,
    gpu_ids_json,
    sql,
)
from forge.stores.sql_writes import (
    forget_states,
    write_completions,
    write_jobs,
    write_nodes,
    write_queues,
    write_reports,
    write_status,
    write_versions,
)

__all__ = [
    "ASSIGNMENT_UPSERT_SET",
    "Dialect",
    "SqlReads",
    "assignment_from_row",
    "forget_states",
    "gpu_ids_json",
    "sql",
    "write_completions",
    "write_jobs",
    "write_nodes",
    "write_queues",
    "write_reports",
    "write_status",
    "write_versions",
]


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
        page = self.job_spec_changes(cluster, since, limit)
        changes = [
            JobChange(revision=rev, job_id=job_id, job=_job(spec))
            for rev, job_id, spec in page.rows
        ]
        return JobPage(changes=changes, revision=page.revision, more=page.more)

    def job_spec_changes(self, cluster: str, since: int, limit: int = 500) -> SpecPage:
        limit = max(limit, 0)
        rows = self._all(
            self._q(
                "SELECT revision, job_id, spec{text} FROM jobs WHERE cluster = ?"
                " AND revision > ? ORDER BY revision LIMIT ?"
            ),
            (cluster, since, limit + 1),
        )
        page = [(int(rev), str(job_id), spec) for rev, job_id, spec in rows[:limit]]
        return SpecPage(page, page[-1][0] if page else since, len(rows) > limit)

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

    def completions(self, cluster: str, after: str = "", limit: int = 5000) -> list[str]:
        rows = self._all(
            self._q(
                "SELECT workload_id FROM completions WHERE cluster = ? AND workload_id > ?"
                " ORDER BY workload_id LIMIT ?"
            ),
            (cluster, after, limit),
        )
        return [str(r[0]) for r in rows]

    def queues(self, cluster: str) -> list[QueueSpec]:
        rows = self._all(
            self._q("SELECT spec FROM queues WHERE cluster = ? ORDER BY name"), (cluster,)
        )
        return [QueueSpec.model_validate_json(r[0]) for r in rows]

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
                "SELECT " + ASSIGNMENT_COLUMNS + " FROM assignments"
                " WHERE cluster = ? AND workload_id > ? ORDER BY workload_id LIMIT ?"
            ),
            (cluster, after, max(limit, 0)),
        )
        return [assignment_from_row(row) for row in rows]

    def assignment_rows(
        self, cluster: str, after: str = "", limit: int = 5000
    ) -> list[AssignmentRow]:
        rows = self._all(
            self._q(
                "SELECT " + ASSIGNMENT_COLUMNS + " FROM assignments"
                " WHERE cluster = ? AND workload_id > ? ORDER BY workload_id LIMIT ?"
            ),
            (cluster, after, max(limit, 0)),
        )
        return [
            AssignmentRow(w, j, g, int(o), n, tuple(json.loads(ids)), c, m, st, mi or 0, v or "")
            for w, j, g, o, n, ids, c, m, st, mi, v in rows
        ]

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
                "SELECT seq, workload_id, status, cpu, memory, at, message, node, healthy,"
                " exit_code FROM reports"
                " WHERE cluster = ? AND seq > ? ORDER BY seq LIMIT ?"
            ),
            (cluster, seq, max(limit, 0)),
        )
        return _task_reports(rows)

    def job_reports(
        self, cluster: str, job_id: str, after: int = 0, limit: int = 5000
    ) -> list[TaskReport]:
        rows = self._all(
            self._q(
                "SELECT seq, workload_id, status, cpu, memory, at, message, node, healthy,"
                " exit_code FROM reports WHERE cluster = ? AND workload_id > ?"
                " AND workload_id < ? AND seq > ? ORDER BY seq LIMIT ?"
            ),
            (cluster, f"{job_id}/", f"{job_id}0", after, max(limit, 0)),  # "0" follows "/"
        )
        return _task_reports(rows)

    def group_usage(self, cluster: str, since: float) -> dict[str, GroupUsage]:
        rows = self._all(
            self._q(
                "SELECT workload_id, cpu, memory, gpu FROM latest_usage"
                " WHERE cluster = ? AND at >= ?"
            ),
            (cluster, since),
        )
        return mean_usage(rows)

    def latest_usage(self, cluster: str, after: str = "", limit: int = 5000) -> list[TaskReport]:
        rows = self._all(
            self._q(
                "SELECT seq, workload_id, status, cpu, memory, gpu, at, message, node"
                " FROM latest_usage WHERE cluster = ? AND workload_id > ?"
                " ORDER BY workload_id LIMIT ?"
            ),
            (cluster, after, max(limit, 0)),
        )
        return [
            TaskReport(
                seq=s, workload_id=w, status=st, cpu=c, memory=m, gpu=g, at=at, message=msg, node=n
            )
            for s, w, st, c, m, g, at, msg, n in rows
        ]


def _task_reports(rows: list[Any]) -> list[TaskReport]:
    """Rows of ``reports`` (seq, workload_id, status, cpu, memory, at, message, node,
    healthy, exit_code) as reports."""
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
            exit_code=code,
        )
        for s, w, st, c, m, at, msg, n, h, code in rows
    ]
