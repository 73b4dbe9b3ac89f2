"""Fault-injection fixtures: a dev server and real ``worker.py`` processes (as in
``tests/e2e``), and a PostgreSQL schema whose clean-up survives the server being
stopped and started by a test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from forge.wire import contract as c
from forge.wire.codec import data_converter
from tests.e2e.procs import WorkerProc
from tests.replay_all import replay_every_run

PG_BASE = os.environ.get("FORGE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest_asyncio.fixture(scope="session")
async def dev_env(temporal_cli: str) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli,
        data_converter=data_converter(),
        search_attributes=[
            SearchAttributeKey.for_keyword(c.SA_CLUSTER),
            SearchAttributeKey.for_int(c.SA_PENDING),
            SearchAttributeKey.for_int(c.SA_BOUND),
            SearchAttributeKey.for_int(c.SA_NODES),
        ],
        dev_server_log_level="error",
    )
    try:
        yield env
        # every run the suite made replays with this code (issue 35)
        failures = await replay_every_run(env.client)
        assert not failures, "runs that do not replay:\n" + "\n".join(failures)
    finally:
        await env.shutdown()


@pytest.fixture
def spawn_worker(
    dev_env: WorkflowEnvironment, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """Start `python worker.py` processes on a task queue of this test; all are
    stopped at the end, and their logs are printed when the test failed."""
    procs: list[WorkerProc] = []
    queue = f"fault-{uuid.uuid4().hex[:8]}"
    address = dev_env.client.service_client.config.target_host

    def spawn(store: str, **env: str) -> WorkerProc:
        w = WorkerProc(address, queue, store, tmp_path / f"worker{len(procs)}.log", **env)
        procs.append(w)
        return w

    spawn.task_queue = queue  # type: ignore[attr-defined]
    spawn.procs = procs  # type: ignore[attr-defined]
    yield spawn
    for w in procs:
        w.stop()
    if _failed(request):
        for i, w in enumerate(procs[-4:], start=max(0, len(procs) - 4)):
            print(f"--- worker {i} log ---\n{w.output()}")


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return bool(rep is not None and rep.failed)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A store URL on a schema of this test. Unlike the e2e fixture it connects
    afresh to drop the schema, since the test may have restarted the server."""
    try:
        psycopg.connect(PG_BASE, autocommit=True, connect_timeout=5).close()
    except psycopg.OperationalError as err:
        pytest.fail(f"PostgreSQL at {PG_BASE} is unreachable: {err}", pytrace=False)
    schema = f"forge_fault_{uuid.uuid4().hex[:10]}"
    yield f"{PG_BASE}?schema={schema}"
    with psycopg.connect(PG_BASE, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
