"""Autoscaling policies: metrics + state + now -> a new desired count.

This module is pure: no clock, no randomness, no I/O, no ``temporalio`` import.
``now`` is a parameter (the workflow passes ``workflow.now()``), the state is a
small frozen model the cluster workflow carries through continue-as-new, and the
same inputs always give the same :class:`Decision` -- so it can run inside
deterministic workflow code and be replayed.

Two policies (``AutoscalePolicy.policy``):

``threshold`` (the original's)
    ``utilisation = max(cpu, memory, gpu)``; ``>= scale_up`` adds ``step``, ``<=
    scale_down`` removes ``step``, clamped to ``[min, max]``; then ``cooldown``
    seconds during which the group does not scale again.

``target`` (Kubernetes' HorizontalPodAutoscaler)
    ``recommendation = ceil(desired * utilisation / target)`` unless the ratio is
    within ``tolerance`` of 1; scale-up applies at once, scale-down is stabilised
    over ``stabilization_window`` seconds.

Why the rules are what they are:

* **Utilisation is the max of cpu, memory and gpu.** A replica runs out of
  whichever resource is scarcer; averaging would hide a memory-bound group behind
  idle cpu (or a GPU-bound one behind both). Unknown values (``None``, and also
  NaN, infinities or negatives, which a broken metrics source can produce) are
  ignored; with nothing known the group is left alone and the state is not
  touched, because "no data" is not "idle".

* **The cooldown is stamped only when the count actually changes.** It exists to
  give a scale time to take effect (new replicas start, load spreads out) before
  the group is judged again. A proposal that the ``[min, max]`` clamp turns into
  "no change" did nothing, so there is nothing to wait for. Stamping it anyway
  would re-arm the cooldown on every evaluation of a group pinned at ``max``
  under load, and when the load finally drops the group would have to sit out a
  full cooldown caused by a non-event (likewise after an operator raises
  ``max``). The cooldown is only consulted when a scale is proposed, so the
  reason string says what would have happened.

* **Scale-down stabilisation takes the max of the window.** Removing capacity is
  the risky direction: if the load comes back, the group is under-provisioned
  while new replicas start, and the two moves together are thrash. Applying the
  largest recommendation of the last ``stabilization_window`` seconds (this one
  included) shrinks the group only to a size that would have been enough for
  every sample in the window, so a brief dip never scales down, while a sustained
  drop does once the window has passed. Scale-up is not stabilised: being short
  of capacity hurts now. This is Kubernetes' downscale stabilisation (default
  five minutes).

* **An old, higher recommendation never scales *up*.** The window only limits
  how far down the group may go: ``new = rec`` if ``rec >= desired``, else
  ``min(desired, max(window))``. (This is the HPA ``behavior`` formulation; the
  legacy one returned the window max outright, which scales a group right back
  up after an operator lowered it by hand.)

* **The tolerance** keeps a group that hovers around its target from flapping
  by one replica on every evaluation of noisy metrics.

* **Float noise is absorbed** by ``_EPS``: ``4 * 0.9 / 0.6`` is
  ``6.000000000000001`` in binary floating point, and a naive ``ceil`` would make
  it 7; likewise a ratio exactly on the tolerance edge counts as inside.

* **The recommendation window is stored compressed and bounded.** An entry
  that is older than a newer entry with an equal or larger value can never again
  be the window's max (the newer one outlives it), so only a strictly
  decreasing run of recommendations is kept -- exact, and short in practice. The
  tuple is still capped at :data:`MAX_RECOMMENDATIONS` (workflow state must not
  grow without bound); on overflow the two oldest entries are merged into one
  that keeps the older (larger) value with the newer time, which can only delay
  a scale-down, never hasten it.

* **Scaling from zero.** With ``desired == 0`` the HPA ratio is meaningless
  (``0 * anything == 0``), so the target policy recommends 1 replica when any
  utilisation above 0 is reported for the group and 0 otherwise (clamped to
  ``[min, max]``); once the group has a replica the ratio takes over. The
  threshold policy needs no special case: ``0 + step``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from forge.core.models import AutoscalePolicy, ScalingPolicy

__all__ = [
    "MAX_RECOMMENDATIONS",
    "AutoscaleState",
    "Decision",
    "GroupMetrics",
    "decide",
    "next_due",
]

#: Upper bound on ``AutoscaleState.recommendations`` (see the module docstring).
MAX_RECOMMENDATIONS = 64

# Absorbs binary floating-point noise in ``ceil`` and in the tolerance check.
_EPS = 1e-9


def _known(value: float | None) -> float | None:
    """``value`` if it is a usable utilisation, else None (unknown)."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class GroupMetrics:
    """A group's utilisation, 0..1 (may exceed 1 when over-committed); None = unknown.

    NaN, infinite and negative values are treated as unknown. ``gpu`` is the busy
    fraction of the group's GPUs as its agents measure it (None for a group without
    GPUs, or where no agent can measure them): a GPU inference service is bound by
    its devices long before its cpu.
    """

    cpu: float | None
    memory: float | None
    gpu: float | None = None

    def utilisation(self) -> float | None:
        """``max(cpu, memory, gpu)`` of the known values; None if none is known."""
        dominant = self._dominant()
        return None if dominant is None else dominant[1]

    def _dominant(self) -> tuple[str, float] | None:
        """The name and value of the largest known metric (on a tie the first of cpu,
        memory, gpu)."""
        best: tuple[str, float] | None = None
        for name, raw in (("cpu", self.cpu), ("memory", self.memory), ("gpu", self.gpu)):
            value = _known(raw)
            if value is not None and (best is None or value > best[1]):
                best = (name, value)
        return best


class AutoscaleState(BaseModel):
    """Per-group autoscaler memory, carried in the cluster workflow's state.

    ``last_scaled_at``: when the count last changed (the cooldown's origin).
    ``recommendations``: ``(time, recommended count)`` pairs of the target
    policy's stabilisation window, oldest first, stored compressed (only entries
    that can still be the window's max).
    """

    # Not strict: the state crosses Temporal's JSON payloads, where tuples come
    # back as lists.
    model_config = ConfigDict(frozen=True, extra="forbid")

    last_scaled_at: float | None = Field(default=None, allow_inf_nan=False)
    recommendations: tuple[tuple[float, int], ...] = Field(
        default=(), max_length=MAX_RECOMMENDATIONS
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one evaluation.

    ``desired``: the count to apply; ``state``: the state to keep for the next
    evaluation; ``reason``: a human-readable explanation; ``previous``: the
    desired count that went in.
    """

    desired: int
    state: AutoscaleState
    reason: str
    previous: int

    @property
    def changed(self) -> bool:
        return self.desired != self.previous


def decide(
    policy: AutoscalePolicy,
    scaling: ScalingPolicy,
    metrics: GroupMetrics | None,
    state: AutoscaleState,
    now: float,
) -> Decision:
    """Evaluate one group: the new desired count, the new state and why."""
    current = scaling.desired
    dominant = None if metrics is None else metrics._dominant()
    if dominant is None:
        return Decision(current, state, "metrics unknown", current)
    metric, util = dominant
    if policy.policy == "threshold":
        return _threshold(policy, scaling, metric, util, state, now)
    return _target(policy, scaling, metric, util, state, now)


def next_due(
    policy: AutoscalePolicy,
    state: AutoscaleState,
    last_evaluated: float | None,
    now: float,
) -> float:
    """When the group should next be evaluated (never earlier than ``now``).

    ``last_evaluated + policy.interval``, or ``now`` if it never was. For the
    threshold policy an evaluation inside the cooldown cannot change anything,
    so the time is pushed to the end of the cooldown (saving a metrics fetch).
    The result is clamped to ``now`` so that ``next_due(...) - now`` is always a
    valid (non-negative) timeout.
    """
    due = now if last_evaluated is None else last_evaluated + policy.interval
    if policy.policy == "threshold" and state.last_scaled_at is not None:
        due = max(due, state.last_scaled_at + policy.cooldown)
    return max(due, now)


def _threshold(
    policy: AutoscalePolicy,
    scaling: ScalingPolicy,
    metric: str,
    util: float,
    state: AutoscaleState,
    now: float,
) -> Decision:
    current = scaling.desired
    if util >= policy.scale_up:
        proposed = min(current + policy.step, scaling.max)
        why = f"{metric} {util:.2f} >= {policy.scale_up:.2f}"
        bound = f"at max {scaling.max}"
    elif util <= policy.scale_down:
        proposed = max(current - policy.step, scaling.min)
        why = f"{metric} {util:.2f} <= {policy.scale_down:.2f}"
        bound = f"at min {scaling.min}"
    else:
        why = f"{metric} {util:.2f} within ({policy.scale_down:.2f}, {policy.scale_up:.2f})"
        return Decision(current, state, f"{why}: {current}", current)

    if proposed == current:
        # Clamped: not a scale, so no cooldown stamp (see the module docstring).
        return Decision(current, state, f"{why}: {current} ({bound})", current)

    # Compare against the end time, exactly as next_due computes it, so the two
    # agree even where ``now - last < cooldown`` would round differently.
    if state.last_scaled_at is not None and now < state.last_scaled_at + policy.cooldown:
        left = math.ceil(state.last_scaled_at + policy.cooldown - now)
        reason = f"cooldown: {left}s left ({why}: would scale {current} -> {proposed})"
        return Decision(current, state, reason, current)

    new_state = AutoscaleState(last_scaled_at=now, recommendations=state.recommendations)
    return Decision(proposed, new_state, f"{why}: {current} -> {proposed}", current)


def _clamp(value: int, scaling: ScalingPolicy) -> int:
    return max(scaling.min, min(scaling.max, value))


def _recommend(policy: AutoscalePolicy, scaling: ScalingPolicy, util: float) -> tuple[int, str]:
    """The HPA recommendation for the current utilisation, and how it was reached."""
    current = scaling.desired
    ratio = util / policy.target
    if current == 0:
        return _clamp(1 if util > 0 else 0, scaling), "from zero"
    if abs(ratio - 1) <= policy.tolerance + _EPS:
        return current, f"= {ratio:.2f} within tolerance {policy.tolerance:.2f}"
    raw = current * ratio
    # ``raw`` is >= 0 (util >= 0, target > 0) but may be huge or even inf; compare
    # before ceil so it never reaches math.ceil (which raises on inf).
    rec = scaling.max if raw >= scaling.max else math.ceil(raw - _EPS)
    clamped = _clamp(rec, scaling)
    how = f"= {ratio:.2f}"
    if clamped != rec or raw > scaling.max:
        how += f", clamped to [{scaling.min}, {scaling.max}]"
    return clamped, how


def _window(
    recommendations: tuple[tuple[float, int], ...], now: float, rec: int, window: float
) -> tuple[tuple[float, int], ...]:
    """The stabilisation window after recording ``rec`` at ``now``, compressed.

    Drops entries older than ``window`` seconds, then every entry that a newer
    one with an equal or larger value dominates, leaving values strictly
    decreasing with time (so the first entry is the window's max), then merges
    the oldest entries while the tuple is over :data:`MAX_RECOMMENDATIONS`.
    """
    cutoff = now - window
    live = [entry for entry in recommendations if entry[0] > cutoff]
    live.append((now, rec))
    live.sort(key=lambda entry: entry[0])  # stable: ties keep insertion order
    kept: list[tuple[float, int]] = []
    best = -1
    for t, value in reversed(live):
        if value > best:
            kept.append((t, value))
            best = value
    kept.reverse()
    while len(kept) > MAX_RECOMMENDATIONS:
        # Keep the older, larger value until the newer time: only delays scale-down.
        kept[0:2] = [(kept[1][0], kept[0][1])]
    return tuple(kept)


def _target(
    policy: AutoscalePolicy,
    scaling: ScalingPolicy,
    metric: str,
    util: float,
    state: AutoscaleState,
    now: float,
) -> Decision:
    current = scaling.desired
    rec, how = _recommend(policy, scaling, util)
    recommendations = _window(state.recommendations, now, rec, policy.stabilization_window)
    why = f"{metric} {util:.2f} / target {policy.target:.2f} {how}"

    if rec >= current:
        new = rec  # scale-up applies at once (or no change)
        detail = f"{current} -> {new}" if new != current else f"{current}"
    else:
        window_max = recommendations[0][1]
        new = min(current, window_max)
        span = f"{policy.stabilization_window:g}s"
        if new == current:
            detail = f"recommend {rec}, holding {current} (max {window_max} in last {span})"
        else:
            detail = f"recommend {rec}: {current} -> {new} (max in last {span})"

    last = now if new != current else state.last_scaled_at
    new_state = AutoscaleState(last_scaled_at=last, recommendations=recommendations)
    return Decision(new, new_state, f"{why}: {detail}", current)
