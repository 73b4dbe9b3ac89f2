"""The shape of a reconcile loop in 40 lines, with none of Forge's defences: it
waits on a timer (``wait_condition`` with a timeout), a timeout marks it dirty, a
pass runs an activity only when an update queued work, and an update returns after
the next pass. Live and replayed, it is deterministic by every rule the SDK states;
what breaks it is the activation a query makes on a worker that never saw the run."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="upstream-write")
async def write(n: int) -> int:
    return n


@workflow.defn(name="UpstreamQueryTakeoverLoop")
class Loop:
    def __init__(self) -> None:
        self.dirty = False
        self.queue = 0
        self.passes = 0

    @workflow.run
    async def run(self, wait_s: float) -> None:
        while True:
            if self.dirty:
                self.dirty = False
                if self.queue:  # an update queued work: one activity
                    q, self.queue = self.queue, 0
                    await workflow.execute_activity(
                        write, q, start_to_close_timeout=timedelta(seconds=10)
                    )
                self.passes += 1
                continue
            try:
                await workflow.wait_condition(lambda: self.dirty, timeout=wait_s)
            except TimeoutError:
                self.dirty = True  # a backoff expired: plan again

    @workflow.query
    def status(self) -> int:
        return self.passes

    @workflow.update
    async def poke(self, work: int) -> int:
        self.queue += work
        self.dirty = True
        target = self.passes + 1
        await workflow.wait_condition(lambda: self.passes >= target)
        return self.passes
