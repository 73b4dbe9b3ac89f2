"""The watchdog every worker runs: a cluster workflow must never stay stuck.

A workflow task that fails is retried by Temporal for ever, with the same history,
so a nondeterminism error (a replay that disagrees with history: a code change
without ``workflow.patched``, or the SDK defect an outside query can trigger,
RELIABILITY.md) or a deadlock (an activation over the SDK's 2 s) stops the loop
until someone acts. The watchdog notices it from ``describe()`` (the pending
workflow task's attempt) and the last ``WorkflowTaskFailed`` event's *cause* (not
its message), logs and counts it, and for nondeterminism does what an operator
would: resets the run to its first completed workflow task. That is safe here: the
store holds the state, persists are fenced (a reset run moves to a newer
generation), and the signals and updates the reset reapplies are idempotent.

A deadlock that repeats (the same task failing ``DEADLOCK_ATTEMPTS`` times: the same
history makes the same activation) is reset too, and the reset run is told to plan
with half the work budget it had (the ``loop_budget`` signal, kept through
continue-as-new and shown in the published notices; halved again on each repeat,
never below ``MIN_BUDGET``). Not reset: a task failed by an activity error the
loop does not handle (``LoopActivityFailed``:
"activity failed", with the activity and its error). A loop that waits out a
failing store fails no task; it says so in its memo (``forge-stalled``), shown as
"store error" with the error.

History records only the *first* attempt of a failing workflow task: when that
attempt timed out instead (the worker holding it died, or a legacy query's replay
failed there and the task was never answered), the attempts that then fail again
and again leave no ``WorkflowTaskFailed`` event, and ``describe()`` gives no cause.
A worker's watchdog is given ``replay`` (the worker's own workflow code) and, for
such a streak, replays the run's history once: a nondeterminism it reproduces is
reset like a recorded one. Without it (``forge cluster status``) such a run is not
diagnosed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, TimeoutType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.common import MetricMeter

from forge.core.reconcile import MAX_WORK
from forge.wire import contract as c
from forge.wire import errors

__all__ = [
    "ACTIVITY_FAILED",
    "DEADLOCK_ATTEMPTS",
    "DIVERGENCE",
    "MIN_BUDGET",
    "STORE_ERROR",
    "Replay",
    "ReplayCheck",
    "Stuck",
    "diagnose",
    "recover",
    "watch",
]

log = structlog.get_logger("forge.client.watchdog")

_NDE = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR
_DEADLOCK_MARK = "[TMPRL1101]"  # the SDK's code for an activation over its time limit
_NDE_MARK = "[TMPRL1100]"  # the SDK's code for a nondeterminism error
#: The failure type of the workflow's own divergence check (a replay planned another
#: delta than the store applied): nondeterminism found by Forge instead of the SDK.
DIVERGENCE = "DivergenceError"
_DIVERGENCE_MESSAGE = "store applied digest"  # its message (a replay's failure text)

#: Replays a run's history with the worker's workflow code: None when it replays
#: cleanly, else the replay failure's text.
Replay = Callable[[WorkflowHistory], Awaitable[str | None]]


class ReplayCheck:
    """``Replay`` once per streak of a run (the history before the streak does not
    change while no task completes), so a watchdog looking every second does not
    replay the same run again and again."""

    def __init__(self, replay: Replay, *, keep: int = 64) -> None:
        self._replay = replay
        self._keep = keep
        self._verdicts: dict[tuple[str, int], str | None] = {}

    async def __call__(self, run_id: str, streak: int, history: WorkflowHistory) -> str | None:
        key = (run_id, streak)
        if key not in self._verdicts:
            if len(self._verdicts) >= self._keep:
                self._verdicts.clear()
            self._verdicts[key] = await self._replay(history)
        return self._verdicts[key]


@dataclass(frozen=True, slots=True)
class Stuck:
    """A run whose workflow task keeps failing."""

    workflow_id: str
    run_id: str
    attempt: int
    cause: str  # "nondeterminism", "deadlock" or the server's cause name
    since: datetime | None  # when the first failure of this streak happened
    reset_to: int | None  # the run's first completed workflow task (event id)
    message: str

    @property
    def line(self) -> str:
        when = self.since.isoformat(timespec="seconds") if self.since else "?"
        if self.cause == STORE_ERROR:
            return f"stuck since {when}: {self.cause}: {self.message[:300]} (retrying)"
        what = (
            f"{self.cause}: {self.message[:300]}" if self.cause == ACTIVITY_FAILED else self.cause
        )
        return f"stuck since {when}: {what} (workflow task attempt {self.attempt})"


#: The causes besides nondeterminism and deadlock that name the loop's own reports.
STORE_ERROR = "store error"
ACTIVITY_FAILED = "activity failed"


async def diagnose(
    client: Client, workflow_id: str, *, replay: ReplayCheck | None = None
) -> Stuck | None:
    """Is the workflow's current run stuck on a failing workflow task, or waiting
    for a failing store? None if not. ``replay``: see the module's docstring (a
    streak that began with a timeout records no failure)."""
    desc = await client.get_workflow_handle(workflow_id).describe()
    pending = desc.raw_description.pending_workflow_task
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return None
    stalled = (await desc.memo()).get(c.MEMO_STALLED)
    if isinstance(stalled, dict) and pending.attempt < 2:
        since = stalled.get("since")
        return Stuck(
            workflow_id=workflow_id,
            run_id=desc.run_id or "",
            attempt=pending.attempt,
            cause=STORE_ERROR,
            since=datetime.fromtimestamp(since, UTC) if isinstance(since, int | float) else None,
            reset_to=None,
            message=str(stalled.get("error", ""))[:500],
        )
    if pending.attempt < 2:
        return None
    run_id = desc.run_id or ""
    failed = None
    timed_out: HistoryEvent | None = None  # since the last completed task: one started, timed out
    streak_start = None
    first_completed: int | None = None
    events: list[HistoryEvent] = []
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for ev in handle.fetch_history_events():
        if replay is not None:  # kept only for a replay
            events.append(ev)
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            if failed is None:
                streak_start = ev.event_time.ToDatetime()
            failed = ev
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timeout = ev.workflow_task_timed_out_event_attributes.timeout_type
            if timeout == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE and timed_out is None:
                timed_out = ev
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            if first_completed is None:
                first_completed = ev.event_id
            failed = None
            timed_out = None
    if failed is None:
        if timed_out is None or replay is None:
            return None  # timeouts (a worker died holding the task) heal by themselves
        # the attempts after the timeout failed or timed out unrecorded: replay
        verdict = await replay(run_id, timed_out.event_id, WorkflowHistory(workflow_id, events))
        if verdict is None or not any(
            mark in verdict for mark in (_NDE_MARK, DIVERGENCE, _DIVERGENCE_MESSAGE)
        ):
            return None  # it replays (a worker died holding the task): it heals
        return Stuck(
            workflow_id=workflow_id,
            run_id=run_id,
            attempt=pending.attempt,
            cause="nondeterminism",
            since=timed_out.event_time.ToDatetime(),
            reset_to=first_completed,
            message=f"found by replaying the run: {verdict}"[:500],
        )
    attrs = failed.workflow_task_failed_event_attributes
    message = attrs.failure.message
    kind = attrs.failure.application_failure_info.type
    if attrs.cause == _NDE or kind == DIVERGENCE:
        # the SDK's own check, or the workflow's: the store applied another delta
        # than this replay plans (workflows.cluster.DivergenceError)
        cause = "nondeterminism"
    elif _DEADLOCK_MARK in message:
        cause = "deadlock"
    elif kind == errors.LOOP_ACTIVITY_FAILED:
        cause = ACTIVITY_FAILED
    else:
        cause = (
            WorkflowTaskFailedCause.Name(attrs.cause)
            .removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")
            .lower()
        )
    return Stuck(
        workflow_id=workflow_id,
        run_id=run_id,
        attempt=pending.attempt,
        cause=cause,
        since=streak_start,
        reset_to=first_completed,
        message=message[:500],
    )


#: A deadlock is reset once its workflow task has failed this many times in a row.
DEADLOCK_ATTEMPTS = 3
#: The smallest pass budget the watchdog asks for (a pass must still make progress).
MIN_BUDGET = 20_000


async def recover(client: Client, stuck: Stuck, budget: int | None = None) -> str | None:
    """Reset a run stuck on nondeterminism, or on a deadlock that repeats, to its
    first completed workflow task; returns the new run id (None when there is
    nothing safe to do). The new run is told it is a reset (the ``loop_reset``
    signal: it counts and shows them) and, after a deadlock, sent ``budget`` (the
    ``loop_budget`` signal). Workers that race to reset the same run send the same
    request id, so only one reset happens."""
    if stuck.reset_to is None:
        return None
    deadlock = stuck.cause == "deadlock" and stuck.attempt >= DEADLOCK_ATTEMPTS
    if stuck.cause != "nondeterminism" and not deadlock:
        return None
    resp = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(
                workflow_id=stuck.workflow_id, run_id=stuck.run_id
            ),
            reason=f"forge watchdog: {stuck.cause}: {stuck.message[:200]}",
            workflow_task_finish_event_id=stuck.reset_to,
            request_id=f"forge-watchdog-{stuck.run_id}-{stuck.reset_to}",
        )
    )
    handle = client.get_workflow_handle(stuck.workflow_id, run_id=resp.run_id)
    # counted and shown by the new run (status, the Web UI's details): a reset must
    # not be visible only in a worker's log
    cause = f"{stuck.cause} in run {stuck.run_id}: {stuck.message[:200]}"
    await handle.signal(c.SIGNAL_LOOP_RESET, {"from_run": stuck.run_id, "cause": cause})
    if deadlock and budget is not None:
        await handle.signal(c.SIGNAL_LOOP_BUDGET, {"max_work": max(MIN_BUDGET, budget)})
    return str(resp.run_id)


async def watch(
    client: Client,
    task_queue: str,
    *,
    period: float,
    meter: MetricMeter | None = None,
    stop: asyncio.Event | None = None,
    replay: Replay | None = None,
) -> None:
    """Every ``period`` seconds, look at the running cluster workflows of
    ``task_queue`` and recover the stuck ones. Runs until ``stop`` is set.
    ``replay``: the worker's workflow code, to diagnose a streak that history does
    not record (see the module's docstring)."""
    stop = stop or asyncio.Event()
    check = ReplayCheck(replay) if replay is not None else None
    failures = (
        meter.create_counter(
            "forge_workflow_task_failures_total",
            "cluster workflows found stuck on a failing workflow task, by cause",
        )
        if meter is not None
        else None
    )
    resets = (
        meter.create_counter("forge_watchdog_resets_total", "runs reset by the watchdog")
        if meter is not None
        else None
    )
    seen: set[tuple[str, str, int]] = set()
    budgets: dict[str, int] = {}  # per workflow: the budget its last deadlock reset asked
    query = (
        f"WorkflowType = '{c.WORKFLOW_TYPE}' AND ExecutionStatus = 'Running' "
        f"AND TaskQueue = '{task_queue}'"
    )
    while not stop.is_set():
        try:
            async for wf in client.list_workflows(query):
                stuck = await diagnose(client, wf.id, replay=check)
                if stuck is None:
                    continue
                key = (stuck.run_id, stuck.cause, stuck.reset_to or 0)
                if key not in seen:
                    seen.add(key)
                    log.error(
                        "cluster workflow stuck",
                        workflow_id=stuck.workflow_id,
                        run_id=stuck.run_id,
                        cause=stuck.cause,
                        attempt=stuck.attempt,
                        error=stuck.message[:200],
                    )
                    if failures is not None:
                        failures.add(1, {"cause": stuck.cause})
                budget = max(MIN_BUDGET, budgets.get(stuck.workflow_id, MAX_WORK) // 2)
                new_run = await recover(client, stuck, budget)
                if new_run is not None:
                    log.warning(
                        "cluster workflow reset by the watchdog",
                        workflow_id=stuck.workflow_id,
                        from_run=stuck.run_id,
                        to_event=stuck.reset_to,
                        new_run=new_run,
                        budget=budget if stuck.cause == "deadlock" else None,
                    )
                    if stuck.cause == "deadlock":
                        budgets[stuck.workflow_id] = budget
                    if resets is not None:
                        resets.add(1)
        except Exception as err:  # the server busy or away: look again next period
            log.warning("watchdog could not look", error=str(err)[:200])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
