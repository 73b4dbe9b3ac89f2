"""Rolling updates: which old replicas a group may replace now, as a pure function.

A changed task spec makes a new *version* of its group. The loop does not release
every old replica at once (an outage); it asks :func:`step` each pass which old
replicas to stop, given every replica's version and health, and places the freed
ordinals on the new version through the normal placement path. The rules are
Nomad's ``update`` stanza and Kubernetes' ``maxUnavailable``:

- never more than ``max_parallel`` replicas of the group in flight (stopped and
  not yet healthy on the new version), and never fewer than
  ``desired - max_parallel`` healthy replicas because of a replacement;
- a wave is done when each of its new replicas has been healthy for
  ``min_healthy_time``; the next starts ``stagger`` seconds after;
- a new replica not healthy within ``healthy_deadline`` fails the rollout: it
  stops (and, with ``auto_revert``, the group rolls back to the last version that
  was healthy, as a rollout of its own);
- with ``canary: N`` the first N replacements make a wave on their own and the
  rollout waits for a promotion (``forge job promote``) unless ``auto_promote``.

The function decides; it never sleeps. Its ``wake_at`` tells the workflow when the
answer can change without new input (a health clock or the stagger running out),
so the wait is a durable timer and a worker crash resumes the same wave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

#: Why a wave waits when its group's disruption budget is spent (status shows it).
BUDGET_WAIT = "disruption budget: no more replicas may go below desired now"

Seconds = Annotated[float, Strict(), Field(ge=0, le=7 * 24 * 3600)]


class UpdatePolicy(BaseModel):
    """How a group moves to a new version; the defaults are safe for services."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_parallel: Annotated[int, Strict(), Field(ge=1, le=10_000)] = 1
    min_healthy_time: Seconds = 10.0
    healthy_deadline: Seconds = 300.0
    canary: Annotated[int, Strict(), Field(ge=0, le=10_000)] = 0
    auto_promote: Annotated[bool, Strict()] = False
    auto_revert: Annotated[bool, Strict()] = False
    stagger: Seconds = 0.0

    @model_validator(mode="after")
    def _deadline_covers_healthy_time(self) -> Self:
        if self.min_healthy_time > self.healthy_deadline:
            raise ValueError(
                f"update.min_healthy_time ({self.min_healthy_time:g}s) must not exceed "
                f"update.healthy_deadline ({self.healthy_deadline:g}s): no replica could "
                "ever count as healthy in time"
            )
        return self

    def check_against(self, desired: int) -> None:
        """Rules that need the group: raise ``ValueError`` naming the field."""
        if self.canary > desired:
            raise ValueError(
                f"update.canary ({self.canary}) exceeds scaling.desired ({desired}): "
                "a canary replaces existing replicas, so it cannot be larger than the group"
            )


class Health(StrEnum):
    """What the agent last said about a replica (a missing replica has no entry)."""

    STARTING = "starting"  # placed or running, its check not yet passed
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # failed, exited, or its check failing


@dataclass(frozen=True, slots=True)
class Replica:
    """One bound replica: its ordinal, the version it runs, its health since when."""

    ordinal: int
    version: str
    health: Health
    since: float  # when ``health`` began (for STARTING: when it was placed)


class Phase(StrEnum):
    ROLLING = "rolling"
    AWAITING_PROMOTION = "awaiting-promotion"
    FAILED = "failed"  # a new replica missed its deadline and auto_revert is off
    REVERT = "revert"  # failed with auto_revert: the caller starts a rollout back
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Rollout:
    """The durable part of a rollout: kept in the workflow state across passes."""

    version: str  # the version the group moves to (its spec digest)
    previous: str  # the last version that was healthy (the revert target)
    promoted: bool = False
    last_wave: float | None = None  # when the latest replacements were made


@dataclass(frozen=True, slots=True)
class Step:
    """What to do this pass; ``stop`` lists old ordinals to release for replacement."""

    phase: Phase
    stop: tuple[int, ...] = ()
    waiting: str = ""  # why nothing more happens now (for status), empty if acting
    wake_at: float | None = None  # the next moment the answer may change by itself
    rollout: Rollout | None = None  # the rollout to keep (``last_wave`` updated)
    healthy: int = 0  # replicas healthy right now, any version (for status)
    updated: int = 0  # replicas on the new version that count as healthy


def counts_healthy(r: Replica, policy: UpdatePolicy, now: float) -> bool:
    """Healthy for ``min_healthy_time`` (by the group's rule: running, and its
    check passed when it has one)."""
    return r.health is Health.HEALTHY and now - r.since >= policy.min_healthy_time


def step(
    *,
    desired: int,
    replicas: Sequence[Replica],
    rollout: Rollout,
    policy: UpdatePolicy,
    now: float,
    budget: int | None = None,
) -> Step:
    """Decide the replacements for this pass.

    ``replicas`` are the group's bound replicas (any version); ordinals at or beyond
    ``desired`` are the scaler's business, not the rollout's, and are ignored here.
    ``budget``: replicas the group's disruption budget lets go now (None: no
    budget); a wave stops at most that many.
    """
    live = sorted((r for r in replicas if r.ordinal < desired), key=lambda r: r.ordinal)
    new = [r for r in live if r.version == rollout.version]
    old = [r for r in live if r.version != rollout.version]
    healthy = sum(r.health is Health.HEALTHY for r in live)
    settled = [r for r in new if counts_healthy(r, policy, now)]
    unsettled = [r for r in new if not counts_healthy(r, policy, now)]
    base = Step(phase=Phase.ROLLING, rollout=rollout, healthy=healthy, updated=len(settled))

    # A new replica past its deadline fails the rollout, whatever else is going on.
    wakes: list[float] = []
    failed = _overdue(unsettled, rollout, policy, now, wakes)
    if failed is not None:
        phase = Phase.REVERT if policy.auto_revert else Phase.FAILED
        return Step(
            phase=phase, waiting=failed, rollout=rollout, healthy=healthy, updated=len(settled)
        )

    missing = desired - len(live)  # ordinals nobody holds: placement fills them (new version)
    if not old:
        if unsettled or missing:
            return _wait(base, "waiting for the new replicas to become healthy", wakes)
        return Step(phase=Phase.DONE, rollout=rollout, healthy=healthy, updated=len(settled))

    in_flight = len(unsettled) + max(missing, 0)
    canary_hold = policy.canary and not (rollout.promoted or policy.auto_promote)
    if canary_hold and len(new) >= policy.canary:
        if unsettled:
            return _wait(base, f"canary: waiting for {len(unsettled)} to become healthy", wakes)
        return Step(
            phase=Phase.AWAITING_PROMOTION,
            waiting=f"canary of {len(new)} healthy: waiting for `forge job promote`",
            rollout=rollout,
            healthy=healthy,
            updated=len(settled),
        )
    if in_flight:
        # A wave is done only when all its replicas are settled.
        return _wait(base, f"wave in flight: {in_flight} replica(s) not yet healthy", wakes)
    if rollout.last_wave is not None and now < rollout.last_wave + policy.stagger:
        return _wait(base, "stagger between waves", [rollout.last_wave + policy.stagger])

    # Unhealthy old replicas first (replacing them costs no availability), then the
    # highest ordinals, so a rollout reads top-down in status.
    order = sorted(old, key=lambda r: (r.health is Health.HEALTHY, -r.ordinal))
    room = policy.max_parallel
    if canary_hold:
        room = min(room, policy.canary - len(new))
    if budget is not None and budget < room:
        room = budget
        if room <= 0:
            return _wait(base, BUDGET_WAIT, wakes)
    # Nothing is in flight here and every new replica is settled, so the healthy
    # count is ``desired`` minus the unhealthy old replicas; taking those first and
    # at most ``max_parallel`` in all keeps it at or above ``desired - max_parallel``
    # (the property tests check that floor over whole simulated rollouts).
    stop = [r.ordinal for r in order[:room]]
    return Step(
        phase=Phase.ROLLING,
        stop=tuple(sorted(stop)),
        rollout=Rollout(rollout.version, rollout.previous, rollout.promoted, now),
        healthy=base.healthy,
        updated=len(settled),
    )


def _overdue(
    unsettled: list[Replica],
    rollout: Rollout,
    policy: UpdatePolicy,
    now: float,
    wakes: list[float],
) -> str | None:
    """Why a new replica fails the rollout (unhealthy, or not healthy by its
    deadline), or None; the moments the answer may change go into ``wakes``."""
    for r in unsettled:
        if r.health is Health.HEALTHY:
            wakes.append(r.since + policy.min_healthy_time)
            continue
        deadline = r.since + policy.healthy_deadline
        if r.health is Health.UNHEALTHY:
            return f"replica {r.ordinal} on version {rollout.version} is unhealthy"
        if now >= deadline:
            why = f"replica {r.ordinal} on version {rollout.version} not healthy within "
            return why + (
                f"{policy.healthy_deadline:g}s" if r.health is Health.STARTING else "its deadline"
            )
        wakes.append(deadline)
    return None


def _wait(base: Step, why: str, wakes: list[float]) -> Step:
    return Step(
        phase=base.phase,
        waiting=why,
        wake_at=min(wakes) if wakes else None,
        rollout=base.rollout,
        healthy=base.healthy,
        updated=base.updated,
    )
