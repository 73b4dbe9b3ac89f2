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
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from forge.core.models import Job
from tests.agent.cluster import AgentCluster, agent_cluster, call_failed
from tests.agent.helpers import task_environs
from tests.e2e.procs import eventually

pytestmark = pytest.mark.slow

CLUSTER = "gang-e2e"
AGENT_CPU = 2000  # one 1500m worker per agent
SLEEP = "import time; time.sleep(3600)"


class Cluster(AgentCluster):
    def processes(self, job: str) -> dict[str, str]:
        """workload id -> the node its live task process runs on."""
        out = {}
        for env in task_environs({"FORGE_CLUSTER": CLUSTER}).values():
            wid = env["FORGE_WORKLOAD_ID"]
            if wid.startswith(f"{job}/"):
                out[wid] = env["FORGE_NODE"]
        return out


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
    flags = ("--cpu", str(AGENT_CPU))
    async with agent_cluster(
        dev_env,
        tmp_path,
        CLUSTER,
        ttl=6.0,
        agent_flags=flags,
        make=Cluster,
        on_failure=lambda: call_failed(request),
    ) as cl:
        yield cl


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
