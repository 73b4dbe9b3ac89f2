"""Typed calls of the store activities, one small function each.

The workflow calls ``await acts.persist(...)`` rather than ``execute_activity`` with
a name and a result type, so the name, the payload types and the options of an
activity are written once, here, and mypy checks every call. Names and payloads
are those of :mod:`forge.wire.activity_contract`: renaming one is a wire change.

No activity failure ends the loop. Raised from workflow code, an ``ActivityError``
(a temporalio ``FailureError``) would fail the workflow *execution*: the cluster
would have no loop until someone starts it again. So every call here ends in one
of three ways:

- a store error (``StoreError``: a closed store, a database schema newer than the
  code; the store activities raise it non-retryable) is waited out: the call is
  made again after a durable timer (1 s doubling to ``STORE_WAIT_MAX``), with the
  failure logged, counted (``forge_activity_errors_total``), shown in the current
  details and in the memo ``forge-stalled``, which the watchdog and ``forge status``
  show ("stuck since ...: store error: ..."). A failed workflow task would not do:
  its retry replays the same ``ActivityTaskFailed`` event and fails the same way,
  so the loop would stay stuck after the store came back;
- any other failure for good (a non-retryable error other than the ones a caller
  handles, such as ``StaleFence``) raises :class:`LoopActivityFailed`, which is not
  a ``FailureError``: it fails the workflow *task* (the run stays running, its
  history intact, until a fixed worker or an operator's reset moves it on), and
  the watchdog shows its cause;
- a cancellation (only a cancelled workflow cancels these) stays an
  ``ActivityError``, so cancelling the workflow still cancels it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from forge.stores.base import ApplyResult
    from forge.wire import activity_contract as ac
    from forge.wire import contract as c
    from forge.wire import errors

__all__ = [
    "STORE_HEARTBEAT",
    "STORE_RETRY",
    "STORE_TIMEOUT",
    "STORE_WAIT_FIRST",
    "STORE_WAIT_MAX",
    "LoopActivityFailed",
    "cause_of",
    "fence",
    "group_spec",
    "intake",
    "job_changes",
    "metrics",
    "persist",
    "read_reports",
    "snapshot_assignments",
    "snapshot_nodes",
    "start_watch",
    "write_jobs",
    "write_jobs_local",
]

STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,  # the store coming back is the only way forward
    non_retryable_error_types=list(errors.NON_RETRYABLE_STORE),
)
STORE_TIMEOUT = timedelta(seconds=60)
# A worker killed mid-activity is noticed after this long (not after the whole
# start-to-close timeout), which is what bounds crash recovery.
STORE_HEARTBEAT = timedelta(seconds=2)

#: A call that failed with a store error is made again after this long, doubling up
#: to STORE_WAIT_MAX. Each wait is a timer and each call an activity in history
#: (~11 events): at the cap an outage costs ~330 events an hour, so a run reaches
#: the server's 51,200-event limit only after days of it.
STORE_WAIT_FIRST = 1.0
STORE_WAIT_MAX = 120.0
#: The failure types a call waits out instead of failing (``StoreError`` is also the
#: class name of the stores' exception: an activity that lets one escape fails with it).
STORE_DOWN = frozenset({errors.STORE_ERROR})
_STALLED_MARK = "**stalled:** "

_Out = TypeVar("_Out")


class LoopActivityFailed(RuntimeError):
    """An activity of the loop failed for good with an error nothing handles.

    Not a temporalio ``FailureError`` (nor a ``TimeoutError``), so raised from workflow
    code it fails the workflow task, not the workflow: the run stays, Temporal
    retries the task, and the watchdog and ``forge status`` show the message."""

    def __init__(self, activity: str, cause_type: str, message: str) -> None:
        super().__init__(f"{activity}: {cause_type}: {message}"[:2000])
        self.activity = activity
        self.cause_type = cause_type
        self.cause_message = message


def _cause(err: BaseException) -> BaseException:
    """What an activity failed with: an ``ActivityError``'s cause (a local activity's
    failure reaches the workflow unwrapped: the error itself, or the timeout)."""
    return err.cause if isinstance(err, ActivityError) and err.cause is not None else err


def cause_of(err: BaseException) -> tuple[str, str]:
    """The type name and message of what made an activity fail (``ApplicationError``:
    its type, which for an exception the activity let escape is its class name)."""
    cause = _cause(err)
    kind = getattr(cause, "type", None) or type(cause).__name__
    message = cause.message if isinstance(cause, FailureError) else str(cause)
    return str(kind), message


async def _call(name: str, arg: Any, result_type: type[_Out], summary: str) -> _Out:
    waited = 0
    while True:
        try:
            out: _Out = await workflow.execute_activity(
                name,
                arg,
                result_type=result_type,
                start_to_close_timeout=STORE_TIMEOUT,
                heartbeat_timeout=STORE_HEARTBEAT,
                retry_policy=STORE_RETRY,
                summary=summary[:200],
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise  # the workflow is being cancelled
            kind, message = cause_of(err)
            if kind not in STORE_DOWN:
                raise LoopActivityFailed(name, kind, message) from err
            waited += 1
            delay = min(STORE_WAIT_MAX, STORE_WAIT_FIRST * 2 ** min(waited - 1, 16))
            _stalled(name, kind, message, delay)
            await workflow.sleep(delay, summary=f"{name} failed ({kind}); again in {delay:g} s")
            continue
        if waited:
            _recovered(name, waited)
        return out


def _stalled(name: str, kind: str, message: str, delay: float) -> None:
    """Show that the loop waits for the store: logged and counted each time, the
    memo (for describe) set once per outage, the details always."""
    line = f"{name}: {kind}: {message}"[:500]
    workflow.logger.warning("store error, trying again in %g s: %s", delay, line)
    workflow.metric_meter().create_counter(
        "forge_activity_errors_total", "store activity calls that failed and are waited out"
    ).add(1, {"activity": name[:64], "type": kind[:64]})
    if workflow.memo_value(c.MEMO_STALLED, None) is None:
        since = workflow.now().timestamp()
        workflow.upsert_memo({c.MEMO_STALLED: {"since": since, "activity": name, "error": line}})
    details = workflow.get_current_details()
    if details.startswith(_STALLED_MARK):
        details = details.partition("\n\n")[2]
    shown = f"{_STALLED_MARK}store error, calling {name} again in {delay:g} s: {line}"
    workflow.set_current_details(f"{shown}\n\n{details}")


def _recovered(name: str, waited: int) -> None:
    workflow.logger.info("store back: %s succeeded after %d failed calls", name, waited)
    if workflow.memo_value(c.MEMO_STALLED, None) is not None:
        workflow.upsert_memo({c.MEMO_STALLED: None})
    details = workflow.get_current_details()
    if details.startswith(_STALLED_MARK):
        workflow.set_current_details(details.partition("\n\n")[2])


async def fence(cluster: str) -> int:
    """The generation of the fence the store holds (0: none yet)."""
    stored = await _call(ac.ACT_FENCE, ac.ClusterRef(cluster=cluster), list, "load fence")
    return int(stored[0]) if stored else 0


async def snapshot_nodes(inp: ac.PageIn) -> ac.NodesPage:
    return await _call(ac.ACT_SNAPSHOT_NODES, inp, ac.NodesPage, "load nodes")


async def snapshot_assignments(inp: ac.PageIn) -> ac.AssignmentRows:
    return await _call(ac.ACT_SNAPSHOT_ASSIGNMENTS, inp, ac.AssignmentRows, "load bindings")


async def snapshot_completions(inp: ac.PageIn) -> ac.CompletionsPage:
    return await _call(
        ac.ACT_SNAPSHOT_COMPLETIONS, inp, ac.CompletionsPage, "load completed batch runs"
    )


async def job_changes(inp: ac.JobChangesIn) -> ac.JobsPage:
    return await _call(
        ac.ACT_JOB_CHANGES, inp, ac.JobsPage, f"load jobs since revision {inp.since}"
    )


async def write_jobs(inp: ac.WriteJobsIn) -> ac.WriteJobsOut:
    summary = f"store {len(inp.put) + len(inp.delete)} job changes"
    return await _call(ac.ACT_WRITE_JOBS, inp, ac.WriteJobsOut, summary)


#: How long the local job write may take before the ordinary activity writes the
#: same specs instead (a write of 10,000 jobs takes ~1 s; a locked store waits).
LOCAL_WRITE_TIMEOUT = timedelta(seconds=3)


async def write_jobs_local(inp: ac.WriteJobsIn) -> ac.WriteJobsOut:
    """The job write as a local activity, whose input history does not record: the
    specs cross history once, in the updates that brought them. A failure or a
    timeout (a locked or unreachable store) writes them through :func:`write_jobs`
    instead, as before; the worker runs one job write per cluster at a time, so a
    timed-out local write still running cannot land after it."""
    summary = f"store {len(inp.put) + len(inp.delete)} job changes (local)"
    try:
        out: ac.WriteJobsOut = await workflow.execute_local_activity(
            ac.ACT_WRITE_JOBS,
            inp,
            result_type=ac.WriteJobsOut,
            start_to_close_timeout=LOCAL_WRITE_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=summary[:200],
        )
        return out
    except (ActivityError, ApplicationError, ActivityTimeout) as err:
        cause = _cause(err)
        if isinstance(cause, CancelledError):
            raise  # the workflow is being cancelled
        if isinstance(cause, ActivityTimeout):
            kind, message = "timeout", f"no answer in {LOCAL_WRITE_TIMEOUT.total_seconds():g} s"
        else:
            kind, message = cause_of(err)
        # whatever it was (a store down, locked, or an error nothing retries), the
        # ordinary activity does what it always did: retries, waits, or fails the task
        workflow.logger.warning("local job write failed (%s: %s); writing again", kind, message)
    return await write_jobs(inp)


#: The intake echoes its input in the worker; a retry only if the worker is swamped.
INTAKE_TIMEOUT = timedelta(seconds=10)


async def intake(seen: ac.Intake) -> ac.Intake:
    """Record what the loop saw when it woke (``workflows.mail``): live, the result is
    ``seen``; replayed, it is what the live run saw, from the local activity's marker."""
    out: ac.Intake = await workflow.execute_local_activity(
        ac.ACT_INTAKE,
        seen,
        result_type=ac.Intake,
        start_to_close_timeout=INTAKE_TIMEOUT,
        summary=f"intake: {seen.mail} items",
    )
    return out


async def persist(inp: ac.PersistIn, *, summary: str) -> ApplyResult:
    return await _call(ac.ACT_PERSIST, inp, ApplyResult, summary)


async def read_reports(inp: ac.ReportsIn) -> ac.ReportsOut:
    summary = f"read task reports after {inp.seq}"
    return await _call(ac.ACT_READ_REPORTS, inp, ac.ReportsOut, summary)


async def metrics(inp: ac.MetricsIn) -> ac.MetricsOut:
    summary = f"metrics for {len(inp.groups)} groups"
    return await _call(ac.ACT_METRICS, inp, ac.MetricsOut, summary)


async def group_spec(inp: ac.GroupSpecIn) -> ac.GroupSpecOut:
    summary = f"read the spec of {inp.job_id}/{inp.group} at version {inp.version}"
    return await _call(ac.ACT_GROUP_SPEC, inp, ac.GroupSpecOut, summary)


def start_watch(inp: ac.WatchIn) -> workflow.ActivityHandle[ac.WatchOut]:
    """Start the store watch, a long poll that returns when something changed.

    Abandoned on cancel: it only reads, and the next run starts its own.
    """
    return workflow.start_activity(
        ac.ACT_WATCH,
        inp,
        result_type=ac.WatchOut,
        start_to_close_timeout=timedelta(seconds=inp.max_seconds + 60),
        heartbeat_timeout=timedelta(seconds=max(5.0, inp.poll * 10)),
        retry_policy=STORE_RETRY,
        cancellation_type=workflow.ActivityCancellationType.ABANDON,
        summary="watch store: jobs, task reports, heartbeats",
    )
