"""The loop's wake-up timers: never cancelled, and only a wake-up.

Why not ``wait_condition(..., timeout=...)``: when something else wakes the loop
first, the SDK cancels that timer, and the cancel is a command. On a cold worker Core
may run the events that trail a query (the watch's result, say) as an activation of
their own with an older clock, and an update in the next one (sdk-rust #1146,
sdk-python #1591, ../shared/research/temporal-query-takeover/): the live run then
records the cancel *before* the update's acceptance, a replay, which runs both in one
activation with the update first, emits it *after*, and the run fails ("Update
machine does not handle this event: TimerCanceled"). A timer nobody cancels has no
such command: it fires, and a stale one only wakes an intake that finds nothing due
(whether a deadline passed is decided by the intake's recorded clock, not by which
timer fired).

A new alarm is set only when none rings at or before the wake-up wanted, so those
outstanding were set for ever earlier times since the last one rang: a handful, each
gone once it fires.
"""

from __future__ import annotations

import asyncio

__all__ = ["Alarms"]


class Alarms:
    def __init__(self) -> None:
        self.set_for: dict[float, None] = {}  # the wake times of the alarms not yet rung
        # Alarms that rang so far. Counted by the timer's own callback, which runs as
        # the activation that fires it begins (before any task resumes), so a wait
        # sees exactly the rings that came after it began, live and replayed.
        self.rings = 0

    def ensure(self, at: float, now: float) -> None:
        """An alarm at ``at`` (workflow time; the live ``now`` only sizes the timer,
        whose length replay does not compare) unless one rings at or before it."""
        if any(t <= at for t in self.set_for):
            return
        self.set_for[at] = None
        asyncio.get_running_loop().call_later(max(at - now, 0.001), self._ring, at)

    def _ring(self, at: float) -> None:
        del self.set_for[at]
        self.rings += 1
