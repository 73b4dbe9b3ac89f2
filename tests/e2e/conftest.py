from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from forge.wire import contract as c
from forge.wire.codec import data_converter
from tests.e2e.procs import WorkerProc
from tests.replay_all import replay_every_run


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
def spawn_worker(dev_env: WorkflowEnvironment, tmp_path: Path, request: pytest.FixtureRequest):
    """Start `python worker.py` processes on a task queue of this test; all are
    stopped at the end, and their logs are printed when the test failed."""
    procs: list[WorkerProc] = []
    queue = f"e2e-{uuid.uuid4().hex[:8]}"
    address = dev_env.client.service_client.config.target_host

    def spawn(store: str, **env: str) -> WorkerProc:
        w = WorkerProc(address, queue, store, tmp_path / f"worker{len(procs)}.log", **env)
        procs.append(w)
        return w

    spawn.task_queue = queue  # type: ignore[attr-defined]
    yield spawn
    for w in procs:
        w.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for i, w in enumerate(procs):
            print(f"--- worker {i} log ---\n{w.output()}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL store URL on a schema of this test (dropped afterwards). The
    server must be up: `make test` starts it; this fails rather than skips."""
    import os

    import psycopg
    from psycopg import sql

    base = os.environ.get("FORGE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        pytest.fail(f"PostgreSQL at {base} is unreachable: {err}", pytrace=False)
    schema = f"forge_e2e_{uuid.uuid4().hex[:10]}"
    yield f"{base}?schema={schema}"
    with admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
