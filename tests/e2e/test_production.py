"""The production path: several workers sharing PostgreSQL, and metrics."""

from __future__ import annotations

import urllib.request

import pytest
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient
from forge.core.invariants import violations
from forge.core.reconcile import ReconcileOptions
from forge.stores import SqliteStore, Store, open_store
from forge.wire import contract as c
from tests.e2e.conftest import free_port
from tests.e2e.procs import assert_store_is_the_workflows, eventually
from tests.workflow.harness import job, node

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _client(
    env: WorkflowEnvironment, queue: str, name: str, store: Store, **opts: object
) -> ForgeClient:
    return ForgeClient(
        env.client,
        cluster=name,
        task_queue=queue,
        options=c.ClusterOptions.model_validate({"watch_poll": 0.2, **opts}),
        store=store,
    )


async def test_two_workers_on_postgres_one_killed_the_other_carries_on(
    dev_env, spawn_worker, pg_url: str
) -> None:
    a = spawn_worker(pg_url)
    spawn_worker(pg_url)
    store = open_store(pg_url)
    fc = _client(
        dev_env,
        spawn_worker.task_queue,
        "pg-two",
        store,
        reconcile=ReconcileOptions(max_placements=50).model_dump(),
    )
    await fc.register_nodes([node(f"n{i:02d}", cpu=8000, memory=16384, gpus=1) for i in range(30)])
    await fc.submit_job(job("web", replicas=400, cpu=500, memory=512), wait=False)
    await fc.submit_job(job("ml", replicas=20, cpu=1000, gpu=1), wait=False)
    try:
        await eventually(
            lambda: _value(store.fence(fc.cluster)),
            lambda f: f is not None and f.pass_no >= 2,
            what="passes persisted",
        )
        a.kill9()
        status = await eventually(
            fc.status,
            lambda s: s.summary.desired == 420 and s.summary.bound == 420,
            timeout=120,
            what="convergence on the surviving worker",
        )
        assert status.summary.pending == 0
        assert_store_is_the_workflows(store, fc.cluster)
        stored = store.assignments(fc.cluster, limit=1_000_000)
        assert violations(store.nodes(fc.cluster, limit=10_000), stored) == []
    finally:
        store.close()


async def test_worker_exposes_sdk_and_forge_metrics(dev_env, spawn_worker, tmp_path) -> None:
    port = free_port()
    spawn_worker(f"sqlite:///{tmp_path / 'forge.db'}", FORGE_METRICS_PORT=str(port))
    fc = _client(dev_env, spawn_worker.task_queue, "metrics", SqliteStore(tmp_path / "forge.db"))
    await fc.register_nodes([node("a"), node("b")])
    await fc.submit_job(job("web", replicas=3))
    await fc.submit_job(job("huge", replicas=1, cpu=100_000))

    async def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    wanted = [
        "forge_replicas_desired",
        "forge_replicas_bound",
        "forge_replicas_pending",
        "forge_replicas_backoff",
        "forge_nodes",
        "forge_pass_seconds",
        "forge_placements_total",
        "forge_releases_total",
        "forge_persist_seconds",
        "forge_pass_work_units",
        "forge_longest_plan_seconds",
        "temporal_workflow_task_execution_latency",  # the SDK runtime's own
    ]
    text = await eventually(
        scrape, lambda t: all(w in t for w in wanted), timeout=30, what="metrics on the endpoint"
    )
    bound = [ln for ln in text.splitlines() if ln.startswith("forge_replicas_bound{")]
    assert any(ln.rstrip().endswith(" 3") for ln in bound), bound
    pending = [ln for ln in text.splitlines() if ln.startswith("forge_replicas_pending{")]
    assert any(ln.rstrip().endswith(" 1") for ln in pending), pending


async def _value(v):
    return v
