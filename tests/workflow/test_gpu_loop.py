"""GPU placement through the loop (issue 10): placement version 2 in the cluster
workflow, on the time-skipping test server."""

from __future__ import annotations

from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from forge.core.models import Job, Node
from forge.wire import activity_contract as ac
from tests.e2e.procs import assert_store_is_the_workflows
from tests.workflow.harness import cluster, default_options, eventually_status, job, node


async def _persists(fc: Any) -> list[ac.PersistIn]:
    """What this run's passes persisted, in order (decoded from its history)."""
    out: list[ac.PersistIn] = []
    async for ev in fc.handle().fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            sa = ev.activity_task_scheduled_event_attributes
            if sa.activity_type.name == ac.ACT_PERSIST:
                (persist,) = await fc.client.data_converter.decode(
                    sa.input.payloads, [ac.PersistIn]
                )
                out.append(persist)
    return out


def _h100(node_id: str) -> Node:
    return Node.model_validate(
        {
            "id": node_id,
            "cpu": 16_000,
            "memory": 64 * 1024,
            "gpus": [{"id": f"gpu{i}", "model": "H100", "memory": 81920} for i in range(2)],
        }
    )


def _gpu_job(name: str, *, cpu: int, memory: int, gpu: dict[str, Any], replicas: int) -> Job:
    res = {"cpu": cpu, "memory": memory, "gpu": gpu}
    return job(name, replicas=replicas, tasks=[{"name": "t", "resources": res}])


async def test_a_node_added_for_a_pending_gpu_job_goes_to_it_not_to_higher_priority_cpu_work(
    skipping_env: WorkflowEnvironment,
) -> None:
    """The issue's scenario: a full cluster, a 2-GPU H100 job pending and a
    higher-priority CPU-only job's replicas pending too; an operator adds an H100
    node. In that very pass the GPU job gets the node, and the CPU replicas take
    only the cpu it leaves (before the GPU reservation they took all of it first and
    the GPUs stood idle)."""
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("c1", cpu=4000), node("c2", cpu=4000)])
        await fc.submit_job(job("fill", replicas=8, cpu=1000, memory=512))
        train = _gpu_job(
            "train", cpu=8000, memory=32 * 1024, gpu={"count": 2, "models": ["H100"]}, replicas=1
        )
        assert (await fc.submit_job(train)).pending == 1
        # higher priority, but within preemption's min_gap of the filler: it waits
        web = job("web", replicas=8, cpu=2000, memory=1024, priority=55)
        assert (await fc.submit_job(web)).pending == 8

        await fc.register_nodes([_h100("h100")])
        await eventually_status(fc, lambda s: s.summary.nodes == 3 and s.summary.bound >= 9)

        (joined,) = [p for p in await _persists(fc) if any(n.id == "h100" for n in p.nodes_upsert)]
        bound = {(r[0], r[2]): r for r in joined.bind}
        assert ("train", 0) in bound, "the GPU job did not get the new node in that pass"
        _, _, _, on, gpu_ids, *_ = bound[("train", 0)]
        assert on == "h100" and tuple(gpu_ids) == ("gpu0", "gpu1")
        web_rows = [r for r in joined.bind if r[0] == "web"]
        assert {r[3] for r in web_rows} == {"h100"}
        assert 8000 + sum(r[5] for r in web_rows) <= 16_000
        assert len(web_rows) == 4, "the CPU replicas should take the cpu the GPU job leaves"

        s = await fc.status()
        assert s.summary.bound == 8 + 1 + 4 and s.summary.pending == 4
        assert_store_is_the_workflows(store, fc.cluster)


async def test_gpu_shares_are_placed_on_one_device_persisted_and_reloaded_exactly(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Fractional GPUs through the loop: 0.3-GPU replicas share one device, the store
    holds their share (assignments.gpu_milli), and a new run (continue-as-new,
    which reloads everything from the store) accounts the shares it loads: more
    replicas go to the device's remaining milli-GPU, never beyond 1000."""
    opts = default_options(max_passes_per_run=2)
    async with cluster(skipping_env.client, options=opts) as (fc, store):
        await fc.register_nodes([node("g", cpu=16_000, memory=65_536, gpus=2)])
        share = _gpu_job("share", cpu=500, memory=512, gpu={"count": 1, "milli": 300}, replicas=3)
        await fc.submit_job(share)
        await eventually_status(fc, lambda s: s.summary.bound == 3)
        first = store.assignments(fc.cluster)
        assert {(a.node, tuple(a.gpu_ids), a.gpu_milli) for a in first} == {("g", ("gpu0",), 300)}
        generation = (await fc.status()).summary.generation

        for i in range(3):  # passes that change nothing for the shares: new runs
            await fc.register_nodes([node(f"cpu{i}")])
            await eventually_status(fc, lambda s, n=2 + i: s.summary.nodes == n)
        assert (await fc.status()).summary.generation >= generation + 1, "no new run"
        assert store.assignments(fc.cluster) == first  # reloaded, nothing moved

        # the reloaded run knows gpu0 has 100 milli left: three more go to gpu1
        await fc.scale("share", "main", 6)
        await eventually_status(fc, lambda s: s.summary.bound == 6)
        # and a seventh finds no device with 300 milli free
        await fc.scale("share", "main", 7)
        s = await eventually_status(fc, lambda s: s.summary.pending == 1)
        assert s.summary.bound == 6
        (pending,) = s.pending
        assert pending.workload_id == "share/main/6"
        rows = store.assignments(fc.cluster)
        assert {a.gpu_milli for a in rows} == {300}
        per_device = Counter((a.node, a.gpu_ids[0]) for a in rows)
        assert per_device == {("g", "gpu0"): 3, ("g", "gpu1"): 3}
        assert_store_is_the_workflows(store, fc.cluster)
