"""An agent on PostgreSQL with the role ``forge store grant-agent`` made for its node
(issue 24): it does its whole job (heartbeats, its bindings' tasks, their reports)
with nothing but the agent functions, and leaves other nodes' bindings alone.

First the agent loop in-process on ``PostgresAgentStore``; then a real
``forge agent`` process given only the URL the command printed, next to a
``worker.py`` on the store owner's URL, against a dev server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forge.agent.agent import Agent
from forge.agent.config import AgentConfig
from forge.client.client import ForgeClient
from forge.core.models import Node
from forge.stores import open_agent_store
from forge.stores.agent_roles import grant_agent
from forge.stores.base import Delta, Fence
from forge.stores.postgres import PostgresStore
from forge.stores.postgres_agent import PostgresAgentStore
from forge.wire import contract as c
from tests.agent.helpers import (
    SLEEP,
    Binder,
    command_job,
    kill_tasks,
    local_node,
    task_of,
    task_processes,
    until,
)
from tests.e2e.procs import ROOT, eventually, start_process, stop_process
from tests.stores.conftest import Backend, postgres_backend
from tests.stores.pg_agents import drop_agent_roles, url_user

__all__ = ["postgres_backend"]

pytestmark = pytest.mark.postgres


@pytest.fixture
def owner(postgres_backend: Backend) -> Iterator[tuple[str, PostgresStore]]:
    """The store owner's (the worker's) URL and store; the agents' roles are
    dropped afterwards (they outlive the schema)."""
    store = postgres_backend.open()
    assert isinstance(store, PostgresStore)
    try:
        yield postgres_backend.url, store
    finally:
        drop_agent_roles(postgres_backend.url)


def _heartbeat(store: PostgresStore, cluster: str, node: str) -> float | None:
    with store._pool.connection() as conn:
        row = conn.execute(
            "SELECT at FROM heartbeats WHERE cluster = %s AND node_id = %s", (cluster, node)
        ).fetchone()
    return float(row[0]) if row is not None else None


def _statuses(store: PostgresStore, cluster: str, wid: str) -> list[tuple[str, str]]:
    return [
        (r.status, r.node)
        for r in store.reports_since(cluster, 0)
        if r.workload_id == wid and r.cpu is None
    ]


def test_the_agent_loop_runs_its_binding_through_its_role_and_no_other(
    owner: tuple[str, PostgresStore], tmp_path: Path
) -> None:
    url, store = owner
    store.apply_delta(
        "default", Fence(0, 1), Delta(nodes_upsert=[local_node("n1"), local_node("n2")])
    )
    binder = Binder(store)
    mine = binder.bind(command_job("mine", SLEEP), 0, "n1")
    theirs = binder.bind(command_job("theirs", SLEEP), 0, "n2")
    agent_store = open_agent_store(grant_agent(url, "default", "n1").url, "default", "n1")
    assert isinstance(agent_store, PostgresAgentStore)
    registered: list[Node] = []
    config = AgentConfig(
        node=local_node("n1"), data_dir=tmp_path, poll=0.05, heartbeat_every=0.2, usage_every=0.2
    )
    agent = Agent(config, agent_store, registered.append)
    try:
        until(lambda: _statuses(store, "default", mine), step=agent.step)
        assert _statuses(store, "default", mine) == [("running", "n1")]
        assert sorted(agent.supervisor.replicas) == [mine]  # n2's binding is not its business
        assert _statuses(store, "default", theirs) == []
        beat = _heartbeat(store, "default", "n1")
        assert beat is not None and abs(beat - time.time()) < 30
        assert _heartbeat(store, "default", "n2") is None
        assert registered == []  # its node is in the store: it read it through its role
        (shim,) = [t.pid for t in agent.supervisor.replicas[mine].tasks]
        os.kill(task_of(shim), signal.SIGKILL)  # the task dies (not its shim)
        until(lambda: len(_statuses(store, "default", mine)) == 2, step=agent.step)
        assert _statuses(store, "default", mine)[1] == ("failed", "n1")
        binder.apply(release=[mine])
        until(lambda: mine not in agent.supervisor.replicas, step=agent.step)
    finally:
        agent.shutdown(stop_tasks=True)
        agent_store.close()


CLUSTER = "pg-agent"


@pytest.mark.slow
async def test_a_forge_agent_with_the_granted_url_heartbeats_and_runs_its_replicas(
    dev_env: Any, owner: tuple[str, PostgresStore], spawn_worker: Any, tmp_path: Path
) -> None:
    owner_url, store = owner  # before spawn_worker: the worker stops before the schema goes
    granted = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "forge", "store", "grant-agent", "pg1", "--cluster", CLUSTER],
        env={**os.environ, "FORGE_STORE": owner_url},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert granted.returncode == 0, granted.stderr
    url = granted.stdout.strip()
    assert url_user(url).startswith("forge_agent_pg1_")
    spawn_worker(owner_url)
    address = dev_env.client.service_client.config.target_host
    fc = ForgeClient(
        dev_env.client,
        cluster=CLUSTER,
        task_queue=spawn_worker.task_queue,
        options=c.ClusterOptions(watch_poll=0.2, heartbeat_ttl=6.0),
        store=store,
    )
    env = {
        **os.environ,
        "FORGE_TEMPORAL_ADDRESS": address,
        "FORGE_TASK_QUEUE": spawn_worker.task_queue,
        "FORGE_STORE": url,  # the agent's own role: nothing else
        "FORGE_CLUSTER": CLUSTER,
    }
    log = tmp_path / "agent.log"
    agent = start_process(
        [sys.executable, "-m", "forge", "agent", "--node-id", "pg1", "--cpu", "2000",
         "--memory", "4096", "--data-dir", str(tmp_path / "agent"), "--poll", "0.2",
         "--heartbeat-every", "0.5", "--usage-every", "1"],
        log, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        await fc.start()
        await eventually(fc.status, lambda s: len(s.nodes) == 1, what="the agent registered")
        await fc.submit_job(command_job("sleepy", SLEEP, replicas=2, cpu=100, memory=64))

        async def running() -> list[tuple[str, str]]:
            return [
                (r.workload_id, r.node)
                for r in store.reports_since(CLUSTER, 0)
                if r.status == "running" and r.cpu is None
            ]

        seen = await eventually(running, lambda rows: len(rows) == 2, what="2 running reports")
        assert sorted(seen) == [("sleepy/main/0", "pg1"), ("sleepy/main/1", "pg1")]

        async def bound() -> set[tuple[str, str, str]]:
            return {(a.workload_id, a.node, a.status.value) for a in store.assignments(CLUSTER)}

        await eventually(  # the loop read the reports the agent wrote through its role
            bound,
            lambda b: (
                b == {("sleepy/main/0", "pg1", "running"), ("sleepy/main/1", "pg1", "running")}
            ),
            what="both bindings running",
        )
        assert len(task_processes({"FORGE_CLUSTER": CLUSTER})) == 2
        first = _heartbeat(store, CLUSTER, "pg1")
        assert first is not None

        async def later() -> float | None:
            return _heartbeat(store, CLUSTER, "pg1")

        await eventually(later, lambda at: at is not None and at > first, what="heartbeats")
        text = log.read_text(errors="replace")
        assert "permission denied" not in text and "InsufficientPrivilege" not in text, text
    except BaseException:
        print(f"--- agent ---\n{log.read_text(errors='replace')[-4000:]}")
        raise
    finally:
        stop_process(agent, timeout=20)
        kill_tasks(task_processes({"FORGE_CLUSTER": CLUSTER}))
