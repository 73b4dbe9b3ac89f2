"""No activity error ends the loop (issue 24, item 4).

The store activities raise a store error non-retryable (a closed store, a database
schema newer than the code). Raised from workflow code as an ``ActivityError`` it
would fail the workflow execution and the cluster would have no loop. Now the loop
waits a failing store out (durable timers, the memo and the watchdog say so) and
converges once it is good again; an activity error nothing handles fails the
workflow *task*, never the execution, with its cause in the history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from forge.client import watchdog
from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.stores import MemoryStore, StoreError
from forge.stores.base import ApplyResult, Delta, Fence
from forge.wire import activity_contract as ac
from forge.wire import contract as c
from tests.workflow.harness import cluster, default_options, job, node

T = TypeVar("T")

SCHEMA = "database schema 9 is newer than this code (8): upgrade the worker"


class FailingStore(MemoryStore):
    """A memory store whose persists fail with a store error while ``broken``."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False
        self.refused = 0

    def apply_delta(self, cluster: str, fence: Fence, delta: Delta) -> ApplyResult:
        if self.broken:
            self.refused += 1
            raise StoreError(SCHEMA)
        return super().apply_delta(cluster, fence, delta)


class InvalidInput(Exception):
    """Its class name is a non-retryable type of the loop's retry policy and not a
    store error: an activity failure nothing in the loop handles."""


class RefusingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.refuse_jobs = False

    def put_jobs(self, cluster: str, jobs: Sequence[Job]) -> int:
        if self.refuse_jobs:
            raise InvalidInput("planted: put_jobs refused")
        return super().put_jobs(cluster, jobs)


async def _until(
    fetch: Callable[[], Awaitable[T]],
    ok: Callable[[T], bool],
    what: str,
    env: WorkflowEnvironment | None = None,
    seconds: float = 30,
) -> T:
    """Poll ``fetch`` until ``ok`` (with a deadline); with ``env``, each poll also
    moves the time-skipping server's clock on, so the loop's retry timers fire."""
    deadline = time.monotonic() + seconds
    while True:
        value = await fetch()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value}"
        if env is not None:
            await env.sleep(2)
        else:
            await asyncio.sleep(0.05)  # a poll interval, not synchronisation


async def _get(read: Callable[[], T]) -> T:
    return read()


async def _event_types(fc: ForgeClient) -> list[int]:
    return [e.event_type async for e in fc.handle().fetch_history_events()]


async def test_a_store_error_on_persist_is_waited_out_and_the_loop_converges(
    skipping_env: WorkflowEnvironment,
) -> None:
    store = FailingStore()
    async with cluster(skipping_env.client, store=store) as (fc, _):
        await fc.register_nodes([node("n1")])
        await _until(fc.status, lambda s: s.summary.nodes == 1, "n1 registered")
        store.broken = True
        await fc.submit_job(job("web", replicas=2), wait=False)

        stuck = await _until(
            lambda: watchdog.diagnose(skipping_env.client, fc.workflow_id),
            lambda s: s is not None,
            "the watchdog to see the stall",
        )
        assert stuck is not None and stuck.cause == watchdog.STORE_ERROR
        assert stuck.line.startswith("stuck since "), stuck.line
        assert f"store error: {ac.ACT_PERSIST}: StoreError: {SCHEMA}" in stuck.line, stuck.line
        desc = await fc.handle().describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING
        memo: Mapping[str, Any] = await desc.memo()
        assert SCHEMA in memo[c.MEMO_STALLED]["error"]
        status = await fc.status()  # forge status shows it as a notice
        assert any(SCHEMA in n and n.startswith("stuck since") for n in status.notices)
        assert store.assignments(fc.cluster) == []
        # more than one failed call, each waited out by a timer
        await _until(
            lambda: _get(lambda: store.refused), lambda n: n >= 2, "a retry", env=skipping_env
        )
        types = await _event_types(fc)
        assert EventType.EVENT_TYPE_TIMER_STARTED in types
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED not in types

        store.broken = False
        await _until(
            lambda: _get(lambda: store.assignments(fc.cluster)),
            lambda a: len(a) == 2,
            "the bindings persisted once the store is good",
            env=skipping_env,
        )
        await _until(
            lambda: watchdog.diagnose(skipping_env.client, fc.workflow_id),
            lambda s: s is None,
            "the stall to clear",
        )
        desc = await fc.handle().describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING
        assert c.MEMO_STALLED not in await desc.memo()
        status = await fc.status()
        assert status.summary.bound == 2 and not status.notices
        # the loop goes on as usual
        result = await fc.submit_job(job("more", replicas=1))
        assert result.bound == 1


async def test_an_activity_error_nothing_handles_fails_the_task_not_the_workflow(
    dev_env: WorkflowEnvironment,
) -> None:
    """A failed workflow task is retried with the same history (the activity's
    failure is in it), so it fails again until a fixed worker or a reset moves it
    on; meanwhile the run is alive and the watchdog names the activity and error."""
    store = RefusingStore()
    async with cluster(dev_env.client, store=store) as (fc, _):
        await fc.register_nodes([node("n1")])
        await fc.submit_job(job("web", replicas=1))
        store.refuse_jobs = True
        await fc.submit_job(job("other"), wait=False)  # the pass then writes it

        stuck = await _until(
            lambda: watchdog.diagnose(dev_env.client, fc.workflow_id),
            lambda s: s is not None,
            "the failed workflow task",
        )
        assert stuck is not None and stuck.cause == watchdog.ACTIVITY_FAILED, stuck
        assert f"{ac.ACT_WRITE_JOBS}: InvalidInput: planted: put_jobs refused" in stuck.line
        desc = await fc.handle().describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING
        failed = [
            e.workflow_task_failed_event_attributes.failure
            async for e in fc.handle().fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        ]
        assert failed, "no WorkflowTaskFailed in the history"
        assert failed[-1].application_failure_info.type == "LoopActivityFailed"
        assert "planted: put_jobs refused" in failed[-1].message
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED not in await _event_types(fc)


class ClosedWatchStore(MemoryStore):
    """A store whose reads for the watch fail with a store error (as a closed store
    does: non-retryable by the loop's policy) while ``broken``."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def revision(self, cluster: str) -> int:
        if self.broken:
            raise StoreError("store is closed")
        return super().revision(cluster)


async def test_a_failing_watch_backs_off_instead_of_spinning_and_resumes(
    skipping_env: WorkflowEnvironment,
) -> None:
    store = ClosedWatchStore()
    options = default_options(watch=True, watch_poll=0.05, watch_seconds=30)
    async with cluster(skipping_env.client, store=store, options=options) as (fc, _):
        await fc.register_nodes([node("n1")])
        await _until(fc.status, lambda s: s.summary.nodes == 1, "n1 registered")
        store.broken = True
        await skipping_env.sleep(120)  # two minutes of a store that fails every watch

        async def watches() -> int:
            names = [
                e.activity_task_scheduled_event_attributes.activity_type.name
                async for e in fc.handle().fetch_history_events()
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            ]
            return names.count(ac.ACT_WATCH)

        failed = await watches()
        assert 2 <= failed <= 12, f"{failed} watches in 2 minutes: the loop spins"
        assert (await fc.handle().describe()).status == WorkflowExecutionStatus.RUNNING

        store.broken = False
        store.put_jobs(fc.cluster, [job("web", replicas=1)])  # written by someone else
        await _until(
            lambda: _get(lambda: store.assignments(fc.cluster)),
            lambda a: len(a) == 1,
            "the watch to hear of the job",
            env=skipping_env,
        )
