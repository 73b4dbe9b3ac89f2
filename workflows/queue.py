"""The job writes that updates and the autoscaler queue for the next pass.

A pass writes the whole queue with one activity, so a burst of submissions costs
one store round trip, not one per job. Each write gets a ticket; an update that
waits for its job to be planned waits for the pass whose write covered its ticket.
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from forge.core.models import MAX_BATCH_BYTES, Job

__all__ = ["JobQueue"]


class JobQueue:
    def __init__(self) -> None:
        self.queued: dict[str, Job | None] = {}  # job id -> the job, None: delete
        # Taken off the queue and being written/loaded: handlers still see them.
        self.writing: dict[str, Job | None] = {}
        self.ticket = 0  # of the latest write queued
        self.written = 0  # every ticket up to this one is in the store
        self.planned = 0  # ... and a pass has planned with it
        self.queued_bytes = 0  # job JSON queued since the queue was last empty

    def put(self, job_id: str, job: Job | None) -> int:
        """Queue a write (None deletes); returns its ticket."""
        self.queued.pop(job_id, None)  # keep arrival order of the latest write
        self.queued[job_id] = job
        self.ticket += 1
        return self.ticket

    def current(self, job_id: str, jobs: Mapping[str, Job]) -> Job | None:
        """The job as it will be after the queued writes (and those in flight)."""
        if job_id in self.queued:
            return self.queued[job_id]
        if job_id in self.writing:
            return self.writing[job_id]
        return jobs.get(job_id)

    async def reserve(self, size: int) -> None:
        """Backpressure: handlers queue at most MAX_BATCH_BYTES of job JSON for one
        store write (whose activity input must stay under Temporal's 2 MiB payload
        limit, or every workflow task fails); one that would overflow the queue waits
        for the next pass to take it. Returns at once, without yielding, when there
        is room, so small submissions run exactly as before."""
        while self.queued and self.queued_bytes + size > MAX_BATCH_BYTES:
            await workflow.wait_condition(lambda: not self.queued)
        if not self.queued:
            self.queued_bytes = 0
        self.queued_bytes += size

    def take(self) -> tuple[dict[str, Job | None], int]:
        """The queued writes for a store write, and the ticket they cover; they stay
        visible to handlers (``current``) until the jobs are reloaded."""
        queue, self.queued = self.queued, {}
        self.writing = {**self.writing, **queue}
        return queue, self.ticket
