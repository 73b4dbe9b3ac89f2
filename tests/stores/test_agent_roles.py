"""Least privilege for node agents on PostgreSQL (issue 24): the role
``grant_agent`` makes for a node may heartbeat and report for that node and read
that node, its bindings and the groups of their jobs, and nothing else; it cannot
write a binding, a job, a node or another node's report, whatever SQL it sends.

The test server trusts every login, so what is tested is what a role may *do*
(PostgreSQL's ``insufficient_privilege``), and which password a role has is read
from its SCRAM verifier, not by logging in with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from forge.core.models import Assignment, Job, Node
from forge.stores import open_agent_store
from forge.stores.agent_roles import CONNECTION_LIMIT, agent_role_name, grant_agent, revoke_agent
from forge.stores.agent_sql import AGENT_FUNCTIONS
from forge.stores.base import Delta, Fence, StoreError, TaskReport
from forge.stores.postgres import PostgresStore
from forge.stores.postgres_agent import AgentRoleError, PostgresAgentStore
from forge.stores.postgres_conn import connect_postgres
from tests.stores.conftest import Backend
from tests.stores.pg_agents import (
    agent_connection,
    drop_agent_roles,
    role_row,
    scram_matches,
    url_password,
    url_user,
)

pytestmark = pytest.mark.postgres

C = "c1"
SECRET = "s3cr3t-of-the-back-group"


def _job(job_id: str, groups: dict[str, dict[str, str]]) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "name": job_id,
            "groups": [
                {
                    "name": name,
                    "scaling": {"min": 0, "max": 10, "desired": 1},
                    "tasks": [
                        {
                            "name": "t",
                            "command": ["sleep", "600"],
                            "env": env,
                            "resources": {"cpu": 100, "memory": 64},
                        }
                    ],
                }
                for name, env in groups.items()
            ],
        }
    )


def _binding(workload_id: str, node: str) -> Assignment:
    job, group, ordinal = workload_id.split("/")
    return Assignment(
        workload_id=workload_id,
        job=job,
        group=group,
        ordinal=int(ordinal),
        node=node,
        cpu=100,
        memory=64,
    )


@dataclass
class Cluster:
    """A store with two nodes: n1 runs web's front group, n2 web's back group (with
    a secret in its env) and the db job."""

    url: str  # the store owner's (the worker's)
    owner: PostgresStore

    def grant(self, node: str = "n1", cluster: str = C, **kw: Any) -> str:
        return grant_agent(self.url, cluster, node, **kw).url

    def owner_sql(self, query: Any, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn, _ = connect_postgres(self.url)
        with conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []


@pytest.fixture
def cluster(postgres_backend: Backend) -> Iterator[Cluster]:
    owner = postgres_backend.open()
    assert isinstance(owner, PostgresStore)
    owner.put_jobs(
        C,
        [
            _job("web", {"front": {"MODE": "front"}, "back": {"TOKEN": SECRET}}),
            _job("db", {"main": {"PASSWORD": SECRET}}),
        ],
    )
    owner.apply_delta(
        C,
        Fence(1, 1),
        Delta(
            nodes_upsert=[
                Node(id="n1", cpu=4000, memory=8192),
                Node(id="n2", cpu=4000, memory=8192),
            ],
            bind=[
                _binding("web/front/0", "n1"),
                _binding("web/back/0", "n2"),
                _binding("db/main/0", "n2"),
            ],
        ),
    )
    try:
        yield Cluster(postgres_backend.url, owner)
    finally:
        drop_agent_roles(postgres_backend.url)  # roles outlive the schema the backend drops


def _agent(url: str, node: str = "n1", cluster: str = C) -> PostgresAgentStore:
    store = open_agent_store(url, cluster, node)
    assert isinstance(store, PostgresAgentStore), "the granted URL must open the agent's store"
    return store


def _denied(conn: psycopg.Connection[Any], statement: str) -> bool:
    """Whether PostgreSQL refuses ``statement`` for lack of a privilege."""
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


# -- what the role is -------------------------------------------------------------------


def test_the_role_is_a_login_with_a_password_and_no_other_power(cluster: Cluster) -> None:
    granted = grant_agent(cluster.url, C, "n1")
    assert granted.created and url_user(granted.url) == granted.role
    row = role_row(cluster.url, granted.role)
    assert row is not None
    assert row["login"] and row["connlimit"] == CONNECTION_LIMIT
    assert not any(row[k] for k in ("super", "createrole", "createdb", "inherit", "replication"))
    assert not row["bypassrls"] and row["memberships"] == 0  # a member of no other role
    assert "idle_in_transaction_session_timeout=10s" in (row["config"] or [])
    password = url_password(granted.url)
    assert password and len(password) >= 24
    assert row["password"].startswith("SCRAM-SHA-256$")  # the verifier, never the password
    assert scram_matches(row["password"], password)
    assert password not in repr(granted)


def test_the_role_may_execute_the_agent_functions_and_touch_no_table(cluster: Cluster) -> None:
    role = url_user(cluster.grant())
    tables = cluster.owner_sql(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace"
        " AND c.relkind = 'r' AND (has_table_privilege(%s, c.oid,"
        "  'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')"
        "  OR has_any_column_privilege(%s, c.oid, 'SELECT, INSERT, UPDATE, REFERENCES'))",
        (role, role),
    )
    assert tables == []
    functions = cluster.owner_sql(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace = current_schema()::regnamespace"
        " AND has_function_privilege(%s, p.oid, 'EXECUTE') ORDER BY 1",
        (role,),
    )
    assert sorted(f for (f,) in functions) == sorted(f.replace(", ", ",") for f in AGENT_FUNCTIONS)
    schema = cluster.owner_sql(
        "SELECT has_schema_privilege(%s, current_schema(), 'CREATE')", (role,)
    )
    assert schema == [(False,)]


def test_no_password_leaves_a_login_role_without_one(cluster: Cluster) -> None:
    url = cluster.grant(password=False)
    assert url_password(url) is None
    row = role_row(cluster.url, url_user(url))
    assert row is not None and row["login"] and row["password"] is None
    _agent(url).close()  # the server authenticates it otherwise (here: trust)


def test_grant_twice_replaces_the_password_and_keeps_the_role(cluster: Cluster) -> None:
    first = grant_agent(cluster.url, C, "n1")
    second = grant_agent(cluster.url, C, "n1")
    assert first.created and not second.created and first.role == second.role
    old, new = url_password(first.url), url_password(second.url)
    assert old and new and old != new
    row = role_row(cluster.url, second.role)
    assert row is not None
    assert scram_matches(row["password"], new) and not scram_matches(row["password"], old)
    assert cluster.owner_sql("SELECT count(*) FROM agent_roles") == [(1,)]
    agent = _agent(second.url)
    agent.heartbeat(C, "n1", 5.0)  # still an agent, with the same rights
    agent.close()


def test_each_node_of_each_cluster_gets_a_role_of_its_own(cluster: Cluster) -> None:
    n1, n2, other = cluster.grant("n1"), cluster.grant("n2"), cluster.grant("n1", "c2")
    assert len({url_user(u) for u in (n1, n2, other)}) == 3
    with pytest.raises(AgentRoleError, match="agent of node n1 in cluster c1, not of node n2"):
        open_agent_store(n1, C, "n2")
    with pytest.raises(AgentRoleError):
        open_agent_store(other, C, "n1")
    owner = open_agent_store(cluster.url, C, "n1")  # the worker's user: the whole store
    assert isinstance(owner, PostgresStore)
    owner.close()


def test_grant_refuses_a_store_whose_tables_public_may_read(cluster: Cluster) -> None:
    cluster.owner_sql("GRANT SELECT ON jobs TO PUBLIC")
    with pytest.raises(StoreError, match="table jobs"):
        grant_agent(cluster.url, C, "n1")
    assert cluster.owner_sql("SELECT count(*) FROM agent_roles") == [(0,)]
    ((database, schema),) = cluster.owner_sql("SELECT current_database(), current_schema()")
    assert role_row(cluster.url, agent_role_name(database, schema, C, "n1")) is None  # rolled back


# -- what it cannot do ------------------------------------------------------------------

#: Statements an agent's login might try; each must be refused by PostgreSQL itself.
FORBIDDEN = [
    # a binding
    "INSERT INTO assignments (cluster, workload_id, job, grp, ordinal, node, gpu_ids, cpu,"
    " memory, status) VALUES ('c1', 'db/main/1', 'db', 'main', 1, 'n1', '[]', 1, 1, 'running')",
    "UPDATE assignments SET node = 'n1' WHERE workload_id = 'db/main/0'",
    "DELETE FROM assignments",
    # a job
    "INSERT INTO jobs (cluster, job_id, revision, spec) VALUES ('c1', 'evil', 99, '{}')",
    "UPDATE jobs SET spec = NULL",
    "UPDATE clusters SET revision = revision + 1",
    # a node, a heartbeat, a report, the fence
    "UPDATE nodes SET state = 'lost' WHERE id = 'n2'",
    "INSERT INTO heartbeats (cluster, node_id, at) VALUES ('c1', 'n2', 1e12)",
    "INSERT INTO reports (cluster, seq, workload_id, status, at, message, node)"
    " VALUES ('c1', 999, 'db/main/0', 'failed', 1, 'x', 'n2')",
    "INSERT INTO report_state (cluster, workload_id, status, node)"
    " VALUES ('c1', 'x', 'failed', 'n2')",
    "UPDATE fences SET generation = 999",
    "UPDATE loop_status SET doc = '{}'",
    # who is whose agent
    "INSERT INTO agent_roles (role_name, cluster, node_id) VALUES (session_user, 'c1', 'n2')",
    "UPDATE agent_roles SET node_id = 'n2'",
    # reads beyond its node
    "SELECT spec FROM jobs",
    "SELECT * FROM assignments",
    "SELECT * FROM reports",
    "SELECT * FROM group_versions",
    # the internal helper, the schema, other roles
    "SELECT forge_agent_node('c1')",
    "CREATE TABLE mine (a int)",
    "CREATE FUNCTION forge_agent_node(p_cluster text) RETURNS text"
    " LANGUAGE sql AS $$ SELECT 'n2' $$",
    "SET ROLE postgres",
    "SET SESSION AUTHORIZATION postgres",
]


def test_an_agent_cannot_write_a_binding_a_job_or_a_node_nor_read_beyond_its_node(
    cluster: Cluster,
) -> None:
    url = cluster.grant()
    before = (cluster.owner.assignments(C), cluster.owner.list_jobs(C), cluster.owner.nodes(C))
    with agent_connection(url) as conn:
        allowed = [s for s in FORBIDDEN if not _denied(conn, s)]
    assert allowed == []
    assert (
        cluster.owner.assignments(C),
        cluster.owner.list_jobs(C),
        cluster.owner.nodes(C),
    ) == before
    assert cluster.owner.reports_since(C, 0) == []
    assert cluster.owner.expired_nodes(C, 1e13) == []  # no heartbeat landed


def test_an_agent_cannot_heartbeat_or_report_for_another_node_or_cluster(cluster: Cluster) -> None:
    agent = _agent(cluster.grant())
    # n2's own replica, named as n2's, and as nobody's
    for node in ("n2", ""):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent of node n1"):
            agent.report(C, [TaskReport(workload_id="db/main/0", status="failed", at=1, node=node)])
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not of node n2"):
        agent.heartbeat(C, "n2", 1e12)
    # one forged report refuses its whole batch: the good one is not written either
    good = TaskReport(workload_id="web/front/0", status="running", at=1, node="n1")
    bad = TaskReport(workload_id="web/back/0", status="failed", at=1, node="n2")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent.report(C, [good, bad])
    # another cluster: not its agent there at all, not even to read
    for call in (
        lambda: agent.heartbeat("c2", "n1", 1.0),
        lambda: agent.report("c2", [good]),
        lambda: agent.assignments("c2"),
        lambda: agent.nodes("c2"),
        lambda: agent.get_job("c2", "web"),
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not a Forge agent"):
            call()
    agent.close()
    assert cluster.owner.reports_since(C, 0) == []
    assert cluster.owner.expired_nodes(C, 1e13) == []


def test_a_temporary_table_cannot_stand_in_for_the_stores_own(cluster: Cluster) -> None:
    """The classic SECURITY DEFINER hijack: objects of the caller's own earlier on its
    search_path. The functions pin theirs to the store's schema, pg_temp last."""
    url = cluster.grant()
    with agent_connection(url) as conn:
        conn.execute("CREATE TEMP TABLE agent_roles (role_name text, cluster text, node_id text)")
        conn.execute("INSERT INTO agent_roles VALUES (session_user, 'c1', 'n2')")
        conn.execute("CREATE TEMP TABLE assignments AS SELECT 'db/main/0'::text AS workload_id")
        conn.execute("SET search_path = pg_temp, public")
        schema = url.rpartition("schema=")[2]
        q = sql.SQL("SELECT workload_id FROM {}.forge_agent_assignments('c1', '', 100)")
        rows = conn.execute(q.format(sql.Identifier(schema))).fetchall()
        assert rows == [("web/front/0",)]
        beat = sql.SQL("SELECT {}.forge_agent_heartbeat('c1', 'n2', 1e12)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(beat.format(sql.Identifier(schema)))
    assert cluster.owner.expired_nodes(C, 1e13) == []


# -- what it can do ---------------------------------------------------------------------


def test_an_agent_heartbeats_and_reports_for_its_own_node(cluster: Cluster) -> None:
    agent = _agent(cluster.grant())
    agent.heartbeat(C, "n1", 100.0)
    agent.heartbeat(C, "n1", 50.0)  # a late one never makes the node look older
    assert cluster.owner.expired_nodes(C, 100.5) == ["n1"]
    assert cluster.owner.expired_nodes(C, 100.0) == []
    started = TaskReport(workload_id="web/front/0", status="running", at=101, node="n1")
    sample = started.model_copy(update={"cpu": 0.5, "memory": 0.25, "at": 102})
    assert agent.report(C, [started, sample]) == 1  # the sample is no decision
    # a replica bound to another node: dropped, not an error (the queue never wedges)
    elsewhere = TaskReport(workload_id="db/main/0", status="failed", at=103, node="n1")
    assert agent.report(C, [elsewhere]) == 1
    assert agent.report(C, []) == 1
    seen = cluster.owner.reports_since(C, 0)
    assert [(r.seq, r.workload_id, r.status, r.node) for r in seen] == [
        (1, "web/front/0", "running", "n1")
    ]
    usage = cluster.owner.latest_usage(C)
    assert [(u.workload_id, u.cpu, u.memory, u.at) for u in usage] == [
        ("web/front/0", 0.5, 0.25, 102.0)
    ]
    failed = started.model_copy(update={"status": "failed", "message": "exit 3", "at": 104})
    assert agent.report(C, [failed]) == 2
    assert cluster.owner.reports_since(C, 1)[0].message == "exit 3"
    agent.close()


def test_an_agent_reads_its_node_its_bindings_and_only_their_groups(cluster: Cluster) -> None:
    agent = _agent(cluster.grant())
    assert [a.workload_id for a in agent.assignments(C)] == ["web/front/0"]
    assert agent.assignments(C, after="web/front/0") == []
    assert [n.id for n in agent.nodes(C)] == ["n1"]
    web = agent.get_job(C, "web")
    assert web is not None and [g.name for g in web.groups] == ["front"]
    assert SECRET not in web.model_dump_json()  # another group's env stays unread
    assert agent.get_job(C, "db") is None  # nothing of it is bound here
    assert agent.get_job(C, "nope") is None
    agent.close()
    n2 = _agent(cluster.grant("n2"), "n2")
    assert [a.workload_id for a in n2.assignments(C)] == ["db/main/0", "web/back/0"]
    web2 = n2.get_job(C, "web")
    assert web2 is not None and [g.name for g in web2.groups] == ["back"]
    n2.close()


def test_revoke_makes_the_url_stop_working(cluster: Cluster) -> None:
    url = cluster.grant()
    role = url_user(url)
    agent = _agent(url)
    agent.heartbeat(C, "n1", 1.0)
    assert revoke_agent(cluster.url, C, "n1") == role
    assert role_row(cluster.url, role) is None
    assert cluster.owner_sql("SELECT count(*) FROM agent_roles") == [(0,)]
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        agent_connection(url)
    with pytest.raises(psycopg.Error):  # its open session ended too
        agent.heartbeat(C, "n1", 2.0)
    agent.close()
    assert revoke_agent(cluster.url, C, "n1") is None  # nothing left to revoke
    assert revoke_agent(cluster.url, C, "never-granted") is None


def test_a_createrole_owner_that_is_no_superuser_grants_and_revokes(
    postgres_backend: Backend,
) -> None:
    """The production shape: the worker's user owns the store and has CREATEROLE,
    nothing more."""
    base, _, schema = postgres_backend.url.rpartition("?schema=")
    owner_role = f"forge_t_owner_{schema[-12:]}"
    admin, _ = connect_postgres(base)
    ident = sql.Identifier(owner_role)
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(ident))
    admin.execute(
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(admin.info.dbname), ident
        )
    )
    url = postgres_backend.url.replace("//postgres@", f"//{owner_role}@", 1)
    assert url != postgres_backend.url
    try:
        store = PostgresStore(url)  # creates and owns the schema
        store.apply_delta(C, Fence(1, 1), Delta(bind=[_binding("web/front/0", "n1")]))
        store.close()
        granted = grant_agent(url, C, "n1")
        agent = _agent(granted.url)
        agent.heartbeat(C, "n1", 1.0)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            agent.heartbeat(C, "n2", 1.0)
        agent.close()
        assert revoke_agent(url, C, "n1") == granted.role
        assert role_row(postgres_backend.url, granted.role) is None
    finally:
        try:
            drop_agent_roles(postgres_backend.url)  # as a superuser: it ends their sessions
        finally:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident))
            admin.close()


# -- the agent's report function is write_reports in SQL ------------------------------

WIDS = ["web/front/0", "web/front/1", "web/front/2"]

reports = st.builds(
    TaskReport,
    workload_id=st.sampled_from(WIDS),
    status=st.sampled_from(["running", "failed", "exited"]),
    cpu=st.none() | st.sampled_from([0.0, 0.5, 1.25]),
    memory=st.none() | st.floats(0, 4, allow_nan=False),
    gpu=st.none() | st.sampled_from([0.0, 0.3, 1.5]),
    at=st.integers(0, 4).map(float),  # ties: the later of two equal times wins
    message=st.sampled_from(["", "started ports http=8080", "exit status 1"]),
    node=st.just("n1"),
    healthy=st.none() | st.booleans(),
    exit_code=st.none() | st.sampled_from([0, 1, 42, -9, 255]),
)


def _rows(store: PostgresStore, cluster: Cluster, name: str) -> tuple[object, ...]:
    decided = [r.model_dump() for r in store.reports_since(name, 0, limit=10_000)]
    usage = [u.model_dump() for u in store.latest_usage(name)]
    states = cluster.owner_sql(
        "SELECT workload_id, status, node, healthy FROM report_state WHERE cluster = %s"
        " ORDER BY workload_id",
        (name,),
    )
    return decided, usage, states


def test_the_agents_report_function_decides_as_the_store_does(cluster: Cluster) -> None:
    """``forge_agent_report`` (SQL) and ``write_reports`` (Python) must agree on every
    batch: which reports are decisions, their numbering, the usage kept and each
    replica's state; the loop reads the same store whichever wrote it."""
    for name in ("ref", "agt"):
        cluster.owner.apply_delta(name, Fence(1, 1), Delta(bind=[_binding(w, "n1") for w in WIDS]))
    agent = _agent(cluster.grant("n1", "agt"), cluster="agt")

    @settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.lists(reports, max_size=6), min_size=1, max_size=4))
    def agree(batches: list[list[TaskReport]]) -> None:
        cluster.owner_sql(
            "DELETE FROM reports WHERE cluster IN ('ref', 'agt');"
            " DELETE FROM report_state WHERE cluster IN ('ref', 'agt');"
            " DELETE FROM latest_usage WHERE cluster IN ('ref', 'agt');"
            " UPDATE clusters SET report_seq = 0 WHERE cluster IN ('ref', 'agt')"
        )
        for batch in batches:
            assert agent.report("agt", batch) == cluster.owner.report("ref", batch)
        assert _rows(cluster.owner, cluster, "agt") == _rows(cluster.owner, cluster, "ref")

    try:
        agree()
    finally:
        agent.close()


def test_the_report_function_refuses_what_a_task_report_may_not_hold(cluster: Cluster) -> None:
    url = cluster.grant()
    bad = [
        {"workload_id": "web/front/0", "status": "weird", "at": 1, "node": "n1"},
        {"workload_id": "web/front/0", "status": "running", "at": 1, "node": "n1", "cpu": -1},
        *(
            {"workload_id": "web/front/0", "status": "running", "at": 1, "node": "n1", "cpu": 0.5}
            | {"gpu": gpu}
            for gpu in (-0.1, "0.5", True)
        ),
        {"workload_id": "web/front/0", "status": "running", "at": "1", "node": "n1"},
        {
            "workload_id": "web/front/0",
            "status": "running",
            "at": 1,
            "message": "x" * 1025,
            "node": "n1",
        },
        *(
            {"workload_id": "web/front/0", "status": "failed", "at": 1, "exit_code": code}
            | {"node": "n1"}
            for code in (256, -256, 1.5, "1", True)
        ),
    ]
    with agent_connection(url) as conn:
        for report in bad:
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                conn.execute("SELECT forge_agent_report('c1', %s::jsonb)", (json.dumps([report]),))
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT forge_agent_heartbeat('c1', 'n1', 'Infinity')")
    assert cluster.owner.reports_since(C, 0) == []
