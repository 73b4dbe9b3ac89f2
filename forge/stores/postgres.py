"""The PostgreSQL store (psycopg 3, synchronous API).

Connections and the ``?schema=`` URL parameter: ``forge.stores.postgres_conn`` (a
small bounded pool; every write an explicit transaction on an autocommit
connection, so none is left open between calls).

Ordering: the job revision and the report sequence are per-cluster counters in a
``clusters`` row, bumped inside the writing transaction, not PostgreSQL sequences.
The row lock makes concurrent writers commit in counter order, so a reader that has
seen revision N has seen every revision below N. With a sequence, revision 7 could
commit before 6 and a watcher that moved its cursor to 7 would never see 6.

Fencing: ``apply_delta`` locks the cluster's row in ``fences`` (``SELECT ... FOR
UPDATE``) before comparing, so two persists of the same cluster serialise and the
comparison and the writes are one atomic step. Fences live in their own table, not
in ``clusters``, so a long persist does not block ``put_job`` or agents' reports.

Agents: a node agent logged in with the role ``forge store grant-agent`` made for
it (``forge.stores.agent_roles``) gets ``PostgresAgentStore``
(``forge.stores.postgres_agent``, re-exported here), which calls the agent
functions of migration step 6 and nothing else, and never migrates: that role may
not touch a table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, LiteralString

import psycopg

from forge.core.models import Assignment, Job
from forge.stores.base import (
    ApplyResult,
    Delta,
    Fence,
    StoreError,
    TaskReport,
    check_fence,
    delta_digest,
)
from forge.stores.migrations import migrate as migrate_schema
from forge.stores.postgres_agent import (
    AgentRoleError,
    PostgresAgentStore,
    agent_identity,
    open_as_agent,
)
from forge.stores.postgres_conn import (
    Cursor,
    Pool,
    connect_postgres,
    parse_postgres_url,
)
from forge.stores.sql import (
    ASSIGNMENT_UPSERT_SET,
    SqlReads,
    forget_states,
    gpu_ids_json,
    write_completions,
    write_jobs,
    write_nodes,
    write_queues,
    write_reports,
    write_status,
)

__all__ = [
    "AgentRoleError",
    "PostgresAgentStore",
    "PostgresStore",
    "agent_identity",
    "connect_postgres",
    "open_as_agent",
    "parse_postgres_url",
]


class PostgresStore(SqlReads):
    """The ``Store`` protocol over PostgreSQL; see the module docstring."""

    def __init__(self, url: str, *, migrate: bool = True, max_connections: int = 8) -> None:
        """Connect to ``url`` and, unless ``migrate=False``, migrate its schema.

        Connecting is eager so a wrong URL or a server that is down fails here, at
        start-up, rather than in the first activity.
        """
        conninfo, self.schema = parse_postgres_url(url)
        self._pool = Pool(conninfo, max_connections)
        conn = psycopg.connect(conninfo, autocommit=True)
        try:
            self.schema_version = migrate_schema(conn, schema=self.schema) if migrate else None
        except BaseException:
            conn.close()
            raise
        self._pool.put(conn)

    DIALECT = "postgres"

    @contextmanager
    def _tx(self) -> Iterator[Cursor]:
        """A cursor inside one transaction, committed on exit, rolled back on error."""
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    def _one(self, query: LiteralString, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._pool.connection() as conn:
            return conn.execute(query, params).fetchone()

    def _all(self, query: LiteralString, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._pool.connection() as conn:
            return conn.execute(query, params).fetchall()

    # -- jobs ----------------------------------------------------------------------
    def put_job(self, cluster: str, job: Job) -> int:
        return self.put_jobs(cluster, [job])

    def put_jobs(self, cluster: str, jobs: Sequence[Job]) -> int:
        if not jobs:
            return self.revision(cluster)
        n = len(jobs)
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO clusters (cluster, revision) VALUES (%s, %s)"
                " ON CONFLICT (cluster) DO UPDATE SET revision = clusters.revision + %s"
                " RETURNING revision",
                (cluster, n, n),
            )
            last = _scalar(cur)
            write_jobs(cur, "postgres", cluster, jobs, last - n + 1)
        return last

    def delete_job(self, cluster: str, job_id: str) -> int | None:
        with self._tx() as cur:
            # Lock the counter first, as put_job does, so job writes of a cluster
            # serialise in revision order (see the module docstring).
            cur.execute("SELECT 1 FROM clusters WHERE cluster = %s FOR UPDATE", (cluster,))
            if cur.fetchone() is None:
                return None  # no job was ever written in this cluster
            cur.execute(
                "SELECT 1 FROM jobs WHERE cluster = %s AND job_id = %s AND spec IS NOT NULL",
                (cluster, job_id),
            )
            if cur.fetchone() is None:
                return None
            cur.execute(
                "UPDATE clusters SET revision = revision + 1 WHERE cluster = %s RETURNING revision",
                (cluster,),
            )
            revision = _scalar(cur)
            cur.execute(
                "UPDATE jobs SET revision = %s, spec = NULL WHERE cluster = %s AND job_id = %s",
                (revision, cluster, job_id),
            )
            cur.execute(
                "DELETE FROM completions WHERE cluster = %s AND job = %s", (cluster, job_id)
            )
        return revision

    # -- actual state --------------------------------------------------------------
    def apply_delta(self, cluster: str, fence: Fence, delta: Delta) -> ApplyResult:
        fence = Fence(*fence)
        digest = delta_digest(delta)
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO fences (cluster) VALUES (%s) ON CONFLICT DO NOTHING", (cluster,)
            )
            cur.execute(
                "SELECT generation, pass_no, digest FROM fences WHERE cluster = %s FOR UPDATE",
                (cluster,),
            )
            row = cur.fetchone()
            assert row is not None  # inserted above if it was missing
            stored = Fence(row[0], row[1]) if row[0] is not None else None
            settled = check_fence(fence, stored, row[2] or "", digest)
            if settled is not None:
                return settled  # nothing written
            if delta.release:
                released = list(delta.release)
                cur.execute(
                    "DELETE FROM assignments WHERE cluster = %s AND workload_id = ANY(%s)",
                    (cluster, released),
                )
                # A released replica's usage must not steer the autoscaler any more
                # (its id is reused if the replica is placed again).
                cur.execute(
                    "DELETE FROM latest_usage WHERE cluster = %s AND workload_id = ANY(%s)",
                    (cluster, released),
                )
            forget_states(cur, "postgres", cluster, delta)
            if delta.bind:
                self._bind(cur, cluster, delta.bind)
            if delta.nodes_remove:
                cur.execute(
                    "DELETE FROM nodes WHERE cluster = %s AND id = ANY(%s)",
                    (cluster, list(delta.nodes_remove)),
                )
            if delta.nodes_upsert:
                write_nodes(cur, "postgres", cluster, delta.nodes_upsert)
            if delta.status is not None:
                write_status(cur, "postgres", cluster, delta.status)
            if delta.complete:
                write_completions(cur, "postgres", cluster, delta.complete)
            if delta.queues is not None:
                write_queues(cur, "postgres", cluster, delta.queues)
            cur.execute(
                "UPDATE fences SET generation = %s, pass_no = %s, digest = %s WHERE cluster = %s",
                (fence.generation, fence.pass_no, digest, cluster),
            )
        return ApplyResult(applied=True, digest=digest)

    @staticmethod
    def _bind(cur: Cursor, cluster: str, binds: list[Assignment]) -> None:
        """Upsert all bindings in one statement: columns travel as arrays and
        ``unnest`` turns them back into rows, one round trip for 20k bindings.

        One statement may not update a row twice, so a workload bound twice in the
        same delta keeps its last binding, as sequential upserts would.
        """
        last = {a.workload_id: a for a in binds}.values()
        cur.execute(
            "INSERT INTO assignments (cluster, workload_id, job, grp, ordinal, node,"
            " gpu_ids, cpu, memory, status, gpu_milli, version)"
            " SELECT %s, w, j, g, o, n, gi::jsonb, c, m, s, gm, v FROM unnest("
            "%s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[],"
            " %s::bigint[], %s::bigint[], %s::text[], %s::int[], %s::text[])"
            " AS t(w, j, g, o, n, gi, c, m, s, gm, v)" + ASSIGNMENT_UPSERT_SET,
            (
                cluster,
                [a.workload_id for a in last],
                [a.job for a in last],
                [a.group for a in last],
                [a.ordinal for a in last],
                [a.node for a in last],
                [gpu_ids_json(a) for a in last],
                [a.cpu for a in last],
                [a.memory for a in last],
                [a.status.value for a in last],
                [a.gpu_milli for a in last],
                [a.version for a in last],
            ),
        )

    # -- liveness and task status --------------------------------------------------
    def heartbeat(self, cluster: str, node_id: str, at: float) -> None:
        with self._pool.connection() as conn:
            # GREATEST: a heartbeat delayed in transit must not make a node look older.
            conn.execute(
                "INSERT INTO heartbeats (cluster, node_id, at) VALUES (%s, %s, %s)"
                " ON CONFLICT (cluster, node_id)"
                " DO UPDATE SET at = GREATEST(heartbeats.at, excluded.at)",
                (cluster, node_id, at),
            )

    def report(self, cluster: str, reports: list[TaskReport]) -> int:
        if not reports:
            return self._counter(cluster, "report_seq")
        with self._tx() as cur:

            def reserve(n: int) -> int:
                if not n:  # usage samples only: no counter row lock, just a read
                    cur.execute("SELECT report_seq FROM clusters WHERE cluster = %s", (cluster,))
                    row = cur.fetchone()
                    return int(row[0]) if row is not None else 0
                cur.execute(
                    "INSERT INTO clusters (cluster, report_seq) VALUES (%s, %s)"
                    " ON CONFLICT (cluster) DO UPDATE"
                    " SET report_seq = clusters.report_seq + excluded.report_seq"
                    " RETURNING report_seq",
                    (cluster, n),
                )
                return _scalar(cur)

            return write_reports(cur, "postgres", cluster, reports, reserve)

    def close(self) -> None:
        """Close idle connections now and lent ones as they come back."""
        self._pool.close()


def _scalar(cur: Cursor) -> int:
    row = cur.fetchone()
    if row is None:
        raise StoreError("expected a row from RETURNING")
    return int(row[0])
