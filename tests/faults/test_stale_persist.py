"""A delayed retry of an old persist arrives after a newer pass: refused.

Every persist carries a fence (generation, pass). A late retry of pass 4 arriving
after pass 5 was applied must change nothing, on every store backend, and must
fail for good (``StaleFence``, non-retryable) rather than be retried forever. A
newer generation (a new run) wins over any pass of an older one.

At the workflow level: after a real worker's cluster has run, an old-fenced persist
applied to its store is refused and the store still equals the workflow's state;
and when another run persists a newer generation behind the loop's back, the loop's
next persist is refused, it reloads from the store and carries on at a newer
generation, converging again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.store_activities import StoreActivities
from forge.client.client import ForgeClient
from forge.core.models import Assignment, Node
from forge.stores import Fence, MemoryStore, SqliteStore, Store, open_store
from forge.wire import activity_contract as ac
from forge.wire import contract as c
from tests.e2e.procs import eventually
from tests.faults.checks import all_assignments, all_nodes, record_figures, reset_run, settle
from tests.workflow.harness import job, node

pytestmark = pytest.mark.slow

CLUSTER = "fenced"


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SqliteStore(tmp_path / "forge.db")
    else:
        s = open_store(request.getfixturevalue("pg_url"))
    try:
        yield s
    finally:
        s.close()


def _persist(
    gen: int,
    pass_no: int,
    bind: Sequence[tuple[str, str]],
    release: Sequence[str] = (),
    nodes: Sequence[Node] = (),
) -> ac.PersistIn:
    """A persist binding ``(workload id, node)`` pairs (1000 mCPU, 1 GiB each)."""
    rows: list[ac.BindRow] = []
    for wid, node_id in bind:
        j, g, o = wid.split("/")
        rows.append((j, g, int(o), node_id, (), 1000, 1024, "pending"))
    return ac.PersistIn(
        cluster=CLUSTER,
        generation=gen,
        pass_no=pass_no,
        bind=rows,
        release=list(release),
        nodes_upsert=list(nodes),
    )


def _state(store: Store, cluster: str = CLUSTER) -> tuple[Any, ...]:
    return (
        store.fence(cluster),
        [(a.workload_id, a.node) for a in all_assignments(store, cluster)],
        [n.id for n in all_nodes(store, cluster)],
    )


def _refused(env: ActivityEnvironment, acts: StoreActivities, req: ac.PersistIn) -> str:
    with pytest.raises(ApplicationError) as info:
        env.run(acts.persist, req)
    assert info.value.type == "StaleFence", info.value
    assert info.value.non_retryable, "a stale persist must not be retried"
    return str(info.value)


def test_old_fence_refused_by_the_persist_activity(store: Store) -> None:
    env = ActivityEnvironment()
    acts = StoreActivities(store)

    pass5 = _persist(3, 5, [("web/main/0", "a"), ("web/main/1", "a")], nodes=[node("a"), node("b")])
    newer = env.run(acts.persist, pass5)
    assert newer.applied
    after_newer = _state(store)
    assert after_newer[0] == Fence(3, 5)

    # pass 4's delayed retry: would move web/main/0 and release web/main/1
    _refused(
        env,
        acts,
        _persist(3, 4, [("web/main/0", "b")], release=["web/main/1"], nodes=[node("ghost")]),
    )
    assert _state(store) == after_newer, "a stale persist wrote something"

    # pass 5 again with another delta: another run (a reset) used this fence: stale too
    _refused(env, acts, _persist(3, 5, [("web/main/0", "b")]))
    assert _state(store) == after_newer, "a colliding persist wrote something"

    # the same fence again (an ordinary retry of pass 5): a no-op, same digest
    again = env.run(acts.persist, pass5)
    assert (again.applied, again.digest) == (False, newer.digest)
    assert _state(store) == after_newer

    # a newer generation wins even with a lower pass number ...
    gen4 = env.run(acts.persist, _persist(4, 1, [("web/main/0", "b")], release=["web/main/1"]))
    assert gen4.applied
    after_gen4 = _state(store)
    assert after_gen4[0] == Fence(4, 1)
    assert after_gen4[1] == [("web/main/0", "b")]
    # ... and an older generation loses even with a higher one
    _refused(env, acts, _persist(3, 9, [("web/main/2", "a")]))
    assert _state(store) == after_gen4, "an older generation wrote something"


async def test_workflow_state_survives_stale_and_newer_fences(
    dev_env: WorkflowEnvironment, spawn_worker: Any, tmp_path: Path
) -> None:
    db = tmp_path / "forge.db"
    spawn_worker(f"sqlite:///{db}")
    fc = ForgeClient(
        dev_env.client,
        cluster="stale",
        task_queue=spawn_worker.task_queue,
        options=c.ClusterOptions(watch_poll=0.2),
        search_attributes=False,
    )
    store = SqliteStore(db)
    fc.store = store  # reads go to the store, never a query
    env = ActivityEnvironment()
    acts = StoreActivities(store)
    try:
        await fc.register_nodes([node("a"), node("b"), node("c")])
        jobs = {"web": job("web", replicas=6, cpu=1000)}
        await fc.submit_job(jobs["web"], wait=True)
        await settle(fc, store, jobs, what="initial convergence")
        fence = store.fence(fc.cluster)
        assert fence is not None and fence.pass_no >= 1
        before = await asyncio.to_thread(_state, store, fc.cluster)

        # a late retry of an older pass: would move a replica and release another
        stored = all_assignments(store, fc.cluster)
        late = _late_persist(fc.cluster, Fence(fence.generation, fence.pass_no - 1), stored)
        _refused(env, acts, late)
        assert await asyncio.to_thread(_state, store, fc.cluster) == before
        await settle(fc, store, jobs, what="state after the refused persist")

        # another run persists a newer generation behind the loop's back (a second
        # starter, a reset): it released web/main/5. The loop's next persist is
        # refused; it must reload from the store and converge at a newer generation.
        intruder = Fence(fence.generation + 1, 1)
        out = env.run(
            acts.persist,
            ac.PersistIn(
                cluster=fc.cluster,
                generation=intruder.generation,
                pass_no=intruder.pass_no,
                release=["web/main/5"],
            ),
        )
        assert out.applied
        jobs["api"] = job("api", replicas=2, cpu=500)
        await fc.submit_job(jobs["api"], wait=False)
        res = await settle(fc, store, jobs, timeout=60, what="convergence after the newer fence")
        final = store.fence(fc.cluster)
        assert final is not None and final.generation == intruder.generation + 1, final
        assert res.status.summary.generation == final.generation
        record_figures(
            "stale_persist_workflow",
            {
                "fence_before": list(fence),
                "stale_refused": [late.generation, late.pass_no],
                "intruder_fence": list(intruder),
                "fence_after_reload": list(final),
                "bound_at_end": res.bound,
                "lost": 0,
            },
        )
    finally:
        store.close()
        with contextlib.suppress(Exception):
            await fc.handle().terminate("fault test finished")


async def test_a_fence_another_run_used_makes_the_loop_reload(
    dev_env: WorkflowEnvironment, spawn_worker: Any, tmp_path: Path
) -> None:
    """A reset run replays its predecessor's generation, so its next persist can carry
    the very fence the old run already applied, with a different delta. That is as
    stale as an older fence: the loop must reload and carry on (not fail)."""
    db = tmp_path / "forge.db"
    spawn_worker(f"sqlite:///{db}")
    fc = ForgeClient(
        dev_env.client,
        cluster="collide",
        task_queue=spawn_worker.task_queue,
        options=c.ClusterOptions(watch_poll=0.2),
        search_attributes=False,
    )
    store = SqliteStore(db)
    fc.store = store  # reads go to the store, never a query
    env = ActivityEnvironment()
    acts = StoreActivities(store)
    try:
        await fc.register_nodes([node("a"), node("b")])
        jobs = {"web": job("web", replicas=4, cpu=1000)}
        await fc.submit_job(jobs["web"], wait=True)
        await settle(fc, store, jobs, what="initial convergence")
        fence = store.fence(fc.cluster)
        assert fence is not None
        # "the other run" applies the loop's next fence: it released web/main/3
        taken = Fence(fence.generation, fence.pass_no + 1)
        out = env.run(
            acts.persist,
            ac.PersistIn(
                cluster=fc.cluster,
                generation=taken.generation,
                pass_no=taken.pass_no,
                release=["web/main/3"],
            ),
        )
        assert out.applied
        jobs["api"] = job("api", replicas=2, cpu=500)
        await fc.submit_job(jobs["api"], wait=False)  # the loop's next pass collides
        await settle(fc, store, jobs, timeout=60, what="convergence after the collision")
        final = store.fence(fc.cluster)
        assert final is not None and final.generation > taken.generation, final
        record_figures(
            "fence_collision_workflow",
            {"taken_fence": list(taken), "fence_after_reload": list(final), "lost": 0},
        )
    finally:
        store.close()
        with contextlib.suppress(Exception):
            await fc.handle().terminate("fault test finished")


async def test_reset_to_an_earlier_task_converges_with_nothing_lost(
    dev_env: WorkflowEnvironment, spawn_worker: Any, tmp_path: Path
) -> None:
    """The operator's way out of a stuck workflow task (``temporal workflow reset``):
    a new run re-executes from an early task, with later signals and updates
    reapplied. Its persists carry fences the old run already used; it must reload
    from the store and converge on everything the old run had accepted."""
    db = tmp_path / "forge.db"
    spawn_worker(f"sqlite:///{db}")
    fc = ForgeClient(
        dev_env.client,
        cluster="reset",
        task_queue=spawn_worker.task_queue,
        options=c.ClusterOptions(watch_poll=0.2),
        search_attributes=False,
    )
    store = SqliteStore(db)
    fc.store = store  # reads go to the store, never a query
    try:
        await fc.register_nodes([node(n, cpu=8000, memory=16384) for n in ("a", "b", "c")])
        jobs = {"web": job("web", replicas=6, cpu=1000)}
        await fc.submit_job(jobs["web"], wait=True)
        first = await fc.handle().describe()
        reset_to = await _task_before_first_persist(dev_env, fc.workflow_id, first.run_id)
        # more work after the reset point: a job, a lost node, a scale-up
        jobs["api"] = job("api", replicas=2, cpu=500)
        await fc.submit_job(jobs["api"], wait=True)
        await fc.node_lost("a")
        jobs["web"] = jobs["web"].with_desired("main", 7)
        await fc.scale("web", "main", 7)
        await settle(fc, store, jobs, what="convergence before the reset")
        fence = store.fence(fc.cluster)
        assert fence is not None

        new_run = await reset_run(dev_env.client, fc.workflow_id, first.run_id, reset_to)
        # what the store shows is the old run's until the reset run publishes
        await eventually(
            fc.status,
            lambda s: s.summary.generation > fence.generation,
            timeout=60,
            what="the reset run's first published pass",
        )
        res = await settle(fc, store, jobs, timeout=60, what="convergence after the reset")
        assert (await fc.handle().describe()).run_id == new_run
        a = next(n for n in res.status.nodes if n.id == "a")
        assert a.state == "lost" and a.replicas == 0, a
        # its first persist was refused (older fence): it reloaded at a newer generation
        assert res.status.summary.generation > fence.generation, (fence, res.status.summary)
        jobs["late"] = job("late", replicas=1, cpu=500)
        await fc.submit_job(jobs["late"], wait=True)
        await settle(fc, store, jobs, what="the reset run keeps working")
        final = store.fence(fc.cluster)
        assert final is not None and final.generation == res.status.summary.generation
        record_figures(
            "workflow_reset",
            {
                "reset_to_event": reset_to,
                "fence_before_reset": list(fence),
                "fence_after": list(store.fence(fc.cluster) or ()),
                "lost": 0,
            },
        )
    finally:
        store.close()
        with contextlib.suppress(Exception):
            await fc.handle().terminate("fault test finished")


async def _task_before_first_persist(env: WorkflowEnvironment, wid: str, run_id: str) -> int:
    """The workflow task completion that scheduled the run's first persist."""
    last_completed = 0
    handle = env.client.get_workflow_handle(wid, run_id=run_id)
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            last_completed = ev.event_id
        elif (
            ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and ev.activity_task_scheduled_event_attributes.activity_type.name == ac.ACT_PERSIST
        ):
            return last_completed
    raise AssertionError("no persist in the history")


def _late_persist(cluster: str, fence: Fence, stored: list[Assignment]) -> ac.PersistIn:
    """An old pass's persist: moves the first replica to another node, releases the
    second, registers a node the cluster never saw."""
    first, second = stored[0], stored[1]
    target = next(n for n in ("a", "b", "c") if n != first.node)
    return ac.PersistIn(
        cluster=cluster,
        generation=fence.generation,
        pass_no=fence.pass_no,
        bind=[
            (first.job, first.group, first.ordinal, target, (), first.cpu, first.memory, "pending")
        ],
        release=[second.workload_id],
        nodes_upsert=[Node.model_validate({"id": "ghost", "cpu": 1000, "memory": 1024})],
    )
