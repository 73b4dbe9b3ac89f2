"""A zone spread with real agents (issue 22): a 6-replica service spread over 3
zones (one agent each, ``--label zone=...``) keeps at least 4 replicas answering
when a zone's agent is killed with ``kill -9`` together with its task processes
(the zone is gone), and is back to 6, 3 per surviving zone, after the heartbeat TTL.

Real ``forge agent`` processes, a dev server on a free port, a ``worker.py``
process and a SQLite store, as in test_agent_e2e.py; the replicas' ports come from
the agents' running reports and are asked with urllib.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from forge.core.models import Assignment, Job
from tests.agent.cluster import AgentCluster, each_answers_on_its_own, http_status, own_cluster
from tests.agent.helpers import kill_tasks, task_environs
from tests.e2e.procs import eventually

pytestmark = pytest.mark.slow

CLUSTER = "spread-e2e"
TTL = 6.0
ZONES = {"za": "a", "zb": "b", "zc": "c"}  # agent (node id) -> zone
SERVE = (
    "import http.server as h, os; "
    "h.test(h.SimpleHTTPRequestHandler, port=int(os.environ['FORGE_PORT_HTTP']), bind='127.0.0.1')"
)


class Cluster(AgentCluster):
    def start_zone_agent(self, node: str) -> None:
        self.start_agent(node, "--label", f"zone={ZONES[node]}")

    def bindings(self) -> list[Assignment]:
        return [a for a in self.store.assignments(CLUSTER, limit=10_000) if a.job == "web"]

    def ports(self) -> dict[str, int]:
        return self.http_ports(self.bindings())

    def answering(self) -> int:
        return sum(http_status(port) == 200 for port in self.ports().values())


def _web(replicas: int) -> Job:
    return Job.model_validate(
        {
            "id": "web",
            "name": "web",
            "groups": [
                {
                    "name": "main",
                    "scaling": {"min": 0, "max": 12, "desired": replicas},
                    "spread": [{"label": "zone", "max_skew": 1}],
                    "tasks": [
                        {
                            "name": "t",
                            "command": [sys.executable, "-c", SERVE],
                            "resources": {"cpu": 100, "memory": 64},
                            "ports": ["http"],
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
    async with own_cluster(dev_env, tmp_path, request, CLUSTER, make=Cluster) as cl:
        yield cl


async def test_a_zone_killed_with_kill_9_leaves_four_of_six_answering_then_six_balanced(
    cluster: Cluster,
) -> None:
    cl = cluster
    for node in ZONES:
        cl.start_zone_agent(node)
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 3, what="3 agents registered")
    await cl.fc.submit_job(_web(6))

    async def ports() -> dict[str, int]:
        return cl.ports()

    await eventually(
        ports,
        lambda p: each_answers_on_its_own(p, 6),
        timeout=60,
        what="6 replicas answering",
    )
    per_zone = Counter(ZONES[a.node] for a in cl.bindings())
    assert per_zone == {"a": 2, "b": 2, "c": 2}

    # zone a goes: its agent and its task processes, all with SIGKILL
    cl.agents["za"].send_signal(signal.SIGKILL)
    cl.agents["za"].wait()
    in_a = [
        pid
        for pid, env in task_environs({"FORGE_CLUSTER": CLUSTER}).items()
        if env["FORGE_NODE"] == "za"
    ]
    assert len(in_a) == 2
    kill_tasks(in_a)
    deadline = time.monotonic() + TTL + 30
    while True:
        now = cl.answering()
        assert now >= 4, f"only {now} of 6 answering after zone a was lost"
        bound = cl.bindings()
        if len(bound) == 6 and all(a.node != "za" for a in bound) and now == 6:
            break
        assert time.monotonic() < deadline, "zone a's replicas never ran elsewhere"
        await asyncio.sleep(0.3)  # poll interval, not synchronisation
    per_zone = Counter(ZONES[a.node] for a in cl.bindings())
    assert per_zone == {"b": 3, "c": 3}
