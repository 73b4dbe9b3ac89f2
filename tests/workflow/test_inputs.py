"""What the loop does with input it cannot use, and with input that arrives twice:
dropped signals are visible within one pass; failure reports keyed by a binding
change nothing once the replica has moved (as after a reset that reapplies them)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient
from forge.wire import contract as c
from tests.workflow.harness import cluster, job, node

T = TypeVar("T")


async def _until(fetch: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + 20
    while True:
        value = await fetch()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value}"
        await asyncio.sleep(0.05)  # a poll interval, not synchronisation


async def test_dropped_signals_show_in_status_details_and_the_published_status(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, _):
        await fc.register_nodes([node("n1")])
        await _until(fc.status, lambda s: s.summary.nodes == 1, "n1 registered")  # idle now
        handle = fc.handle()
        await handle.signal(c.SIGNAL_REGISTER_NODE, {"id": "n2", "cpu": 1000})  # not {"nodes"}
        await handle.signal("register_nodes", {"nodes": []})  # misspelt name
        status = await _until(
            fc.status, lambda s: any("2 signal(s) dropped" in n for n in s.notices), "notices"
        )
        (notice,) = status.notices
        assert "last: register_nodes: unknown signal" in notice
        assert status.summary.nodes == 1  # the bad one registered nothing
        doc = await fc.published()
        assert doc is not None and doc.notices == [notice]
        desc = await handle.describe()
        raw: Any = await handle.query("__temporal_workflow_metadata")
        assert "2 signal(s) dropped" in str(raw), raw
        assert desc.status is not None


async def test_a_failure_report_for_a_replica_that_moved_restarts_nothing(
    skipping_env: WorkflowEnvironment,
) -> None:
    """A report names the node the replica failed on; replayed after the replica
    moved (a reset reapplies updates, a new run re-reads store reports), it is
    ignored instead of restarting the replica where it runs now."""
    async with cluster(skipping_env.client) as (fc, _):
        await fc.register_nodes([node("a", cpu=1000)])
        await fc.submit_job(job("web", replicas=1, cpu=1000))
        (before,) = await fc.assignments()
        assert before.node == "a"
        await fc.register_nodes([node("b", cpu=1000)])
        await fc.node_lost("a")
        moved = await _until(
            fc.assignments, lambda a: len(a) == 1 and a[0].node == "b", "the move to b"
        )
        # the old report, about node a, arrives (again): nothing happens
        assert await fc.report_failed(["web/main/0"], on={"web/main/0": "a"}) == 0
        status = await fc.status()
        assert await fc.assignments() == moved and status.summary.bound == 1
        # a report about where it runs now does restart it
        assert await fc.report_failed(["web/main/0"], on={"web/main/0": "b"}) == 1


async def test_status_of_a_cluster_nobody_started_is_an_error(
    skipping_env: WorkflowEnvironment,
) -> None:
    fc = ForgeClient(skipping_env.client, cluster="never-started-here")
    try:
        await fc.status()
    except Exception as err:
        assert "not found" in str(err).lower()
    else:
        raise AssertionError("status of a missing workflow answered")


async def test_a_burst_of_node_registrations_is_persisted_in_bounded_chunks(
    skipping_env: WorkflowEnvironment,
) -> None:
    """1,500 nodes of ~1.5 KiB of labels each (2.2 MB) sent in three signals: no
    persist input carries more than NODE_BYTES of nodes (plus one), all arrive."""
    from temporalio.api.enums.v1 import EventType

    from forge.wire import activity_contract as ac
    from workflows.cluster import NODE_BYTES

    labels = {f"label-{i:02d}": "x" * 40 for i in range(24)}

    def big(name: str) -> Any:
        n = node(name)
        return n.model_copy(update={"labels": labels})

    async with cluster(skipping_env.client) as (fc, store):
        await fc.start()
        await asyncio.gather(
            *(fc.register_nodes([big(f"n{b}-{i:03d}") for i in range(500)]) for b in range(3))
        )
        await _until(fc.status, lambda s: s.summary.nodes == 1500, "every node registered")
        assert len(store.nodes(fc.cluster, limit=5000)) == 1500
        sizes = []
        async for ev in fc.handle().fetch_history_events():
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                sa = ev.activity_task_scheduled_event_attributes
                if sa.activity_type.name == ac.ACT_PERSIST:
                    (persist,) = await fc.client.data_converter.decode(
                        sa.input.payloads, [ac.PersistIn]
                    )
                    if persist.nodes_upsert:
                        sizes.append(sum(len(n.model_dump_json()) for n in persist.nodes_upsert))
        one = len(big("n0-000").model_dump_json())
        assert len(sizes) >= 4 and max(sizes) <= NODE_BYTES + one, sizes
