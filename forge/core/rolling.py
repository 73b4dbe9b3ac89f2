"""Rolling updates inside a reconcile pass: the hook between release and placement.

:func:`forge.core.rollout.step` decides one group's replacements from replicas and
their health; this module feeds it from a pass: it finds the groups whose bound
replicas run another version than the group's spec (``TaskGroup.version``), starts,
advances and ends their rollouts, and returns the ordinals to stop (the pass
releases them with reason ``rollout`` and places them again, on the new version,
with the freed capacity). Pure, deterministic (groups in key order), no clock.

Health comes from what the loop knows of a binding: ``failed`` is unhealthy,
``running`` healthy since the pass that saw it running, ``pending`` starting since
it was placed (``since``). With health checks (``health`` given: the rollouts-3
patch) a running replica of a group whose tasks declare a ``check`` is healthy
only once its check has passed (``health[wid]`` True, since the pass that heard
it); while its check fails or has not yet passed it is starting (so a new
replica turns unhealthy past its deadline). The loop records a verdict for the
replicas it places while the group rolls (False until the agent says it passed);
a replica with no entry ran before the rollout began, when the loop was not
watching its check, and running counts as healthy for it, as without a check.

A binding made before versions existed (version "") runs the group's current
version when its resources match the spec (a command or env change then never
reached it, as before), and an unknown old one otherwise.

A spec that changes while a rollout's last wave settles (every replica on the
rollout's version, none failed, the newest not yet healthy for
``min_healthy_time``: ``settle``, the superseded-wave-settles patch) waits for
that wave: once it has settled the rollout completed, so its version is the one
the new rollout reverts to, as Nomad's last stable version. Without ``settle`` the
new spec took over at once and kept the older rollout's revert target, so a
revert after ``v1 -> v2 -> v3`` went back to v1 when v3 came within
``min_healthy_time`` of v2's last replica starting.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from forge.core.groups import Group, Groups
from forge.core.models import AssignmentStatus, Request, TaskGroup, workload_id
from forge.core.placement import Binding
from forge.core.rollout import (
    Health,
    Phase,
    Replica,
    Rollout,
    Step,
    UpdatePolicy,
    counts_healthy,
    step,
)

__all__ = [
    "DEFAULT_POLICY",
    "GroupRollout",
    "RolloutPlan",
    "has_check",
    "plan_rollouts",
    "version_of",
]

DEFAULT_POLICY = UpdatePolicy()
#: The version of a pre-versions binding whose resources differ from the spec.
LEGACY = "legacy"
#: Pre-versions bindings a pass stamps with their version at most (each is then
#: persisted again): the rest the next passes, so one persist stays small.
MAX_STAMPS = 2000


@dataclass(frozen=True, slots=True)
class GroupRollout:
    """A group's rollout as the loop keeps it (state and checkpoint)."""

    rollout: Rollout
    failed: str = ""  # why it stopped (a replica missed its deadline), "" while it runs
    revert_asked: bool = False  # auto_revert: the loop has asked for the old spec


@dataclass(slots=True)
class RolloutPlan:
    stop: list[str] = field(default_factory=list)  # workload ids, in order
    rollouts: dict[str, GroupRollout] = field(default_factory=dict)  # "job/group" -> kept
    steps: dict[str, Step] = field(default_factory=dict)  # for status
    revert: dict[str, str] = field(default_factory=dict)  # "job/group" -> version to go back to
    stamped: list[str] = field(default_factory=list)  # pre-versions bindings given one
    #: groups left with bindings that have no version yet (past MAX_STAMPS): the next
    #: pass must look at them again even if nothing about them changes
    unstamped: set[tuple[str, str]] = field(default_factory=set)
    wake: float | None = None


def version_of(b: Binding, g: TaskGroup, req: Request) -> str:
    if b.version:
        return b.version
    return g.version if (b.cpu, b.memory) == (req.cpu, req.memory) else LEGACY


def _group_key(name: str) -> tuple[str, str]:
    job, group = name.split("/", 1)  # names have no "/" (forge.core.fields.Name)
    return job, group


def has_check(g: TaskGroup) -> bool:
    """The group's replicas are healthy only when their checks pass."""
    return any(t.check is not None for t in g.tasks)


def _health(
    b: Binding, since: Mapping[str, float], wid: str, verdict: bool | None = None
) -> tuple[Health, float]:
    """``verdict``: the replica's check as the loop knows it (None: no check, or
    none recorded)."""
    if b.status is AssignmentStatus.FAILED:
        return Health.UNHEALTHY, since.get(wid, 0.0)
    if b.status is AssignmentStatus.RUNNING and verdict is not False:
        return Health.HEALTHY, since.get(wid, 0.0)
    return Health.STARTING, since.get(wid, 0.0)


def plan_rollouts(
    *,
    groups: Groups,
    bindings: Mapping[str, Binding],
    rollouts: Mapping[str, GroupRollout],
    since: Mapping[str, float],
    failed: Mapping[str, Binding] = {},
    promoted: Mapping[str, None] = {},
    health: Mapping[str, bool] | None = None,
    now: float,
    only: Collection[tuple[str, str]] | None = None,
    budget: Callable[[tuple[str, str]], int | None] | None = None,
    settle: bool = False,
) -> RolloutPlan:
    """Each group's step. ``failed``: bindings this pass released as failed (a new
    replica that failed fails its rollout); ``promoted``: groups (``job/group``)
    promoted since the last pass; ``health``: check verdicts of rolling groups'
    replicas (None: checks are not counted, as before rollouts-3). Pre-versions
    bindings are given their version in place (``stamped``: the loop persists them again).

    ``only``: the groups that may have a replica off their version (their spec
    changed, or their bindings were loaded or left unstamped), looked at with the
    groups rolling now; None looks at every group. A pass with a carry passes it, so
    its cost follows what changed, not the number of groups: a group outside both
    has every replica on its version and no rollout, and would be skipped anyway.

    ``budget``: what a group's disruption budget lets go now (None: no budget), so
    a wave never takes the group further below desired than its budget allows.

    ``settle``: a rollout whose spec changed again while its last wave settles
    finishes that wave first, and its version becomes the revert target (the
    superseded-wave-settles patch; off: the new spec takes over at once, keeping
    the older revert target)."""
    out = RolloutPlan()
    wakes: list[float] = []
    keys: Collection[tuple[str, str]] = groups
    if only is not None:
        keys = {k for k in (*only, *map(_group_key, rollouts)) if k in groups}
    for key in sorted(keys):
        entry = groups[key]
        name = f"{key[0]}/{key[1]}"
        replicas = _replicas(key, entry, bindings, failed, health, since, now, out)
        prior = rollouts.get(name)
        if settle and prior is not None:
            last = _superseded(entry.spec, prior, replicas, now)
            if isinstance(last, Step):  # its last wave settles first
                out.rollouts[name], out.steps[name] = prior, last
                wakes.append(last.wake_at or now)
                continue
            if last:
                prior = None  # it completed: the new rollout reverts to its version
        current = _current(prior, entry.spec, replicas, name in promoted)
        if current is not None:
            left = budget(key) if budget is not None else None
            _roll(name, entry, current, replicas, now, out, wakes, left)
    if len(out.stamped) >= MAX_STAMPS:
        wakes.append(now)  # more to stamp: the next pass at once
    out.wake = min(wakes) if wakes else None
    return out


def _replicas(
    key: tuple[str, str],
    entry: Group,
    bindings: Mapping[str, Binding],
    failed: Mapping[str, Binding],
    health: Mapping[str, bool] | None,
    since: Mapping[str, float],
    now: float,
    out: RolloutPlan,
) -> list[Replica]:
    """A group's replicas as a rollout sees them (version, health), stamping the
    versions of bindings recorded before versions (at most MAX_STAMPS a pass)."""
    job, g, req = entry
    checked = health is not None and has_check(g)
    replicas: list[Replica] = []
    for ordinal in range(g.scaling.desired):
        wid = workload_id(job.id, g.name, ordinal)
        b = bindings.get(wid)
        if b is None:
            gone = failed.get(wid)
            if gone is not None and gone.version == g.version:
                replicas.append(Replica(ordinal, g.version, Health.UNHEALTHY, now))
            continue
        if not b.version:
            if len(out.stamped) < MAX_STAMPS:
                b.version = version_of(b, g, req)
                out.stamped.append(wid)
            else:
                out.unstamped.add(key)
        verdict = health.get(wid) if checked and health is not None else None
        state, at = _health(b, since, wid, verdict)
        replicas.append(Replica(ordinal, version_of(b, g, req), state, at))
    return replicas


def _superseded(
    g: TaskGroup, prior: GroupRollout, replicas: list[Replica], now: float
) -> bool | Step:
    """A rollout whose spec changed again: True when it completed (every replica on
    its version, each healthy for ``min_healthy_time`` by the group's rule), so its
    version is the last stable one; a step that waits while its last wave is still
    on its way there (no replica off its version, none failed or past its deadline);
    False otherwise (or when the spec did not change): the new spec takes over with
    the older revert target."""
    rollout = prior.rollout
    if prior.failed or rollout.version == g.version:
        return False
    if len(replicas) != g.scaling.desired or any(r.version != rollout.version for r in replicas):
        return False
    policy = g.update or DEFAULT_POLICY
    wakes: list[float] = []
    for r in replicas:
        if counts_healthy(r, policy, now):
            continue
        if r.health is Health.HEALTHY:
            wakes.append(r.since + policy.min_healthy_time)
        elif r.health is Health.STARTING and now < r.since + policy.healthy_deadline:
            wakes.append(r.since + policy.healthy_deadline)
        else:
            return False  # failed, or past its deadline: the version never completed
    if not wakes:
        return True
    return Step(
        phase=Phase.ROLLING,
        waiting=f"version {g.version} waits for the last wave of {rollout.version} to settle",
        wake_at=min(wakes),
        rollout=rollout,
        healthy=sum(r.health is Health.HEALTHY for r in replicas),
        updated=len(replicas) - len(wakes),
    )


def _current(
    current: GroupRollout | None, g: TaskGroup, replicas: list[Replica], promoted: bool
) -> GroupRollout | None:
    """The group's rollout this pass: the one under way (retargeted if the spec
    changed again), a new one if a replica is off the group's version, or None."""
    if current is None:
        old = [r for r in replicas if r.version != g.version]
        if not old:
            return None  # nothing to roll
        current = GroupRollout(Rollout(g.version, old[0].version))
    elif current.rollout.version != g.version:
        # changed again mid-rollout: roll to the newest, back to the last good one
        current = GroupRollout(Rollout(g.version, current.rollout.previous))
    if promoted and not current.rollout.promoted:
        current = replace(current, rollout=replace(current.rollout, promoted=True))
    return current


def _roll(
    name: str,
    entry: Group,
    current: GroupRollout,
    replicas: list[Replica],
    now: float,
    out: RolloutPlan,
    wakes: list[float],
    budget: int | None = None,
) -> None:
    """One group's step of its rollout, written into ``out``."""
    job, g, _ = entry
    if current.failed:
        out.rollouts[name] = current
        out.steps[name] = Step(phase=Phase.FAILED, waiting=current.failed)
        return
    policy = g.update or DEFAULT_POLICY
    s = step(
        desired=g.scaling.desired,
        replicas=replicas,
        rollout=current.rollout,
        policy=policy,
        now=now,
        budget=budget,
    )
    out.steps[name] = s
    if s.phase is Phase.DONE:
        return  # finished: forgotten
    if s.phase in (Phase.FAILED, Phase.REVERT):
        kept = GroupRollout(current.rollout, failed=s.waiting or "failed")
        if s.phase is Phase.REVERT and current.rollout.previous != LEGACY:
            out.revert[name] = current.rollout.previous
            kept = replace(kept, revert_asked=True)
        out.rollouts[name] = kept
        return
    out.rollouts[name] = replace(current, rollout=s.rollout or current.rollout)
    out.stop.extend(workload_id(job.id, g.name, o) for o in s.stop)
    if s.stop:  # placed again this pass: their deadline, should no report come
        wakes.append(now + policy.healthy_deadline)
    if s.wake_at is not None:
        wakes.append(s.wake_at)
