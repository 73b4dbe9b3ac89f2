"""Entry points the CLI calls: ``forge agent`` and ``forge logs``.

They take typed values (see ``forge.agent.config.build_config``) so the command-line
front end stays a thin layer of flags.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from typing import IO

import structlog

from forge.agent.agent import Agent
from forge.agent.config import LOGS_LABEL, AgentConfig
from forge.agent.limits import hard_limits
from forge.agent.server import LogServer
from forge.core.models import Node
from forge.errors import Unavailable
from forge.settings import Settings
from forge.stores import Store, open_agent_store

__all__ = ["LogsError", "fetch_logs", "replicas_json", "run_agent"]

log = structlog.get_logger("forge.agent")


def _registrar(settings: Settings) -> Callable[[Node], None]:
    def register(node: Node) -> None:
        from forge.client.client import ForgeClient

        async def go() -> None:
            fc = await ForgeClient.connect(settings)
            await fc.register_nodes([node])

        asyncio.run(asyncio.wait_for(go(), timeout=30))

    return register


def run_agent(
    config: AgentConfig,
    settings: Settings,
    *,
    stop_tasks_on_exit: bool = False,
    ready: Callable[[str], None] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT. The tasks keep running after the agent exits
    unless ``stop_tasks_on_exit``: a restarted agent adopts them."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    # with an agent's role (forge store grant-agent) only its node's rows, no migration
    store = open_agent_store(config.store_url or settings.store_url, config.cluster, config.node.id)
    agent_box: list[Agent] = []
    server = LogServer(
        config.logs_address,
        config.data_dir,
        lambda: agent_box[0].views() if agent_box else [],
        "" if config.loopback else config.token,
    )
    node = config.node.model_copy(
        update={"labels": {**config.node.labels, LOGS_LABEL: server.address}}
    )
    config = replace(config, node=node)
    cgroups, limits_line = hard_limits(config.node.id)
    agent = Agent(config, store, _registrar(settings), cgroups=cgroups)
    agent_box.append(agent)
    server.start()
    print(f"forge agent: node {node.id} ({node.cpu}m cpu, {node.memory} MiB", end="")
    print(f", {len(node.gpus)} GPU)" if node.gpus else ")", f"cluster {config.cluster}")
    print(f"forge agent: logs and replicas at http://{server.address}/v1/", end="")
    print("" if config.loopback else " (token required)")
    for note in config.notes:
        print(f"forge agent: {note}")
    print(f"forge agent: {limits_line}", flush=True)
    if ready is not None:
        ready(server.address)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            try:
                agent.step()
            except Exception:  # one bad step must not take the node's tasks down with it
                log.exception("agent.step_failed")
            stop.wait(config.poll)
    finally:
        agent.shutdown(stop_tasks_on_exit)
        server.close()
        store.close()
    return 0


class LogsError(Unavailable):
    """The log cannot be read: the replica is not bound, or its agent does not answer."""


def _agent_url(store: Store, cluster: str, workload_id: str) -> str:
    found = store.assignments(cluster, workload_id[:-1], 1000)
    binding = next((a for a in found if a.workload_id == workload_id), None)
    if binding is None:
        raise LogsError(f"{workload_id} is not bound to any node in cluster {cluster}")
    from forge.agent.agent import find_node

    node = find_node(store, cluster, binding.node)
    address = node.labels.get(LOGS_LABEL) if node is not None else None
    if not address:
        raise LogsError(f"node {binding.node} runs no agent that serves logs")
    return f"http://{address}/v1/logs/{workload_id}"


def fetch_logs(
    store: Store,
    cluster: str,
    workload_id: str,
    *,
    task: str = "",
    follow: bool = False,
    token: str = "",
    out: IO[bytes] | None = None,
    poll: float = 0.5,
) -> int:
    """Print a replica's log, then (``follow``) what it appends until interrupted."""
    sink = out or sys.stdout.buffer
    base = _agent_url(store, cluster, workload_id)
    offset = 0
    while True:
        url = f"{base}?offset={offset}" + (f"&task={task}" if task else "")
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                data = resp.read()
                offset = int(resp.headers.get("X-Forge-Offset", offset + len(data)))
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace").strip()
            raise LogsError(f"{base}: {err.code} {body}") from None
        except (urllib.error.URLError, OSError) as err:
            raise LogsError(f"{base}: agent unreachable: {err}") from None
        sink.write(data)
        sink.flush()
        if not follow:
            return 0
        if not data:
            time.sleep(poll)


def replicas_json(address: str, token: str = "") -> list[dict[str, object]]:
    request = urllib.request.Request(f"http://{address}/v1/replicas")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as resp:
        doc: list[dict[str, object]] = json.loads(resp.read())
        return doc
