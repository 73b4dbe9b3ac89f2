"""The loop's ``workflow.patched`` ids, in one place.

Fourteen are in use (``PREEMPTION``, ``DISRUPTION_BUDGETS``, ``TOPOLOGY``, ``GANGS``,
``ADAPTIVE_BUDGET``, ``SPREAD_SCALE_DOWN``, ``REPLAY_SECONDS``, ``BUDGET_TO_TARGET``,
``HELD_BACK_DEFERRED``, ``JOB_WRITES_LOCAL``, ``PASS_INTAKE``,
``SUPERSEDED_WAVE_SETTLES``, ``PREEMPTION_REFILLS_WAITING``, ``FAILED_BATCH_JOB_ENDS``).
The round before folded every earlier patch (work budgets, the published status,
rolling updates and health checks, placement version 2, dropped-signal notices)
into one baseline, since no user runs
histories recorded before them, and re-recorded the replay corpus (tests/histories/).
The rule from here on (README "Tests"): a behaviour change to code a pass runs gets
an id here, named by the behaviour (``"gpu-spread-score"``, never ``"v3"``), a
``workflow.patched(ID)`` branch, the corpus recorded before it kept beside the new
one, and, once no running workflow can need the old branch,
``workflow.deprecate_patch(ID)`` and then nothing.
"""

from __future__ import annotations

__all__ = [
    "ADAPTIVE_BUDGET",
    "BUDGET_TO_TARGET",
    "DISRUPTION_BUDGETS",
    "FAILED_BATCH_JOB_ENDS",
    "GANGS",
    "HELD_BACK_DEFERRED",
    "JOB_WRITES_LOCAL",
    "PASS_INTAKE",
    "PREEMPTION",
    "PREEMPTION_REFILLS_WAITING",
    "REPLAY_SECONDS",
    "SPREAD_SCALE_DOWN",
    "SUPERSEDED_WAVE_SETTLES",
    "TOPOLOGY",
]

#: A replica that fits nowhere may evict lower-priority replicas (issue 21,
#: forge.core.preemption); runs recorded before it place without preempting.
PREEMPTION = "preemption"

#: A group's disruption budget bounds node drains and rolling-update waves together
#: with preemption (forge.core.disruption); runs recorded before it release a
#: draining node's replicas at once, roll by max_parallel alone and count
#: preemption's evictions on their own.
DISRUPTION_BUDGETS = "disruption-budgets"

#: A pass's work budget follows how long the recorded planning of the last passes
#: took (forge.core.budget: the persist activity returns the worker's measurement,
#: so history holds it); runs recorded before it plan with the fixed budget.
ADAPTIVE_BUDGET = "adaptive-budget"

#: A group's ``distinct_hosts`` and ``spread`` rules (issue 22,
#: forge.core.placement.topology); runs recorded before them place such a group like
#: any other (no recorded spec can name them: older workers refused unknown fields).
TOPOLOGY = "topology-rules"

#: ``gang: true`` groups placed all or nothing, and released whole when a member is
#: lost (issue 22, forge.core.placing); runs recorded before place them one by one.
GANGS = "gang-placement"

#: A run also continues as new once the recorded time of its workflow work after its
#: bootstrap (each pass's planning, the updates parsed and pages loaded, handed back
#: by the persist activity so history holds them) reaches ``max_replay_seconds``:
#: a worker taking the run over replays about that much, on a loaded machine too.
#: Runs recorded before it count replicas examined and jobs submitted only.
REPLAY_SECONDS = "replay-seconds"

#: A scale-down that leaves a ``do_not_schedule`` spread rule past its max_skew
#: moves kept replicas off the most loaded value into the slots it freed, as if it
#: released from the most loaded value first (issue 22, forge.core.spread_down);
#: runs recorded before it release the highest ordinals and leave the skew.
SPREAD_SCALE_DOWN = "spread-scale-down"

#: A pass that left work grows the next one's budget toward the target time from
#: anywhere under 90% of it (forge.core.budget), not only from under half: a budget
#: kept in between could stay below what the head of a backlog costs to walk, and
#: then pass after pass placed nothing. Runs recorded before it keep it there.
BUDGET_TO_TARGET = "budget-to-target"

#: Replicas without GPUs that the GPU reservation turned away, and that the pass's
#: placement limit then kept from their retry once it lifted, are deferred to the
#: next pass (forge.core.placing): runs recorded before it left them a backoff
#: entry while a node could take them (invariant 4; found when the state-machine
#: tests moved to the one placement, which has the reservation).
HELD_BACK_DEFERRED = "held-back-deferred"

#: The queued job specs are written to the store by a local activity, whose input
#: is not recorded: a submitted spec crosses the run's history once, in its update
#: (issue 20; an ordinary activity recorded it a second time as its input). When the
#: local write fails or times out, the same write goes through the ordinary activity
#: (recorded, as before). Runs recorded before it use the ordinary activity.
JOB_WRITES_LOCAL = "job-writes-local"

#: Handlers post what they bring (job writes, node operations, failure reports,
#: promotions, budgets, dropped signals) to ``workflows.mail`` instead of changing the
#: loop's state, and the loop takes them at an *intake*, a local activity recording
#: how many it saw, the clock, the watch and whether continue-as-new was due: each
#: pass plans from what history recorded, whatever activation Core runs a handler
#: in on a cold worker (issue 35: a takeover with a query and a scale replayed to a
#: different plan). Decided once per run, in its first activation (handlers read it).
#: Runs recorded before it let handlers change the state directly.
PASS_INTAKE = "pass-intake-recorded"

#: A group's spec that changes again while its rollout's last wave settles (every
#: replica on the rollout's version, none failed, the newest not yet healthy for
#: min_healthy_time) waits for that wave (forge.core.rolling): the rollout then
#: completed, and its version is what the new one reverts to (auto_revert after
#: v1 -> v2 -> a crashing v3 goes back to v2, the last stable version). Runs
#: recorded before it let the new spec take over at once and revert to v1.
SUPERSEDED_WAVE_SETTLES = "superseded-wave-settles"

#: The room a pass's preemptions free is offered to the replicas still waiting out
#: an earlier backoff too, in placement order with the ones refused in the same pass
#: (forge.core.preempting ``refill``): runs recorded before it offered it only to
#: those refused this pass and the victims, and left a backed-off replica pending
#: while the freed node could take it until the next pass (invariant 4; found by the
#: reconcile state machine: a higher-priority submission preempted on a node with
#: room to spare while an earlier submission waited out its backoff).
PREEMPTION_REFILLS_WAITING = "preemption-refills-waiting"

#: A batch job that failed for good ends there (workflows.batch ``settle``): none of
#: its runs is placed again (the run that failed, after its reschedule interval, nor
#: one never started) and those still bound are stopped, as a Kubernetes Job that
#: reached its backoffLimit terminates its pods: a failed job holds no GPU. Runs
#: recorded before it left the others running and placed the failed run again once
#: its interval passed, though ``forge job wait`` had said failed.
FAILED_BATCH_JOB_ENDS = "failed-batch-job-ends"

#: A batch gang whose member failed restarts whole (``on_member_loss: restart_all``),
#: and that restart is one attempt of the gang: every member carries the gang's
#: failure times (forge.core.releasing ``share_attempts``), so the gang fails for good
#: after ``reschedule.attempts`` restarts, whichever member failed each time. Runs
#: recorded before it counted each member alone: a gang of n could run up to
#: n x attempts + 1 times. Asked only in a pass where a batch gang's member failed
#: (forge.core.kinds ``restarts_a_batch_gang``), so no other history records it
#: (hence not in ``__all__``, the ids every pass asks).
BATCH_GANG_ONE_ATTEMPT = "batch-gang-one-attempt"

#: The pass options (forge.core.plan.ReconcileOptions) each patch turns on, in the
#: order the loop asks them every pass: a run recorded before a patch plans with its
#: option off.
OPTION_SWITCHES: tuple[tuple[str, str], ...] = (
    (PREEMPTION, "preemption"),
    (DISRUPTION_BUDGETS, "disruption_budgets"),
    (TOPOLOGY, "topology"),
    (GANGS, "gangs"),
    (SPREAD_SCALE_DOWN, "spread_down"),
    (HELD_BACK_DEFERRED, "held_back_deferred"),
    (SUPERSEDED_WAVE_SETTLES, "settle_superseded"),
    (PREEMPTION_REFILLS_WAITING, "refill_waiting"),
)
