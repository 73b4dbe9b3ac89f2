"""A spread group's scale-down through the loop (issue 22, patch ``spread-scale-down``)
on the time-skipping server: two replicas placed while only zone a had a node, two
more in zone b once it joined, then a scale-down to two keeps one per zone (the
ordinals released, 2 and 3, were both in b: replica 1 moves into the slot one of
them left). The history carries the patch marker and replays."""

from __future__ import annotations

from collections import Counter

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge.core.models import Node
from forge.wire.codec import data_converter
from tests.e2e.procs import assert_store_is_the_workflows
from tests.workflow.harness import cluster, eventually_status, job
from workflows import patches
from workflows.cluster import ClusterWorkflow


def _zoned(node_id: str, zone: str) -> Node:
    return Node(id=node_id, cpu=4000, memory=8192, labels={"zone": zone})


async def test_a_spread_scale_down_keeps_the_zones_within_max_skew_and_replays(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([_zoned("a0", "a")])
        web = await fc.submit_job(job("web", replicas=2, cpu=500, spread=[{"label": "zone"}]))
        assert web.bound == 2  # zone a is the only zone there is
        await fc.register_nodes([_zoned("b0", "b")])
        await fc.scale("web", "main", 4)
        await eventually_status(fc, lambda s: s.summary.bound == 4)

        def zones() -> Counter[str]:
            held = [a for a in store.assignments(fc.cluster) if a.job == "web"]
            return Counter({"a0": "a", "b0": "b"}[a.node] for a in held)

        assert zones() == {"a": 2, "b": 2}
        await fc.scale("web", "main", 2)
        await eventually_status(fc, lambda s: s.summary.bound == 2 and s.summary.pending == 0)
        assert zones() == {"a": 1, "b": 1}
        assert_store_is_the_workflows(store, fc.cluster)

        history = await fc.handle().fetch_history()
        details = [
            str(e.marker_recorded_event_attributes.details)
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        ]
        assert any(patches.SPREAD_SCALE_DOWN in d for d in details), "no marker"
        replayed = await Replayer(
            workflows=[ClusterWorkflow], data_converter=data_converter()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
