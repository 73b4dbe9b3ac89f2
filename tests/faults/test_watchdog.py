"""The watchdog: a run whose workflow task fails with nondeterminism is reset by
the workers themselves, and the cluster converges with nothing lost.

The nondeterminism is planted as a real determinism bug would be: a worker whose
workflow code creates a timer only when it is not replaying. The runs it serves
record a command that no replay produces, so once a worker without its cache takes
the run over, every workflow task fails. The production watchdog
(``forge.client.watchdog.watch``, what ``worker.py`` runs) must notice it from
``describe()`` and the failure's cause, reset the run to its first workflow task,
and the loop must carry on from the store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.store_activities import StoreActivities
from forge.client import watchdog
from forge.client.client import ForgeClient
from forge.core.reconcile import MAX_WORK
from forge.stores import MemoryStore, Store
from forge.wire import activity_contract as ac
from forge.wire import contract as c
from forge.wire.published import StatusView
from tests.e2e.procs import assert_store_is_the_workflows, eventually
from tests.workflow.harness import default_options, job, node
from workflows.cluster import ClusterWorkflow

pytestmark = pytest.mark.slow


@workflow.defn(name=c.WORKFLOW_TYPE, sandboxed=False)
class TimerOnlyWhenLive(ClusterWorkflow):
    """A determinism bug: the second pass sleeps, but only when run live."""

    @workflow.init
    def __init__(self, inp: c.ClusterInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: c.ClusterInput) -> None:
        await super().run(inp)

    async def _pass(self, rec: ac.Intake | None = None) -> None:
        if self.st.passes == 1 and not workflow.unsafe.is_replaying():
            await workflow.sleep(0.01)
        await super()._pass(rec)


@asynccontextmanager
async def _worker(
    client: Client, queue: str, store: Store, workflow_cls: type[Any]
) -> AsyncIterator[None]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[workflow_cls],
            activities=StoreActivities(store).all(),
            activity_executor=pool,
            graceful_shutdown_timeout=timedelta(seconds=1),
        ):
            yield


def _fresh_cluster(client: Client) -> tuple[str, MemoryStore, ForgeClient]:
    """A task queue, a memory store and a client for a cluster of its own."""
    queue = f"wd-{uuid.uuid4().hex[:8]}"
    store = MemoryStore()
    fc = ForgeClient(
        client, cluster=f"wd{uuid.uuid4().hex[:6]}", task_queue=queue,
        options=default_options(), store=store, search_attributes=False,
    )  # fmt: skip
    return queue, store, fc


async def _task_failures(client: Client, workflow_id: str, run_id: str | None) -> int:
    """Workflow task failures in the run, the reset's own (which ends the old
    task) excepted."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    failed = 0
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            cause = ev.workflow_task_failed_event_attributes.cause
            failed += cause != WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
    return failed


async def test_the_watchdog_resets_a_run_stuck_on_nondeterminism_and_it_converges(
    dev_env: WorkflowEnvironment,
) -> None:
    client = dev_env.client
    queue, store, fc = _fresh_cluster(client)
    # 1. the buggy worker serves the run: the live-only timer enters its history;
    # the user's changes are acknowledged (a submit, then a scale)
    async with _worker(client, queue, store, TimerOnlyWhenLive):
        await fc.register_nodes([node("a"), node("b")])
        await fc.submit_job(job("web", replicas=3, cpu=1000))
        assert (await fc.scale("web", "main", 4)).desired == 4
        first_run = (await fc.handle().describe()).run_id
        assert first_run is not None
        timers = [
            ev
            async for ev in fc.handle().fetch_history_events()
            if ev.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        ]
        assert timers, "the planted bug recorded no timer"

    # 2. a correct worker takes over: its replay disagrees, every task fails
    async with _worker(client, queue, store, ClusterWorkflow):
        await fc.register_nodes([node("c")])  # a new task: replayed from scratch
        stuck = await eventually(
            lambda: watchdog.diagnose(client, fc.workflow_id),
            lambda s: s is not None,
            timeout=60,
            what="the run stuck on its failing workflow task",
        )
        assert stuck is not None and stuck.cause == "nondeterminism", stuck
        assert stuck.run_id == first_run and stuck.reset_to is not None
        status = await fc.status()
        assert any("stuck since" in n and "nondeterminism" in n for n in status.notices)
        assert status.resets == 0
        # a user's change sent while the run is stuck: it cannot be accepted by this
        # run, and must land on the reset one (the client sends it again)
        scaled = asyncio.create_task(fc.scale("web", "main", 5))

        # 3. the watchdog (as worker.py runs it) resets the run; the loop converges
        new_run, status = await _reset_by_watchdog(client, queue, fc, first_run, bound=5)
        assert (await asyncio.wait_for(scaled, 60)).desired == 5
        assert status.summary.pending == 0 and status.summary.desired == 5
        assert_store_is_the_workflows(store, fc.cluster)
        # the reset is visible: status (its count and cause) and the Web UI's details
        assert status.resets == 1 and "nondeterminism" in status.last_reset, status
        assert first_run in status.last_reset
        text = await _details(client, fc.workflow_id)
        assert "resets: 1 by the workers' watchdog" in text, text
        started = time.monotonic()
        await fc.submit_job(job("db", replicas=1, cpu=500))  # the loop is alive
        assert time.monotonic() - started < 30
        assert await _task_failures(client, fc.workflow_id, new_run) == 0
        await fc.handle().terminate("test finished")


async def _reset_by_watchdog(
    client: Client,
    queue: str,
    fc: ForgeClient,
    first_run: str | None,
    replay: watchdog.Replay | None = None,
    *,
    bound: int = 4,
) -> tuple[str | None, StatusView]:
    """Run the watchdog (as worker.py runs it, with ``replay`` or without) until it
    has reset the run: the new run, and the status once the cluster (3 nodes,
    ``bound`` replicas, the signal reapplied) has converged on it."""
    stop = asyncio.Event()
    guard = asyncio.create_task(watchdog.watch(client, queue, period=0.2, stop=stop, replay=replay))
    try:
        new_run = await eventually(
            lambda: _run_id(fc), lambda r: r != first_run, timeout=60, what="the watchdog's reset"
        )
        status = await eventually(
            fc.status,
            lambda s: s.summary.nodes == 3 and s.summary.bound == bound and not s.notices,
            timeout=60,
            what="convergence after the reset (the signal reapplied)",
        )
    finally:
        stop.set()
        await guard
    return new_run, status


async def _run_id(fc: ForgeClient) -> str | None:
    return (await fc.handle().describe()).run_id


async def _details(client: Client, workflow_id: str) -> str:
    """The run's current details, as the Web UI reads them (the SDK's built-in
    metadata query)."""
    meta = await client.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return meta.current_details


@workflow.defn(name=c.WORKFLOW_TYPE, sandboxed=False)
class SlowAtFullBudget(ClusterWorkflow):
    """A pass that overruns the SDK's 2 s activation limit whenever it plans with the
    default budget and two jobs: the same history deadlocks every attempt, as a pass
    too big for its budget does."""

    @workflow.init
    def __init__(self, inp: c.ClusterInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: c.ClusterInput) -> None:
        await super().run(inp)

    def _plan(self, now: float) -> Any:
        if not self.st.max_work and len(self.st.jobs) >= 2:
            time.sleep(2.5)  # the planted overrun (blocking, inside the activation)
        return super()._plan(now)


async def test_a_deadlock_that_repeats_is_reset_with_a_smaller_budget_and_converges(
    dev_env: WorkflowEnvironment,
) -> None:
    client = dev_env.client
    queue, store, fc = _fresh_cluster(client)
    async with _worker(client, queue, store, SlowAtFullBudget):
        await fc.register_nodes([node("a"), node("b")])
        await fc.submit_job(job("web", replicas=2, cpu=1000))
        first_run = (await fc.handle().describe()).run_id
        await fc.submit_job(job("db", replicas=1, cpu=500), wait=False)
        stuck = await eventually(
            lambda: watchdog.diagnose(client, fc.workflow_id),
            lambda s: s is not None and s.attempt >= watchdog.DEADLOCK_ATTEMPTS,
            timeout=120,
            what="the run deadlocking on every attempt",
        )
        assert stuck is not None and stuck.cause == "deadlock", stuck
        status = await fc.status()
        assert any("deadlock" in n for n in status.notices), status.notices

        stop = asyncio.Event()
        guard = asyncio.create_task(watchdog.watch(client, queue, period=0.2, stop=stop))
        try:
            await eventually(
                lambda: _run_id(fc), lambda r: r != first_run, timeout=60, what="the reset"
            )
            status = await eventually(
                fc.status,
                lambda s: s.summary.bound == 3 and any("pass budget" in n for n in s.notices),
                timeout=120,
                what="convergence with the lowered budget",
            )
        finally:
            stop.set()
            await guard
        assert f"{MAX_WORK // 2:,}" in " ".join(status.notices)
        assert_store_is_the_workflows(store, fc.cluster)
        await fc.handle().terminate("test finished")


async def test_a_streak_whose_first_attempt_timed_out_is_found_by_replay_and_reset(
    dev_env: WorkflowEnvironment,
) -> None:
    """History records the first attempt of a failing workflow task only. Here that
    attempt times out (a poller takes it and never answers, as a worker did in the
    kill test after a legacy query's replay failed there): the nondeterminism of
    every attempt after it leaves no event, so only a replay of the run finds it.
    The watchdog with ``worker.py``'s replay resets the run; the loop converges."""
    from temporalio.api.enums.v1 import TaskQueueKind
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import PollWorkflowTaskQueueRequest

    import worker

    client = dev_env.client
    queue, store, fc = _fresh_cluster(client)
    # 1. the buggy worker serves the run: the live-only timer enters its history
    async with _worker(client, queue, store, TimerOnlyWhenLive):
        await fc.register_nodes([node("a"), node("b")])
        await fc.submit_job(job("web", replicas=4, cpu=1000))
        first_run = await _run_id(fc)
    assert first_run is not None

    # 2. a new task (a signal); a silent poller takes its first attempt
    await fc.register_nodes([node("c")])
    polled = await client.workflow_service.poll_workflow_task_queue(
        PollWorkflowTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            identity="silent-poller",
        )
    )
    assert polled.workflow_execution.run_id == first_run and polled.attempt == 1

    # 3. a correct worker takes the attempts after the timeout: each fails replay
    async with _worker(client, queue, store, ClusterWorkflow):
        await eventually(
            lambda: fc.handle().describe(),
            lambda d: d.raw_description.pending_workflow_task.attempt >= 2,
            timeout=60,
            what="the first attempt timing out",
        )
        # what history shows: a timeout, no failure; without a replay, nothing to see
        assert await _task_failures(client, fc.workflow_id, first_run) == 0
        assert await watchdog.diagnose(client, fc.workflow_id) is None

        # 4. the watchdog as worker.py runs it replays the run, finds it, resets it
        replay = worker.history_replay(client.data_converter)
        new_run, status = await _reset_by_watchdog(client, queue, fc, first_run, replay)
    assert status.summary.pending == 0
    assert_store_is_the_workflows(store, fc.cluster)
    old = client.get_workflow_handle(fc.workflow_id, run_id=first_run)
    reasons = [
        ev.workflow_execution_terminated_event_attributes.reason
        async for ev in old.fetch_history_events()
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED
    ]
    assert len(reasons) == 1 and "found by replaying the run" in reasons[0], reasons
    assert "[TMPRL1100]" in reasons[0]
    assert await _task_failures(client, fc.workflow_id, new_run) == 0
    await fc.handle().terminate("test finished")
