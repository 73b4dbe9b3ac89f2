"""A submitted job spec crosses the cluster workflow's history once: in the update
that brought it. The loop writes it to the store with a local activity (patch
``job-writes-local``), whose input history does not record; when that write fails,
the ordinary activity writes it (and records it, as before), and the job is stored
either way."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.testing import WorkflowEnvironment

from forge.core.models import Job
from forge.stores import MemoryStore, StoreError
from forge.wire.codec import ZlibCodec
from tests.builders import job_with_env
from tests.e2e.procs import eventually
from tests.system.test_security import _collect
from tests.workflow.harness import cluster, eventually_status, node


def _job(name: str, marker: str) -> Job:
    return job_with_env(name, {"MARK": marker})


async def _carrying(events: list[HistoryEvent], marker: str) -> list[str]:
    """The types of the events whose payloads (inflated) hold ``marker``."""
    found = []
    for event in events:
        payloads = await ZlibCodec().decode(_collect(event))
        if any(marker.encode() in p.data for p in payloads):
            found.append(EventType.Name(event.event_type))
    return found


async def test_a_submitted_spec_crosses_history_once(skipping_env: WorkflowEnvironment) -> None:
    marker = f"mark-{uuid.uuid4().hex}"
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1")])
        res = await fc.submit_jobs([_job("web", marker), _job("api", marker + "-2")], wait=True)
        assert [r.bound for r in res] == [1, 1]
        stored = store.get_job(fc.cluster, res[0].job_id)
        assert stored is not None and stored.groups[0].tasks[0].env["MARK"] == marker
        history = await fc.handle().fetch_history()
    found = await _carrying(list(history.events), marker)
    assert found == ["EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED"], found
    names = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert "forge.write_jobs" not in names  # written by the local activity


class _FirstWriteFails(MemoryStore):
    """A store whose first job write fails as an unreachable store does."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def put_jobs(self, cluster: str, jobs: Sequence[Job]) -> int:
        self.writes += 1
        if self.writes == 1:
            raise StoreError("store unreachable (planted)")
        return super().put_jobs(cluster, jobs)


async def test_a_failed_local_write_is_written_by_the_activity(
    skipping_env: WorkflowEnvironment,
) -> None:
    marker = f"mark-{uuid.uuid4().hex}"
    store = _FirstWriteFails()
    async with cluster(skipping_env.client, store=store) as (fc, _):
        await fc.register_nodes([node("n1")])
        res = await fc.submit_jobs([_job("web", marker)], wait=True)
        assert res[0].bound == 1
        stored = store.get_job(fc.cluster, res[0].job_id)
        assert stored is not None and stored.groups[0].tasks[0].env["MARK"] == marker
        history = await fc.handle().fetch_history()
    assert store.writes == 2
    found = await _carrying(list(history.events), marker)
    assert found == [
        "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED",
        "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED",
    ], found


class _FirstWriteHangs(MemoryStore):
    """A store whose first job write blocks (a locked store) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.order: list[str] = []

    def put_jobs(self, cluster: str, jobs: Sequence[Job]) -> int:
        first = not self.order
        self.order.append("local" if activity.info().is_local else "activity")
        if first:
            assert self.release.wait(60), "never released"
        return super().put_jobs(cluster, jobs)


async def test_a_timed_out_local_write_lands_before_the_activity_that_repeats_it(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Python cannot stop the timed-out local write's thread: the ordinary activity
    that writes the same specs waits for it (one job write per cluster at a time in
    a worker), so a later write can never be overwritten by it."""
    marker = f"mark-{uuid.uuid4().hex}"
    store = _FirstWriteHangs()
    async with cluster(skipping_env.client, store=store) as (fc, _):
        await fc.register_nodes([node("n1")])
        await fc.submit_jobs([_job("web", marker)], wait=False)

        async def write_pending() -> bool:
            pending = (await fc.handle().describe()).raw_description.pending_activities
            return any(p.activity_type.name == "forge.write_jobs" for p in pending)

        await eventually(write_pending, lambda up: up, timeout=30, what="the activity's write")
        assert store.order == ["local", "activity"] or store.order == ["local"]
        store.release.set()
        status = await eventually_status(fc, lambda s: s.summary.bound == 1, timeout=30)
        assert status.summary.bound == 1
        history = await fc.handle().fetch_history()
    assert store.order == ["local", "activity"]
    stored = store.get_job(fc.cluster, "web")
    assert stored is not None and stored.groups[0].tasks[0].env["MARK"] == marker
    found = await _carrying(list(history.events), marker)
    assert "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED" in found, found
