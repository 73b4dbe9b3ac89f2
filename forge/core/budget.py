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

__all__ = ["MIN_PASS_BUDGET", "NEAR_TARGET", "TARGET_SECONDS", "next_budget"]

#: What one planning activation should take: far inside the SDK's 2 s, with room
#: for a collection or a busy neighbour landing in it.
TARGET_SECONDS = 0.3
#: Never below this (a pass must still make progress; the watchdog's floor too).
MIN_PASS_BUDGET = 20_000


#: With ``to_target``, a pass that left work and took under this share of the target
#: grows toward it (in proportion): between half the target and this, a budget that
#: was kept as it was could stay below what the head of a backlog costs for good.
NEAR_TARGET = 0.9


def next_budget(
    current: int, seconds: float, *, deferred: bool, ceiling: int, to_target: bool = False
) -> int:
    """The next pass's budget after a pass of ``current`` units took ``seconds``.

    Over the target: scaled down in proportion. Well under it while work was left
    for later: grown (at most doubled a pass), up to ``ceiling``. Otherwise kept: a
    short pass that finished everything says nothing about a longer one.

    ``to_target`` (patch ``budget-to-target``): a pass that left work grows toward
    the target from anywhere under ``NEAR_TARGET`` of it, not only from under half.
    Seen at 10,000 nodes / 300,000 replicas: passes of 0.17 s kept a budget of
    77,000 units while the replicas waiting out a backoff at the head of the order
    cost 77,000 to walk, so pass after pass placed nothing."""
    if seconds > TARGET_SECONDS:
        return max(MIN_PASS_BUDGET, min(ceiling, current, int(current * TARGET_SECONDS / seconds)))
    grow_under = TARGET_SECONDS * (NEAR_TARGET if to_target else 0.5)
    if deferred and seconds < grow_under:
        grown = int(current * min(2.0, TARGET_SECONDS / max(seconds, 1e-3)))
        return max(MIN_PASS_BUDGET, min(ceiling, grown))
    return max(MIN_PASS_BUDGET, min(ceiling, current))
