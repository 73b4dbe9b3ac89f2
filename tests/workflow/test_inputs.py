"""What the loop does with input it cannot use, and with input that arrives twice:
dropped signals are visible within one pass; failure reports keyed by a binding
change nothing once the replica has moved (as after a reset that reapplies them)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient
from forge.errors import Unavailable
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
    with pytest.raises(Unavailable) as raised:  # a ForgeError kind, not the SDK's RPCError
        await fc.status()
    text = str(raised.value)
    assert "'never-started-here' is not running" in text and "forge cluster start" in text


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


async def test_one_bad_node_does_not_drop_the_batch_and_integer_gpu_ids_are_read(
    skipping_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    """Plain JSON, as any Temporal client sends it: seven nodes, one with cpu -1 and
    one whose GPU ids are JSON integers. Six register (the GPU ids as "0", "1"), the
    bad one is reported by its id and field through the dropped-signal notice."""

    def plain(node_id: str, **kw: Any) -> dict[str, Any]:
        return {"id": node_id, "cpu": 4000, "memory": 8192, **kw}

    nodes = [plain(f"n{i}") for i in range(1, 5)]
    nodes.insert(2, plain("bad", cpu=-1))
    gpus = [{"id": i, "model": "A100", "memory": 40960} for i in range(2)]
    nodes.append(plain("g1", gpus=gpus))
    nodes.append(plain("n5"))
    assert len(nodes) == 7
    async with cluster(skipping_env.client) as (fc, store):
        await fc.start()
        with caplog.at_level(logging.WARNING):
            await fc.handle().signal(c.SIGNAL_REGISTER_NODE, {"nodes": nodes})
            status = await _until(
                fc.status, lambda s: s.summary.nodes == 6 and bool(s.notices), "six nodes"
            )
        assert sorted(n.id for n in status.nodes) == ["g1", "n1", "n2", "n3", "n4", "n5"]
        (notice,) = status.notices
        assert notice.startswith("1 signal(s) dropped; last: register_node: 1 of 7 nodes"), notice
        assert "node bad: cpu: Input should be greater than or equal to 0" in notice, notice
        stored = {n.id: n for n in store.nodes(fc.cluster)}
        assert [g.id for g in stored["g1"].gpus] == ["0", "1"]
        assert "bad" not in stored
        doc = await fc.published()
        assert doc is not None and doc.notices == [notice]
        assert any("node dropped: bad: cpu" in r.getMessage() for r in caplog.records)

        # a GPU node binds to its integer-named devices
        await fc.submit_job(job("train", replicas=2, gpu=1))
        bound = sorted((a.node, tuple(a.gpu_ids)) for a in await fc.assignments() if a.node == "g1")
        assert bound == [("g1", ("0",)), ("g1", ("1",))]

        # without a readable id the node is named by its position; bools stay errors
        await fc.handle().signal(
            c.SIGNAL_REGISTER_NODE,
            {"nodes": [{"cpu": 1, "memory": 1}, plain("n6"), plain(True)]},  # type: ignore[arg-type]
        )
        status = await _until(fc.status, lambda s: "2 signal(s)" in str(s.notices), "notice")
        assert status.summary.nodes == 7
        assert "2 of 3 nodes dropped: node [0]: id: Field required" in status.notices[0]
        assert "node [2]: id: Input should be a valid string" in status.notices[0]

        # an envelope that is wrong as a whole still drops the signal as before
        await fc.handle().signal(c.SIGNAL_REGISTER_NODE, {"nodes": [plain("n7")], "x": 1})
        status = await _until(fc.status, lambda s: "3 signal(s)" in str(s.notices), "notice")
        assert "last: register_node: x: Extra inputs are not permitted" in status.notices[0]
        assert status.summary.nodes == 7
