"""Versioned schema migrations for the SQLite and PostgreSQL stores.

Each dialect has a list of numbered steps; step ``i`` (1-based) moves the schema
from version ``i - 1`` to ``i``. ``migrate`` applies the missing ones in a single
transaction and records each in ``schema_version``, so a crash half-way leaves the
old version intact and the next start simply tries again.

Several workers may start at once against the same database. On SQLite the
migration runs under ``BEGIN IMMEDIATE`` (the database write lock); on PostgreSQL
under ``pg_advisory_xact_lock`` with one constant key for the whole database, so
concurrent migrators (and the ``CREATE SCHEMA`` that precedes them) queue up
behind each other and the later ones find nothing left to do.

This module is a leaf: it knows the DDL and the locking, not the stores. A backend
hands ``migrate`` an open connection; ``forge.stores.migrate_url`` picks the backend.

Steps are append-only: never edit a released step, add a new one. Both dialects
keep the same number of steps so a version number means the same layout in both.
"""

from __future__ import annotations

import re
import sqlite3
from typing import TYPE_CHECKING, Any, LiteralString

from forge.stores.base import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "AGENT_FUNCTIONS",
    "LATEST_VERSION",
    "POSTGRES_MIGRATIONS",
    "SCHEMA_NAME_PATTERN",
    "SQLITE_MIGRATIONS",
    "migrate",
]

#: Key of the PostgreSQL advisory lock that serialises migrations ("Forg").
_PG_LOCK_KEY = 0x466F7267

SCHEMA_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"

# Step 5's backfills, the same SQL in both dialects.
_BACKFILL_USAGE: LiteralString = (
    "UPDATE latest_usage SET"
    " status = coalesce((SELECT r.status FROM reports r"
    "  WHERE r.cluster = latest_usage.cluster AND r.seq = latest_usage.seq), status),"
    " message = coalesce((SELECT r.message FROM reports r"
    "  WHERE r.cluster = latest_usage.cluster AND r.seq = latest_usage.seq), message),"
    " node = coalesce((SELECT r.node FROM reports r"
    "  WHERE r.cluster = latest_usage.cluster AND r.seq = latest_usage.seq), node)"
)
_BACKFILL_STATE: LiteralString = (
    "INSERT INTO report_state (cluster, workload_id, status, node, healthy)"
    " SELECT r.cluster, r.workload_id, r.status, r.node, r.healthy FROM reports r"
    " JOIN (SELECT cluster, workload_id, max(seq) AS seq FROM reports"
    "  GROUP BY cluster, workload_id) m ON m.cluster = r.cluster AND m.seq = r.seq"
    " JOIN assignments a ON a.cluster = r.cluster AND a.workload_id = r.workload_id"
    " WHERE a.status <> 'pending'"
)

# Step 6 (PostgreSQL only): least privilege for node agents. An agent logs in as a
# role of its own (``forge store grant-agent``) that holds no table privilege at all,
# only EXECUTE on the functions below. They run as the store's owner (SECURITY
# DEFINER) and take the agent's identity from ``session_user``, the authenticated
# login, which a session cannot change (SET ROLE changes ``current_user`` only, and
# an agent's role is a member of no other role), looked up in ``agent_roles``, which
# only the owner writes. The node never comes from an argument the agent could
# choose: an argument naming another node is refused, not obeyed.
#
# Their search_path is pinned to the store's schema with pg_temp explicitly last
# (the DO block sets it for the CREATE FUNCTIONs' ``FROM CURRENT``), so an agent's
# temporary table cannot stand in for one of the store's: the classic hijack of a
# SECURITY DEFINER function. EXECUTE is revoked from PUBLIC; grant-agent grants it
# per role (``AGENT_FUNCTIONS``).
_AGENT_ROLES: LiteralString = """CREATE TABLE agent_roles (
            role_name TEXT COLLATE "C" PRIMARY KEY,
            cluster TEXT COLLATE "C" NOT NULL,
            node_id TEXT COLLATE "C" NOT NULL,
            UNIQUE (cluster, node_id)
        )"""
_PIN_SEARCH_PATH: LiteralString = (
    "DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$"
)
_AGENT_IDENTITY: LiteralString = """CREATE FUNCTION forge_agent_identity()
        RETURNS TABLE (cluster TEXT, node_id TEXT)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
            SELECT r.cluster, r.node_id FROM agent_roles r WHERE r.role_name = session_user::text
        $$"""
# The node of the calling agent in p_cluster, or insufficient_privilege. Internal:
# only the functions below call it (as the owner), no agent is granted it.
_AGENT_NODE: LiteralString = """CREATE FUNCTION forge_agent_node(p_cluster TEXT) RETURNS TEXT
        LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        DECLARE
            v_me TEXT;
        BEGIN
            SELECT r.node_id INTO v_me FROM agent_roles r
             WHERE r.role_name = session_user::text AND r.cluster = p_cluster;
            IF v_me IS NULL THEN
                RAISE EXCEPTION 'store user % is not a Forge agent of cluster %',
                    session_user, p_cluster
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'forge store grant-agent NODE prints the credentials of '
                                 'a node''s agent';
            END IF;
            RETURN v_me;
        END $$"""
_AGENT_HEARTBEAT: LiteralString = """CREATE FUNCTION forge_agent_heartbeat(
            p_cluster TEXT, p_node TEXT, p_at DOUBLE PRECISION) RETURNS VOID
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        DECLARE
            v_me TEXT := forge_agent_node(p_cluster);
        BEGIN
            IF p_node IS DISTINCT FROM v_me THEN
                RAISE EXCEPTION 'store user % is the agent of node %, not of node %',
                    session_user, v_me, p_node USING ERRCODE = 'insufficient_privilege';
            END IF;
            IF p_at IS NULL OR p_at IN ('Infinity', '-Infinity', 'NaN') THEN
                RAISE EXCEPTION 'a heartbeat needs a finite time, not %', p_at
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- GREATEST: a heartbeat delayed in transit must not make a node look older
            INSERT INTO heartbeats AS h (cluster, node_id, at) VALUES (p_cluster, v_me, p_at)
            ON CONFLICT (cluster, node_id) DO UPDATE SET at = GREATEST(h.at, excluded.at);
        END $$"""
# The agent's own node (it decides from its state whether to register again).
_AGENT_NODES: LiteralString = """CREATE FUNCTION forge_agent_nodes(
            p_cluster TEXT, p_after TEXT, p_limit INTEGER) RETURNS SETOF TEXT
        LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        DECLARE
            v_me TEXT := forge_agent_node(p_cluster);
        BEGIN
            RETURN QUERY SELECT n.spec::text FROM nodes n
             WHERE n.cluster = p_cluster AND n.id = v_me AND n.id > p_after AND p_limit > 0;
        END $$"""
_AGENT_ASSIGNMENTS: LiteralString = """CREATE FUNCTION forge_agent_assignments(
            p_cluster TEXT, p_after TEXT, p_limit INTEGER)
        RETURNS TABLE (workload_id TEXT, job TEXT, grp TEXT, ordinal INTEGER, node TEXT,
                       gpu_ids TEXT, cpu BIGINT, memory BIGINT, status TEXT,
                       gpu_milli INTEGER, version TEXT)
        LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        #variable_conflict use_column
        DECLARE
            v_me TEXT := forge_agent_node(p_cluster);
        BEGIN
            RETURN QUERY SELECT a.workload_id::text, a.job, a.grp, a.ordinal, a.node,
                   a.gpu_ids::text, a.cpu, a.memory, a.status, a.gpu_milli, a.version
              FROM assignments a
             WHERE a.cluster = p_cluster AND a.node = v_me AND a.workload_id > p_after
             ORDER BY a.workload_id LIMIT greatest(p_limit, 0);
        END $$"""
# A job's spec with only the groups bound on the agent's node (their env values are
# all it needs; other groups' may be another team's secrets); NULL when none is.
_AGENT_JOB: LiteralString = """CREATE FUNCTION forge_agent_job(p_cluster TEXT, p_job_id TEXT)
        RETURNS TEXT
        LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        DECLARE
            v_me TEXT := forge_agent_node(p_cluster);
            v_spec JSONB;
            v_groups JSONB;
        BEGIN
            SELECT j.spec INTO v_spec FROM jobs j
             WHERE j.cluster = p_cluster AND j.job_id = p_job_id;
            IF v_spec IS NULL THEN
                RETURN NULL;
            END IF;
            SELECT jsonb_agg(g.value ORDER BY g.pos) INTO v_groups
              FROM jsonb_array_elements(v_spec -> 'groups') WITH ORDINALITY g(value, pos)
             WHERE g.value ->> 'name' IN (
                   SELECT a.grp FROM assignments a
                    WHERE a.cluster = p_cluster AND a.job = p_job_id AND a.node = v_me);
            IF v_groups IS NULL THEN
                RETURN NULL;
            END IF;
            RETURN jsonb_set(v_spec, '{groups}', v_groups)::text;
        END $$"""
# ``Store.report`` for an agent: ``forge.stores.sql.write_reports`` in SQL, in one
# statement (so one transaction: the counter row's lock orders the numbering as the
# Python path's does). A report is checked as ``TaskReport`` checks it (a malformed
# row would break the loop's reads) and must name the agent's node; a report about a
# replica not bound to the node (released, moved since) is dropped, not an error, so
# the agent's queue never wedges on it. Decisions follow
# ``forge.stores.base.next_state``; tests/stores/test_agent_roles.py holds the two
# implementations equal.
_AGENT_REPORT: LiteralString = """CREATE FUNCTION forge_agent_report(
            p_cluster TEXT, p_reports JSONB) RETURNS BIGINT
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
        DECLARE
            v_me TEXT := forge_agent_node(p_cluster);
            v_r JSONB;
            v_i BIGINT;
            v_w TEXT;
            v_st TEXT;
            v_h BOOLEAN;
            v_prev JSONB;
            v_bound TEXT[];
            v_states JSONB;
            v_changed TEXT[] := '{}';
            v_decided BIGINT[] := '{}';
            v_n INTEGER;
            v_last BIGINT;
            v_seq BIGINT;
        BEGIN
            IF jsonb_typeof(p_reports) IS DISTINCT FROM 'array' THEN
                RAISE EXCEPTION 'reports must be a JSON array'
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF jsonb_array_length(p_reports) > 1000 THEN
                RAISE EXCEPTION 'at most 1000 reports a call, not %', jsonb_array_length(p_reports)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- check every report first: one bad report refuses the batch, nothing written
            FOR v_r, v_i IN SELECT e, o FROM jsonb_array_elements(p_reports) WITH ORDINALITY x(e, o)
            LOOP
                IF jsonb_typeof(v_r) <> 'object'
                   OR jsonb_typeof(v_r -> 'workload_id') IS DISTINCT FROM 'string'
                   OR jsonb_typeof(v_r -> 'status') IS DISTINCT FROM 'string'
                   OR jsonb_typeof(v_r -> 'at') IS DISTINCT FROM 'number'
                   OR coalesce(jsonb_typeof(v_r -> 'cpu'), 'null') NOT IN ('number', 'null')
                   OR coalesce(jsonb_typeof(v_r -> 'memory'), 'null') NOT IN ('number', 'null')
                   OR coalesce(jsonb_typeof(v_r -> 'message'), 'string') <> 'string'
                   OR coalesce(jsonb_typeof(v_r -> 'healthy'), 'null') NOT IN ('boolean', 'null')
                THEN
                    RAISE EXCEPTION 'report % is not a task report', v_i
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                IF v_r ->> 'status' NOT IN ('running', 'failed', 'exited')
                   OR coalesce((v_r ->> 'cpu')::float8, 0) < 0
                   OR coalesce((v_r ->> 'memory')::float8, 0) < 0
                   OR length(coalesce(v_r ->> 'message', '')) > 1024
                THEN
                    RAISE EXCEPTION 'report %: a status running, failed or exited, cpu and '
                        'memory >= 0, a message of at most 1024 characters', v_i
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                IF (v_r ->> 'node') IS DISTINCT FROM v_me THEN
                    RAISE EXCEPTION 'store user % is the agent of node %, not of node %',
                        session_user, v_me, coalesce(v_r ->> 'node', '(none)')
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
            END LOOP;
            SELECT coalesce(array_agg(a.workload_id::text), '{}') INTO v_bound FROM assignments a
             WHERE a.cluster = p_cluster AND a.node = v_me
               AND a.workload_id IN (SELECT e ->> 'workload_id'
                                       FROM jsonb_array_elements(p_reports) e);
            SELECT coalesce(jsonb_object_agg(s.workload_id,
                                             jsonb_build_array(s.status, s.node, s.healthy)),
                            '{}')
              INTO v_states FROM report_state s
             WHERE s.cluster = p_cluster AND s.workload_id = ANY(v_bound);
            -- the decisions, in order (next_state)
            FOR v_r, v_i IN SELECT e, o FROM jsonb_array_elements(p_reports) WITH ORDINALITY x(e, o)
                            ORDER BY o
            LOOP
                v_w := v_r ->> 'workload_id';
                CONTINUE WHEN NOT (v_w = ANY(v_bound));
                v_st := v_r ->> 'status';
                v_h := (v_r ->> 'healthy')::boolean;
                CONTINUE WHEN v_st = 'running' AND v_h IS NULL
                    AND ((v_r ->> 'cpu') IS NOT NULL OR (v_r ->> 'memory') IS NOT NULL);
                v_prev := v_states -> v_w;
                CONTINUE WHEN v_prev IS NOT NULL AND v_prev ->> 0 = v_st
                    AND v_prev ->> 1 = v_me AND (v_prev ->> 2)::boolean IS NOT DISTINCT FROM v_h;
                v_states := v_states || jsonb_build_object(v_w, jsonb_build_array(v_st, v_me, v_h));
                v_changed := v_changed || v_w;
                v_decided := v_decided || v_i;
            END LOOP;
            v_n := coalesce(array_length(v_decided, 1), 0);
            IF v_n = 0 THEN
                -- usage samples only: no counter row lock, just a read
                SELECT c.report_seq INTO v_last FROM clusters c WHERE c.cluster = p_cluster;
                v_last := coalesce(v_last, 0);
            ELSE
                INSERT INTO clusters AS c (cluster, report_seq) VALUES (p_cluster, v_n)
                ON CONFLICT (cluster) DO UPDATE SET report_seq = c.report_seq + excluded.report_seq
                RETURNING c.report_seq INTO v_last;
                INSERT INTO reports (cluster, seq, workload_id, status, cpu, memory, at, message,
                                     node, healthy)
                SELECT p_cluster, v_last - v_n + d.k, e ->> 'workload_id', e ->> 'status',
                       (e ->> 'cpu')::float8, (e ->> 'memory')::float8, (e ->> 'at')::float8,
                       coalesce(e ->> 'message', ''), v_me, (e ->> 'healthy')::boolean
                  FROM unnest(v_decided) WITH ORDINALITY d(i, k),
                       LATERAL (SELECT p_reports -> (d.i - 1)::integer AS e) r;
                INSERT INTO report_state AS s (cluster, workload_id, status, node, healthy)
                SELECT p_cluster, x.w, v_states -> x.w ->> 0, v_states -> x.w ->> 1,
                       (v_states -> x.w ->> 2)::boolean
                  FROM (SELECT DISTINCT unnest(v_changed) AS w) x
                ON CONFLICT (cluster, workload_id) DO UPDATE SET status = excluded.status,
                   node = excluded.node, healthy = excluded.healthy;
            END IF;
            -- every report carrying usage, in order; ">=": the later of two reports with
            -- the same timestamp wins
            FOR v_r, v_i IN SELECT e, o FROM jsonb_array_elements(p_reports) WITH ORDINALITY x(e, o)
                            ORDER BY o
            LOOP
                v_w := v_r ->> 'workload_id';
                CONTINUE WHEN NOT (v_w = ANY(v_bound));
                CONTINUE WHEN (v_r ->> 'cpu') IS NULL AND (v_r ->> 'memory') IS NULL;
                v_seq := CASE WHEN v_i = ANY(v_decided)
                              THEN v_last - v_n + array_position(v_decided, v_i) ELSE 0 END;
                INSERT INTO latest_usage AS u (cluster, workload_id, seq, cpu, memory, at, status,
                                               message, node)
                VALUES (p_cluster, v_w, v_seq, (v_r ->> 'cpu')::float8,
                        (v_r ->> 'memory')::float8, (v_r ->> 'at')::float8, v_r ->> 'status',
                        coalesce(v_r ->> 'message', ''), v_me)
                ON CONFLICT (cluster, workload_id) DO UPDATE SET seq = excluded.seq,
                   cpu = excluded.cpu, memory = excluded.memory, at = excluded.at,
                   status = excluded.status, message = excluded.message, node = excluded.node
                WHERE excluded.at >= u.at;
            END LOOP;
            RETURN v_last;
        END $$"""

#: What an agent's role may execute (``GRANT EXECUTE ON FUNCTION`` names them so).
AGENT_FUNCTIONS: tuple[LiteralString, ...] = (
    "forge_agent_identity()",
    "forge_agent_heartbeat(text, text, double precision)",
    "forge_agent_nodes(text, text, integer)",
    "forge_agent_assignments(text, text, integer)",
    "forge_agent_job(text, text)",
    "forge_agent_report(text, jsonb)",
)

SQLITE_MIGRATIONS: tuple[tuple[LiteralString, ...], ...] = (
    # 1: the initial layout. Text keys use SQLite's BINARY collation, which orders
    # like Python's str comparison, so paging by id matches the memory store.
    (
        """CREATE TABLE clusters (
            cluster TEXT PRIMARY KEY,
            revision INTEGER NOT NULL DEFAULT 0,
            report_seq INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID""",
        """CREATE TABLE fences (
            cluster TEXT PRIMARY KEY,
            generation INTEGER,
            pass_no INTEGER,
            digest TEXT
        ) WITHOUT ROWID""",
        """CREATE TABLE jobs (
            cluster TEXT NOT NULL,
            job_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            spec TEXT,
            PRIMARY KEY (cluster, job_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX jobs_by_revision ON jobs (cluster, revision)",
        """CREATE TABLE assignments (
            cluster TEXT NOT NULL,
            workload_id TEXT NOT NULL,
            job TEXT NOT NULL,
            grp TEXT NOT NULL,
            ordinal INTEGER NOT NULL,
            node TEXT NOT NULL,
            gpu_ids TEXT NOT NULL,
            cpu INTEGER NOT NULL,
            memory INTEGER NOT NULL,
            status TEXT NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE nodes (
            cluster TEXT NOT NULL,
            id TEXT NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (cluster, id)
        ) WITHOUT ROWID""",
        """CREATE TABLE heartbeats (
            cluster TEXT NOT NULL,
            node_id TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (cluster, node_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE reports (
            cluster TEXT NOT NULL,
            seq INTEGER NOT NULL,
            workload_id TEXT NOT NULL,
            status TEXT NOT NULL,
            cpu REAL,
            memory REAL,
            at REAL NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (cluster, seq)
        )""",
        """CREATE TABLE latest_usage (
            cluster TEXT NOT NULL,
            workload_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            cpu REAL,
            memory REAL,
            at REAL NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        ) WITHOUT ROWID""",
    ),
    # 2: what the loop publishes each pass (summary, pending replicas and why), so
    # status reads the store instead of querying the workflow.
    (
        """CREATE TABLE loop_status (
            cluster TEXT PRIMARY KEY,
            doc TEXT NOT NULL
        ) WITHOUT ROWID""",
        # the node a task report is about: a failure reported for a replica that
        # has moved since (a replayed report) must not restart it where it is now
        "ALTER TABLE reports ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        # a shared GPU's milli-GPU (0: whole devices), so a reload holds the share
        "ALTER TABLE assignments ADD COLUMN gpu_milli INTEGER NOT NULL DEFAULT 0",
    ),
    # 3: rolling updates. The group version a binding runs, and every accepted
    # version of each group's task spec, numbered per group, with what it changed.
    (
        "ALTER TABLE assignments ADD COLUMN version TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE group_versions (
            cluster TEXT NOT NULL,
            job_id TEXT NOT NULL,
            grp TEXT NOT NULL,
            number INTEGER NOT NULL,
            version TEXT NOT NULL,
            revision INTEGER NOT NULL,
            changed TEXT NOT NULL,
            spec TEXT NOT NULL,
            PRIMARY KEY (cluster, job_id, grp, number)
        ) WITHOUT ROWID""",
    ),
    # 4: health checks. A running replica's check verdict as its agent reported it
    # (NULL: the report says nothing of health).
    ("ALTER TABLE reports ADD COLUMN healthy BOOLEAN",),
    # 5: wake for decisions, not for data. Each replica's last decision state
    # (status, node, health verdict: ``forge.stores.base.next_state``) so a report
    # that only repeats it, a usage sample, is not appended to ``reports`` and does
    # not move the sequence the watch follows; its usage still lands in
    # ``latest_usage``, which now keeps its status, message and node itself.
    # Existing rows are filled in from the reports they point at, and bound,
    # non-pending replicas start from their latest report.
    (
        """CREATE TABLE report_state (
            cluster TEXT NOT NULL,
            workload_id TEXT NOT NULL,
            status TEXT NOT NULL,
            node TEXT NOT NULL,
            healthy BOOLEAN,
            PRIMARY KEY (cluster, workload_id)
        ) WITHOUT ROWID""",
        "ALTER TABLE latest_usage ADD COLUMN status TEXT NOT NULL DEFAULT 'running'",
        "ALTER TABLE latest_usage ADD COLUMN message TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE latest_usage ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        _BACKFILL_USAGE,
        _BACKFILL_STATE,
    ),
    # 6: least privilege for agents is PostgreSQL-only (SQLite has no users: whoever
    # can open the file can write all of it), so nothing changes here; the step
    # exists so a version number means the same layout in both dialects.
    (),
)

POSTGRES_MIGRATIONS: tuple[tuple[LiteralString, ...], ...] = (
    # 1: the initial layout. Keys are COLLATE "C" so ORDER BY / ``> after`` paging
    # follows code-point order on every server, whatever its locale: the same
    # order as SQLite and the memory store (invariant 7 needs a stable order).
    (
        """CREATE TABLE clusters (
            cluster TEXT COLLATE "C" PRIMARY KEY,
            revision BIGINT NOT NULL DEFAULT 0,
            report_seq BIGINT NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE fences (
            cluster TEXT COLLATE "C" PRIMARY KEY,
            generation BIGINT,
            pass_no BIGINT,
            digest TEXT
        )""",
        """CREATE TABLE jobs (
            cluster TEXT COLLATE "C" NOT NULL,
            job_id TEXT COLLATE "C" NOT NULL,
            revision BIGINT NOT NULL,
            spec JSONB,
            PRIMARY KEY (cluster, job_id)
        )""",
        "CREATE INDEX jobs_by_revision ON jobs (cluster, revision)",
        """CREATE TABLE assignments (
            cluster TEXT COLLATE "C" NOT NULL,
            workload_id TEXT COLLATE "C" NOT NULL,
            job TEXT NOT NULL,
            grp TEXT NOT NULL,
            ordinal INTEGER NOT NULL,
            node TEXT NOT NULL,
            gpu_ids JSONB NOT NULL,
            cpu BIGINT NOT NULL,
            memory BIGINT NOT NULL,
            status TEXT NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        )""",
        """CREATE TABLE nodes (
            cluster TEXT COLLATE "C" NOT NULL,
            id TEXT COLLATE "C" NOT NULL,
            spec JSONB NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (cluster, id)
        )""",
        """CREATE TABLE heartbeats (
            cluster TEXT COLLATE "C" NOT NULL,
            node_id TEXT COLLATE "C" NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (cluster, node_id)
        )""",
        """CREATE TABLE reports (
            cluster TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL,
            workload_id TEXT NOT NULL,
            status TEXT NOT NULL,
            cpu DOUBLE PRECISION,
            memory DOUBLE PRECISION,
            at DOUBLE PRECISION NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (cluster, seq)
        )""",
        """CREATE TABLE latest_usage (
            cluster TEXT COLLATE "C" NOT NULL,
            workload_id TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL,
            cpu DOUBLE PRECISION,
            memory DOUBLE PRECISION,
            at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        )""",
    ),
    # 2: see the SQLite step
    (
        """CREATE TABLE loop_status (
            cluster TEXT COLLATE "C" PRIMARY KEY,
            doc TEXT NOT NULL
        )""",
        "ALTER TABLE reports ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE assignments ADD COLUMN gpu_milli INTEGER NOT NULL DEFAULT 0",
    ),
    # 3: see the SQLite step
    (
        "ALTER TABLE assignments ADD COLUMN version TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE group_versions (
            cluster TEXT COLLATE "C" NOT NULL,
            job_id TEXT COLLATE "C" NOT NULL,
            grp TEXT COLLATE "C" NOT NULL,
            number INTEGER NOT NULL,
            version TEXT NOT NULL,
            revision BIGINT NOT NULL,
            changed TEXT NOT NULL,
            spec JSONB NOT NULL,
            PRIMARY KEY (cluster, job_id, grp, number)
        )""",
    ),
    # 4: see the SQLite step
    ("ALTER TABLE reports ADD COLUMN healthy BOOLEAN",),
    # 5: see the SQLite step
    (
        """CREATE TABLE report_state (
            cluster TEXT COLLATE "C" NOT NULL,
            workload_id TEXT COLLATE "C" NOT NULL,
            status TEXT NOT NULL,
            node TEXT NOT NULL,
            healthy BOOLEAN,
            PRIMARY KEY (cluster, workload_id)
        )""",
        "ALTER TABLE latest_usage ADD COLUMN status TEXT NOT NULL DEFAULT 'running'",
        "ALTER TABLE latest_usage ADD COLUMN message TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE latest_usage ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        _BACKFILL_USAGE,
        _BACKFILL_STATE,
    ),
    # 6: agents' roles and the functions they may call (see above ``_AGENT_ROLES``)
    (
        _AGENT_ROLES,
        _PIN_SEARCH_PATH,
        _AGENT_IDENTITY,
        _AGENT_NODE,
        _AGENT_HEARTBEAT,
        _AGENT_NODES,
        _AGENT_ASSIGNMENTS,
        _AGENT_JOB,
        _AGENT_REPORT,
        "REVOKE ALL ON FUNCTION forge_agent_identity(), forge_agent_node(text),"
        " forge_agent_heartbeat(text, text, double precision),"
        " forge_agent_nodes(text, text, integer), forge_agent_assignments(text, text, integer),"
        " forge_agent_job(text, text), forge_agent_report(text, jsonb) FROM PUBLIC",
    ),
)

assert len(SQLITE_MIGRATIONS) == len(POSTGRES_MIGRATIONS), "dialects must stay in step"

#: The schema version this code writes and expects.
LATEST_VERSION = len(SQLITE_MIGRATIONS)


def _too_new(version: int) -> StoreError:
    return StoreError(
        f"the database schema is at version {version}, newer than this Forge knows "
        f"({LATEST_VERSION}): upgrade Forge before pointing it at this database"
    )


def _migrate_sqlite(conn: sqlite3.Connection) -> int:
    # BEGIN IMMEDIATE takes the write lock before we read the version, so two
    # processes starting together cannot both decide to apply step 1.
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version INTEGER PRIMARY KEY,"
            " applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
        )
        row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
        current = int(row[0])
        if current > LATEST_VERSION:
            raise _too_new(current)
        for version in range(current + 1, LATEST_VERSION + 1):
            for statement in SQLITE_MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return LATEST_VERSION


def _migrate_postgres(conn: psycopg.Connection[Any], schema: str | None) -> int:
    from psycopg import sql

    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK_KEY,))
        if schema is not None:
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        cur.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version INTEGER PRIMARY KEY,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        cur.execute("SELECT coalesce(max(version), 0) FROM schema_version")
        row = cur.fetchone()
        current = int(row[0]) if row is not None else 0
        if current > LATEST_VERSION:
            raise _too_new(current)
        for version in range(current + 1, LATEST_VERSION + 1):
            for statement in POSTGRES_MIGRATIONS[version - 1]:
                cur.execute(statement)
            cur.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
    return LATEST_VERSION


def migrate(
    conn: sqlite3.Connection | psycopg.Connection[Any], *, schema: str | None = None
) -> int:
    """Bring the schema behind ``conn`` to ``LATEST_VERSION``; returns it.

    Idempotent and safe to run from several processes at once. ``schema``
    (PostgreSQL only) is created first if missing; the caller's ``search_path``
    must already point at it. A database newer than this code is refused with
    ``StoreError`` rather than written with an old layout.
    """
    if isinstance(conn, sqlite3.Connection):
        if schema is not None:
            raise ValueError("SQLite has no schemas")
        if conn.in_transaction:
            raise StoreError("migrate() needs a connection outside a transaction")
        return _migrate_sqlite(conn)
    if schema is not None and not re.match(SCHEMA_NAME_PATTERN, schema):
        raise ValueError(f"invalid schema name {schema!r}")
    return _migrate_postgres(conn, schema)
