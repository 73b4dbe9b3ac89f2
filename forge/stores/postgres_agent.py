"""The store of a node agent logged in with its own PostgreSQL role.

``forge store grant-agent`` (``forge.stores.agent_roles``) makes the role; it holds
no table privilege, only EXECUTE on the agent functions of migration step 6
(``forge.stores.agent_sql``). ``PostgresAgentStore`` calls those and nothing else,
and never migrates: that role may not touch a table. ``open_as_agent`` tells such a
login from the worker's user, which gets the ordinary ``PostgresStore``.
"""

from __future__ import annotations

import json
from typing import Any, LiteralString

import psycopg

from forge.core.models import Assignment, Job, Node
from forge.errors import InvalidInput
from forge.stores.base import StoreError, TaskReport
from forge.stores.postgres_conn import Connection, Pool, connect_postgres, parse_postgres_url
from forge.stores.sql_dialect import assignment_from_row

__all__ = ["AgentRoleError", "PostgresAgentStore", "agent_identity", "open_as_agent"]


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
        self._pool = Pool(conninfo, max_connections)
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
