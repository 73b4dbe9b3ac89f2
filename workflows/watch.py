"""The store watch: one long-poll activity at a time, whose result wakes the loop.

Heartbeats, task reports and writes by other processes land in the store, not in
history; the watch is how the loop hears of them without polling from workflow
code (each poll would be history).
"""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import activities as acts

with workflow.unsafe.imports_passed_through():
    from forge.wire import activity_contract as ac

__all__ = ["StoreWatch"]


class StoreWatch:
    def __init__(self) -> None:
        self.handle: workflow.ActivityHandle[ac.WatchOut] | None = None
        # after a failed watch the next starts only after a durable pause (1 s
        # doubling to acts.STORE_WAIT_MAX): a store that fails every call at once (a
        # closed one raises a non-retryable StoreError) must not spin the loop
        self.pause: asyncio.Task[None] | None = None
        self.failures = 0
        self.wait = 0.0

    def done(self) -> bool:
        running = self.handle if self.handle is not None else self.pause
        return running is not None and running.done()

    def ensure(self, inp: ac.WatchIn) -> None:
        """Start a watch unless one is running (or, after a failure, a pause)."""
        if self.handle is not None or self.pause is not None:
            return
        if self.wait:
            why = f"store watch failed {self.failures} time(s); again in {self.wait:g} s"
            self.pause = asyncio.create_task(workflow.sleep(self.wait, summary=why))
            self.wait = 0.0
            return
        self.handle = acts.start_watch(inp)

    def take(self) -> ac.WatchOut:
        """The news of a finished watch (nothing new if it failed, or after a
        pause); the next ``ensure`` starts another."""
        news = ac.WatchOut(jobs_revision=0, reports_seq=0)
        if self.handle is None:  # a pause ended
            self.pause = None
            return news
        try:
            news = self.handle.result()
            self.failures = 0
        except ActivityError as err:  # it retries, except for a store error or a cancel
            kind, message = acts.cause_of(err)
            self.failures += 1
            self.wait = min(
                acts.STORE_WAIT_MAX, acts.STORE_WAIT_FIRST * 2 ** min(self.failures - 1, 16)
            )
            workflow.logger.warning(
                "store watch failed (%s: %s); again in %g s", kind, message[:300], self.wait
            )
        self.handle = None
        return news

    async def cancel(self) -> None:
        if self.handle is not None and not self.handle.done():
            self.handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await self.handle
        if self.pause is not None and not self.pause.done():
            self.pause.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.pause
        self.handle = None
        self.pause = None
