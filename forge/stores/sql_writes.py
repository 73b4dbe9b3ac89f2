"""The writes the SQLite and PostgreSQL stores share, run inside the backend's own
write transaction (a ``sqlite3.Connection`` under ``BEGIN IMMEDIATE`` or a psycopg
cursor in ``conn.transaction()``): jobs and their group versions, nodes, the
published status, task reports and the replica states they decide on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import LiteralString

from forge.core.models import Job, Node, TaskGroup
from forge.core.quota import QueueSpec
from forge.core.versions import describe_change
from forge.stores.base import (
    Delta,
    ReplicaState,
    TaskReport,
    forgets_state,
    is_usage,
    next_state,
)
from forge.stores.sql_dialect import Dialect, Executor, sql

__all__ = [
    "forget_states",
    "write_jobs",
    "write_nodes",
    "write_reports",
    "write_status",
    "write_versions",
]


def write_jobs(
    db: Executor, dialect: Dialect, cluster: str, jobs: Sequence[Job], first: int
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
    db: Executor, dialect: Dialect, cluster: str, jobs: Sequence[Job], first: int
) -> None:
    """Number each group's new task-spec version (see ``Store.group_versions``).

    A bulk submission is mostly new jobs: one query per chunk finds the jobs that
    have versions at all, and only their groups look up their latest; a group spec
    repeated across the batch has its version digest computed once."""
    rows = []
    latest: dict[tuple[str, str], tuple[int, str, str]] = {}
    known = _versioned(db, dialect, cluster, [j.id for j in jobs])
    digests: dict[str, str] = {}  # group JSON -> its version
    for i, job in enumerate(jobs):
        for g in job.groups:
            key = (job.id, g.name)
            last = latest.get(key)
            if last is None:
                last = _latest_version(db, dialect, cluster, key) if job.id in known else _NONE
            spec = g.model_dump_json()
            version = digests.get(spec)
            if version is None:
                version = digests[spec] = g.version
            if last[1] == version:
                continue
            old = TaskGroup.model_validate_json(last[2]) if last[2] else None
            rows.append(
                (
                    cluster,
                    job.id,
                    g.name,
                    last[0] + 1,
                    version,
                    first + i,
                    describe_change(old, g),
                    spec,
                )
            )
            latest[key] = (last[0] + 1, version, spec)
    if rows:
        db.executemany(
            sql(
                "INSERT INTO group_versions (cluster, job_id, grp, number, version, revision,"
                " changed, spec) VALUES (?, ?, ?, ?, ?, ?, ?, ?{jsonb})",
                dialect,
            ),
            rows,
        )


_NONE = (0, "", "")
#: Job ids per ``IN (...)`` query (far below either database's parameter limit).
_CHUNK = 500


def _versioned(db: Executor, dialect: Dialect, cluster: str, job_ids: list[str]) -> set[str]:
    """Which of ``job_ids`` have a group version stored."""
    found: set[str] = set()
    for at in range(0, len(job_ids), _CHUNK):
        chunk = job_ids[at : at + _CHUNK]
        marks = ", ".join(["?"] * len(chunk))
        query = "SELECT DISTINCT job_id FROM group_versions WHERE cluster = ? AND job_id IN ("
        found.update(
            str(row[0])
            for row in db.execute(sql(query + marks + ")", dialect), (cluster, *chunk)).fetchall()
        )
    return found


def _latest_version(
    db: Executor, dialect: Dialect, cluster: str, key: tuple[str, str]
) -> tuple[int, str, str]:
    found = db.execute(
        sql(
            "SELECT number, version, spec{text} FROM group_versions WHERE cluster = ?"
            " AND job_id = ? AND grp = ? ORDER BY number DESC LIMIT 1",
            dialect,
        ),
        (cluster, *key),
    ).fetchone()
    return (int(found[0]), str(found[1]), str(found[2])) if found else _NONE


def write_nodes(db: Executor, dialect: Dialect, cluster: str, nodes: Iterable[Node]) -> None:
    db.executemany(
        sql(
            "INSERT INTO nodes (cluster, id, spec, state) VALUES (?, ?, ?{jsonb}, ?)"
            " ON CONFLICT (cluster, id)"
            " DO UPDATE SET spec = excluded.spec, state = excluded.state",
            dialect,
        ),
        [(cluster, n.id, n.model_dump_json(), n.state.value) for n in nodes],
    )


def write_status(db: Executor, dialect: Dialect, cluster: str, doc: str) -> None:
    db.execute(
        sql(
            "INSERT INTO loop_status (cluster, doc) VALUES (?, ?)"
            " ON CONFLICT (cluster) DO UPDATE SET doc = excluded.doc",
            dialect,
        ),
        (cluster, doc),
    )


def write_completions(db: Executor, dialect: Dialect, cluster: str, done: list[str]) -> None:
    """Record batch replicas that completed; one written again is left as it is."""
    db.executemany(
        sql(
            "INSERT INTO completions (cluster, workload_id, job) VALUES (?, ?, ?)"
            " ON CONFLICT (cluster, workload_id) DO NOTHING",
            dialect,
        ),
        [(cluster, w, w.split("/", 1)[0]) for w in done],
    )


def write_queues(db: Executor, dialect: Dialect, cluster: str, queues: list[QueueSpec]) -> None:
    """Replace the cluster's queues with ``queues`` (all of them: few, MAX_QUEUES)."""
    db.execute(sql("DELETE FROM queues WHERE cluster = ?", dialect), (cluster,))
    db.executemany(
        sql("INSERT INTO queues (cluster, name, spec) VALUES (?, ?, ?)", dialect),
        [(cluster, q.name, q.model_dump_json()) for q in queues],
    )


def _states(
    db: Executor, dialect: Dialect, cluster: str, workloads: list[str]
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


def _report_row(cluster: str, seq: int, r: TaskReport) -> tuple[object, ...]:
    """A decision's row of ``reports``, in the INSERT's column order."""
    return (
        *(cluster, seq, r.workload_id, r.status, r.cpu, r.memory, r.at, r.message),
        *(r.node, r.healthy, r.exit_code),
    )


def write_reports(
    db: Executor,
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
                " message, node, healthy, exit_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                dialect,
            ),
            [_report_row(cluster, seqs[i], reports[i]) for i in decided],
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
    usage = [_usage_row(cluster, seqs.get(i, 0), r) for i, r in enumerate(reports) if is_usage(r)]
    if usage:
        # Only reports that carry usage feed group_usage; ">=" lets the later of two
        # reports with the same timestamp win (rows go in order).
        db.executemany(sql(_UPSERT_USAGE, dialect), usage)
    return last


_UPSERT_USAGE: LiteralString = (
    "INSERT INTO latest_usage (cluster, workload_id, seq, cpu, memory, gpu, at, status,"
    " message, node) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (cluster, workload_id)"
    " DO UPDATE SET seq = excluded.seq, cpu = excluded.cpu, memory = excluded.memory,"
    " gpu = excluded.gpu, at = excluded.at, status = excluded.status,"
    " message = excluded.message, node = excluded.node WHERE excluded.at >= latest_usage.at"
)


def _usage_row(cluster: str, seq: int, r: TaskReport) -> tuple[object, ...]:
    """A report's ``latest_usage`` row (``seq``: its number when it was a decision)."""
    return (cluster, r.workload_id, seq, r.cpu, r.memory, r.gpu, r.at, r.status, r.message, r.node)


def forget_states(db: Executor, dialect: Dialect, cluster: str, delta: Delta) -> None:
    """Inside ``apply_delta``: drop the state of the replicas ``delta`` releases or
    binds pending (``forgets_state``), so their next report is a decision."""
    gone = forgets_state(delta)
    if gone:
        db.executemany(
            sql("DELETE FROM report_state WHERE cluster = ? AND workload_id = ?", dialect),
            [(cluster, w) for w in gone],
        )
