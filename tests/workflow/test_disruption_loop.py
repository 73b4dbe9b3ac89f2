"""Disruption budgets through the loop (issue 21), on the time-skipping test server:
a drain moves a budgeted group's replicas one delta at a time, never taking more
than its budget below desired, and the history replays (under the
``disruption-budgets`` patch)."""

from __future__ import annotations

import asyncio
import time

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge.wire import activity_contract as ac
from forge.wire.codec import data_converter
from tests.e2e.procs import assert_store_is_the_workflows
from tests.workflow.harness import cluster, job, node
from workflows.cluster import ClusterWorkflow


async def test_a_drain_moves_a_budgeted_group_one_replica_per_delta_and_replays(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("a"), node("b"), node("c")])
        web = job("web", replicas=4, cpu=2000, memory=512, disruption={"max_unavailable": 1})
        assert (await fc.submit_job(web)).bound == 4
        bound = await fc.assignments()
        host = next(a.node for a in bound if a.workload_id == "web/main/0")
        on_host = sorted(a.workload_id for a in bound if a.node == host)
        assert len(on_host) == 2  # binpack: two a node

        await fc.drain_node(host)
        deadline = time.monotonic() + 20
        while True:
            bound = await fc.assignments()
            assert len(bound) >= 3  # never more than the budget below desired
            if not [a for a in bound if a.node == host]:
                break
            assert time.monotonic() < deadline, "the drain did not finish"
            await asyncio.sleep(0.05)  # poll interval, not synchronisation
        assert len(await fc.assignments()) == 4

        deltas: list[ac.PersistIn] = []
        async for ev in fc.handle().fetch_history_events():
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                sa = ev.activity_task_scheduled_event_attributes
                if sa.activity_type.name == ac.ACT_PERSIST:
                    (p,) = await fc.client.data_converter.decode(sa.input.payloads, [ac.PersistIn])
                    deltas.append(p)
        drained = [sorted(p.release) for p in deltas if p.release]
        # one replica a delta, each placed again before the next goes
        assert sorted(drained) == [[w] for w in on_host], drained
        assert_store_is_the_workflows(store, fc.cluster)

        history = await fc.handle().fetch_history()
        markers = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and "disruption-budgets" in str(e.marker_recorded_event_attributes.details)
        ]
        assert markers, "the disruption-budgets patch marker is not in the history"
        replayed = await Replayer(
            workflows=[ClusterWorkflow], data_converter=data_converter()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
