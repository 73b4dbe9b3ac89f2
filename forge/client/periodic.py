"""Periodic jobs as Temporal Schedules: create or update one from a job with a
``schedule``, remove it, describe it.

``forge job run`` and ``forge job stop`` call these; so can any program with a
Temporal client (the schedule's id is :func:`schedule_id`), and the schedule itself
is an ordinary one: ``temporal schedule list / trigger / backfill / toggle`` and
the Web UI's Schedules page act on it. Each firing runs ``workflows/periodic.py``
on the cluster's task queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

from forge.core.models import Job
from forge.core.periodic import INSTANCE_SUFFIX
from forge.errors import InvalidInput
from forge.wire import periodic as p

__all__ = [
    "OVERLAP",
    "Applied",
    "apply_schedule",
    "firing_id",
    "remove_schedule",
    "schedule_id",
]

#: ``schedule.concurrency`` as the schedule's overlap policy (see workflows/periodic.py).
OVERLAP = {
    "allow": ScheduleOverlapPolicy.ALLOW_ALL,
    "forbid": ScheduleOverlapPolicy.SKIP,
    "replace": ScheduleOverlapPolicy.CANCEL_OTHER,
}


def schedule_id(cluster: str, job_id: str) -> str:
    """The Temporal Schedule of periodic job ``job_id`` (``:`` is in no name)."""
    return f"forge-periodic-{cluster}:{job_id}"


def firing_id(sid: str, instance: str) -> str:
    """The workflow id of the firing that submitted ``instance``: the server names a
    schedule's workflow by its action id and the firing's time (RFC 3339, UTC), the
    time an instance's name carries (forge.core.periodic.instance_id)."""
    fired = datetime.strptime(instance[-INSTANCE_SUFFIX + 1 :], "%Y%m%d%H%M%S")
    return f"{sid}-{fired:%Y-%m-%dT%H:%M:%S}Z"


@dataclass(frozen=True)
class Applied:
    job_id: str
    schedule_id: str
    created: bool  # False: an existing schedule was updated to this spec

    def line(self) -> str:
        verb = "scheduled" if self.created else "schedule updated"
        return f"{self.job_id}: {verb} (Temporal Schedule {self.schedule_id})"


def _schedule(cluster: str, task_queue: str, job: Job) -> Schedule:
    spec = job.schedule
    if spec is None:
        raise InvalidInput(f"job {job.id} has no schedule")
    sid = schedule_id(cluster, job.id)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            p.WORKFLOW_PERIODIC,
            p.Firing(cluster=cluster, job=job),
            id=sid,  # the server appends each firing's time
            task_queue=task_queue,
            static_summary=f"Forge periodic job `{job.id}` on cluster `{cluster}`",
        ),
        spec=ScheduleSpec(cron_expressions=[spec.cron], time_zone_name=spec.timezone),
        policy=SchedulePolicy(
            overlap=OVERLAP[spec.concurrency],
            catchup_window=timedelta(seconds=spec.catch_up),
        ),
    )


async def apply_schedule(client: Client, cluster: str, task_queue: str, job: Job) -> Applied:
    """Create the job's schedule, or bring an existing one to this spec (its
    pause state and past firings kept, as ``kubectl apply`` keeps a CronJob's)."""
    schedule = _schedule(cluster, task_queue, job)
    sid = schedule_id(cluster, job.id)
    try:
        await client.create_schedule(sid, schedule)
        return Applied(job.id, sid, created=True)
    except ScheduleAlreadyRunningError:
        pass
    except RPCError as err:
        raise _refused(err, job.id) from err

    def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
        # keep what an operator set on it (paused, a note), replace the rest
        schedule.state = current.description.schedule.state
        return ScheduleUpdate(schedule=schedule)

    try:
        await client.get_schedule_handle(sid).update(update)
    except RPCError as err:
        raise _refused(err, job.id) from err
    return Applied(job.id, sid, created=False)


def _refused(err: RPCError, job_id: str) -> Exception:
    if err.status == RPCStatusCode.INVALID_ARGUMENT:
        return InvalidInput(f"job {job_id}: schedule: the server refused it: {err.message}")
    return err


async def remove_schedule(client: Client, cluster: str, job_id: str) -> bool:
    """Delete the job's schedule; False when it has none. Its instances are jobs of
    their own, left as they are (a running one finishes; ``forge job stop`` each)."""
    try:
        await client.get_schedule_handle(schedule_id(cluster, job_id)).delete()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True
