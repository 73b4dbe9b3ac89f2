"""The rollout planner: availability floor, waves, canaries, deadlines, reverts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from forge.core.rollout import Health, Phase, Replica, Rollout, Step, UpdatePolicy, step

H, S, U = Health.HEALTHY, Health.STARTING, Health.UNHEALTHY


def _group(desired: int, version: str = "v1", since: float = 0.0) -> list[Replica]:
    return [Replica(i, version, H, since) for i in range(desired)]


def test_one_wave_replaces_max_parallel_highest_ordinals_first() -> None:
    policy = UpdatePolicy(max_parallel=2, min_healthy_time=10)
    s = step(desired=6, replicas=_group(6), rollout=Rollout("v2", "v1"), policy=policy, now=100)
    assert s.phase is Phase.ROLLING
    assert s.stop == (4, 5)
    assert s.rollout is not None and s.rollout.last_wave == 100


def test_the_next_wave_waits_until_the_new_replicas_are_healthy_long_enough() -> None:
    policy = UpdatePolicy(max_parallel=1, min_healthy_time=10, healthy_deadline=60)
    reps = [*_group(5), Replica(5, "v2", H, since=95)]
    s = step(
        desired=6, replicas=reps, rollout=Rollout("v2", "v1", last_wave=90), policy=policy, now=100
    )
    assert s.stop == ()
    assert s.wake_at == 105  # healthy since 95 + 10
    later = step(
        desired=6, replicas=reps, rollout=Rollout("v2", "v1", last_wave=90), policy=policy, now=105
    )
    assert later.stop == (4,)


def test_a_new_replica_past_its_deadline_fails_or_reverts() -> None:
    reps = [*_group(5), Replica(5, "v2", S, since=0)]
    for revert, phase in ((False, Phase.FAILED), (True, Phase.REVERT)):
        policy = UpdatePolicy(healthy_deadline=30, min_healthy_time=5, auto_revert=revert)
        early = step(desired=6, replicas=reps, rollout=Rollout("v2", "v1"), policy=policy, now=29)
        assert early.phase is Phase.ROLLING and early.stop == () and early.wake_at == 30
        late = step(desired=6, replicas=reps, rollout=Rollout("v2", "v1"), policy=policy, now=30)
        assert late.phase is phase and late.stop == ()
        assert "not healthy within 30s" in late.waiting


def test_an_unhealthy_new_replica_fails_at_once() -> None:
    reps = [*_group(5), Replica(5, "v2", U, since=1)]
    s = step(desired=6, replicas=reps, rollout=Rollout("v2", "v1"), policy=UpdatePolicy(), now=2)
    assert s.phase is Phase.FAILED and "unhealthy" in s.waiting


def test_a_canary_waits_for_promotion_then_the_rest_rolls() -> None:
    policy = UpdatePolicy(canary=1, max_parallel=2, min_healthy_time=1)
    first = step(desired=4, replicas=_group(4), rollout=Rollout("v2", "v1"), policy=policy, now=10)
    assert first.stop == (3,)  # only the canary, although max_parallel is 2
    reps = [*_group(3), Replica(3, "v2", H, since=11)]
    held = step(desired=4, replicas=reps, rollout=Rollout("v2", "v1"), policy=policy, now=20)
    assert held.phase is Phase.AWAITING_PROMOTION and held.stop == ()
    assert "forge job promote" in held.waiting
    promoted = step(
        desired=4, replicas=reps, rollout=Rollout("v2", "v1", promoted=True), policy=policy, now=20
    )
    assert promoted.stop == (1, 2)
    auto = step(
        desired=4,
        replicas=reps,
        rollout=Rollout("v2", "v1"),
        policy=UpdatePolicy(canary=1, max_parallel=2, min_healthy_time=1, auto_promote=True),
        now=20,
    )
    assert auto.stop == (1, 2)


def test_stagger_spaces_the_waves() -> None:
    policy = UpdatePolicy(min_healthy_time=0, stagger=30)
    reps = [*_group(3), Replica(3, "v2", H, since=10)]
    s = step(
        desired=4, replicas=reps, rollout=Rollout("v2", "v1", last_wave=10), policy=policy, now=20
    )
    assert s.stop == () and s.wake_at == 40 and s.waiting == "stagger between waves"


def test_unhealthy_old_replicas_are_replaced_first() -> None:
    reps = [Replica(0, "v1", H, 0), Replica(1, "v1", U, 0), Replica(2, "v1", H, 0)]
    s = step(desired=3, replicas=reps, rollout=Rollout("v2", "v1"), policy=UpdatePolicy(), now=1)
    assert s.stop == (1,)


def test_done_when_every_replica_runs_the_new_version() -> None:
    s = step(
        desired=3,
        replicas=_group(3, version="v2"),
        rollout=Rollout("v2", "v1"),
        policy=UpdatePolicy(min_healthy_time=0),
        now=1,
    )
    assert s.phase is Phase.DONE and s.updated == 3


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_parallel": 0}, "max_parallel"),
        ({"min_healthy_time": 60, "healthy_deadline": 30}, "min_healthy_time"),
        ({"canary": -1}, "canary"),
    ],
)
def test_a_policy_that_cannot_work_is_refused_naming_the_field(
    fields: dict[str, object], named: str
) -> None:
    with pytest.raises(ValidationError, match=named):
        UpdatePolicy.model_validate(fields)


def test_a_canary_larger_than_the_group_is_refused() -> None:
    with pytest.raises(ValueError, match=r"update\.canary"):
        UpdatePolicy(canary=4).check_against(desired=3)


# -- properties -----------------------------------------------------------------

policies = st.builds(
    UpdatePolicy,
    max_parallel=st.integers(1, 4),
    min_healthy_time=st.sampled_from([0.0, 5.0, 10.0]),
    healthy_deadline=st.just(60.0),
    canary=st.integers(0, 2),
    auto_promote=st.booleans(),
    stagger=st.sampled_from([0.0, 7.0]),
)


@given(
    desired=st.integers(1, 12),
    policy=policies,
    healths=st.lists(st.sampled_from([H, H, H, S, U]), min_size=12, max_size=12),
    versions=st.lists(st.sampled_from([1, 2]), min_size=12, max_size=12),
    now=st.floats(0, 200),
)
def test_one_step_never_takes_healthy_replicas_below_the_floor(
    desired: int,
    policy: UpdatePolicy,
    healths: list[Health],
    versions: list[int],
    now: float,
) -> None:
    reps = [Replica(i, f"v{versions[i]}", healths[i], 0.0) for i in range(desired)]
    s = step(desired=desired, replicas=reps, rollout=Rollout("v2", "v1"), policy=policy, now=now)
    by = {r.ordinal: r for r in reps}
    assert all(by[o].version != "v2" for o in s.stop), "only old replicas are replaced"
    healthy = sum(r.health is H for r in reps)
    after = healthy - sum(by[o].health is H for o in s.stop)
    assert after >= min(healthy, desired - policy.max_parallel)
    unsettled = sum(
        1
        for r in reps
        if r.version == "v2" and not (r.health is H and now >= policy.min_healthy_time)
    )
    assert len(s.stop) + unsettled <= policy.max_parallel or not s.stop


def _simulate(desired: int, policy: UpdatePolicy, boot: float) -> tuple[list[int], Step]:
    """Run a rollout to its end: a replaced ordinal starts on the new version and is
    healthy ``boot`` seconds later. Returns the healthy count after every pass."""
    now = 0.0
    reps = {i: Replica(i, "v1", H, 0.0) for i in range(desired)}
    started: dict[int, float] = {}
    rollout = Rollout("v2", "v1", promoted=True)
    seen = []
    for _ in range(10_000):
        for o, t in started.items():  # health advances with time
            if reps[o].health is S and now >= t + boot:
                reps[o] = Replica(o, "v2", H, t + boot)
        s = step(
            desired=desired, replicas=list(reps.values()), rollout=rollout, policy=policy, now=now
        )
        assert s.rollout is not None
        rollout = s.rollout
        for o in s.stop:  # released, then placed again on the new version
            reps[o] = Replica(o, "v2", S, now)
            started[o] = now
        seen.append(sum(r.health is H for r in reps.values()))
        if s.phase is not Phase.ROLLING:
            return seen, s
        now = s.wake_at if s.wake_at is not None and not s.stop else now + 1.0
    raise AssertionError("the rollout never ended")


@given(desired=st.integers(1, 10), policy=policies, boot=st.sampled_from([0.0, 3.0, 20.0]))
def test_a_whole_rollout_keeps_the_floor_and_ends_on_the_new_version(
    desired: int, policy: UpdatePolicy, boot: float
) -> None:
    seen, last = _simulate(desired, policy, boot)
    assert last.phase is Phase.DONE
    assert last.updated == desired
    assert min(seen) >= desired - policy.max_parallel
