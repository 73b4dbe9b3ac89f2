"""A gang with real agents (issue 22): a 2-worker gang on a cluster with room for
one worker only runs no process until a node joins, then both start.

Real ``forge agent`` processes running real commands against a dev server (on a
free port), a ``worker.py`` process and a SQLite store, as in test_agent_e2e.py;
what runs is found from the outside, by the task processes' environment
(``FORGE_WORKLOAD_ID``). A cluster of its own: the gang needs the cluster to start
with exactly one agent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.stores import SqliteStore
from forge.wire import contract as c
from tests.agent.helpers import kill_tasks, task_environs, task_processes
from tests.e2e.procs import ROOT, WorkerProc, eventually, start_process, stop_process

pytestmark = pytest.mark.slow

CLUSTER = "gang-e2e"
AGENT_CPU = 2000  # one 1500m worker per agent
SLEEP = "import time; time.sleep(3600)"


@dataclass
class Cluster:
    fc: ForgeClient
    store: SqliteStore
    tmp: Path
    env: dict[str, str]
    worker: WorkerProc
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start_agent(self, node: str) -> None:
        self.agents[node] = start_process(
            [sys.executable, "-m", "forge", "agent", "--node-id", node,
             "--cpu", str(AGENT_CPU), "--memory", "4096",
             "--data-dir", str(self.tmp / f"agent-{node}"),
             "--poll", "0.2", "--heartbeat-every", "0.5"],
            self.tmp / f"agent-{node}.log", cwd=ROOT, env={**os.environ, **self.env},
        )  # fmt: skip

    def processes(self, job: str) -> dict[str, str]:
        """workload id -> the node its live task process runs on."""
        out = {}
        for env in task_environs({"FORGE_CLUSTER": CLUSTER}).values():
            wid = env["FORGE_WORKLOAD_ID"]
            if wid.startswith(f"{job}/"):
                out[wid] = env["FORGE_NODE"]
        return out

    def logs(self) -> str:
        parts = [f"--- worker ---\n{self.worker.output()}"]
        for node in sorted(self.agents):
            text = (self.tmp / f"agent-{node}.log").read_text(errors="replace")
            parts.append(f"--- agent {node} ---\n{text[-3000:]}")
        return "\n".join(parts)


def _gang(name: str, replicas: int) -> Job:
    return Job.model_validate(
        {
            "id": name,
            "name": name,
            "groups": [
                {
                    "name": "main",
                    "gang": True,
                    "scaling": {"min": 0, "max": 8, "desired": replicas},
                    "tasks": [
                        {
                            "name": "t",
                            "command": [sys.executable, "-c", SLEEP],
                            "resources": {"cpu": 1500, "memory": 64},
                            "stop_grace": 2.0,
                        }
                    ],
                }
            ],
        }
    )


@pytest_asyncio.fixture
async def cluster(
    dev_env: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    db = tmp_path / "forge.db"
    address = dev_env.client.service_client.config.target_host
    queue = f"gang-{uuid.uuid4().hex[:8]}"
    worker = WorkerProc(address, queue, f"sqlite:///{db}", tmp_path / "worker.log")
    store = SqliteStore(db)
    fc = ForgeClient(
        dev_env.client,
        cluster=CLUSTER,
        task_queue=queue,
        options=c.ClusterOptions(watch_poll=0.2, heartbeat_ttl=6.0),
        store=store,
    )
    env = {
        "FORGE_TEMPORAL_ADDRESS": address,
        "FORGE_TASK_QUEUE": queue,
        "FORGE_STORE": f"sqlite:///{db}",
        "FORGE_CLUSTER": CLUSTER,
    }
    cl = Cluster(fc, store, tmp_path, env, worker)
    try:
        await fc.start()
        yield cl
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(cl.logs())
        for p in cl.agents.values():  # all at once, then each waited for
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in cl.agents.values():
            stop_process(p, timeout=20)
        # the agents leave their tasks running by design (for adoption): end them
        kill_tasks(task_processes({"FORGE_CLUSTER": CLUSTER}))
        worker.stop()
        store.close()


async def test_a_two_worker_gang_runs_nothing_until_a_node_joins_then_both_start(
    cluster: Cluster,
) -> None:
    cl = cluster
    cl.start_agent("a")
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 1, what="agent a registered")

    first = await cl.fc.submit_job(_gang("train", 2))
    assert (first.bound, first.pending) == (0, 2)
    why = await cl.fc.explain("train/main/1")
    assert why.state == "pending"
    assert any(r.startswith("gang: 1 of 2 fit") for r in why.reasons), why.reasons

    # a few seconds of agent polls (every 0.2 s): no worker process at any of them
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        assert not cl.processes("train"), "a gang member ran before the gang fit"
        await asyncio.sleep(0.2)  # poll interval, not synchronisation
    status = await cl.fc.status()
    assert status.summary.bound == 0

    cl.start_agent("b")
    running = await eventually(
        _probe(cl),
        lambda procs: len(procs) == 2,
        timeout=60,
        what="both gang workers running",
    )
    assert set(running) == {"train/main/0", "train/main/1"}
    assert sorted(running.values()) == ["a", "b"]  # one 1500m worker per 2-core agent


def _probe(cl: Cluster) -> Any:
    async def probe() -> dict[str, str]:
        return cl.processes("train")

    return probe
