"""Per-node PostgreSQL roles for node agents (``forge store grant-agent`` and
``revoke-agent``).

Why a role per node: the store's own user can rewrite every job, binding and node,
so an agent holding it makes each machine a key to the whole cluster. An agent's
role instead holds no table privilege at all, only EXECUTE on the agent functions of
migration step 6, which work out the node from the login (``session_user``) through
``agent_roles``: it can heartbeat and report for its node and read its node, its
bindings and the groups of their jobs, nothing else. Least privilege is
PostgreSQL-only: SQLite has no users.

The role's name is derived from the database, schema, cluster and node (a readable
part and a hash, within PostgreSQL's 63 bytes), because roles are shared by every
database of a server: two stores on one server never share an agent role. The name
itself grants nothing; the ``agent_roles`` row does.

Granting needs the store's owner (the worker's user, which owns the functions) with
CREATEROLE, or a superuser. The password is random, sent to the server only as the
verifier libpq computes (``PQencryptPasswordConn``), so neither the server's log nor
``pg_stat_activity`` ever holds it, and returned once, in the agent's store URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from forge.core.models import is_valid_name
from forge.stores.agent_sql import AGENT_FUNCTIONS
from forge.stores.base import StoreError
from forge.stores.migrations import migrate
from forge.stores.postgres_conn import connect_postgres

__all__ = ["AgentGrant", "agent_role_name", "agent_url", "grant_agent", "revoke_agent"]

#: Key of the advisory lock that serialises grants and revokes ("FAgt").
_LOCK_KEY = 0x46416774
#: Connections one agent's role may hold: its store keeps two; the rest is room for
#: a restart while the old connections are still being torn down. A bound, so one
#: compromised machine cannot take every connection the server has.
CONNECTION_LIMIT = 10
#: A session of the role left idle inside a transaction is ended: the agent itself
#: never opens one (each call is one statement), and one held open would hold the
#: counter row its reports share with job writes. A default the role could change
#: in its own session, so a guard against a broken client, not an attacker.
IDLE_IN_TRANSACTION = "10s"
_PREFIX = "forge_agent_"


@dataclass(frozen=True)
class AgentGrant:
    """What ``grant_agent`` did: the role, whether it was new (else its password
    was replaced), and the store URL to give the agent (with the new password)."""

    role: str
    created: bool
    url: str

    def __repr__(self) -> str:  # the URL holds the password
        return f"AgentGrant(role={self.role!r}, created={self.created})"


def agent_role_name(database: str, schema: str, cluster: str, node_id: str) -> str:
    """``forge_agent_<node, readable>_<hash>``: unique per database, schema, cluster
    and node, at most 55 bytes, lower case (no quoting surprises in psql)."""
    slug = re.sub(r"[^a-z0-9]+", "_", node_id.lower()).strip("_")[:32]
    digest = hashlib.sha256("\0".join((database, schema, cluster, node_id)).encode())
    return f"{_PREFIX}{slug}_{digest.hexdigest()[:10]}"


def agent_url(url: str, role: str, password: str | None) -> str:
    """``url`` (the store owner's) with the agent's user and password instead:
    host, port, database, schema and TLS parameters stay as they are."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    auth = quote(role, safe="") + (f":{quote(password, safe='')}" if password else "")
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    query = [(k, v) for k, v in query if k not in ("user", "password")]
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}", query=urlencode(query)))


def _check_names(cluster: str, node_id: str) -> None:
    for what, value in (("cluster", cluster), ("node id", node_id)):
        if not is_valid_name(value):
            raise ValueError(f"{what} {value!r}: must be 1-63 of A-Z a-z 0-9 . _ -")


def _owner_error(err: psycopg.errors.InsufficientPrivilege) -> StoreError:
    return StoreError(
        "granting or revoking an agent's role needs the store's owner (the worker's "
        f"user) with CREATEROLE, or a superuser: {err}"
    )


def grant_agent(url: str, cluster: str, node_id: str, *, password: bool = True) -> AgentGrant:
    """Create (or refresh) the role of node ``node_id``'s agent in ``cluster`` for
    the store at ``url`` (a ``postgresql://`` URL of the store's owner); returns the
    URL the agent should use. Migrates the store first (the functions must exist).

    Run again, it replaces the password (a rotation: the old URL stops working) and
    re-applies the grants. ``password=False`` leaves the role without one, for
    servers that authenticate agents otherwise (client certificates, GSSAPI).
    Refuses, with nothing changed, when the role would get more than the agent
    functions through PUBLIC (CREATE on the schema, any right on a store table):
    an agent could then write what the role scheme keeps from it.
    """
    _check_names(cluster, node_id)
    conn, schema = connect_postgres(url)
    try:
        migrate(conn, schema=schema)
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            role, database, current, exists = _agent_role(cur, cluster, node_id)
            secret = _login(conn, cur, role, exists, password)
            _grant(cur, role, database, current)
            _refuse_wider_rights(cur, role, current)
            cur.execute(
                "INSERT INTO agent_roles (role_name, cluster, node_id) VALUES (%s, %s, %s)"
                " ON CONFLICT (role_name) DO NOTHING",
                (role, cluster, node_id),
            )
    except psycopg.errors.InsufficientPrivilege as err:
        raise _owner_error(err) from None
    finally:
        conn.close()
    return AgentGrant(role=role, created=not exists, url=agent_url(url, role, secret))


def _agent_role(cur: psycopg.Cursor[Any], cluster: str, node_id: str) -> tuple[str, str, str, bool]:
    """Step 1 of a grant: the node's role name (the one recorded, else a new one),
    the database and schema, and whether the role exists. Refuses a role of that
    name that this store did not create: it may be anyone's."""
    cur.execute("SELECT current_database(), current_schema()")
    database, current = (str(v) for v in _fetch(cur))
    cur.execute(
        "SELECT role_name FROM agent_roles WHERE cluster = %s AND node_id = %s",
        (cluster, node_id),
    )
    row = cur.fetchone()
    role = str(row[0]) if row else agent_role_name(database, current, cluster, node_id)
    cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
    exists = cur.fetchone() is not None
    if exists and row is None:
        raise StoreError(
            f"a role {role} exists but is no agent of this store: drop it, or "
            "grant from the store it belongs to"
        )
    return role, database, current, exists


def _login(
    conn: psycopg.Connection[Any],
    cur: psycopg.Cursor[Any],
    role: str,
    exists: bool,
    password: bool,
) -> str | None:
    """Step 2: the role as a login without privileges (created if new), a fresh
    password (or none), and a short idle-in-transaction timeout; returns the
    password."""
    ident = sql.Identifier(role)
    if not exists:
        cur.execute(
            sql.SQL(
                "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT"
                " NOREPLICATION NOBYPASSRLS CONNECTION LIMIT {}"
            ).format(ident, sql.Literal(CONNECTION_LIMIT))
        )
    secret = secrets.token_urlsafe(24) if password else None
    if secret is not None:
        verifier = conn.pgconn.encrypt_password(secret.encode(), role.encode())
        cur.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(ident, sql.Literal(verifier.decode()))
        )
    else:
        cur.execute(sql.SQL("ALTER ROLE {} PASSWORD NULL").format(ident))
    cur.execute(
        sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout = {}").format(
            ident, sql.Literal(IDLE_IN_TRANSACTION)
        )
    )
    return secret


def _grant(cur: psycopg.Cursor[Any], role: str, database: str, schema: str) -> None:
    """Step 3: what the role may do: connect, see the schema, run the agent
    functions (and nothing else: the tables stay out of its reach)."""
    ident = sql.Identifier(role)
    # Only where PUBLIC may not connect (the default lets every role): a grant
    # on the database is one more thing a revoke by another user must undo.
    cur.execute("SELECT has_database_privilege('public', current_database(), 'CONNECT')")
    if not _fetch(cur)[0]:
        cur.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), ident)
        )
    cur.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), ident))
    cur.execute(
        sql.SQL("GRANT EXECUTE ON FUNCTION " + ", ".join(AGENT_FUNCTIONS) + " TO {}").format(ident)
    )


def _refuse_wider_rights(cur: psycopg.Cursor[Any], role: str, schema: str) -> None:
    """Raise (rolling the grant back) if ``role`` can do more in ``schema`` than the
    agent functions: rights it holds through PUBLIC or a default privilege."""
    cur.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'v', 'm', 'p', 'f')"
        " AND (has_table_privilege(%s, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')"
        "  OR has_any_column_privilege(%s, c.oid, 'SELECT, INSERT, UPDATE'))"
        " ORDER BY 1",
        (schema, role, role),
    )
    tables = [str(name) for (name,) in cur.fetchall()]
    cur.execute("SELECT has_schema_privilege(%s, %s, 'CREATE')", (role, schema))
    create = bool(_fetch(cur)[0])
    cur.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.oid::regprocedure::text <> ALL(%s)"
        " AND has_function_privilege(%s, p.oid, 'EXECUTE') ORDER BY 1",
        # regprocedure spells argument lists without a space after the comma
        (schema, [f.replace(", ", ",") for f in AGENT_FUNCTIONS], role),
    )
    functions = [str(name) for (name,) in cur.fetchall()]
    if not (tables or create or functions):
        return
    what = [f"table {t}" for t in tables] + [f"function {f}" for f in functions]
    if create:
        what.insert(0, "CREATE on the schema")
    raise StoreError(
        f"an agent's role would hold more than the agent functions in schema {schema} "
        f"(through PUBLIC or default privileges): {', '.join(what)}; revoke those from "
        "PUBLIC, then grant again"
    )


def revoke_agent(url: str, cluster: str, node_id: str) -> str | None:
    """Drop the role of node ``node_id``'s agent in ``cluster``; returns its name, or
    None when the node has none. From the commit on, every agent function refuses
    the role (its ``agent_roles`` row is gone) and it can no longer log in; its open
    sessions are ended where the caller may signal them."""
    _check_names(cluster, node_id)
    conn, schema = connect_postgres(url)
    try:
        migrate(conn, schema=schema)
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            cur.execute(
                "DELETE FROM agent_roles WHERE cluster = %s AND node_id = %s RETURNING role_name",
                (cluster, node_id),
            )
            row = cur.fetchone()
            if row is None:
                return None
            role = str(row[0])
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            if cur.fetchone() is not None:
                _drop_role(cur, role)
        # not allowed to signal them: they can call nothing any more anyway
        with contextlib.suppress(psycopg.Error):
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
        return role
    except psycopg.errors.InsufficientPrivilege as err:
        raise _owner_error(err) from None
    finally:
        conn.close()


def _drop_role(cur: psycopg.Cursor[Any], role: str) -> None:
    """Take back what ``grant_agent`` gave ``role``, then drop it. Revoked one by one,
    not with ``DROP OWNED BY``: that needs the role's own privileges, which the
    store's owner (CREATEROLE, not a superuser) does not hold."""
    ident = sql.Identifier(role)
    cur.execute("SELECT current_database(), current_schema()")
    database, schema = (str(v) for v in _fetch(cur))
    cur.execute(
        sql.SQL("REVOKE ALL ON FUNCTION " + ", ".join(AGENT_FUNCTIONS) + " FROM {}").format(ident)
    )
    cur.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(sql.Identifier(schema), ident))
    cur.execute(
        sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(sql.Identifier(database), ident)
    )
    try:
        with cur.connection.transaction():  # a savepoint: the error below, not an abort
            cur.execute(sql.SQL("DROP ROLE {}").format(ident))
    except psycopg.errors.DependentObjectsStillExist as err:
        detail = " ".join((err.diag.message_detail or str(err)).split())
        raise StoreError(
            f"role {role} still holds rights this user did not grant ({detail}): revoke "
            f"as the user who granted them, or DROP OWNED BY {role} as a superuser"
        ) from None


def _fetch(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    row = cur.fetchone()
    if row is None:
        raise StoreError("expected a row")
    return tuple(row)
