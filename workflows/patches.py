"""The loop's ``workflow.patched`` ids, in one place: the workflow and its
presentation both branch on them, and each names a behaviour change that a history
recorded before it must replay without."""

from __future__ import annotations

__all__ = [
    "PATCH_PLACEMENT_V2",
    "PATCH_PUBLISH",
    "PATCH_ROLLOUTS",
    "PATCH_ROLLOUTS_2",
    "PATCH_ROLLOUTS_3",
    "PATCH_WORK_BUDGET",
    "PATCH_WORK_BUDGET_2",
]

#: workflow.patched ids. A behaviour change to code a pass runs is guarded by one,
#: so a history recorded before it replays with the old behaviour.
PATCH_WORK_BUDGET = "work-budget-1"
#: Each pass that changes something publishes a status to the store (with its delta)
#: and a summary memo, for readers that must not query.
PATCH_PUBLISH = "publish-status-1"
#: Rolling updates (forge.core.rolling): a changed task spec replaces replicas in
#: waves; placements record their group version.
PATCH_ROLLOUTS = "rollouts-1"
#: Rollouts in the published status and the details; a failed rollout with
#: auto_revert submits the previous version's spec (read from the store).
PATCH_ROLLOUTS_2 = "rollouts-2"
#: Health checks: a replica of a group that declares a check counts healthy for
#: its rollout only once the agent reports its check passed.
PATCH_ROLLOUTS_3 = "rollouts-3"
#: Placement version 2 in the loop (GPU reservation, GPU jobs first, fractional
#: GPUs placed to keep devices whole), with the carry. Before it: version 1, and a
#: run whose options asked version 2 planned every pass without the carry.
PATCH_PLACEMENT_V2 = "placement-v2"
#: The work budget of a pass re-measured for what a pass now does (placement version 2,
#: rollouts): 800,000 units had become ~1 s of planning on an idle core and failed
#: activations (TMPRL1101) at 10,000 nodes / 300,000 replicas; MAX_WORK_V2 after it,
#: and a replica left pending costs PENDING_UNITS_V2 (it had cost one unit, ~15x less
#: than its time).
PATCH_WORK_BUDGET_2 = "work-budget-2"
