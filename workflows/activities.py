"""Typed calls of the store activities, one small function each.

The workflow calls ``await acts.persist(...)`` rather than ``execute_activity`` with
a name and a result type, so the name, the payload types and the options of an
activity are written once, here, and mypy checks every call. Names and payloads
are those of :mod:`forge.wire.activity_contract`: renaming one is a wire change.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from forge.stores.base import ApplyResult, JobPage
    from forge.wire import activity_contract as ac
    from forge.wire import errors

__all__ = [
    "STORE_HEARTBEAT",
    "STORE_RETRY",
    "STORE_TIMEOUT",
    "fence",
    "group_spec",
    "job_changes",
    "metrics",
    "persist",
    "read_reports",
    "snapshot_assignments",
    "snapshot_nodes",
    "start_watch",
    "write_jobs",
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

_Out = TypeVar("_Out")


async def _call(name: str, arg: Any, result_type: type[_Out], summary: str) -> _Out:
    out: _Out = await workflow.execute_activity(
        name,
        arg,
        result_type=result_type,
        start_to_close_timeout=STORE_TIMEOUT,
        heartbeat_timeout=STORE_HEARTBEAT,
        retry_policy=STORE_RETRY,
        summary=summary[:200],
    )
    return out


async def fence(cluster: str) -> int:
    """The generation of the fence the store holds (0: none yet)."""
    stored = await _call(ac.ACT_FENCE, ac.ClusterRef(cluster=cluster), list, "load fence")
    return int(stored[0]) if stored else 0


async def snapshot_nodes(inp: ac.PageIn) -> ac.NodesPage:
    return await _call(ac.ACT_SNAPSHOT_NODES, inp, ac.NodesPage, "load nodes")


async def snapshot_assignments(inp: ac.PageIn) -> ac.AssignmentRows:
    return await _call(ac.ACT_SNAPSHOT_ASSIGNMENTS, inp, ac.AssignmentRows, "load bindings")


async def job_changes(inp: ac.JobChangesIn) -> JobPage:
    return await _call(ac.ACT_JOB_CHANGES, inp, JobPage, f"load jobs since revision {inp.since}")


async def write_jobs(inp: ac.WriteJobsIn) -> ac.WriteJobsOut:
    summary = f"store {len(inp.put) + len(inp.delete)} job changes"
    return await _call(ac.ACT_WRITE_JOBS, inp, ac.WriteJobsOut, summary)


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
