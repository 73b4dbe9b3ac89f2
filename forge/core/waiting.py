"""Who waits this pass, and how long: backoff after finding no node, the reschedule
policy after a failure.

Backoff: a replica that found no node waits ``base * 2**(attempts-1)`` seconds (1, 2,
4 ... capped at 300 by default). A pass that frees or adds capacity (a release, or a
node joining) makes every backed-off replica eligible at once, like Kubernetes'
queueing hints moving pods out of the unschedulable queue or Nomad unblocking
blocked evaluations: waiting out a timer while a node sits idle would break
"everything that fits is placed".

Failed replicas follow their group's reschedule policy: at most ``attempts``
reschedules per ``interval``, each after a delay grown by the policy's delay
function.

Deferred groups (the place phase stopped before them at a placement or work limit)
wait for the next pass: :func:`defer_groups` keeps their entries by the same rule,
:func:`waiting`, without a step per replica.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple

from forge.core.groups import Group, GroupKey, Groups
from forge.core.models import DelayFunction, ReschedulePolicy
from forge.core.plan import FailureHistory, PendingEntry, Plan, ReconcileOptions

__all__ = ["Deferred", "backoff_delay", "defer_groups", "past_cap", "reschedule_delay", "waiting"]


class Deferred(NamedTuple):
    """A group the pass stopped before, with how many of its replicas it left."""

    job: str
    group: str
    left: int


def backoff_delay(attempts: int, options: ReconcileOptions) -> float:
    """1, 2, 4, ... seconds (for base 1), capped."""
    if attempts <= 0:
        return 0.0
    exp = min(attempts - 1, 62)
    return float(min(options.backoff_cap, options.backoff_base * (2**exp)))


def reschedule_delay(policy: ReschedulePolicy, reschedules: int) -> float:
    """Delay before the n-th reschedule (n >= 1) under a group's policy."""
    n = max(1, reschedules)
    if policy.delay_function is DelayFunction.CONSTANT:
        d = policy.delay
    elif policy.delay_function is DelayFunction.EXPONENTIAL:
        d = policy.delay * (2 ** min(n - 1, 62))
    else:
        a, b = 1, 1
        for _ in range(min(n - 1, 90)):
            a, b = b, a + b
        d = policy.delay * a
    return float(min(d, policy.max_delay))


def waiting(
    prev: PendingEntry | None,
    hist: FailureHistory | None,
    policy: ReschedulePolicy,
    just_failed: bool,
    now: float,
    capacity_freed: bool,
) -> PendingEntry | None:
    """The entry to keep when this replica must not be tried in this pass, or None
    to try it. One whose end was fatal is never tried again."""
    if hist is not None and hist.fatal:
        return PendingEntry(kind="failed", attempts=len(hist.times), reasons=(hist.fatal,))
    if just_failed and hist is not None:
        return _rescheduled(hist, policy, now)
    if prev is None or now >= prev.not_before:
        return None
    if prev.kind == "backoff" and capacity_freed:
        return None
    return prev


def _rescheduled(hist: FailureHistory, policy: ReschedulePolicy, now: float) -> PendingEntry | None:
    """It failed in this very pass: the reschedule policy's entry."""
    recent = [t for t in hist.times if t > now - policy.interval]
    if not policy.unlimited and len(recent) > policy.attempts:
        return PendingEntry(
            kind="exhausted",
            attempts=len(recent),
            not_before=recent[0] + policy.interval,
            reasons=(
                f"failed {len(recent)} times within {policy.interval:g}s; "
                f"reschedule attempts ({policy.attempts}) exhausted",
            ),
        )
    delay = reschedule_delay(policy, len(recent))
    if delay <= 0:
        # no delay: try it in this very pass (a "reschedule" entry with
        # not_before == now would never be woken: wake times are > now)
        return None
    return PendingEntry(
        kind="reschedule",
        attempts=len(recent),
        not_before=now + delay,
        reasons=(f"failed on {hist.last_node}; rescheduling in {delay:g}s",),
    )


def defer_groups(
    plan: Plan,
    deferred: list[Deferred],
    tail: list[GroupKey],
    tail_left: int,
    groups: Groups,
    pending: Mapping[str, PendingEntry],
    failures: Mapping[str, FailureHistory],
    just_failed: Collection[str],
    now: float,
    capacity_freed: bool,
) -> None:
    """Leave the unbound replicas of ``deferred`` groups for the next pass, in
    O(groups + pending) rather than one step per replica: they are counted, not
    listed (a missing replica without an entry is simply tried next time), their
    earlier entries (backoff attempts, reschedule delays) are kept, and one that
    failed in this very pass still gets its reschedule policy applied."""
    keys = {(d.job, d.group) for d in deferred}
    keys.update(tail)  # the groups deferred whole, ``tail_left`` replicas in all
    kept = 0
    # the entries a one-by-one pass would have kept: the same rule, waiting()
    for wid in sorted(just_failed) + [w for w in pending if w not in just_failed]:
        if wid in plan.pending or wid in plan.bindings:
            continue
        job_id, group, ordinal = wid.rsplit("/", 2)
        entry = groups.get((job_id, group))
        if (job_id, group) not in keys or entry is None:
            continue
        policy = entry.spec.reschedule
        wait = waiting(
            pending.get(wid), failures.get(wid), policy, wid in just_failed, now, capacity_freed
        )
        if wait is not None and int(ordinal) < entry.spec.scaling.desired:
            plan.pending[wid] = wait
            kept += 1
    plan.deferred += sum(d.left for d in deferred) + tail_left - kept


def past_cap(
    plan: Plan,
    entry: Group,
    stop: int,
    finished: Collection[int],
    pending: Mapping[str, PendingEntry],
    failures: Mapping[str, FailureHistory],
    just_failed: Collection[str],
    now: float,
) -> None:
    """The runs of a batch group its parallelism stopped at ordinal ``stop`` that
    failed in this pass still get their reschedule entry, as the walk would have
    given them: a delay, or ``exhausted``, which fails the job. Bounded by this
    pass's failures."""
    job, g, _ = entry
    prefix = f"{job.id}/{g.name}/"
    for wid in sorted(w for w in just_failed if w.startswith(prefix)):
        ordinal = int(wid[len(prefix) :])
        if ordinal < stop or ordinal >= g.scaling.desired or ordinal in finished:
            continue
        wait = waiting(pending.get(wid), failures.get(wid), g.reschedule, True, now, False)
        if wait is not None and wid not in plan.bindings:
            plan.pending[wid] = wait
