"""Wake for decisions, not for data: a usage sample of a running replica stays in the
store (the autoscaler reads it when due) and never wakes the loop; a report that
changes a decision (a replica failed) does, and the loop acts on it.

Checked twice: on the store watch activity itself (its own timeout bounds the wait,
no sleeps), and on the whole loop with the watch running on the test server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.store_activities import StoreActivities
from forge.client.client import ForgeClient
from forge.core.models import AssignmentStatus
from forge.stores import MemoryStore, SqliteStore, Store, TaskReport
from forge.wire.activity_contract import ReportsIn, WatchIn
from tests.workflow.harness import cluster, default_options, job, node

C = "wake"


def _running(wid: str, at: float, node_id: str = "n1") -> TaskReport:
    return TaskReport(workload_id=wid, status="running", at=at, node=node_id)


def _usage(wid: str, at: float, cpu: float, node_id: str = "n1") -> TaskReport:
    return TaskReport(
        workload_id=wid,
        status="running",
        cpu=cpu,
        memory=0.5,
        at=at,
        node=node_id,
        message=f"cpu {int(cpu * 1000)}m memory 32Mi ports http=8080",
    )


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "f.db")


def test_the_watch_sleeps_through_usage_samples_and_wakes_for_a_failure(store: Store) -> None:
    acts = StoreActivities(store)
    env = ActivityEnvironment()
    store.report(C, [_running("web/main/0", 1.0), _running("web/main/1", 1.0)])
    seq = store.reports_since(C, 0)[-1].seq

    def watch() -> tuple[str, int]:
        out = env.run(
            acts.watch,
            WatchIn(
                cluster=C,
                jobs_revision=0,
                reports_seq=seq,
                heartbeat_ttl=1e9,
                max_seconds=0.3,
                poll=0.01,
            ),
        )
        return out.reason, out.reports_seq

    for i in range(20):  # two replicas sampled ten times each
        store.report(C, [_usage(f"web/main/{i % 2}", 2.0 + i, cpu=0.05 * i)])
    assert watch() == ("timeout", seq)  # nothing to decide: it ran out its time
    # ... and they are in the store, for the autoscaler (last samples: 0.9 and 0.95)
    assert store.group_usage(C, since=0.0) == {"web/main": pytest.approx((0.925, 0.5, None))}

    failed = TaskReport(
        workload_id="web/main/1", status="failed", at=30.0, node="n1", message="exit 3"
    )
    store.report(C, [_usage("web/main/0", 29.0, cpu=0.1), failed])
    reason, moved = watch()
    assert (reason, moved) == ("reports", seq + 1)
    out = env.run(acts.read_reports, ReportsIn(cluster=C, seq=seq))
    assert out.statuses == [("web/main/1", "failed")]  # the samples are not in it
    assert out.last_seq == moved


async def _until(what: str, check: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"never {what}")
        await asyncio.sleep(0.02)  # poll interval, not synchronisation


async def _history_length(fc: ForgeClient) -> int:
    return (await fc.handle().describe()).raw_description.workflow_execution_info.history_length


def _status(store: Store, fc: ForgeClient, wid: str) -> AssignmentStatus | None:
    return next((a.status for a in store.assignments(fc.cluster) if a.workload_id == wid), None)


async def test_usage_samples_start_no_pass_and_a_failure_restarts_the_replica(
    skipping_env: WorkflowEnvironment,
) -> None:
    # The watch runs (an activity), so the test server does not skip time here.
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000)])
        await fc.submit_job(job("web", replicas=2, cpu=500, memory=256))
        wids = ["web/main/0", "web/main/1"]
        store.report(fc.cluster, [_running(w, time.time()) for w in wids])
        await _until(
            "both replicas persisted running",
            lambda: all(_status(store, fc, w) is AssignmentStatus.RUNNING for w in wids),
        )
        # quiet: the pass that persisted "running" is over and a new watch is waiting
        await _until("the loop idle on its watch", lambda: _quiet(fc))
        length = await _history_length(fc)

        # usage samples, as an agent writes them every few seconds, and the same
        # "running" again (an agent that restarted): none of it is news
        for i in range(10):
            store.report(fc.cluster, [_usage(w, time.time(), cpu=0.1 * i) for w in wids])
        store.report(fc.cluster, [_running(w, time.time()) for w in wids])
        # An observation window, not a synchronisation: the watch polls every 20 ms,
        # so a wake would have shown within this second, 50 polls.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert await _history_length(fc) == length, "a usage sample woke the loop"
            await asyncio.sleep(0.05)
        usage = store.group_usage(fc.cluster, since=0.0)
        assert usage == {"web/main": pytest.approx((0.9, 0.5, None))}

        # a failure is a decision: the watch returns, a pass releases the replica
        store.report(
            fc.cluster,
            [TaskReport(workload_id=wids[1], status="failed", at=time.time(), node="n1")],
        )
        await _until(
            "the failed replica released",
            lambda: _status(store, fc, wids[1]) is not AssignmentStatus.RUNNING,
        )
        assert _status(store, fc, wids[0]) is AssignmentStatus.RUNNING
        assert await _history_length(fc) > length


async def _quiet(fc: ForgeClient) -> bool:
    """Two history lengths 0.2 s apart agree (the loop is parked on its watch)."""
    before = await _history_length(fc)
    await asyncio.sleep(0.2)  # the comparison window
    return await _history_length(fc) == before
