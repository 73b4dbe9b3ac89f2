"""Disruption budgets: how many of a group's replicas the pass's voluntary
disruptions may still take below ``desired``.

A group's ``disruption: {max_unavailable: N | "P%"}`` bounds three things together
(a Kubernetes PodDisruptionBudget bounds evictions and drains the same way): node
drains, rolling-update waves and preemption. A replica counts as unavailable when
it is desired and not bound to a node; a replacement placed in the same pass has
not started yet, so releases of a pass count until the next pass sees the
replacement bound. Involuntary losses (a lost node, a failed replica) are never
held back, but they use the budget up: while they leave a group short, its
voluntary disruptions wait.

Pure: it reads the group's spec and the pass's live bound count.
"""

from __future__ import annotations

from collections.abc import Callable

from forge.core.groups import GroupKey, Groups

__all__ = ["budget_left"]


def budget_left(groups: Groups, key: GroupKey, bound: Callable[[GroupKey], int]) -> int | None:
    """Replicas of the group a voluntary disruption may still release now (None:
    the group has no budget): its allowance less the desired replicas unbound."""
    entry = groups.get(key)
    if entry is None or entry.spec.disruption is None:
        return None
    desired = entry.spec.scaling.desired
    return entry.spec.disruption.allowed(desired) - max(0, desired - bound(key))
