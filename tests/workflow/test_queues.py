"""Queues through the loop (issue 34): declared by an update, held by the loop and its
checkpoint, asked by every pass before it places a queued job's replica.

Time-skipping server, the real worker and store. A queue at its quota leaves the rest
``queued`` with the queue's reason (the store's ``forge explain`` says it); raising
the quota admits them in the pass that takes the change; a job naming an unknown
queue and a delete of a queue in use are refused with the field named; queues
outlive continue-as-new; a plain-JSON client (another language, the raw
``temporal`` CLI) gets the same. Each history replays."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from forge import render
from forge.client import reads
from forge.client.client import ForgeClient
from forge.client.queues import apply_queues, read_queues
from forge.core.models import Job
from forge.core.quota import QueueSpec
from forge.errors import InvalidInput
from forge.stores import MemoryStore, Store
from forge.wire import queues as q
from tests.workflow.harness import cluster, default_options, job, node
from tests.workflow.test_batch_end import _replays
from tests.workflow.test_batch_loop import bound, until
from tests.workflow.test_rollouts import details_once


def _queue(name: str, cpu: int, cohort: str | None = None, **more: int) -> QueueSpec:
    return QueueSpec.model_validate(
        {"name": name, "cohort": cohort, "quota": {"cpu": {"nominal": cpu, **more}}}
    )


def _in(queue: str, name: str, replicas: int) -> Job:
    spec = job(name, replicas, cpu=1000).model_dump(mode="json")
    return Job.model_validate({**spec, "queue": queue})


async def _listed(fc: ForgeClient) -> q.QueueView:
    """The first queue as the loop shows it once a run has loaded its bindings (the
    query is best-effort: a run that has just continued as new is still loading)."""
    deadline = time.monotonic() + 20
    while not (view := (await read_queues(fc)).queues[0]).usage:
        assert time.monotonic() < deadline, "the queue never showed its usage"
        await asyncio.sleep(0.02)  # poll interval, not synchronisation
    return view


async def _shown(fc: ForgeClient, store: Store) -> None:
    """What the pass published shows the queue (``forge status``, ``forge queue list``
    read it from the store, never a query), and so does the run's Web UI details."""
    status = await asyncio.to_thread(reads.status, store, fc.cluster)
    assert [(v.spec.name, v.usage, v.bound, v.queued) for v in status.queues] == [
        ("ml", {"cpu": 2000, "memory": 2048}, 2, 1)
    ]
    text = render.status_text(fc.cluster, status)
    assert re.search(r"(?m)^ml +- +cpu +2000 +2000 +2 +1$", text), text
    assert render.status_json(status, [])["queues"][0]["spec"]["name"] == "ml"
    # a run that has just continued as new shows its details after its first pass
    await details_once(fc, "- ml: cpu 2000/2000; 2 bound, 1 queued")


@pytest.mark.parametrize("limit", [0, 2])
async def test_a_queue_admits_up_to_its_quota_and_more_when_it_is_raised(
    skipping_env: WorkflowEnvironment, limit: int
) -> None:
    options = default_options(max_passes_per_run=limit)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=16000, memory=65536)])
        with pytest.raises(InvalidInput, match=r"job a: queue: no queue 'ml'"):
            await fc.submit_job(_in("ml", "a", 3))
        view = await apply_queues(fc, [_queue("ml", 2000)])
        assert [v.spec.name for v in view.queues] == ["ml"]
        await fc.submit_job(_in("ml", "a", 3))
        await fc.submit_job(job("free", 2, cpu=1000))  # default: no quota
        await until("two of a bound", lambda: len(bound(store, fc, "a")) == 2)
        assert len(bound(store, fc, "free")) == 2
        why = await fc.explain("a/main/2")
        assert why.state == "pending"
        assert why.reasons[0] == "queue ml: cpu quota 2000/2000 in use"
        listed = await _listed(fc)
        assert (listed.usage["cpu"], listed.bound, listed.queued) == (2000, 2, 1)
        await _shown(fc, store)
        busy = r"delete: queue 'ml' has work admitted or waiting \(2 replica\(s\) bound, 1 queued"
        with pytest.raises(InvalidInput, match=busy):
            await apply_queues(fc, [], ["ml"])
        await apply_queues(fc, [_queue("ml", 3000)])  # returns after its pass
        assert len(bound(store, fc, "a")) == 3
        await fc.stop_job("a")
        await apply_queues(fc, [], ["ml"])
        assert (await read_queues(fc)).queues == []
        await _replays(fc)


async def test_a_cohort_lends_idle_quota_reclaimed_and_a_plain_json_client_applies_queues(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client, options=default_options()) as (fc, store):
        await fc.register_nodes([node("n1", cpu=16000, memory=65536)])
        plain = {  # what another language's client sends: JSON, no Forge types
            "queues": [
                {"name": "ml", "cohort": "r", "quota": {"cpu": {"nominal": 2000}}},
                {"name": "nlp", "cohort": "r", "quota": {"cpu": {"nominal": 2000}}},
            ]
        }
        await fc.handle().execute_update(q.UPDATE_APPLY_QUEUES, plain)
        await fc.submit_job(_in("ml", "a", 5))
        await until("ml borrowed nlp's", lambda: len(bound(store, fc, "a")) == 4)
        why = await fc.explain("a/main/4")
        assert why.reasons[0] == "queue ml: cpu quota 4000/2000 in use, cohort r has 0m to lend"
        bad = {"queues": [{"name": "x", "quota": {"cpu": {"nominal": 1, "lending_limit": 2}}}]}
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await fc.handle().execute_update(q.UPDATE_APPLY_QUEUES, bad)
        assert "lending_limit" in str(err.value.cause)
        assert [v.spec.name for v in (await read_queues(fc)).queues] == ["ml", "nlp"]
        # nlp wants its own 2 back: it reclaims them from ml, which borrowed them
        await fc.submit_job(_in("nlp", "b", 2))
        await until("nlp reclaimed", lambda: len(bound(store, fc, "b")) == 2)
        assert len(bound(store, fc, "a")) == 2
        why = await fc.explain("a/main/3")
        assert any(r.startswith("preempted by b/main/") for r in why.reasons), why.reasons
        await _replays(fc)


async def test_a_queue_arriving_with_nothing_takes_its_fair_share_from_the_first(
    skipping_env: WorkflowEnvironment,
) -> None:
    """``pool`` lends 6 cpus and runs nothing; ml takes all 6, then nlp (owning nothing,
    like ml) submits: the loop evicts ml's replicas for it until both hold 3, then
    nothing moves (fair-share preemption), and the history replays."""
    async with cluster(skipping_env.client, options=default_options()) as (fc, store):
        await fc.register_nodes([node("n1", cpu=16000, memory=65536)])
        specs = [_queue("pool", 6000, "r"), _queue("ml", 0, "r"), _queue("nlp", 0, "r")]
        await apply_queues(fc, specs)
        await fc.submit_job(_in("ml", "a", 6))
        await until("ml borrowed the pool", lambda: len(bound(store, fc, "a")) == 6)
        await fc.submit_job(_in("nlp", "b", 6))
        await until("nlp has its share", lambda: len(bound(store, fc, "b")) == 3)
        assert len(bound(store, fc, "a")) == 3
        left = sorted({f"b/main/{i}" for i in range(6)} - set(bound(store, fc, "b")))
        for wid in left:  # the rest of nlp's wait for the pool, as ml's do (once a
            # pass after the preempting one has published their entries)
            deadline = time.monotonic() + 20
            while not (await fc.explain(wid)).reasons[0].startswith("queue nlp: cpu quota 3000/0"):
                assert time.monotonic() < deadline, (await fc.explain(wid)).reasons
                await asyncio.sleep(0.02)  # poll interval, not synchronisation
        evicted = sorted({f"a/main/{i}" for i in range(6)} - set(bound(store, fc, "a")))
        why = await fc.explain(evicted[0])
        assert any(r.startswith("preempted by b/main/") for r in why.reasons), why.reasons
        await _replays(fc)
        assert (len(bound(store, fc, "a")), len(bound(store, fc, "b"))) == (3, 3)


async def _planned_view(fc: ForgeClient) -> q.QueueView | None:
    """The loop's first queue once a pass of the run has counted its bound replicas
    (asked of the loop: the store's published copy outlives any run); None if the
    run shows none within 20 s."""
    deadline = time.monotonic() + 20
    while True:
        view = await fc.handle().query(q.QUERY_QUEUES, result_type=q.QueuesView)
        if (view.queues and view.queues[0].bound) or time.monotonic() > deadline:
            return view.queues[0] if view.queues else None
        await asyncio.sleep(0.02)  # poll interval, not synchronisation


async def test_queues_outlive_a_terminated_cluster_through_the_store(
    skipping_env: WorkflowEnvironment,
) -> None:
    """A cluster terminated and started again (a workflow with no checkpoint on the
    same store) gets its queues back from the store, as it gets its jobs and
    bindings: the replica the quota held back stays queued, not placed past it."""
    store, name = MemoryStore(), f"c{uuid.uuid4().hex[:8]}"
    async with cluster(skipping_env.client, store=store, name=name) as (fc, _):
        await fc.register_nodes([node("n1", cpu=16000, memory=65536)])
        await apply_queues(fc, [_queue("ml", 2000)])
        await fc.submit_job(_in("ml", "a", 3))
        await until("two of a bound", lambda: len(bound(store, fc, "a")) == 2)
        await _replays(fc)
    assert store.queues(name) == [_queue("ml", 2000)]
    async with cluster(skipping_env.client, store=store, name=name) as (fc, _):
        await fc.start()
        view = await _planned_view(fc)
        assert view is not None, "the new run has no queue"
        assert (view.spec, view.bound, view.queued) == (_queue("ml", 2000), 2, 1)
        assert len(bound(store, fc, "a")) == 2
        await apply_queues(fc, [_queue("ml", 3000)])  # and a change goes on as before
        assert len(bound(store, fc, "a")) == 3
        assert store.queues(name) == [_queue("ml", 3000)]
        await _replays(fc)


async def test_the_last_queue_deleted_in_a_resyncing_pass_stays_deleted(
    skipping_env: WorkflowEnvironment,
) -> None:
    """A full reload of the jobs (a resync, here every pass) does not take the store's
    queues back: only a run's start does, and a deletion of the last queue is not in
    the store until the pass that took it persists."""
    store = MemoryStore()
    options = default_options(resync_seconds=0.001)
    async with cluster(skipping_env.client, store=store, options=options) as (fc, _):
        await fc.register_nodes([node("n1", cpu=16000, memory=65536)])
        await apply_queues(fc, [_queue("ml", 2000)])
        assert store.queues(fc.cluster) == [_queue("ml", 2000)]
        await apply_queues(fc, [], ["ml"])  # returns after its pass
        await fc.submit_job(job("probe", 1))  # and one more pass
        view = await fc.handle().query(q.QUERY_QUEUES, result_type=q.QueuesView)
        assert view.queues == [] and store.queues(fc.cluster) == []
        await _replays(fc)
