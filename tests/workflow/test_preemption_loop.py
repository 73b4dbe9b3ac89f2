"""Preemption through the loop (issue 21), on the time-skipping test server: the
victims released and the preemptor bound in one fenced delta, the count and the
explanations published, and the history replays (under the ``preemption`` patch)."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge.wire import activity_contract as ac
from forge.wire.codec import data_converter
from tests.e2e.procs import assert_store_is_the_workflows
from tests.workflow.harness import cluster, eventually_status, job, node
from workflows.cluster import ClusterWorkflow


async def test_a_priority_90_job_on_a_full_cluster_preempts_in_one_delta_and_says_so(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("a", cpu=4000), node("b", cpu=4000)])
        low = await fc.submit_job(job("batch", replicas=8, cpu=1000, memory=512, priority=20))
        assert low.bound == 8
        urgent = await fc.submit_job(job("urgent", replicas=2, cpu=2000, memory=512, priority=90))
        assert (urgent.bound, urgent.pending) == (2, 0)
        status = await eventually_status(fc, lambda s: s.summary.bound == 6)
        assert status.preemptions == 4 and status.summary.pending == 4

        persists: list[ac.PersistIn] = []
        async for ev in fc.handle().fetch_history_events():
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                sa = ev.activity_task_scheduled_event_attributes
                if sa.activity_type.name == ac.ACT_PERSIST:
                    (p,) = await fc.client.data_converter.decode(sa.input.payloads, [ac.PersistIn])
                    persists.append(p)
        [delta] = [p for p in persists if any(r[0] == "urgent" for r in p.bind)]
        victims = sorted(delta.release)
        assert len(victims) == 4 and all(v.startswith("batch/main/") for v in victims)

        doc = await fc.published()
        assert doc is not None and doc.preemptions == 4
        by = {v: p.preemptor for p in doc.recent_preemptions for v in p.victims}
        assert sorted(by) == victims
        victim = await fc.explain(victims[0])
        assert victim.state == "pending"
        assert any(r.startswith(f"preempted by {by[victims[0]]} at ") for r in victim.reasons)
        assert any(r.startswith(f"preempted by {by[victims[0]]} on ") for r in victim.reasons)
        preemptor = await fc.explain(by[victims[0]])
        assert preemptor.state == "bound"
        mine = sorted(v for v, p in by.items() if p == by[victims[0]])
        assert any(r.startswith(f"preempted {', '.join(mine)} on ") for r in preemptor.reasons)
        assert_store_is_the_workflows(store, fc.cluster)

        history = await fc.handle().fetch_history()
        markers = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and "preemption" in str(e.marker_recorded_event_attributes.details)
        ]
        assert markers, "the preemption patch marker is not in the history"
        replayed = await Replayer(
            workflows=[ClusterWorkflow], data_converter=data_converter()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_job_within_min_gap_or_marked_never_waits(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, _):
        await fc.register_nodes([node("a", cpu=2000)])
        await fc.submit_job(job("batch", replicas=2, cpu=1000, memory=512, priority=45))
        near = await fc.submit_job(job("near", replicas=1, cpu=2000, memory=512, priority=50))
        assert (near.bound, near.pending) == (0, 1)
        polite = job("polite", replicas=1, cpu=2000, memory=512, priority=90)
        polite = polite.model_copy(update={"preemption": "never"})
        assert (await fc.submit_job(polite)).bound == 0
        status = await fc.status()
        assert status.preemptions == 0 and status.summary.bound == 2
