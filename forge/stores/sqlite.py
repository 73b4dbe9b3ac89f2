"""The default store: one SQLite file in WAL mode.

Threading: **one connection per thread**, created lazily. Activities run in a
thread pool; with a connection each, WAL lets any number of readers (loading job
changes, paging assignments) proceed while one thread writes a big persist, which
a single lock-protected connection would serialise behind it. Writers queue on
SQLite's own write lock (``BEGIN IMMEDIATE`` + ``busy_timeout``), which is the same
mechanism that serialises several worker *processes* sharing the file, so there is
one locking story, not two. Connections are opened with ``check_same_thread=False``
only so ``close()`` (and the clean-up when a pool thread exits) may close them from
another thread; each is otherwise used by its own thread alone.

Durability: ``synchronous=FULL``. The store is the system of record for what the
workflow persisted (invariant 6); NORMAL could lose the last committed pass on a
power cut while the workflow believes it persisted. One fsync per pass is cheap
because a whole pass is one transaction.

Every write is one transaction started with ``BEGIN IMMEDIATE``: it takes the write
lock up front, so the fence read in ``apply_delta`` and the writes it guards cannot
interleave with another writer (a deferred transaction could read, then fail to
upgrade its lock, or worse, decide on a stale fence).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, LiteralString

from forge.core.models import Assignment, Job
from forge.stores.base import (
    ApplyResult,
    Delta,
    Fence,
    StoreError,
    TaskReport,
    check_fence,
    delta_digest,
)
from forge.stores.migrations import migrate
from forge.stores.sql import (
    ASSIGNMENT_UPSERT_SET,
    SqlReads,
    forget_states,
    gpu_ids_json,
    write_completions,
    write_jobs,
    write_nodes,
    write_queues,
    write_reports,
    write_status,
)

__all__ = ["SqliteStore", "sqlite_path"]


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:`` URL: ``sqlite:///abs/path.db`` or ``sqlite:rel.db``.

    ``sqlite://rel.db`` is read as relative too. In-memory databases are refused:
    each thread has its own connection, so each would see a different database
    (use ``memory://`` instead).
    """
    if not url.startswith("sqlite:"):
        raise ValueError(f"not a sqlite URL: {url!r}")
    path = url[len("sqlite:") :]
    if path.startswith("//"):
        path = path[2:]
    path = path.split("?", 1)[0]
    if not path or path == ":memory:":
        raise ValueError(
            f"{url!r} names no database file; use sqlite:///abs/path.db, "
            "sqlite:relative.db, or memory:// for an in-process store"
        )
    return os.path.expanduser(path)


class _Handle:
    """Owns one thread's connection; lives in a ``threading.local`` so it dies with
    the thread, and its finalizer then closes the connection."""

    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


def _assignment_row(cluster: str, a: Assignment) -> tuple[Any, ...]:
    return (
        cluster,
        a.workload_id,
        a.job,
        a.group,
        a.ordinal,
        a.node,
        gpu_ids_json(a),
        a.cpu,
        a.memory,
        a.status.value,
        a.gpu_milli,
        a.version,
    )


class SqliteStore(SqlReads):
    """The ``Store`` protocol over one SQLite file; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        """Open (creating it and its directory if needed) and migrate ``path``.

        ``timeout`` is the busy timeout in seconds: how long a writer waits for
        another thread or process holding the write lock before failing (with a
        retryable ``sqlite3.OperationalError``).
        """
        raw = os.fspath(path)
        if not raw or raw == ":memory:" or raw.startswith("file:"):
            raise ValueError(f"SqliteStore needs a file path, got {raw!r}")
        self.path = os.path.abspath(raw)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._timeout = timeout
        self._local = threading.local()
        self._handles: weakref.WeakSet[_Handle] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self.schema_version = migrate(self._conn())

    DIALECT = "sqlite"

    def _one(self, query: LiteralString, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._conn().execute(query, params).fetchone()
        return row

    def _all(self, query: LiteralString, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self._conn().execute(query, params).fetchall()

    # -- connections and transactions ----------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        handle: _Handle | None = getattr(self._local, "handle", None)
        if handle is not None and not self._closed:
            return handle.conn
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.path} is closed")
            conn = sqlite3.connect(
                self.path,
                timeout=self._timeout,
                isolation_level=None,  # we issue BEGIN / COMMIT ourselves
                check_same_thread=False,
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
                self._enable_wal(conn)
                conn.execute("PRAGMA synchronous = FULL")
            except BaseException:
                conn.close()
                raise
            handle = _Handle(conn)
            weakref.finalize(handle, conn.close)
            self._handles.add(handle)
            self._local.handle = handle
            return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (a persistent, once-per-file change), retrying.

        Converting a fresh file needs an exclusive lock, and SQLite reports
        ``SQLITE_BUSY`` for it at once instead of calling the busy handler, so
        several workers opening a new file together would fail without this loop.
        """
        deadline = time.monotonic() + self._timeout
        delay = 0.001
        while True:
            try:
                (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
                break
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() >= deadline:
                    raise
                time.sleep(delay)  # back off: another connection holds the lock
                delay = min(delay * 2, 0.05)
        if str(mode).lower() != "wal":
            raise StoreError(
                f"cannot use WAL on {self.path} (journal_mode={mode}); "
                "is it on a filesystem without shared-memory support?"
            )

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:  # (BEGIN inside: an exception raised in this thread right after it rolls back)
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # -- jobs ----------------------------------------------------------------------
    def put_job(self, cluster: str, job: Job) -> int:
        return self.put_jobs(cluster, [job])

    def put_jobs(self, cluster: str, jobs: Sequence[Job]) -> int:
        if not jobs:
            return self.revision(cluster)
        with self._write() as db:
            last = self._bump(db, cluster, "revision", len(jobs))
            write_jobs(db, "sqlite", cluster, jobs, last - len(jobs) + 1)
        return last

    def delete_job(self, cluster: str, job_id: str) -> int | None:
        with self._write() as db:
            live = db.execute(
                "SELECT 1 FROM jobs WHERE cluster = ? AND job_id = ? AND spec IS NOT NULL",
                (cluster, job_id),
            ).fetchone()
            if live is None:
                return None
            revision = self._bump(db, cluster, "revision", 1)
            db.execute(
                "UPDATE jobs SET revision = ?, spec = NULL WHERE cluster = ? AND job_id = ?",
                (revision, cluster, job_id),
            )
            db.execute("DELETE FROM completions WHERE cluster = ? AND job = ?", (cluster, job_id))
        return revision

    @staticmethod
    def _bump(db: sqlite3.Connection, cluster: str, column: str, by: int) -> int:
        """Advance a per-cluster counter inside the caller's write transaction."""
        assert column in ("revision", "report_seq")
        db.execute(
            f"INSERT INTO clusters (cluster, {column}) VALUES (?, ?)"
            f" ON CONFLICT (cluster) DO UPDATE SET {column} = {column} + excluded.{column}",
            (cluster, by),
        )
        row = db.execute(f"SELECT {column} FROM clusters WHERE cluster = ?", (cluster,)).fetchone()
        return int(row[0])

    # -- actual state --------------------------------------------------------------
    def apply_delta(self, cluster: str, fence: Fence, delta: Delta) -> ApplyResult:
        fence = Fence(*fence)
        digest = delta_digest(delta)
        with self._write() as db:
            row = db.execute(
                "SELECT generation, pass_no, digest FROM fences WHERE cluster = ?", (cluster,)
            ).fetchone()
            stored = Fence(row[0], row[1]) if row is not None else None
            settled = check_fence(fence, stored, row[2] if row is not None else "", digest)
            if settled is not None:
                return settled  # nothing written: the transaction commits empty
            if delta.release:
                released = [(cluster, w) for w in delta.release]
                db.executemany(
                    "DELETE FROM assignments WHERE cluster = ? AND workload_id = ?", released
                )
                # A released replica's usage must not steer the autoscaler any more
                # (its id is reused if the replica is placed again).
                db.executemany(
                    "DELETE FROM latest_usage WHERE cluster = ? AND workload_id = ?", released
                )
            forget_states(db, "sqlite", cluster, delta)
            if delta.bind:
                db.executemany(
                    "INSERT INTO assignments (cluster, workload_id, job, grp, ordinal, node,"
                    " gpu_ids, cpu, memory, status, gpu_milli, version)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" + ASSIGNMENT_UPSERT_SET,
                    (_assignment_row(cluster, a) for a in delta.bind),
                )
            if delta.nodes_remove:
                db.executemany(
                    "DELETE FROM nodes WHERE cluster = ? AND id = ?",
                    [(cluster, n) for n in delta.nodes_remove],
                )
            if delta.nodes_upsert:
                write_nodes(db, "sqlite", cluster, delta.nodes_upsert)
            if delta.status is not None:
                write_status(db, "sqlite", cluster, delta.status)
            if delta.complete:
                write_completions(db, "sqlite", cluster, delta.complete)
            if delta.queues is not None:
                write_queues(db, "sqlite", cluster, delta.queues)
            db.execute(
                "INSERT INTO fences (cluster, generation, pass_no, digest) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (cluster) DO UPDATE SET generation = excluded.generation,"
                " pass_no = excluded.pass_no, digest = excluded.digest",
                (cluster, fence.generation, fence.pass_no, digest),
            )
        return ApplyResult(applied=True, digest=digest)

    # -- liveness and task status --------------------------------------------------
    def heartbeat(self, cluster: str, node_id: str, at: float) -> None:
        with self._write() as db:
            # max(): a heartbeat delayed in transit must not make a node look older.
            db.execute(
                "INSERT INTO heartbeats (cluster, node_id, at) VALUES (?, ?, ?)"
                " ON CONFLICT (cluster, node_id) DO UPDATE SET at = max(at, excluded.at)",
                (cluster, node_id, at),
            )

    def report(self, cluster: str, reports: list[TaskReport]) -> int:
        if not reports:
            return self._counter(cluster, "report_seq")
        with self._write() as db:
            return write_reports(
                db, "sqlite", cluster, reports, lambda n: self._bump(db, cluster, "report_seq", n)
            )

    def close(self) -> None:
        """Close every thread's connection; later calls raise ``StoreError``."""
        with self._lock:
            self._closed = True
            handles = list(self._handles)
            self._handles.clear()
        for handle in handles:
            handle.conn.close()
