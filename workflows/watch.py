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

    def done(self) -> bool:
        return self.handle is not None and self.handle.done()

    def ensure(self, inp: ac.WatchIn) -> None:
        """Start a watch unless one is running."""
        if self.handle is None:
            self.handle = acts.start_watch(inp)

    def take(self) -> ac.WatchOut:
        """The news of a finished watch (nothing new if it failed); the next
        ``ensure`` starts another."""
        assert self.handle is not None
        try:
            news = self.handle.result()
        except ActivityError as err:  # it retries forever; only a cancel gets here
            workflow.logger.warning("store watch ended: %s", err)
            news = ac.WatchOut(jobs_revision=0, reports_seq=0)
        self.handle = None
        return news

    async def cancel(self) -> None:
        if self.handle is not None and not self.handle.done():
            self.handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await self.handle
        self.handle = None
