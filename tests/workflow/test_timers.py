"""Timer-driven behaviour on the time-skipping test server: backoff, autoscaling,
continue-as-new, and validators that keep bad input out of history."""

from __future__ import annotations

import time

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeError
from forge.core.reconcile import ReconcileOptions
from forge.stores import TaskReport
from forge.wire import activity_contract as ac
from tests.e2e.procs import assert_store_is_the_workflows
from tests.workflow.harness import cluster, default_options, eventually_status, job, node


async def _pending(fc, wid):
    status = await fc.status()
    return next((p for p in status.pending if p.workload_id == wid), None)


async def test_backoff_timers_fire_doubling_then_place_when_capacity_appears(
    skipping_env: WorkflowEnvironment,
) -> None:
    opts = default_options(reconcile=ReconcileOptions(backoff_base=1.0, backoff_cap=16.0))
    async with cluster(skipping_env.client, options=opts) as (fc, _):
        await fc.register_nodes([node("small", cpu=1000, memory=1024)])
        res = await fc.submit_job(job("big", replicas=1, cpu=4000))
        assert res.pending == 1
        p = await _pending(fc, "big/main/0")
        assert p is not None and p.attempts == 1 and p.kind == "backoff"
        assert "insufficient cpu" in p.reasons[0]
        # each timer fires and the replica is retried: attempts grow, delays double
        seen = [(p.attempts, p.not_before)]
        for _ in range(6):
            await skipping_env.sleep(16.5)
            p = await _pending(fc, "big/main/0")
            assert p is not None
            seen.append((p.attempts, p.not_before))
        attempts = [a for a, _ in seen]
        assert attempts == sorted(attempts) and attempts[-1] > attempts[0]
        # a node joins: the replica is placed at once, without waiting out its backoff
        await fc.register_nodes([node("big-node", cpu=8000)])
        await eventually_status(fc, lambda s: s.summary.bound == 1 and s.summary.pending == 0)


async def test_backoff_delays_double_up_to_the_cap(skipping_env: WorkflowEnvironment) -> None:
    opts = default_options(reconcile=ReconcileOptions(backoff_base=1.0, backoff_cap=300.0))
    async with cluster(skipping_env.client, options=opts) as (fc, _):
        await fc.register_nodes([node("small", cpu=1000, memory=1024)])
        await fc.submit_job(job("big", replicas=1, cpu=4000))
        delays = []
        p = await _pending(fc, "big/main/0")
        assert p is not None
        last_attempt = p.attempts
        prev_nb = p.not_before
        for _ in range(11):
            await skipping_env.sleep(prev_nb - await _now(fc) + 0.5)
            p = await _pending(fc, "big/main/0")
            assert p is not None
            assert p.attempts == last_attempt + 1, "the backoff timer did not fire"
            delays.append(round(p.not_before - prev_nb))
            last_attempt, prev_nb = p.attempts, p.not_before
        # the delay after attempt n is 2**(n-1) s: 2, 4, ... then capped at 300
        assert delays[:7] == [2, 4, 8, 16, 32, 64, 128]
        assert delays[7:] == [256, 300, 300, 300]


async def _now(fc) -> float:
    # the workflow's clock: the time of its last pass
    status = await fc.status()
    assert status.summary.last_pass_at is not None
    return status.summary.last_pass_at


async def test_autoscale_scales_up_then_respects_cooldown(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1", cpu=16000, memory=65536)])
        j = job(
            "api",
            replicas=1,
            autoscale={"policy": "threshold", "interval": 60, "cooldown": 300, "step": 1},
        )
        await fc.submit_job(j)

        def hot() -> None:
            store.report(
                fc.cluster,
                [
                    TaskReport(
                        workload_id=f"api/main/{i}",
                        status="running",
                        cpu=0.95,
                        memory=0.2,
                        at=time.time(),
                    )
                    for i in range(4)
                ],
            )

        hot()
        await skipping_env.sleep(61)
        s = await fc.status()
        assert s.summary.desired == 2, s.summary
        # within the cooldown: no further scale even though it is still hot
        hot()
        await skipping_env.sleep(120)
        assert (await fc.status()).summary.desired == 2
        # after the cooldown: scales again
        hot()
        await skipping_env.sleep(200)
        assert (await fc.status()).summary.desired == 3


async def test_a_gpu_bound_group_scales_on_its_gpus_an_unmeasured_one_does_not(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Through the loop's metrics activity: the same idle cpu and memory, one group's
    GPUs busy (its agents measured them), the other's unmeasured (declared GPUs)."""
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1", cpu=16000, memory=65536)])
        scale = {"policy": "target", "interval": 60, "target": 0.6}
        for name in ("infer", "twin"):
            await fc.submit_job(job(name, replicas=2, autoscale=scale))

        def sample(name: str, gpu: float | None) -> list[TaskReport]:
            return [
                TaskReport(
                    workload_id=f"{name}/main/{i}",
                    status="running",
                    cpu=0.5,
                    memory=0.5,
                    gpu=gpu,
                    at=time.time(),
                )
                for i in range(2)
            ]

        store.report(fc.cluster, sample("infer", 0.9) + sample("twin", None))
        await skipping_env.sleep(61)
        await eventually_status(fc, lambda s: s.summary.desired == 5)
        desired = {}
        for name in ("infer", "twin"):
            spec = store.get_job(fc.cluster, name)
            assert spec is not None
            desired[name] = spec.groups[0].scaling.desired
        # infer: ceil(2 * 0.9 / 0.6) = 3 on its gpu; twin: 0.5 / 0.6 within tolerance
        assert desired == {"infer": 3, "twin": 2}, desired


async def test_continue_as_new_keeps_state_and_loses_no_signal(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client, options=default_options(max_passes_per_run=2)) as (
        fc,
        store,
    ):
        first = await fc.start()
        for i in range(30):
            await fc.register_nodes([node(f"n{i:02d}")])
        await fc.submit_job(job("web", replicas=40))
        for i in range(30, 40):
            await fc.register_nodes([node(f"n{i:02d}")])
        await fc.submit_job(job("batch", replicas=20, cpu=500))
        s = await eventually_status(fc, lambda s: s.summary.nodes == 40 and s.summary.pending == 0)
        assert s.summary.bound == 60
        desc = await fc.handle().describe()
        assert desc.run_id != first, "no continue-as-new happened"
        assert s.summary.generation > 1
        # the store holds exactly the workflow's bindings (the hash the loop published
        # from its own state) and nodes
        assert_store_is_the_workflows(store, fc.cluster)
        assert len(store.assignments(fc.cluster)) == 60
        assert len(store.nodes(fc.cluster)) == 40


async def test_continue_as_new_moves_no_replica_and_keeps_gpu_ids(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Stability: a new run reloads the bindings with their nodes and device ids and
    keeps them; nothing is released (and restarted) because a run ended."""
    async with cluster(skipping_env.client, options=default_options(max_passes_per_run=2)) as (
        fc,
        store,
    ):
        await fc.register_nodes([node(f"g{i}", cpu=16000, memory=65536, gpus=4) for i in range(4)])
        await fc.submit_job(job("train", replicas=5, cpu=2000, gpu=2))
        await fc.submit_job(job("infer", replicas=4, cpu=1000, gpu=1))
        # three 0.3-GPU shares: one device between them, its share held on reload
        share = {"cpu": 500, "memory": 512, "gpu": {"count": 1, "milli": 300}}
        await fc.submit_job(job("share", replicas=3, tasks=[{"name": "t", "resources": share}]))
        await eventually_status(fc, lambda s: s.summary.bound == 12 and s.summary.pending == 0)
        shared = [a for a in store.assignments(fc.cluster) if a.job == "share"]
        assert {a.gpu_milli for a in shared} == {300}
        assert len({(a.node, a.gpu_ids) for a in shared}) == 1, "three shares, one device"
        before = {(a.workload_id, a.node, tuple(a.gpu_ids)) for a in store.assignments(fc.cluster)}
        released = await _released(fc)
        generation = (await fc.status()).summary.generation
        for i in range(6):  # a pass each, changing nothing for the GPU jobs: several runs
            await fc.register_nodes([node(f"cpu{i}")])
            s = await eventually_status(fc, lambda s, n=5 + i: s.summary.nodes == n)
        assert s.summary.generation >= generation + 2, "no continue-as-new happened"
        after = {(a.workload_id, a.node, tuple(a.gpu_ids)) for a in store.assignments(fc.cluster)}
        assert after == before
        assert await _released(fc) == released, "a replica was released across runs"


async def _released(fc) -> int:
    """Releases persisted by every run so far (decoded from the persists in history)."""
    total = 0
    run_id = (await fc.handle().describe()).run_id
    while run_id:
        handle = fc.client.get_workflow_handle(fc.workflow_id, run_id=run_id)
        previous = None
        async for ev in handle.fetch_history_events():
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                attrs = ev.workflow_execution_started_event_attributes
                previous = attrs.continued_execution_run_id or None
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                sa = ev.activity_task_scheduled_event_attributes
                if sa.activity_type.name == ac.ACT_PERSIST:
                    (persist,) = await fc.client.data_converter.decode(
                        sa.input.payloads, [ac.PersistIn]
                    )
                    total += len(persist.release)
        run_id = previous
    return total


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda fc: fc.scale("nope", "main", 3), "unknown job"),
        (lambda fc: fc.scale("web", "nope", 3), "no group"),
        (lambda fc: fc.stop_job("nope"), "unknown job"),
        (lambda fc: fc.drain_node("ghost"), "unknown node"),
        (lambda fc: fc.report_failed(["web/main/99"]), "not bound"),
    ],
)
async def test_validators_reject_bad_input_with_nothing_in_history(
    skipping_env: WorkflowEnvironment, call, message
) -> None:
    async with cluster(skipping_env.client) as (fc, _):
        await fc.register_nodes([node("n1")])
        await fc.submit_job(job("web", replicas=1))
        before = await _history_events(fc)
        with pytest.raises(ForgeError, match=message) as err:
            await call(fc)
        assert err.value.bad_input
        after = await _history_events(fc)
        assert after == before, "a rejected update must not reach history"
        assert (await fc.handle().describe()).status is not None
        assert (await fc.status()).summary.bound == 1


async def _history_events(fc) -> list[int]:
    hist = await fc.handle().fetch_history()
    return [
        e.event_type
        for e in hist.events
        if e.event_type
        in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
        )
    ]
