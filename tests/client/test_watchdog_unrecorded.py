"""The watchdog and a failing streak that history does not record.

Temporal writes a ``WorkflowTaskFailed`` event for the first attempt of a workflow
task only. When that attempt *timed out* instead (in the kill test: the worker
holding it answered a legacy query whose replay hit the SDK's takeover defect, and
never answered the task), the attempts that then fail on nondeterminism again and
again leave nothing in history: ``describe()`` shows the attempt climbing, history
shows a timeout. The watchdog used to call that a timeout that heals by itself, and
the run stayed stuck (Temporal refusing every update: "Workflow Task in failed
state"); a worker's watchdog now replays such a run with its own workflow code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.enums.v1 import EventType, TimeoutType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory

from forge.client import watchdog

WF = "forge-cluster-test"
RUN = "run-1"
NDE = "[TMPRL1100] Nondeterminism error: Update machine does not handle this event"


def _ev(event_id: int, kind: EventType.ValueType, seconds: int = 0, **attrs: Any) -> HistoryEvent:
    ev = HistoryEvent(event_id=event_id, event_type=kind, event_time=Timestamp(seconds=seconds))
    for name, value in attrs.items():
        getattr(ev, name).CopyFrom(value)
    return ev


def _history(*, first_attempt: str) -> list[HistoryEvent]:
    """A run whose first workflow task completed (event 4), then a task whose first
    attempt timed out after it was started, or failed (recorded); the attempt after
    it is pending (not in history)."""
    from temporalio.api.history.v1 import (
        WorkflowTaskFailedEventAttributes,
        WorkflowTaskTimedOutEventAttributes,
    )

    E = EventType
    events = [
        _ev(1, E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 100),
        _ev(2, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 100),
        _ev(3, E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 100),
        _ev(4, E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 100),
        _ev(5, E.EVENT_TYPE_TIMER_STARTED, 100),
        _ev(6, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 110),
        _ev(7, E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 110),
        _ev(8, E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 110),
        _ev(9, E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, 120),
        _ev(10, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 120),
        _ev(11, E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 120),
    ]
    if first_attempt == "timed out":
        events.append(
            _ev(
                12,
                E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
                140,
                workflow_task_timed_out_event_attributes=WorkflowTaskTimedOutEventAttributes(
                    scheduled_event_id=10,
                    started_event_id=11,
                    timeout_type=TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE,
                ),
            )
        )
    else:
        attrs = WorkflowTaskFailedEventAttributes(
            scheduled_event_id=10,
            started_event_id=11,
            cause=WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR,
        )
        attrs.failure.message = NDE
        events.append(
            _ev(
                12,
                E.EVENT_TYPE_WORKFLOW_TASK_FAILED,
                121,
                workflow_task_failed_event_attributes=attrs,
            )
        )
    # the attempt after it, as history shows it while it is pending
    events.append(_ev(13, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 200))
    events.append(_ev(14, E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 200))
    return events


@dataclass
class _Desc:
    attempt: int
    run_id: str = RUN
    status: WorkflowExecutionStatus = WorkflowExecutionStatus.RUNNING

    @property
    def raw_description(self) -> Any:
        from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse

        raw = DescribeWorkflowExecutionResponse()
        raw.pending_workflow_task.attempt = self.attempt
        return raw

    async def memo(self) -> dict[str, Any]:
        return {}


@dataclass
class _FakeClient:
    """describe(), the run's history, and the resets asked of the server."""

    events: list[HistoryEvent]
    attempt: int
    namespace: str = "default"
    resets: list[Any] = field(default_factory=list)
    stop: asyncio.Event | None = None

    def get_workflow_handle(self, workflow_id: str, run_id: str | None = None) -> Any:
        client = self

        class Handle:
            async def describe(self) -> _Desc:
                return _Desc(client.attempt)

            async def fetch_history_events(self) -> AsyncIterator[HistoryEvent]:
                for ev in client.events:
                    yield ev

        return Handle()

    async def list_workflows(self, query: str) -> AsyncIterator[Any]:
        @dataclass
        class Listed:
            id: str = WF

        yield Listed()

    @property
    def workflow_service(self) -> Any:
        client = self

        class Service:
            async def reset_workflow_execution(self, req: Any) -> Any:
                client.resets.append(req)
                if client.stop is not None:
                    client.stop.set()

                @dataclass
                class Resp:
                    run_id: str = "run-2"

                return Resp()

        return Service()


async def _diagnose(client: _FakeClient, replays: _Replays | None = None) -> watchdog.Stuck | None:
    check = watchdog.ReplayCheck(replays) if replays is not None else None
    return await watchdog.diagnose(cast(Client, client), WF, replay=check)


class _Replays:
    """A worker's replay, scripted: the verdict it returns, and how often it ran."""

    def __init__(self, verdict: str | None) -> None:
        self.verdict = verdict
        self.histories: list[WorkflowHistory] = []

    async def __call__(self, history: WorkflowHistory) -> str | None:
        self.histories.append(history)
        return self.verdict


async def test_a_streak_that_began_with_a_timeout_is_replayed_and_found_nondeterministic() -> None:
    client = _FakeClient(_history(first_attempt="timed out"), attempt=6)
    replays = _Replays(f"Workflow activation completion failed: {NDE}")
    stuck = await _diagnose(client, replays)
    assert stuck is not None
    assert stuck.cause == "nondeterminism"
    assert stuck.reset_to == 4  # the run's first completed workflow task
    assert stuck.attempt == 6
    assert stuck.since is not None and stuck.since.timestamp() == 140  # the timeout
    assert NDE in stuck.message
    (history,) = replays.histories
    assert [e.event_id for e in history.events] == list(range(1, 15))  # the whole run
    assert history.workflow_id == WF


async def test_the_workflows_own_divergence_check_counts_as_nondeterminism() -> None:
    client = _FakeClient(_history(first_attempt="timed out"), attempt=3)
    replays = _Replays("DivergenceError: the store applied digest abc, this replay plans def")
    stuck = await _diagnose(client, replays)
    assert stuck is not None and stuck.cause == "nondeterminism"


async def test_a_streak_that_replays_cleanly_is_left_to_heal() -> None:
    """A worker killed holding the task: the run replays, the next attempt completes."""
    client = _FakeClient(_history(first_attempt="timed out"), attempt=2)
    for verdict in (None, "[TMPRL1101] Potential deadlock detected"):
        replays = _Replays(verdict)
        assert await _diagnose(client, replays) is None
        assert len(replays.histories) == 1


async def test_without_a_replay_a_timed_out_streak_is_not_diagnosed() -> None:
    """``forge cluster status`` (no workflow code): as before, nothing to say."""
    client = _FakeClient(_history(first_attempt="timed out"), attempt=6)
    assert await _diagnose(client) is None


async def test_a_recorded_failure_needs_no_replay() -> None:
    client = _FakeClient(_history(first_attempt="failed"), attempt=2)
    replays = _Replays(None)
    stuck = await _diagnose(client, replays)
    assert stuck is not None and stuck.cause == "nondeterminism" and stuck.reset_to == 4
    assert replays.histories == []


async def test_a_streak_is_replayed_once_however_often_the_watchdog_looks() -> None:
    client = _FakeClient(_history(first_attempt="timed out"), attempt=2)
    replays = _Replays(None)
    check = watchdog.ReplayCheck(replays)
    for attempt in (2, 3, 4):
        client.attempt = attempt
        assert await watchdog.diagnose(cast(Client, client), WF, replay=check) is None
    assert len(replays.histories) == 1


async def test_a_single_attempt_is_not_a_streak() -> None:
    client = _FakeClient(_history(first_attempt="timed out"), attempt=1)
    replays = _Replays(NDE)
    assert await _diagnose(client, replays) is None
    assert replays.histories == []


async def test_the_watchdog_given_a_replay_resets_the_unrecorded_streak() -> None:
    """``watch`` as ``worker.py`` runs it: the stuck run is reset to its first
    completed workflow task, with the watchdog's reason and request id."""
    stop = asyncio.Event()
    client = _FakeClient(_history(first_attempt="timed out"), attempt=6, stop=stop)
    await asyncio.wait_for(
        watchdog.watch(
            cast(Client, client),
            "queue",
            period=0.01,
            stop=stop,
            replay=_Replays(f"Workflow activation completion failed: {NDE}"),
        ),
        10,
    )
    (req,) = client.resets
    assert req.workflow_execution.run_id == RUN
    assert req.workflow_task_finish_event_id == 4
    assert req.reason.startswith("forge watchdog: nondeterminism: found by replaying the run")
    assert req.request_id == f"forge-watchdog-{RUN}-4"
