"""One firing of a periodic job: submit its instance to the cluster workflow, wait
for the instance to finish, drop the instances past ``keep``.

A periodic job's Temporal Schedule (``forge.client.periodic``) starts this workflow
at each firing. It lives as long as its instance runs, which is what lets the
schedule's overlap policy carry ``concurrency``: ``forbid`` is ``SKIP`` (a firing
that finds the last one running is skipped), ``replace`` is ``CANCEL_OTHER`` (the
running firing is cancelled, stops its instance, and only then the next starts),
``allow`` is ``ALLOW_ALL``. The Web UI's Schedules page then lists every firing
with its outcome: this workflow fails when its instance failed.

Deterministic like every workflow: the instance's name comes from the firing time
the server records (``TemporalScheduledStartTime``), the lateness from the
workflow's own start, and all I/O is in ``activities/periodic.py``.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from forge.core.periodic import instance_id
    from forge.wire import periodic as p

__all__ = ["PeriodicJobWorkflow"]

#: Set by the server on a workflow a schedule starts: the firing's nominal time
#: (a backfilled firing's is in the past; a trigger's is the moment of the trigger).
SCHEDULED_AT = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
_QUICK = timedelta(seconds=60)
_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))

#: ``workflow.patched`` id (here, not in workflows/patches.py, which are the loop's:
#: every pass asks for those). A firing cancelled while (or just after) it submits
#: its instance stops the instance, as one cancelled while it waits always did.
#: Found with a kill -9 of the worker between the submit and the wait: the submit's
#: result and the cancel (``concurrency: replace``) reached the next worker in one
#: activation, the firing ended cancelled and its instance ran on, unowned, beside
#: the next one. Runs recorded before it let the cancel through.
FIRING_CANCELLED_AT_SUBMIT_STOPS = "firing-cancelled-at-submit-stops"


@workflow.defn(name=p.WORKFLOW_PERIODIC)
class PeriodicJobWorkflow:
    @workflow.run
    async def run(self, fire: p.Firing) -> str:
        schedule = fire.job.schedule
        if schedule is None:
            raise ApplicationError("the job has no schedule", non_retryable=True)
        # How long the firing waited for a worker: a worker down past ``catch_up``
        # skips it rather than running a backlog (a backfill starts at once: not late).
        waited = (workflow.now() - workflow.info().workflow_start_time).total_seconds()
        if waited > schedule.catch_up:
            return (
                f"skipped: no worker ran it for {waited:.0f} s (catch_up {schedule.catch_up:g} s)"
            )
        name = instance_id(fire.job.id, _fired_at())
        job = fire.job.model_copy(update={"id": name, "name": name, "schedule": None})
        ref = p.Instance(cluster=fire.cluster, job_id=name)
        firing = p.Firing(cluster=fire.cluster, job=job)
        guarded = _guarded()
        if not guarded:
            await _submit(firing)  # recorded before: a cancel here left the instance running
        try:
            if guarded:
                await _submit(firing)
            out = await workflow.execute_activity(
                p.ACT_AWAIT,
                ref,
                result_type=p.Outcome,
                start_to_close_timeout=timedelta(days=366),
                heartbeat_timeout=timedelta(seconds=10),
                retry_policy=_RETRY,
            )
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not isinstance(err.cause, CancelledError):
                raise
            # replaced by the next firing (concurrency: replace) or cancelled by hand:
            # the instance must not keep its resources for a result nobody waits for.
            # Cancelled at the submit too: it may have reached the loop (or be
            # resolved in the very activation the cancel arrived in), and a stop of
            # an instance that never came is a no-op. (The SDK raises the cancelled
            # activity's ActivityError, not asyncio's.)
            await workflow.execute_activity(
                p.ACT_STOP, ref, start_to_close_timeout=_QUICK, retry_policy=_RETRY
            )
            raise
        await workflow.execute_activity(
            p.ACT_PRUNE,
            p.Prune(cluster=fire.cluster, job=fire.job, own=name),
            start_to_close_timeout=_QUICK,
            retry_policy=_RETRY,
        )
        said = f"{name}: {out.state}: {out.what}"
        if out.state == "failed":
            raise ApplicationError(said, non_retryable=True)
        return said


def _guarded() -> bool:
    return workflow.patched(FIRING_CANCELLED_AT_SUBMIT_STOPS)


async def _submit(firing: p.Firing) -> None:
    await workflow.execute_activity(
        p.ACT_SUBMIT, firing, start_to_close_timeout=_QUICK, retry_policy=_RETRY
    )


def _fired_at() -> datetime:
    at = workflow.info().typed_search_attributes.get(SCHEDULED_AT)
    return at if at is not None else workflow.now()
