"""A real cluster for the agent end-to-end suites: a ``worker.py`` process on a SQLite
store against the session's dev server, ``forge agent`` processes started on demand,
and a teardown that leaves nothing running (agents, the task processes they leave
for adoption, every worker a test started). Each suite subclasses
:class:`AgentCluster` with what it reads from the outside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from forge.client.client import ForgeClient
from forge.core.models import Assignment
from forge.stores import SqliteStore
from forge.wire import contract as c
from tests.agent.helpers import kill_tasks, task_processes
from tests.e2e.procs import ROOT, WorkerProc, start_process, stop_process

__all__ = [
    "AgentCluster",
    "agent_cluster",
    "call_failed",
    "http_body",
    "http_status",
    "own_cluster",
]


@dataclass
class AgentCluster:
    fc: ForgeClient
    store: SqliteStore
    tmp: Path
    env: dict[str, str]
    worker: WorkerProc
    #: the ``forge agent`` flags every agent of this cluster gets (cpu, usage, ...)
    agent_flags: Sequence[str] = ()
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: every worker started, the current one last: the teardown stops them all
    workers: list[WorkerProc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workers.append(self.worker)

    @property
    def name(self) -> str:
        return self.env["FORGE_CLUSTER"]

    def new_worker(self) -> None:
        """Start another ``worker.py`` on the cluster's task queue (after a kill)."""
        self.worker = WorkerProc(
            self.env["FORGE_TEMPORAL_ADDRESS"],
            self.env["FORGE_TASK_QUEUE"],
            self.env["FORGE_STORE"],
            self.tmp / f"worker-{len(self.workers) + 1}.log",
        )
        self.workers.append(self.worker)

    def start_agent(self, node: str, *flags: str, env: Mapping[str, str] | None = None) -> None:
        """A ``forge agent`` for ``node``; ``env`` adds to its environment (a PATH
        with a fake ``nvidia-smi``)."""
        self.agents[node] = start_process(
            [sys.executable, "-m", "forge", "agent", "--node-id", node, "--memory", "4096",
             "--data-dir", str(self.tmp / f"agent-{node}"),
             "--poll", "0.2", "--heartbeat-every", "0.5", *self.agent_flags, *flags],
            self.tmp / f"agent-{node}.log", cwd=ROOT, env={**os.environ, **self.env, **(env or {})},
        )  # fmt: skip

    def http_ports(self, bindings: Iterable[Assignment]) -> dict[str, int]:
        """workload id -> its http port, from the latest running report of the node
        it is bound to in ``bindings``."""
        where = {a.workload_id: a.node for a in bindings}
        ports: dict[str, int] = {}
        for r in self.store.reports_since(self.name, 0, limit=1_000_000):
            if (
                r.status == "running"
                and "ports http=" in r.message
                and where.get(r.workload_id) == r.node
            ):
                ports[r.workload_id] = int(r.message.rsplit("=", 1)[1])
        return ports

    def logs(self) -> str:
        parts = [f"--- worker ---\n{self.worker.output()}"]
        for node in sorted(self.agents):
            text = (self.tmp / f"agent-{node}.log").read_text(errors="replace")
            parts.append(f"--- agent {node} ---\n{text[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for p in self.agents.values():  # all at once, then each waited for
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.agents.values():
            stop_process(p, timeout=20)
        # the agents leave their tasks running by design (for adoption): end them
        kill_tasks(task_processes({"FORGE_CLUSTER": self.name}))
        for w in self.workers:  # every worker, not just the first: a test may kill one
            w.stop()
        self.store.close()


C = TypeVar("C", bound=AgentCluster)


def http_status(port: int) -> int:
    """The status of a GET on a replica's local port (0: nothing answered)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


def each_answers_on_its_own(ports: dict[str, int], n: int) -> bool:
    """``n`` replicas, each answering 200 on a port no other replica's binding names.

    Own: the agents of these tests share one host, and each picks a task's port at
    random from the dynamic range, so two agents can pick the same one (about 4% of
    runs at 30 replicas). The task that binds second exits 1 and is placed again with
    a fresh port; until then both bindings name the port the first one answers on.
    """
    return (
        len(ports) == n
        and len(set(ports.values())) == n
        and all(http_status(port) == 200 for port in ports.values())
    )


def http_body(port: int) -> str | None:
    """The body of a GET on a replica's local port (None: nothing answered 200)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except OSError:
        return None


def call_failed(request: Any) -> bool:
    """Whether the test of ``request`` failed (conftest records ``rep_call``)."""
    rep = getattr(request.node, "rep_call", None)
    return rep is not None and bool(rep.failed)


@asynccontextmanager
async def agent_cluster(
    dev_env: Any,
    tmp: Path,
    name: str,
    *,
    ttl: float,
    agent_flags: Sequence[str] = (),
    make: Callable[..., C] = AgentCluster,  # type: ignore[assignment]
    on_failure: Callable[[], bool] = lambda: False,
) -> AsyncIterator[C]:
    """The cluster ``name`` started (its workflow running); stopped on exit, with
    the worker's and agents' logs printed when ``on_failure()`` says the test failed."""
    db = tmp / "forge.db"
    address = dev_env.client.service_client.config.target_host
    queue = f"{name}-{uuid.uuid4().hex[:8]}"
    worker = WorkerProc(address, queue, f"sqlite:///{db}", tmp / "worker.log")
    store = SqliteStore(db)
    fc = ForgeClient(
        dev_env.client,
        cluster=name,
        task_queue=queue,
        options=c.ClusterOptions(watch_poll=0.2, heartbeat_ttl=ttl),
        store=store,
    )
    env = {
        "FORGE_TEMPORAL_ADDRESS": address,
        "FORGE_TASK_QUEUE": queue,
        "FORGE_STORE": f"sqlite:///{db}",
        "FORGE_CLUSTER": name,
    }
    cl = make(fc, store, tmp, env, worker, agent_flags)
    try:
        await fc.start()
        yield cl
    finally:
        if on_failure():
            print(cl.logs())
        cl.stop()


def own_cluster(
    dev_env: Any,
    tmp: Path,
    request: Any,
    name: str,
    *,
    make: Callable[..., C],
    cpu: int = 2000,
) -> AbstractAsyncContextManager[C]:
    """A test's cluster as the agent e2e fixtures make it: agents of ``cpu``
    millicores, a 6 s heartbeat TTL, the logs printed when the test failed."""
    return agent_cluster(
        dev_env,
        tmp,
        name,
        ttl=6.0,
        agent_flags=("--cpu", str(cpu)),
        make=make,
        on_failure=lambda: call_failed(request),
    )
