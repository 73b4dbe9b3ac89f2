"""How much work the loop gives its next pass, from how long the last one took.

A pass's budget is counted in work units (node checks and scores), never wall time,
so the plan is the same on every machine. But the SDK's deadlock limit is wall time:
an activation of 2 s fails its workflow task. On a machine shared with other work
(two cores, a dev server, the CLI, tests) a unit costs two or three times what it
costs on an idle core, and the fixed budget then ran activations past 2 s. So the
loop measures each planning activation and the persist activity hands the figure
back: it is then in history (the activity's result), and the next pass's budget is
a pure function of it here. A replay reads the recorded figure, never its own clock,
and plans exactly as the original run did, however fast the replaying worker is.
"""

from __future__ import annotations

__all__ = ["MIN_PASS_BUDGET", "TARGET_SECONDS", "next_budget"]

#: What one planning activation should take: far inside the SDK's 2 s, with room
#: for a collection or a busy neighbour landing in it.
TARGET_SECONDS = 0.3
#: Never below this (a pass must still make progress; the watchdog's floor too).
MIN_PASS_BUDGET = 20_000


def next_budget(current: int, seconds: float, *, deferred: bool, ceiling: int) -> int:
    """The next pass's budget after a pass of ``current`` units took ``seconds``.

    Over the target: scaled down in proportion. Well under it while work was left
    for later: grown (at most doubled a pass), up to ``ceiling``. Otherwise kept: a
    short pass that finished everything says nothing about a longer one."""
    if seconds > TARGET_SECONDS:
        return max(MIN_PASS_BUDGET, min(ceiling, current, int(current * TARGET_SECONDS / seconds)))
    if deferred and seconds < TARGET_SECONDS / 2:
        grown = int(current * min(2.0, TARGET_SECONDS / max(seconds, 1e-3)))
        return max(MIN_PASS_BUDGET, min(ceiling, grown))
    return max(MIN_PASS_BUDGET, min(ceiling, current))
