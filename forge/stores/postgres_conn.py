"""Connecting to the PostgreSQL store: the store URL, one connection, a pool.

Shared by the worker's store (``forge.stores.postgres``) and an agent's
(``forge.stores.postgres_agent``).

Connections: a small bounded pool written here (``psycopg_pool`` is not a
dependency). Activities run in a thread pool; each call borrows a connection for
its duration, so concurrent activities run concurrent transactions instead of
queueing behind one lock, and the number of server connections stays bounded
however many threads the worker has. Connections run in autocommit mode and every
write is an explicit ``conn.transaction()`` block, so no transaction is ever left
open between calls; a connection that comes back broken or mid-transaction is
discarded rather than reused.

Schema: ``?schema=NAME`` in the URL selects (and, when migrating, creates) a
schema by setting the connection's ``search_path``; ``options=-csearch_path=...``
works too, but then the schema must already exist.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from forge.stores.base import StoreError
from forge.stores.migrations import SCHEMA_NAME_PATTERN

__all__ = ["Connection", "Cursor", "Pool", "connect_postgres", "parse_postgres_url"]

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


class Pool:
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
