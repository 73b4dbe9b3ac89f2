"""Helpers to run the cluster workflow in-process against a test server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.store_activities import StoreActivities
from forge.client.client import ForgeClient
from forge.core.models import Job, Node
from forge.core.reconcile import ReconcileOptions
from forge.stores import MemoryStore, Store
from forge.wire import contract as c
from workflows.cluster import ClusterWorkflow

__all__ = ["cluster", "default_options", "job", "node"]


def default_options(**kw: object) -> c.ClusterOptions:
    base: dict[str, object] = {"watch": False, "reconcile": ReconcileOptions()}
    base.update(kw)
    return c.ClusterOptions.model_validate(base)


def node(node_id: str, cpu: int = 4000, memory: int = 8192, gpus: int = 0) -> Node:
    return Node.model_validate(
        {
            "id": node_id,
            "cpu": cpu,
            "memory": memory,
            "gpus": [{"id": f"gpu{i}", "model": "A100", "memory": 40960} for i in range(gpus)],
        }
    )


def job(
    name: str,
    replicas: int = 1,
    cpu: int = 1000,
    memory: int = 1024,
    gpu: int = 0,
    priority: int = 50,
    kind: str = "service",
    **group: object,
) -> Job:
    g: dict[str, object] = {
        "name": "main",
        "scaling": {"min": 0, "max": max(replicas, 1) * 10, "desired": replicas},
        "tasks": [
            {"name": "t", "resources": {"cpu": cpu, "memory": memory, "gpu": {"count": gpu}}}
        ],
    }
    g.update(group)
    return Job.model_validate({"name": name, "type": kind, "priority": priority, "groups": [g]})


@asynccontextmanager
async def cluster(
    client: Client,
    *,
    store: Store | None = None,
    options: c.ClusterOptions | None = None,
    name: str | None = None,
    search_attributes: bool = False,
    sandboxed: bool = True,
) -> AsyncIterator[tuple[ForgeClient, Store]]:
    """A worker on a fresh task queue, and a client bound to a fresh cluster
    (``sandboxed=False``: workflow code as the test's monkeypatches leave it)."""
    store = store or MemoryStore()
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    cname = name or f"c{uuid.uuid4().hex[:8]}"
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[ClusterWorkflow],
            activities=StoreActivities(store).all(),
            activity_executor=pool,
            graceful_shutdown_timeout=timedelta(seconds=1),
            workflow_runner=SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner(),
        ):
            fc = ForgeClient(
                client,
                cluster=cname,
                task_queue=queue,
                options=options or default_options(),
                search_attributes=search_attributes,
                store=store,
            )
            try:
                yield fc, store
            finally:
                # an orphaned workflow (no worker any more) would hold the
                # time-skipping server's clock for the tests that follow
                with contextlib.suppress(Exception):
                    await fc.handle().terminate("test finished")


async def eventually_status(
    fc: ForgeClient, pred: Callable[..., bool], timeout: float = 20.0
) -> c.StatusView:
    """Poll the published status until ``pred`` holds; fail naming the last summary."""
    deadline = time.monotonic() + timeout
    while True:
        status = await fc.status()
        if pred(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached; last status {status.summary}")
        await asyncio.sleep(0.05)  # poll interval, not synchronisation
