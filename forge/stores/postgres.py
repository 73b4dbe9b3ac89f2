"""The PostgreSQL store (psycopg 3, synchronous API).

Connections: a small bounded pool written here (``psycopg_pool`` is not a
dependency). Activities run in a thread pool; each call borrows a connection for
its duration, so concurrent activities run concurrent transactions instead of
queueing behind one lock, and the number of server connections stays bounded
however many threads the worker has. Connections run in autocommit mode and every
write is an explicit ``conn.transaction()`` block, so no transaction is ever left
open between calls; a connection that comes back broken or mid-transaction is
discarded rather than reused.

Ordering: the job revision and the report sequence are per-cluster counters in a
``clusters`` row, bumped inside the writing transaction, not PostgreSQL sequences.
The row lock makes concurrent writers commit in counter order, so a reader that has
seen revision N has seen every revision below N. With a sequence, revision 7 could
commit before 6 and a watcher that moved its cursor to 7 would never see 6.

Fencing: ``apply_delta`` locks the cluster's row in ``fences`` (``SELECT ... FOR
UPDATE``) before comparing, so two persists of the same cluster serialise and the
comparison and the writes are one atomic step. Fences live in their own table, not
in ``clusters``, so a long persist does not block ``put_job`` or agents' reports.

Schema: ``?schema=NAME`` in the URL selects (and, when migrating, creates) a
schema by setting the connection's ``search_path``; ``options=-csearch_path=...``
works too, but then the schema must already exist.

Agents: a node agent logged in with the role ``forge store grant-agent`` made for
it (``forge.stores.agent_roles``) gets ``PostgresAgentStore``, which calls the
agent functions of migration step 6 and nothing else, and never migrates: that
role may not touch a table.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, LiteralString
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from forge.core.models import Assignment, Job, Node
from forge.errors import InvalidInput
from forge.stores import migrations
from forge.stores.base import (
    ApplyResult,
    Delta,
    Fence,
    StoreError,
    TaskReport,
    check_fence,
    delta_digest,
)
from forge.stores.migrations import SCHEMA_NAME_PATTERN
from forge.stores.sql import (
    ASSIGNMENT_UPSERT_SET,
    SqlReads,
    assignment_from_row,
    forget_states,
    gpu_ids_json,
    write_jobs,
    write_nodes,
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

Connection = psycopg.Connection[TupleRow]
Cursor = psycopg.Cursor[TupleRow]


def parse_postgres_url(url: str) -> tuple[str, str | None]:
    """Split a store URL into a libpq conninfo string and the ``?schema=`` name.

    libpq rejects parameters it does not know, so ``schema`` is removed from the
    query and turned into ``options=-csearch_path=NAME`` (appended to any options
    already there). Schema names are restricted to plain identifiers so they need
    no escaping in ``options``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
    if not schemas:
        return conninfo, None
    schema = schemas[-1]
    if not re.match(SCHEMA_NAME_PATTERN, schema):
        raise ValueError(f"invalid schema name {schema!r} in the store URL")
    options = pg_conninfo.conninfo_to_dict(conninfo).get("options") or ""
    options = f"{options} -csearch_path={schema}".strip()
    return pg_conninfo.make_conninfo(conninfo, options=options), schema


def connect_postgres(url: str) -> tuple[Connection, str | None]:
    """One autocommit connection to the store at ``url`` and its schema name."""
    conninfo, schema = parse_postgres_url(url)
    return psycopg.connect(conninfo, autocommit=True), schema


class _Pool:
    """A bounded set of connections; ``connection()`` lends one to the caller."""

    def __init__(self, conninfo: str, max_size: int) -> None:
        if max_size < 1:
            raise ValueError("max_connections must be at least 1")
        self._conninfo = conninfo
        self._max_size = max_size
        self._idle: list[Connection] = []
        self._size = 0  # connections open: idle + lent out
        self._cond = threading.Condition()
        self._closed = False

    def put(self, conn: Connection) -> None:
        """Adopt an already open connection (the one used to migrate)."""
        with self._cond:
            self._size += 1
        self._give_back(conn)

    def _take(self) -> Connection:
        with self._cond:
            while True:
                if self._closed:
                    raise StoreError("store is closed")
                if self._idle:
                    return self._idle.pop()
                if self._size < self._max_size:
                    self._size += 1
                    break
                self._cond.wait()
        try:
            return psycopg.connect(self._conninfo, autocommit=True)
        except BaseException:
            with self._cond:
                self._size -= 1
                self._cond.notify()
            raise

    def _give_back(self, conn: Connection) -> None:
        healthy = (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == TransactionStatus.IDLE
        )
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(conn)
            else:
                self._size -= 1
            self._cond.notify()
        if not healthy or self._closed:
            conn.close()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        conn = self._take()
        try:
            yield conn
        finally:
            self._give_back(conn)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._size -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()


class PostgresStore(SqlReads):
    """The ``Store`` protocol over PostgreSQL; see the module docstring."""

    def __init__(self, url: str, *, migrate: bool = True, max_connections: int = 8) -> None:
        """Connect to ``url`` and, unless ``migrate=False``, migrate its schema.

        Connecting is eager so a wrong URL or a server that is down fails here, at
        start-up, rather than in the first activity.
        """
        conninfo, self.schema = parse_postgres_url(url)
        self._pool = _Pool(conninfo, max_connections)
        conn = psycopg.connect(conninfo, autocommit=True)
        try:
            self.schema_version = migrations.migrate(conn, schema=self.schema) if migrate else None
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


class AgentRoleError(StoreError, InvalidInput):
    """The store credentials an agent was given are another node's (or cluster's):
    a configuration mistake to fix, not an outage to wait out."""


def agent_identity(conn: Connection) -> tuple[str, str] | None:
    """``(cluster, node)`` when ``conn`` is logged in as an agent's role
    (``forge store grant-agent``), else None (the worker's user, or a schema from
    before agent roles existed)."""
    row = conn.execute(
        "SELECT coalesce(has_function_privilege("
        "to_regprocedure('forge_agent_identity()'), 'EXECUTE'), false)"
    ).fetchone()
    if row is None or not row[0]:
        return None
    found = conn.execute("SELECT cluster, node_id FROM forge_agent_identity()").fetchone()
    return (str(found[0]), str(found[1])) if found is not None else None


def open_as_agent(url: str, cluster: str, node_id: str) -> PostgresAgentStore | None:
    """The agent's store when ``url`` logs in as an agent's role, None otherwise
    (the caller then opens an ordinary ``PostgresStore``, as agents did before
    roles existed). ``AgentRoleError`` when the role is another node's or cluster's:
    it could not heartbeat for this one, so the agent would be lost on arrival."""
    conn, _ = connect_postgres(url)
    try:
        identity = agent_identity(conn)
    except BaseException:
        conn.close()
        raise
    if identity is None:
        conn.close()
        return None
    if identity != (cluster, node_id):
        user = conn.info.user
        conn.close()
        raise AgentRoleError(
            f"store user {user} is the agent of node {identity[1]} in cluster {identity[0]}, "
            f"not of node {node_id} in cluster {cluster}: give this agent the store URL "
            f"`forge store grant-agent {node_id} --cluster {cluster}` prints"
        )
    return PostgresAgentStore(url, cluster, node_id, _conn=conn)


class PostgresAgentStore:
    """The ``AgentStore`` of one node agent logged in with its own role.

    Every call is one statement calling one agent function (migration step 6), each
    checked inside the database against the login, so this class is a convenience,
    not the guard: what it cannot do, the role cannot do either. A call about
    another node or cluster fails with ``psycopg.errors.InsufficientPrivilege``.
    It never migrates (the role may not), and keeps at most two connections (an
    agent makes one call at a time), well inside the role's connection limit.
    """

    def __init__(
        self,
        url: str,
        cluster: str,
        node_id: str,
        *,
        max_connections: int = 2,
        _conn: Connection | None = None,
    ) -> None:
        conninfo, self.schema = parse_postgres_url(url)
        self.cluster, self.node_id = cluster, node_id
        self._pool = _Pool(conninfo, max_connections)
        self._pool.put(_conn if _conn is not None else psycopg.connect(conninfo, autocommit=True))

    def _rows(self, query: LiteralString, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._pool.connection() as conn:
            return conn.execute(query, params).fetchall()

    def heartbeat(self, cluster: str, node_id: str, at: float) -> None:
        self._rows("SELECT forge_agent_heartbeat(%s, %s, %s)", (cluster, node_id, at))

    def report(self, cluster: str, reports: list[TaskReport]) -> int:
        body = json.dumps([r.model_dump(mode="json") for r in reports])
        (row,) = self._rows("SELECT forge_agent_report(%s, %s::jsonb)", (cluster, body))
        return int(row[0])

    def nodes(self, cluster: str, after: str = "", limit: int = 5000) -> list[Node]:
        rows = self._rows("SELECT * FROM forge_agent_nodes(%s, %s, %s)", (cluster, after, limit))
        return [Node.model_validate_json(spec) for (spec,) in rows]

    def assignments(self, cluster: str, after: str = "", limit: int = 5000) -> list[Assignment]:
        rows = self._rows(
            "SELECT * FROM forge_agent_assignments(%s, %s, %s)", (cluster, after, limit)
        )
        return [assignment_from_row(row) for row in rows]

    def get_job(self, cluster: str, job_id: str) -> Job | None:
        (row,) = self._rows("SELECT forge_agent_job(%s, %s)", (cluster, job_id))
        return Job.model_validate_json(row[0]) if row[0] is not None else None

    def close(self) -> None:
        self._pool.close()


def _scalar(cur: Cursor) -> int:
    row = cur.fetchone()
    if row is None:
        raise StoreError("expected a row from RETURNING")
    return int(row[0])
