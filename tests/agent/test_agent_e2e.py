"""Real agents: `forge agent` processes running real commands against a dev server,
a `worker.py` process and a SQLite store."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.stores import SqliteStore
from forge.wire import contract as c
from tests.e2e.procs import ROOT, eventually

pytestmark = pytest.mark.slow

TTL = 3.0


def _agent(node: str, tmp: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = (tmp / f"agent-{node}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "forge", "agent", "--node-id", node, "--cpu", "4000",
         "--memory", "4096", "--data-dir", str(tmp / f"agent-{node}"),
         "--heartbeat-every", "0.5", "--usage-every", "2"],
        cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _web(replicas: int) -> Job:
    serve = "import http.server as h, os; h.test(h.SimpleHTTPRequestHandler, port=int(os.environ['FORGE_PORT_HTTP']), bind='127.0.0.1')"  # noqa: E501
    return Job.model_validate(
        {
            "id": "web",
            "name": "web",
            "groups": [
                {
                    "name": "http",
                    "scaling": {"min": 0, "max": 50, "desired": replicas},
                    "reschedule": {"delay": 0.5, "delay_function": "constant"},
                    "tasks": [
                        {
                            "name": "server",
                            "command": [sys.executable, "-c", serve],
                            "ports": ["http"],
                            "stop_grace": 2.0,
                            "resources": {"cpu": 100, "memory": 128},
                        }
                    ],
                }
            ],
        }
    )


def _serving(store: SqliteStore) -> dict[str, int]:
    """workload -> port, from the agents' latest running reports."""
    ports: dict[str, int] = {}
    for r in store.reports_since("web-e2e", 0, limit=100_000):
        if r.status == "running" and "ports http=" in r.message:
            ports[r.workload_id] = int(r.message.rsplit("=", 1)[1])
    return ports


def _get(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
        return int(resp.status)


async def test_agents_run_a_web_job_and_survive_a_task_and_an_agent_kill(
    dev_env, spawn_worker, tmp_path: Path
) -> None:
    db = tmp_path / "forge.db"
    spawn_worker(f"sqlite:///{db}")
    store = SqliteStore(db)
    fc = ForgeClient(
        dev_env.client,
        cluster="web-e2e",
        task_queue=spawn_worker.task_queue,
        options=c.ClusterOptions(watch_poll=0.2, heartbeat_ttl=TTL),
        store=store,
    )
    await fc.start()
    env = {
        "FORGE_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "FORGE_TASK_QUEUE": spawn_worker.task_queue,
        "FORGE_STORE": f"sqlite:///{db}",
        "FORGE_CLUSTER": "web-e2e",
    }
    agents = {n: _agent(n, tmp_path, env) for n in ("a", "b", "c")}
    try:
        await eventually(fc.status, lambda s: len(s.nodes) == 3, what="3 agents registered")
        await fc.submit_job(_web(6))

        def running() -> list[str]:
            return [a.workload_id for a in store.assignments("web-e2e") if a.status == "running"]

        await eventually(_now(lambda: running()), lambda r: len(r) == 6, what="6 replicas running")
        ports = _serving(store)
        await eventually(
            _now(lambda: [_get(p) for p in _serving(store).values()]),
            lambda codes: codes == [200] * 6,
            what="every replica answers on its port",
        )
        assert len(set(ports.values())) == 6

        # kill -9 of an agent: its replicas run elsewhere within the TTL + 5 s
        held = [a.node for a in store.assignments("web-e2e")]
        victim = max(sorted(agents), key=held.count)  # the agent holding the most replicas
        agents[victim].send_signal(signal.SIGKILL)
        agents[victim].wait()
        await eventually(
            _now(lambda: store.assignments("web-e2e")),
            lambda rows: (
                len([r for r in rows if r.status == "running"]) == 6
                and all(r.node != victim for r in rows)
            ),
            timeout=TTL + 5 + 10,  # + the time a pass and a start take on a loaded machine
            what="replicas of the killed agent running elsewhere",
        )
        assert {r.workload_id for r in store.assignments("web-e2e")} == set(ports)
    finally:
        for p in agents.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in agents.values():
            p.wait(timeout=20)
        _kill_leftovers(tmp_path)
        store.close()


def _now(fn):
    async def probe():
        return fn()

    return probe


def _kill_leftovers(tmp: Path) -> None:
    """Agents leave their tasks running by design (for adoption): end them here."""
    import json

    for state in tmp.glob("agent-*/agent-state.json"):
        for p in json.loads(state.read_text())["processes"]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p["pid"], signal.SIGKILL)
