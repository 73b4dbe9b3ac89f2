"""A gang with real agents (issue 22): a 2-worker gang on a cluster with room for
one worker only runs no process until a node joins, then both start; and its members
are told their ranks and their peers (issue 33), afresh when the gang is placed
again after a kill -9 of a member's agent.

Real ``forge agent`` processes running real commands against a dev server (on a
free port), a ``worker.py`` process and a SQLite store, as in test_agent_e2e.py;
what runs is found from the outside, by the task processes' environment
(``FORGE_WORKLOAD_ID``). A cluster of its own: the gang needs the cluster to start
with exactly one agent.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from forge.core.models import Job
from tests.agent.cluster import AgentCluster, own_cluster
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
        for env in task_environs({"FORGE_CLUSTER": self.name}).values():
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
    """A cluster of each test's own (a workflow id is not reused across tests)."""
    name = f"{CLUSTER}-{uuid.uuid4().hex[:8]}"
    async with own_cluster(dev_env, tmp_path, request, name, make=Cluster, cpu=AGENT_CPU) as cl:
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


async def test_gang_members_are_told_their_ranks_and_peers_afresh_after_a_kill_9(
    cluster: Cluster,
) -> None:
    cl = cluster
    address = {n: f"127.0.0.{i}" for i, n in enumerate("abc", start=1)}  # all loopback
    for n in "ab":
        cl.start_agent(n, "--advertise-address", address[n])
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 2, what="agents a and b")
    await cl.fc.submit_job(_gang("train", 2))
    first = await eventually(_told(cl), lambda e: len(e) == 2, timeout=60, what="both told")
    _assert_consistent(first, address)
    assert sorted(e["FORGE_NODE"] for e in first.values()) == ["a", "b"]

    cl.start_agent("c", "--advertise-address", address["c"])
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 3, what="agent c")
    lost = first["1"]["FORGE_NODE"]  # rank 1's node
    cl.agents[lost].send_signal(signal.SIGKILL)  # its task runs on, orphaned
    cl.agents[lost].wait(timeout=10)

    old = {e["pid"] for e in first.values()}

    def restarted(envs: dict[str, dict[str, str]]) -> bool:
        """Both members run off the lost node, neither in the process it had."""
        nodes = {e["FORGE_NODE"] for e in envs.values()}
        return len(envs) == 2 and lost not in nodes and not old & {e["pid"] for e in envs.values()}

    again = await eventually(
        _told(cl, besides=lost),
        restarted,
        timeout=60,
        what="both members started again off the lost node (the survivor too)",
    )
    _assert_consistent(again, address)
    assert address[lost] not in again["0"]["FORGE_PEERS"]


def _told(cl: Cluster, besides: str = "") -> Any:
    """rank -> the environment of the live gang member with that rank (the task
    processes left on node ``besides`` not counted), with its pid as ``pid``."""

    async def probe() -> dict[str, dict[str, str]]:
        out = {}
        for pid, env in task_environs({"FORGE_CLUSTER": cl.name}).items():
            if env["FORGE_WORKLOAD_ID"].startswith("train/") and env["FORGE_NODE"] != besides:
                out[env["RANK"]] = {**env, "pid": str(pid)}
        return out

    return probe


def _assert_consistent(envs: dict[str, dict[str, str]], address: dict[str, str]) -> None:
    """Ranks 0..n-1, one master (rank 0's node), the same port, peers in rank order."""
    assert sorted(envs) == ["0", "1"], envs.keys()
    peers = ",".join(address[envs[r]["FORGE_NODE"]] for r in ("0", "1"))
    for rank, env in envs.items():
        assert env["FORGE_WORKLOAD_ID"] == f"train/main/{rank}"
        assert env["WORLD_SIZE"] == env["FORGE_WORLD_SIZE"] == "2"
        assert env["FORGE_RANK"] == rank and env["LOCAL_RANK"] == "0"
        assert env["MASTER_ADDR"] == address[envs["0"]["FORGE_NODE"]]
        assert env["MASTER_PORT"] == envs["0"]["MASTER_PORT"]
        assert env["FORGE_PEERS"] == peers
