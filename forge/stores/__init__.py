"""Where Forge keeps jobs, bindings, heartbeats and task reports.

``open_store(url)`` turns a ``FORGE_STORE`` setting into a ``Store``:

- ``memory://`` — in-process, for tests (a fresh, empty store on every call);
- ``sqlite:///abs/path.db`` or ``sqlite:relative.db`` — the default, one file;
- ``postgresql://...`` or ``postgres://...`` — optionally ``?schema=NAME``.

``open_agent_store(url, cluster, node)`` is what a node agent opens: on PostgreSQL,
logged in with the role ``forge store grant-agent`` made for its node, a store that
can only heartbeat, report and read that node's bindings (least privilege is
PostgreSQL-only: a SQLite file has no users, whoever opens it writes all of it).

The PostgreSQL store is imported only when asked for, so SQLite users never load
psycopg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from forge.stores.base import (
    AgentStore,
    ApplyResult,
    Delta,
    Fence,
    JobChange,
    JobPage,
    StaleFenceError,
    Store,
    StoreError,
    TaskReport,
    delta_digest,
)

if TYPE_CHECKING:
    from forge.stores.memory import MemoryStore
    from forge.stores.sqlite import SqliteStore, sqlite_path

# The backends load on first use: the workflow imports the row types above through
# the activity contract, and must not drag sqlite3 or the migrations in with them.
_LAZY = {
    "MemoryStore": "forge.stores.memory",
    "SqliteStore": "forge.stores.sqlite",
    "sqlite_path": "forge.stores.sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forge.stores' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AgentStore",
    "ApplyResult",
    "Delta",
    "Fence",
    "JobChange",
    "JobPage",
    "MemoryStore",
    "SqliteStore",
    "StaleFenceError",
    "Store",
    "StoreError",
    "TaskReport",
    "delta_digest",
    "migrate_url",
    "open_agent_store",
    "open_store",
    "sqlite_path",
    "store_kind",
]

StoreKind = Literal["memory", "sqlite", "postgres"]


def store_kind(url: str) -> StoreKind:
    """Which backend a ``FORGE_STORE`` URL names; ``ValueError`` if none."""
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme == "memory":
        return "memory"
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgres"
    raise ValueError(
        f"FORGE_STORE={url!r} is not a store URL: use memory://, sqlite:///abs/path.db, "
        "sqlite:relative.db or postgresql://user@host/db[?schema=NAME]"
    )


def open_store(url: str) -> Store:
    """Open (creating and migrating as needed) the store a ``FORGE_STORE`` URL names."""
    kind = store_kind(url)
    if kind == "memory":
        from forge.stores.memory import MemoryStore

        return MemoryStore()
    if kind == "sqlite":
        from forge.stores.sqlite import SqliteStore, sqlite_path

        return SqliteStore(sqlite_path(url))  # creates the parent directories
    from forge.stores.postgres import PostgresStore

    return PostgresStore(url)


def open_agent_store(url: str, cluster: str, node_id: str) -> AgentStore:
    """The store a node agent opens. On PostgreSQL with an agent's role: the
    least-privilege store (no migration: the role may not), after checking that the
    role is this node's of this cluster (``AgentRoleError`` otherwise). With any other
    user, and on SQLite or memory: the ordinary store, as ``open_store``."""
    if store_kind(url) == "postgres":
        from forge.stores.postgres_agent import open_as_agent

        agent = open_as_agent(url, cluster, node_id)
        if agent is not None:
            return agent
    return open_store(url)


def migrate_url(url: str) -> int:
    """Migrate the store at ``url`` (a ``FORGE_STORE`` value); returns the version.

    Here rather than in ``migrations`` so that module stays a leaf the backends
    import, never one that imports them back. The memory store has no schema and
    reports version 0.
    """
    kind = store_kind(url)
    if kind == "memory":
        return 0
    if kind == "sqlite":
        from forge.stores.sqlite import SqliteStore, sqlite_path

        store = SqliteStore(sqlite_path(url))  # migrates on open
        try:
            return store.schema_version
        finally:
            store.close()
    from forge.stores.migrations import migrate
    from forge.stores.postgres_conn import connect_postgres

    conn, schema = connect_postgres(url)
    try:
        return migrate(conn, schema=schema)
    finally:
        conn.close()
