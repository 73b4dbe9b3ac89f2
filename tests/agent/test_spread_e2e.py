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
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from forge.client.client import ForgeClient
from forge.core.models import Assignment, Job
from forge.stores import SqliteStore
from forge.wire import contract as c
from tests.agent.helpers import kill_tasks, task_environs, task_processes
from tests.e2e.procs import ROOT, WorkerProc, eventually, start_process, stop_process

pytestmark = pytest.mark.slow

CLUSTER = "spread-e2e"
TTL = 6.0
ZONES = {"za": "a", "zb": "b", "zc": "c"}  # agent (node id) -> zone
SERVE = (
    "import http.server as h, os; "
    "h.test(h.SimpleHTTPRequestHandler, port=int(os.environ['FORGE_PORT_HTTP']), bind='127.0.0.1')"
)


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
             "--cpu", "2000", "--memory", "4096", "--label", f"zone={ZONES[node]}",
             "--data-dir", str(self.tmp / f"agent-{node}"),
             "--poll", "0.2", "--heartbeat-every", "0.5"],
            self.tmp / f"agent-{node}.log", cwd=ROOT, env={**os.environ, **self.env},
        )  # fmt: skip

    def bindings(self) -> list[Assignment]:
        return [a for a in self.store.assignments(CLUSTER, limit=10_000) if a.job == "web"]

    def ports(self) -> dict[str, int]:
        """workload id -> its http port, from the latest running report of the node
        it is bound to now."""
        where = {a.workload_id: a.node for a in self.bindings()}
        ports: dict[str, int] = {}
        for r in self.store.reports_since(CLUSTER, 0, limit=1_000_000):
            if (
                r.status == "running"
                and "ports http=" in r.message
                and where.get(r.workload_id) == r.node
            ):
                ports[r.workload_id] = int(r.message.rsplit("=", 1)[1])
        return ports

    def answering(self) -> int:
        return sum(_get(port) == 200 for port in self.ports().values())

    def logs(self) -> str:
        parts = [f"--- worker ---\n{self.worker.output()}"]
        for node in sorted(self.agents):
            text = (self.tmp / f"agent-{node}.log").read_text(errors="replace")
            parts.append(f"--- agent {node} ---\n{text[-3000:]}")
        return "\n".join(parts)


def _get(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


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
    db = tmp_path / "forge.db"
    address = dev_env.client.service_client.config.target_host
    queue = f"spread-{uuid.uuid4().hex[:8]}"
    worker = WorkerProc(address, queue, f"sqlite:///{db}", tmp_path / "worker.log")
    store = SqliteStore(db)
    fc = ForgeClient(
        dev_env.client,
        cluster=CLUSTER,
        task_queue=queue,
        options=c.ClusterOptions(watch_poll=0.2, heartbeat_ttl=TTL),
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


async def test_a_zone_killed_with_kill_9_leaves_four_of_six_answering_then_six_balanced(
    cluster: Cluster,
) -> None:
    cl = cluster
    for node in ZONES:
        cl.start_agent(node)
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 3, what="3 agents registered")
    await cl.fc.submit_job(_web(6))

    async def ports() -> dict[str, int]:
        return cl.ports()

    await eventually(
        ports,
        lambda p: len(p) == 6 and all(_get(port) == 200 for port in p.values()),
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
