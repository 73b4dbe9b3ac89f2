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
"""

from __future__ import annotations

from forge.core.models import DelayFunction, ReschedulePolicy
from forge.core.plan import FailureHistory, PendingEntry, ReconcileOptions

__all__ = ["backoff_delay", "reschedule_delay", "waiting"]


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
    to try it."""
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
