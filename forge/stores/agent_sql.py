"""Step 6 of the PostgreSQL migrations: least privilege for node agents.

An agent logs in as a role of its own (``forge store grant-agent``,
``forge.stores.agent_roles``) that holds no table privilege at all, only EXECUTE on
the functions created here (``AGENT_FUNCTIONS``). They run as the store's owner
(SECURITY DEFINER) and take the agent's node from the login; the comments below say
how. ``PostgresAgentStore`` (``forge.stores.postgres_agent``) calls them.

A leaf like ``forge.stores.migrations``, which lists ``AGENT_STEP`` as step 6: the
SQL text only, no connection, no import of the stores. A released step is never
edited: a change to these functions is a new migration step.
"""

from __future__ import annotations

from typing import LiteralString

__all__ = ["AGENT_FUNCTIONS", "AGENT_STEP", "EXIT_CODE_STEP", "GPU_USAGE_STEP"]

# Who is calling: the agent's role holds no table privilege, so everything goes
# through these functions, which take the agent's identity from ``session_user``,
# the authenticated login, which a session cannot change (SET ROLE changes
# ``current_user`` only, and an agent's role is a member of no other role), looked
# up in ``agent_roles``, which only the owner writes. The node never comes from an
# argument the agent could choose: an argument naming another node is refused, not
# obeyed.
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
# ``Store.report`` for an agent: ``forge.stores.sql_writes.write_reports`` in SQL, in one
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

#: Step 6: agents' roles and the functions they may call, EXECUTE revoked from PUBLIC
#: (grant-agent grants it per role). ``forge_agent_node`` is internal: no role gets it.
AGENT_STEP: tuple[LiteralString, ...] = (
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
)


def _edited(text: LiteralString, *edits: tuple[LiteralString, LiteralString]) -> LiteralString:
    """``text`` with each ``(old, new)`` applied, each ``old`` found exactly once (a
    step derived from a released one changes exactly what it says it changes)."""
    for old, new in edits:
        if text.count(old) != 1:
            raise AssertionError(f"expected one {old!r} in the released function")
        text = text.replace(old, new)
    return text


_EXIT: LiteralString = "coalesce((v_r ->> 'exit_code')::numeric, 0)"

# Step 8's report function: step 6's, also checking and keeping a report's
# ``exit_code`` (an integer -255..255 or absent, as ``TaskReport`` checks it).
# Derived from the released text rather than copied, so the two cannot drift apart
# anywhere but here; CREATE OR REPLACE keeps the roles' EXECUTE grants.
_REPORT_WITH_EXIT: LiteralString = _edited(
    _AGENT_REPORT,
    ("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"),
    (
        "NOT IN ('boolean', 'null')\n",
        "NOT IN ('boolean', 'null')\n"
        "                   OR coalesce(jsonb_typeof(v_r -> 'exit_code'), 'null')"
        " NOT IN ('number', 'null')\n",
    ),
    (
        "OR length(coalesce(v_r ->> 'message', '')) > 1024\n",
        "OR length(coalesce(v_r ->> 'message', '')) > 1024\n"
        f"                   OR abs({_EXIT}) > 255 OR {_EXIT} <> trunc({_EXIT})\n",
    ),
    (
        "a message of at most 1024 characters', v_i",
        "a message of at most 1024 characters, an '\n"
        "                        'integer exit_code of -255..255', v_i",
    ),
    (
        "node, healthy)\n                SELECT p_cluster, v_last",
        "node, healthy, exit_code)\n                SELECT p_cluster, v_last",
    ),
    (
        "v_me, (e ->> 'healthy')::boolean\n",
        "v_me, (e ->> 'healthy')::boolean,\n"
        "                       (e ->> 'exit_code')::numeric::integer\n",
    ),
)

#: Step 8: a report's exit status, kept with it (batch jobs' ``fail_on_exit``).
EXIT_CODE_STEP: tuple[LiteralString, ...] = (
    "ALTER TABLE reports ADD COLUMN exit_code INTEGER",
    _PIN_SEARCH_PATH,
    _REPORT_WITH_EXIT,
)

# Step 9's report function: step 8's, also checking a report's ``gpu`` (a number >= 0
# or absent) and keeping it with the replica's latest usage sample.
_REPORT_WITH_GPU: LiteralString = _edited(
    _REPORT_WITH_EXIT,
    (
        "OR coalesce(jsonb_typeof(v_r -> 'memory'), 'null') NOT IN ('number', 'null')\n",
        "OR coalesce(jsonb_typeof(v_r -> 'memory'), 'null') NOT IN ('number', 'null')\n"
        "                   OR coalesce(jsonb_typeof(v_r -> 'gpu'), 'null')"
        " NOT IN ('number', 'null')\n",
    ),
    (
        "OR coalesce((v_r ->> 'memory')::float8, 0) < 0\n",
        "OR coalesce((v_r ->> 'memory')::float8, 0) < 0\n"
        "                   OR coalesce((v_r ->> 'gpu')::float8, 0) < 0\n",
    ),
    ("'memory >= 0,", "'memory and gpu >= 0,"),
    ("seq, cpu, memory, at, status,", "seq, cpu, memory, gpu, at, status,"),
    (
        "(v_r ->> 'memory')::float8, (v_r ->> 'at')::float8,",
        "(v_r ->> 'memory')::float8, (v_r ->> 'gpu')::float8, (v_r ->> 'at')::float8,",
    ),
    (
        "memory = excluded.memory, at = excluded.at,",
        "memory = excluded.memory, gpu = excluded.gpu,\n                   at = excluded.at,",
    ),
)

#: Step 9: a usage sample's GPU utilisation, kept by the agents' report function too.
GPU_USAGE_STEP: tuple[LiteralString, ...] = (
    "ALTER TABLE latest_usage ADD COLUMN gpu DOUBLE PRECISION",
    _PIN_SEARCH_PATH,
    _REPORT_WITH_GPU,
)
