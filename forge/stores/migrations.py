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

The steps themselves (the DDL) are in :mod:`forge.stores.migration_steps`.
"""

from __future__ import annotations

import re
import sqlite3
from typing import TYPE_CHECKING, Any

from forge.stores.agent_sql import AGENT_FUNCTIONS
from forge.stores.base import StoreError
from forge.stores.migration_steps import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS

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
