"""Activities of a periodic job's firing (``workflows/periodic.py``): its only I/O.

They act on the cluster as any client does, through ``ForgeClient`` (the
instance is submitted and stopped by the cluster workflow's updates, so the loop
sees one more job, nothing special), and read the instance's state from the store
the worker persists to, as ``forge job wait`` does. A refusal (bad input, a job
that cannot be stopped) is non-retryable: the firing fails, naming it, in the Web
UI; an unavailable server or store is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from forge.client.client import ForgeClient
from forge.client.periodic import firing_id, schedule_id
from forge.client.reads import batch_state
from forge.core.periodic import instances, to_remove
from forge.errors import InvalidInput, NotFound
from forge.stores import Store
from forge.wire import periodic as p
from forge.wire.errors import encode

__all__ = ["POLL", "UNSEEN_POLLS", "PeriodicActivities"]

#: Seconds between two reads of an instance's state (each one heartbeats).
POLL = 1.0
#: Polls an instance may be missing from the store before it counts as stopped.
UNSEEN_POLLS = 60


class PeriodicActivities:
    def __init__(self, client: Client, store: Store) -> None:
        self.client = client
        self.store = store

    def all(self) -> list[Callable[..., Any]]:
        return [self.submit, self.await_instance, self.stop, self.prune]

    def _forge(self, cluster: str) -> ForgeClient:
        return ForgeClient(
            self.client, cluster=cluster, task_queue=activity.info().task_queue, store=self.store
        )

    @activity.defn(name=p.ACT_SUBMIT)
    async def submit(self, fire: p.Firing) -> None:
        """Submit the instance (the same id again is the same spec again: no change)."""
        try:
            await self._forge(fire.cluster).submit_job(fire.job, wait=False)
        except InvalidInput as err:
            raise encode(err) from err

    @activity.defn(name=p.ACT_AWAIT)
    async def await_instance(self, ref: p.Instance) -> p.Outcome:
        """Heartbeat until the instance is complete, failed or gone (stopped by hand)."""
        seen, polls = False, 0
        while True:
            found = await asyncio.to_thread(batch_state, self.store, ref.cluster, ref.job_id)
            polls += 1
            if found is None and (seen or polls > UNSEEN_POLLS):
                return p.Outcome(state="stopped", what="the instance was stopped")
            if found is None:  # not in the store yet (a retried activity, a slow pass)
                activity.heartbeat("waiting for the instance to be stored")
                await asyncio.sleep(POLL)
                continue
            seen = True
            state, what = found
            if state in ("complete", "failed"):
                return p.Outcome.model_validate({"state": state, "what": what})
            activity.heartbeat(what)
            await asyncio.sleep(POLL)  # polling the store: the loop publishes no events

    @activity.defn(name=p.ACT_STOP)
    async def stop(self, ref: p.Instance) -> None:
        with contextlib.suppress(NotFound):  # stopped already: the end this asks for
            await self._forge(ref.cluster).stop_job(ref.job_id)

    @activity.defn(name=p.ACT_PRUNE)
    async def prune(self, req: p.Prune) -> list[str]:
        """Stop the finished instances past the newest ``schedule.keep``; returns them.

        An instance whose firing still runs is left to a later pruning (unless it is
        this firing's own): its firing may not have read the end yet, and would then
        say ``stopped`` of an instance that completed."""
        keep = req.job.schedule.keep if req.job.schedule is not None else 0
        jobs = await asyncio.to_thread(self.store.list_jobs, req.cluster)
        finished = []
        for job_id in instances(req.job.id, (j.id for j in jobs)):
            found = await asyncio.to_thread(batch_state, self.store, req.cluster, job_id)
            if found is not None and found[0] in ("complete", "failed"):
                finished.append(job_id)
        sid = schedule_id(req.cluster, req.job.id)
        gone = [
            job_id
            for job_id in to_remove(finished, keep)
            if job_id == req.own or not await self._firing_runs(firing_id(sid, job_id))
        ]
        for job_id in gone:
            await self.stop(p.Instance(cluster=req.cluster, job_id=job_id))
        return gone

    async def _firing_runs(self, workflow_id: str) -> bool:
        try:
            desc = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False  # submitted by hand, or its firing's history is gone
            raise
        return desc.status == WorkflowExecutionStatus.RUNNING
