"""Helpers of the agent-role tests: what a role holds, what its password is, and
the clean-up a test that granted roles needs (roles belong to the server, not to
the schema a test drops)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import sql

from forge.stores.postgres_conn import connect_postgres, parse_postgres_url

__all__ = [
    "agent_connection",
    "drop_agent_roles",
    "role_row",
    "scram_matches",
    "url_password",
    "url_user",
]


def agent_connection(url: str) -> psycopg.Connection[Any]:
    """A raw autocommit connection logged in as the URL's user (an agent's role):
    to try what the role may do without the store class in between."""
    conninfo, _ = parse_postgres_url(url)
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=5)


def url_user(url: str) -> str:
    return unquote(urlsplit(url).username or "")


def url_password(url: str) -> str | None:
    password = urlsplit(url).password
    return unquote(password) if password is not None else None


def role_row(owner_url: str, role: str) -> dict[str, Any] | None:
    """The role's ``pg_authid`` row (the password verifier needs a superuser to read,
    which the test server's ``postgres`` is), with its memberships."""
    conn, _ = connect_postgres(owner_url)
    with conn:
        cur = conn.execute(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolinherit,"
            " rolreplication, rolbypassrls, rolconnlimit, rolpassword,"
            " (SELECT r.rolconfig FROM pg_roles r WHERE r.oid = a.oid),"
            " (SELECT count(*) FROM pg_auth_members m WHERE m.member = a.oid)"
            " FROM pg_authid a WHERE rolname = %s",
            (role,),
        )
        row = cur.fetchone()
    if row is None:
        return None
    keys = (
        "login",
        "super",
        "createrole",
        "createdb",
        "inherit",
        "replication",
        "bypassrls",
        "connlimit",
        "password",
        "config",
        "memberships",
    )
    return dict(zip(keys, row, strict=True))


def scram_matches(verifier: str, password: str) -> bool:
    """Whether ``password`` is the one a ``SCRAM-SHA-256$iter:salt$stored:server``
    verifier was made from (RFC 5802's StoredKey and ServerKey, as PostgreSQL keeps
    them): the test server trusts every login, so this is how a test tells which
    password a role has."""
    method, _, rest = verifier.partition("$")
    if method != "SCRAM-SHA-256":
        return False
    params, keys = rest.split("$")
    iterations, salt = params.split(":")
    stored, server = (base64.b64decode(k) for k in keys.split(":"))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(salt), int(iterations)
    )
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    return hashlib.sha256(client_key).digest() == stored and (
        hmac.digest(salted, b"Server Key", "sha256") == server
    )


def drop_agent_roles(owner_url: str) -> list[str]:
    """Drop every agent role of the store at ``owner_url`` (its ``agent_roles`` rows,
    if the schema got that far), ending their sessions first; returns their names.
    For a test's teardown, before its schema goes: a role outlives any schema."""
    conn, _ = connect_postgres(owner_url)
    with conn:
        try:
            roles = [str(r) for (r,) in conn.execute("SELECT role_name FROM agent_roles")]
        except psycopg.errors.UndefinedTable:
            return []
        # and any role still granted the schema without a row (a revoke that failed)
        granted = conn.execute(
            "SELECT DISTINCT r.rolname FROM pg_namespace n, aclexplode(n.nspacl) a"
            " JOIN pg_roles r ON r.oid = a.grantee"
            " WHERE n.nspname = current_schema() AND r.rolname LIKE 'forge\\_agent\\_%%'"
        )
        roles += sorted({str(r) for (r,) in granted} - set(roles))
        for role in roles:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            if exists.fetchone() is None:
                continue
            ident = sql.Identifier(role)
            with contextlib.suppress(psycopg.errors.UndefinedObject):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
                conn.execute(sql.SQL("DROP ROLE {}").format(ident))
    return roles
