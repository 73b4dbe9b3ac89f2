"""Shared bits of the agent tests: jobs that run real commands, a bound store."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from forge.agent.shim import is_shim
from forge.core.models import Assignment, Job, Node
from forge.stores.base import Delta, Fence, Store

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(600)"]


def command_job(
    name: str,
    command: list[str],
    *,
    replicas: int = 1,
    cpu: int = 500,
    memory: int = 256,
    **task: Any,
) -> Job:
    return Job.model_validate(
        {
            "id": name,
            "name": name,
            "groups": [
                {
                    "name": "main",
                    "scaling": {"min": 0, "max": 100, "desired": replicas},
                    "tasks": [
                        {
                            "name": "t",
                            "command": command,
                            "resources": {"cpu": cpu, "memory": memory},
                            **task,
                        }
                    ],
                }
            ],
        }
    )


class Binder:
    """Writes bindings into a store as the cluster loop's persist would."""

    def __init__(self, store: Store, cluster: str = "default") -> None:
        self.store, self.cluster, self.pass_no = store, cluster, 0

    def apply(self, bind: list[Assignment] = (), release: list[str] = ()) -> None:  # type: ignore[assignment]
        self.pass_no += 1
        self.store.apply_delta(
            self.cluster, Fence(1, self.pass_no), Delta(bind=list(bind), release=list(release))
        )

    def bind(self, job: Job, ordinal: int, node: str) -> str:
        self.store.put_job(self.cluster, job)
        g = job.groups[0]
        wid = f"{job.id}/{g.name}/{ordinal}"
        cpu = sum(t.resources.cpu for t in g.tasks)
        memory = sum(t.resources.memory for t in g.tasks)
        self.apply(
            bind=[
                Assignment(
                    workload_id=wid,
                    job=job.id,
                    group=g.name,
                    ordinal=ordinal,
                    node=node,
                    cpu=cpu,
                    memory=memory,
                )
            ]
        )
        return wid


def until(pred: Callable[[], Any], timeout: float = 10.0, step: Callable[[], None] | None = None):
    """Poll ``pred`` (running ``step`` first each time) until truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            step()
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not reached in {timeout}s")


def local_node(node_id: str = "n1") -> Node:
    return Node(id=node_id, cpu=4000, memory=8192)


def task_processes(match: dict[str, str]) -> dict[int, str]:
    """pid -> workload id of the live task processes (not their shims) whose environment has every
    item of ``match`` (a task process: one an agent started, with FORGE_WORKLOAD_ID)."""
    return {pid: env["FORGE_WORKLOAD_ID"] for pid, env in task_environs(match).items()}


def task_environs(match: dict[str, str]) -> dict[int, dict[str, str]]:
    """pid -> environment of the live task processes whose environment has every
    item of ``match`` (what a task was started with: its workload id, its version's env)."""
    found: dict[int, dict[str, str]] = {}
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if is_shim(proc.cmdline()):
                continue  # the shell a task runs under (forge.agent.shim), not the task
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("FORGE_WORKLOAD_ID") and all(env.get(k) == v for k, v in match.items()):
            found[proc.pid] = env
    return found


def task_of(shim: int, timeout: float = 10.0) -> int:
    """The task process a shim runs (its child: forge.agent.shim), once forked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = psutil.Process(shim).children()
        if children:
            return children[0].pid
        time.sleep(0.01)
    raise AssertionError(f"shim {shim} started no task in {timeout}s")


def kill_tasks(pids: Iterable[int], timeout: float = 10.0) -> None:
    """SIGKILL each task's process group (its shim leads its own session, the task
    in it), then wait until they are gone."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)  # in case it left its group
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
