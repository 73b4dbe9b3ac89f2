"""Store fixtures: every conformance test runs on memory, SQLite and PostgreSQL.

PostgreSQL is part of the suite, not an optional extra: if the server at
``FORGE_TEST_PG`` is unreachable the postgres tests *error*. Set
``FORGE_SKIP_POSTGRES=1`` to skip them deliberately (e.g. on a laptop without it).
Each postgres test gets its own schema, dropped afterwards, so tests never see
each other's data and can run in parallel against one database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from forge.stores import MemoryStore, SqliteStore, Store
from forge.stores.postgres import PostgresStore

__all__ = ["Backend"]

PG_URL = os.environ.get("FORGE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _postgres_admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        if os.environ.get("FORGE_SKIP_POSTGRES") == "1":
            pytest.skip(f"PostgreSQL unreachable and FORGE_SKIP_POSTGRES=1: {exc}")
        pytest.fail(
            f"PostgreSQL at FORGE_TEST_PG={PG_URL} is unreachable ({exc}). Start it "
            "(scripts/ensure-postgres.sh) or set FORGE_SKIP_POSTGRES=1 to skip these tests.",
            pytrace=False,
        )


class Backend:
    """One backend's storage for one test; ``open()`` may be called repeatedly to get
    independent store instances on the same data (to test reopening)."""

    def __init__(
        self,
        name: str,
        url: str,
        factory: Callable[[], Store],
        cleanup: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.url = url
        self._factory = factory
        self._cleanup = cleanup
        self._opened: list[Store] = []

    def open(self) -> Store:
        store = self._factory()
        self._opened.append(store)
        return store

    def close_all(self) -> None:
        try:
            for store in self._opened:
                store.close()
        finally:
            self._cleanup()


def _with_query(url: str, param: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{param}"


def _postgres_backend() -> Backend:
    """A fresh schema (created by the store's migration), dropped after the test."""
    admin = _postgres_admin()
    schema = f"forge_t_{uuid.uuid4().hex[:12]}"
    url = _with_query(PG_URL, f"schema={schema}")

    def drop() -> None:
        with admin:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )

    return Backend("postgres", url, lambda: PostgresStore(url), drop)


def _make_backend(name: str, tmp_path: Path) -> Backend:
    if name == "memory":
        shared = MemoryStore()  # "reopening" memory gives the same process-local store
        return Backend(name, "memory://", lambda: shared)
    if name == "sqlite":
        path = tmp_path / "forge.db"
        return Backend(name, f"sqlite://{path}", lambda: SqliteStore(path))
    return _postgres_backend()


_ALL = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
_DURABLE = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=_ALL)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = _make_backend(request.param, tmp_path)
    try:
        yield b
    finally:
        b.close_all()


@pytest.fixture(params=_DURABLE)
def durable_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = _make_backend(request.param, tmp_path)
    try:
        yield b
    finally:
        b.close_all()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.open()


@pytest.fixture
def postgres_backend() -> Iterator[Backend]:
    """For PostgreSQL-only tests (URL handling); same no-silent-skip rule."""
    b = _postgres_backend()
    try:
        yield b
    finally:
        b.close_all()
