"""Task reports on their way to the store, kept in order through store outages.

While the store is unreachable the tasks keep running and their reports queue
here; each flush sends the oldest first and drops only what the store accepted,
so reports arrive in the order they happened and none is sent twice (unless the
store committed a batch and then failed to say so: a duplicate status report is
harmless, the store drops a report that repeats a replica's known state and the
loop keeps the latest per replica). Usage samples (``running`` with cpu and
memory, no health verdict) never wake the loop: the store keeps them for the
autoscaler and ``forge status`` (``forge.stores.base.next_state``). They are the only
reports that may be coalesced: a newer sample of a replica replaces an unsent
older one, so a long outage cannot grow the queue without bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from forge.stores.base import TaskReport

__all__ = ["Reporter"]

#: Reports sent in one store call.
BATCH = 500


@dataclass
class _Queued:
    report: TaskReport
    usage_only: bool


class Reporter:
    def __init__(self, send: Callable[[list[TaskReport]], object], max_transitions: int = 100_000):
        self._send = send
        self._queue: list[_Queued] = []
        self._max = max_transitions
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._queue)

    def transition(self, report: TaskReport) -> None:
        """A status change (running, failed, exited): always kept, in order."""
        self._queue.append(_Queued(report, usage_only=False))
        if len(self._queue) > self._max:  # only after days of outage at a high churn
            del self._queue[0]
            self.dropped += 1

    def usage(self, report: TaskReport) -> None:
        """A usage sample: replaces an unsent sample of the same replica."""
        for i in range(len(self._queue) - 1, -1, -1):
            q = self._queue[i]
            if q.report.workload_id != report.workload_id:
                continue
            if q.usage_only:
                del self._queue[i]
            break  # never jump ahead of a transition of the same replica
        self._queue.append(_Queued(report, usage_only=True))

    def flush(self) -> Exception | None:
        """Send what is queued, oldest first; returns the error that stopped it."""
        while self._queue:
            batch = [q.report for q in self._queue[:BATCH]]
            try:
                self._send(batch)
            except Exception as err:  # the store is down: keep everything, retry later
                return err
            del self._queue[: len(batch)]
        return None
