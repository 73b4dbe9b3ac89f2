"""The real thing: a dev server, `python worker.py` processes, kill -9."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient
from forge.core.invariants import violations
from forge.core.reconcile import ReconcileOptions
from forge.stores import SqliteStore, Store
from forge.wire import contract as c
from tests.e2e.procs import assert_store_is_the_workflows, eventually
from tests.workflow.harness import job, node

pytestmark = pytest.mark.slow


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


def _assert_store_matches(store: Store, fc: ForgeClient) -> None:
    assert_store_is_the_workflows(store, fc.cluster)
    stored = store.assignments(fc.cluster, limit=1_000_000)
    problems = violations(store.nodes(fc.cluster, limit=1_000_000), stored)
    assert problems == []


async def test_node_loss_rebinds_on_survivors(dev_env, spawn_worker, tmp_path: Path) -> None:
    db = tmp_path / "forge.db"
    spawn_worker(f"sqlite:///{db}")
    store = SqliteStore(db)
    fc = _client(dev_env, spawn_worker.task_queue, "loss", store)
    await fc.register_nodes([node("a"), node("b"), node("c")])
    res = await fc.submit_job(job("web", replicas=6, cpu=1000))
    assert res.bound == 6
    before = await fc.assignments()
    on_a = {a.workload_id for a in before if a.node == "a"}
    assert on_a, "binpack should have put something on node a"
    await fc.node_lost("a")
    status = await eventually(
        fc.status,
        lambda s: s.summary.bound == 6 and next(n for n in s.nodes if n.id == "a").replicas == 0,
        what="replicas rebound off the lost node",
    )
    assert next(n for n in status.nodes if n.id == "a").state == "lost"
    after = await fc.assignments()
    assert all(a.node in ("b", "c") for a in after)
    _assert_store_matches(store, fc)


async def test_kill_9_mid_pass_then_a_new_worker_converges(
    dev_env, spawn_worker, tmp_path: Path
) -> None:
    db = tmp_path / "forge.db"
    url = f"sqlite:///{db}"
    first = spawn_worker(url)
    store = SqliteStore(db)
    # small passes (100 placements each) so the kill lands while passes run
    fc = _client(
        dev_env,
        spawn_worker.task_queue,
        "crash",
        store,
        reconcile=ReconcileOptions(max_placements=100).model_dump(),
    )
    await fc.register_nodes([node(f"n{i:02d}", cpu=16000, memory=32768, gpus=2) for i in range(40)])
    await fc.submit_job(job("web", replicas=800, cpu=500, memory=512), wait=False)
    await fc.submit_job(job("gpu", replicas=60, cpu=1000, memory=1024, gpu=1), wait=False)
    await eventually(
        lambda: _async(store.fence(fc.cluster)),
        lambda f: f is not None and f.pass_no >= 3,
        what="a few persisted passes",
    )
    first.kill9()
    bound_at_kill = len(store.assignments(fc.cluster, limit=1_000_000))
    assert bound_at_kill < 860, "the kill should land before convergence"
    spawn_worker(url)
    status = await eventually(
        fc.status,
        lambda s: s.summary.desired == 860 and s.summary.bound == 860,
        timeout=120,
        what="convergence after the crash",
    )
    assert status.summary.pending == 0
    shown = await fc.assignments()
    assert len({a.workload_id for a in shown}) == 860
    _assert_store_matches(store, fc)


async def _async(value):
    return value
