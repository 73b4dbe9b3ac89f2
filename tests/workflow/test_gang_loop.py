"""Gangs and spread through the loop (issue 22), on the time-skipping test server: a
2-worker gang on room for one binds nothing until a node joins, then both; a zone
spread lands balanced; the store is the workflow's, and the history (with the
``topology-rules`` and ``gang-placement`` patch markers) replays."""

from __future__ import annotations

from collections import Counter

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge.core.models import Node
from forge.wire.codec import data_converter
from tests.e2e.procs import assert_store_is_the_workflows
from tests.workflow.harness import cluster, eventually_status, job, node
from workflows import patches
from workflows.cluster import ClusterWorkflow


def _zoned(node_id: str, zone: str) -> Node:
    return Node(id=node_id, cpu=4000, memory=8192, labels={"zone": zone})


async def test_a_gang_waits_whole_until_a_node_joins_and_a_spread_lands_balanced(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("g1", cpu=16000, memory=65536, gpus=2)])
        first = await fc.submit_job(
            job("train", replicas=2, cpu=4000, memory=8192, gpu=2, gang=True)
        )
        assert (first.bound, first.pending) == (0, 2)
        why = await fc.explain("train/main/1")
        assert why.state == "pending"
        assert any(r.startswith("gang: 1 of 2 fit; 0/1 nodes available") for r in why.reasons)

        await fc.register_nodes([node("g2", cpu=16000, memory=65536, gpus=2)])
        await eventually_status(fc, lambda s: s.summary.bound == 2)

        zones = [_zoned(f"z{i}", "abc"[i % 3]) for i in range(6)]
        await fc.register_nodes(zones)
        web = await fc.submit_job(job("web", replicas=6, cpu=500, spread=[{"label": "zone"}]))
        assert web.bound == 6
        held = [a for a in store.assignments(fc.cluster) if a.job == "web"]
        zone_of = {n.id: n.labels["zone"] for n in zones}
        assert Counter(zone_of[a.node] for a in held) == {"a": 2, "b": 2, "c": 2}
        assert_store_is_the_workflows(store, fc.cluster)

        history = await fc.handle().fetch_history()
        details = [
            str(e.marker_recorded_event_attributes.details)
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        ]
        for patch in (patches.TOPOLOGY, patches.GANGS):
            assert any(patch in d for d in details), f"no {patch} marker in the history"
        replayed = await Replayer(
            workflows=[ClusterWorkflow], data_converter=data_converter()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
