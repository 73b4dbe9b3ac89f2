"""forge.core.autoscale: the threshold and target (HPA) policies, pure and deterministic."""

from __future__ import annotations

import ast
import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import forge.core.autoscale as autoscale_module
from forge.core.autoscale import (
    MAX_RECOMMENDATIONS,
    AutoscaleState,
    Decision,
    GroupMetrics,
    decide,
    next_due,
)
from forge.core.models import AutoscalePolicy, ScalingPolicy

THRESHOLD = AutoscalePolicy(policy="threshold")  # up >= 0.8 by 1, down <= 0.3, 300 s cooldown
TARGET = AutoscalePolicy(policy="target")  # target 0.6, tolerance 0.1, 300 s window
EMPTY = AutoscaleState()


def scaling(desired: int, lo: int = 0, hi: int = 10) -> ScalingPolicy:
    return ScalingPolicy(min=lo, max=hi, desired=desired)


def cpu(value: float) -> GroupMetrics:
    return GroupMetrics(cpu=value, memory=0.0)


# --- GroupMetrics -------------------------------------------------------------


def test_utilisation_is_max_of_known() -> None:
    assert GroupMetrics(cpu=0.2, memory=0.7).utilisation() == 0.7
    assert GroupMetrics(cpu=0.9, memory=0.1).utilisation() == 0.9
    assert GroupMetrics(cpu=None, memory=0.4).utilisation() == 0.4
    assert GroupMetrics(cpu=0.4, memory=None).utilisation() == 0.4
    assert GroupMetrics(cpu=1.5, memory=None).utilisation() == 1.5  # over-committed
    assert GroupMetrics(cpu=None, memory=None).utilisation() is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.5])
def test_garbage_metric_values_are_unknown(bad: float) -> None:
    assert GroupMetrics(cpu=bad, memory=None).utilisation() is None
    assert GroupMetrics(cpu=bad, memory=0.5).utilisation() == 0.5


# --- unknown metrics ------------------------------------------------------------


@pytest.mark.parametrize("policy", [THRESHOLD, TARGET])
@pytest.mark.parametrize(
    "metrics", [None, GroupMetrics(cpu=None, memory=None), GroupMetrics(math.nan, None)]
)
def test_unknown_metrics_change_nothing(
    policy: AutoscalePolicy, metrics: GroupMetrics | None
) -> None:
    state = AutoscaleState(last_scaled_at=5.0, recommendations=((1.0, 3),))
    d = decide(policy, scaling(3), metrics, state, now=1000.0)
    assert d.desired == 3
    assert not d.changed
    assert d.state is state
    assert d.reason == "metrics unknown"


# --- threshold policy (the original's scenarios) ----------------------------------


def test_high_utilisation_raises_by_step() -> None:
    d = decide(THRESHOLD, scaling(3), GroupMetrics(cpu=0.85, memory=0.2), EMPTY, now=100.0)
    assert d.desired == 4
    assert d.changed
    assert d.state.last_scaled_at == 100.0
    assert d.reason == "cpu 0.85 >= 0.80: 3 -> 4"


def test_memory_counts_too() -> None:
    d = decide(THRESHOLD, scaling(3), GroupMetrics(cpu=0.1, memory=0.9), EMPTY, now=0.0)
    assert d.desired == 4
    assert d.reason.startswith("memory 0.90")


def test_gpu_counts_too_and_unknown_gpu_is_not_idle() -> None:
    """A GPU-bound group scales on its devices' busy time; a group whose GPUs are
    not measured (gpu None) scales on cpu and memory as before."""
    busy = GroupMetrics(cpu=0.1, memory=0.2, gpu=0.95)
    assert busy.utilisation() == 0.95
    d = decide(THRESHOLD, scaling(3), busy, EMPTY, now=0.0)
    assert (d.desired, d.reason) == (4, "gpu 0.95 >= 0.80: 3 -> 4")
    hpa = decide(TARGET, scaling(3), busy, EMPTY, now=0.0)
    assert hpa.desired == 5  # ceil(3 * 0.95 / 0.6)
    assert hpa.reason.startswith("gpu 0.95")
    unmeasured = decide(THRESHOLD, scaling(3), GroupMetrics(0.1, 0.2, None), EMPTY, now=0.0)
    assert unmeasured.desired == 2  # idle on what is known: scaled down
    assert GroupMetrics(cpu=None, memory=None, gpu=0.4).utilisation() == 0.4
    assert GroupMetrics(cpu=0.5, memory=0.5, gpu=math.nan).utilisation() == 0.5
    assert GroupMetrics(cpu=0.5, memory=0.2, gpu=0.5)._dominant() == ("cpu", 0.5)  # tie: cpu


def test_step_is_honoured_and_clamped() -> None:
    policy = AutoscalePolicy(step=3)
    assert decide(policy, scaling(2), cpu(0.9), EMPTY, 0.0).desired == 5
    assert decide(policy, scaling(9), cpu(0.9), EMPTY, 0.0).desired == 10  # clamp to max
    assert decide(policy, scaling(2, lo=1), cpu(0.1), EMPTY, 0.0).desired == 1  # clamp to min


def test_low_utilisation_lowers_by_step() -> None:
    d = decide(THRESHOLD, scaling(3), cpu(0.2), EMPTY, now=100.0)
    assert d.desired == 2
    assert d.state.last_scaled_at == 100.0
    assert d.reason == "cpu 0.20 <= 0.30: 3 -> 2"


def test_thresholds_are_inclusive() -> None:
    assert decide(THRESHOLD, scaling(3), cpu(0.8), EMPTY, 0.0).desired == 4
    assert decide(THRESHOLD, scaling(3), cpu(0.3), EMPTY, 0.0).desired == 2


def test_between_thresholds_no_change() -> None:
    d = decide(THRESHOLD, scaling(3), cpu(0.5), EMPTY, now=100.0)
    assert d.desired == 3
    assert not d.changed
    assert d.state == EMPTY
    assert "within" in d.reason


def test_cooldown_blocks_second_scale_within_300s_and_allows_after() -> None:
    first = decide(THRESHOLD, scaling(3), cpu(0.9), EMPTY, now=1000.0)
    assert first.desired == 4

    blocked = decide(THRESHOLD, scaling(4), cpu(0.9), first.state, now=1180.0)
    assert blocked.desired == 4
    assert not blocked.changed
    assert blocked.state == first.state
    assert blocked.reason.startswith("cooldown: 120s left")

    # Scale-down is blocked too.
    assert not decide(THRESHOLD, scaling(4), cpu(0.1), first.state, now=1299.0).changed

    allowed = decide(THRESHOLD, scaling(4), cpu(0.9), first.state, now=1300.0)
    assert allowed.desired == 5
    assert allowed.state.last_scaled_at == 1300.0


def test_cooldown_not_stamped_when_clamped_at_max() -> None:
    at_max = scaling(5, hi=5)
    d = decide(THRESHOLD, at_max, cpu(0.95), EMPTY, now=1000.0)
    assert d.desired == 5
    assert not d.changed
    assert d.state.last_scaled_at is None
    assert "at max 5" in d.reason

    # The load drops right after: the group scales down at once, no cooldown.
    down = decide(THRESHOLD, at_max, cpu(0.1), d.state, now=1001.0)
    assert down.desired == 4


def test_cooldown_not_restamped_when_clamped_at_min() -> None:
    state = AutoscaleState(last_scaled_at=10.0)
    d = decide(THRESHOLD, scaling(1, lo=1), cpu(0.0), state, now=5000.0)
    assert not d.changed
    assert d.state.last_scaled_at == 10.0


def test_threshold_scales_from_zero() -> None:
    assert decide(THRESHOLD, scaling(0), cpu(0.9), EMPTY, 0.0).desired == 1


def test_threshold_leaves_recommendations_alone() -> None:
    state = AutoscaleState(recommendations=((1.0, 4),))
    d = decide(THRESHOLD, scaling(3), cpu(0.9), state, now=2.0)
    assert d.state.recommendations == ((1.0, 4),)


# --- target policy (Kubernetes HPA) ---------------------------------------------


def test_hpa_scales_up_at_once() -> None:
    # ceil(4 * 0.9 / 0.6) = ceil(6.000000000000001) = 6, not 7.
    d = decide(TARGET, scaling(4), cpu(0.9), EMPTY, now=10.0)
    assert d.desired == 6
    assert d.changed
    assert d.state.last_scaled_at == 10.0
    assert d.reason == "cpu 0.90 / target 0.60 = 1.50: 4 -> 6"


def test_hpa_scale_up_is_clamped_to_max() -> None:
    d = decide(TARGET, scaling(4, hi=5), cpu(0.9), EMPTY, 0.0)
    assert d.desired == 5
    assert d.reason == "cpu 0.90 / target 0.60 = 1.50, clamped to [0, 5]: 4 -> 5"
    # An absurd (finite) utilisation does not overflow.
    assert decide(TARGET, scaling(4, hi=5), cpu(1e308), EMPTY, 0.0).desired == 5


@pytest.mark.parametrize("util", [0.6, 0.55, 0.65, 0.54, 0.66])
def test_hpa_within_tolerance_no_change(util: float) -> None:
    # ratio 0.9 .. 1.1 (edges included, despite float noise)
    d = decide(TARGET, scaling(4), cpu(util), EMPTY, now=10.0)
    assert d.desired == 4
    assert not d.changed
    assert "within tolerance" in d.reason
    assert d.state.last_scaled_at is None
    assert d.state.recommendations == ((10.0, 4),)  # still recorded for the window


def test_hpa_just_outside_tolerance_scales() -> None:
    assert decide(TARGET, scaling(10, hi=20), cpu(0.67), EMPTY, 0.0).desired == 12  # ceil(11.17)


def test_hpa_dip_inside_window_does_not_scale_down() -> None:
    steady = decide(TARGET, scaling(4), cpu(0.6), EMPTY, now=0.0)
    assert steady.desired == 4
    dip = decide(TARGET, scaling(4), cpu(0.3), steady.state, now=60.0)  # recommends 2
    assert dip.desired == 4
    assert not dip.changed
    assert "recommend 2, holding 4" in dip.reason
    assert dip.state.last_scaled_at is None
    back = decide(TARGET, scaling(4), cpu(0.6), dip.state, now=120.0)
    assert back.desired == 4


def test_hpa_scales_down_after_the_window() -> None:
    steady = decide(TARGET, scaling(4), cpu(0.6), EMPTY, now=0.0)
    low = decide(TARGET, scaling(4), cpu(0.3), steady.state, now=60.0)
    assert low.desired == 4
    early = decide(TARGET, scaling(4), cpu(0.3), low.state, now=299.0)
    assert early.desired == 4
    # At t=300 the t=0 entry is exactly a window old: out (the window is (now - 300, now]).
    still = decide(TARGET, scaling(4), cpu(0.3), early.state, now=300.0)
    assert still.desired == 2
    assert still.changed
    assert still.state.last_scaled_at == 300.0
    assert "4 -> 2" in still.reason


def test_hpa_scale_down_goes_to_window_max_not_current_recommendation() -> None:
    state = EMPTY
    for t, util in [(0.0, 0.6), (100.0, 0.45), (200.0, 0.3)]:  # recs 4, 3, 2
        state = decide(TARGET, scaling(4), cpu(util), state, now=t).state
    d = decide(TARGET, scaling(4), cpu(0.3), state, now=350.0)  # window (50, 350]: recs 3, 2, 2
    assert d.desired == 3


def test_hpa_stale_higher_recommendation_never_scales_up() -> None:
    # An operator lowered the group from 8 to 4 by hand; the window still holds 8.
    state = AutoscaleState(recommendations=((0.0, 8),))
    d = decide(TARGET, scaling(4), cpu(0.6), state, now=10.0)
    assert d.desired == 4
    assert not d.changed


def test_hpa_zero_window_scales_down_at_once() -> None:
    policy = AutoscalePolicy(policy="target", stabilization_window=0.0)
    state = decide(policy, scaling(4), cpu(0.6), EMPTY, now=0.0).state
    assert decide(policy, scaling(4), cpu(0.3), state, now=1.0).desired == 2


def test_hpa_from_zero() -> None:
    assert decide(TARGET, scaling(0), cpu(0.01), EMPTY, 0.0).desired == 1
    assert decide(TARGET, scaling(0), cpu(0.0), EMPTY, 0.0).desired == 0
    assert decide(TARGET, scaling(0, hi=0), cpu(0.9), EMPTY, 0.0).desired == 0


def test_hpa_idle_respects_min() -> None:
    policy = AutoscalePolicy(policy="target", stabilization_window=0.0)
    assert decide(policy, scaling(4, lo=2), cpu(0.0), EMPTY, 0.0).desired == 2


def test_hpa_window_is_compressed_and_capped() -> None:
    policy = AutoscalePolicy(policy="target", stabilization_window=1e6, tolerance=0.0)
    # A steadily decreasing load: every recommendation is a new, smaller value.
    state = EMPTY
    big = scaling(1000, hi=1000)
    for i in range(200):
        util = 0.6 * (1000 - i) / 1000  # recommends 1000 - i
        d = decide(policy, big, cpu(util), state, now=float(i))
        assert d.desired == 1000  # the window max (1000 at t=0) holds the group
        state = d.state
        assert len(state.recommendations) <= MAX_RECOMMENDATIONS
    recs = state.recommendations
    assert len(recs) == MAX_RECOMMENDATIONS
    assert recs[0][1] == 1000  # merging keeps the largest value
    assert recs[-1] == (199.0, 801)
    # An equal or larger newer value dominates everything older.
    d = decide(policy, big, cpu(0.6 * 0.9), state, now=500.0)  # recommends 900
    assert d.state.recommendations[-1] == (500.0, 900)
    assert all(v > 900 for _, v in d.state.recommendations[:-1])


def test_hpa_window_prunes_old_entries() -> None:
    state = AutoscaleState(recommendations=((0.0, 9), (10.0, 7)))
    d = decide(TARGET, scaling(4), cpu(0.6), state, now=305.0)
    assert d.state.recommendations == ((10.0, 7), (305.0, 4))


# --- next_due --------------------------------------------------------------------


def test_next_due() -> None:
    assert next_due(THRESHOLD, EMPTY, None, now=50.0) == 50.0
    assert next_due(THRESHOLD, EMPTY, 100.0, now=110.0) == 160.0
    assert next_due(THRESHOLD, EMPTY, 100.0, now=500.0) == 500.0  # overdue: now
    # Inside a threshold cooldown an evaluation is pointless: wait it out.
    cooling = AutoscaleState(last_scaled_at=100.0)
    assert next_due(THRESHOLD, cooling, 100.0, now=100.0) == 400.0
    assert next_due(THRESHOLD, cooling, None, now=100.0) == 400.0
    # The target policy has no cooldown; it must keep sampling for its window.
    assert next_due(TARGET, cooling, 100.0, now=100.0) == 160.0


def test_next_due_and_cooldown_agree_at_the_boundary() -> None:
    # 0.1 + 300 - 0.1 < 300 in floating point; the group must still be allowed
    # to scale at exactly the time next_due names.
    first = decide(THRESHOLD, scaling(3), cpu(0.9), EMPTY, now=0.1)
    due = next_due(THRESHOLD, first.state, 0.1, now=0.1)
    assert decide(THRESHOLD, scaling(4), cpu(0.9), first.state, now=due).changed


# --- purity ------------------------------------------------------------------------


def test_module_imports_nothing_impure() -> None:
    source = Path(autoscale_module.__file__).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "math", "dataclasses", "pydantic", "forge"}


def test_all_is_declared() -> None:
    for name in autoscale_module.__all__:
        assert hasattr(autoscale_module, name)


# --- properties ------------------------------------------------------------------


@st.composite
def scalings(draw: st.DrawFn) -> ScalingPolicy:
    lo = draw(st.integers(0, 40))
    hi = draw(st.integers(lo, 60))
    return ScalingPolicy(min=lo, max=hi, desired=draw(st.integers(lo, hi)))


@st.composite
def policies(draw: st.DrawFn) -> AutoscalePolicy:
    up = draw(st.floats(0.01, 1.0))
    return AutoscalePolicy(
        policy=draw(st.sampled_from(["threshold", "target"])),
        scale_up=up,
        scale_down=draw(st.floats(0.0, up, exclude_max=True)),
        step=draw(st.integers(1, 10)),
        cooldown=draw(st.floats(0.0, 1000.0)),
        target=draw(st.floats(0.01, 1.0)),
        tolerance=draw(st.floats(0.0, 1.0, exclude_max=True)),
        stabilization_window=draw(st.floats(0.0, 1000.0)),
        interval=draw(st.floats(1.0, 600.0)),
    )


values = st.none() | st.floats(0.0, 3.0) | st.sampled_from([math.nan, math.inf, -1.0, 1e308])
metrics_st = st.none() | st.builds(GroupMetrics, cpu=values, memory=values)
times = st.floats(0.0, 1e6)
states = st.builds(
    AutoscaleState,
    last_scaled_at=st.none() | times,
    recommendations=st.lists(
        st.tuples(times, st.integers(0, 60)), max_size=MAX_RECOMMENDATIONS
    ).map(tuple),
)


def _check(d: Decision, s: ScalingPolicy) -> None:
    assert s.min <= d.desired <= s.max
    assert len(d.state.recommendations) <= MAX_RECOMMENDATIONS
    assert d.changed == (d.desired != s.desired)


@given(policies(), scalings(), metrics_st, states, times)
def test_result_within_bounds(
    policy: AutoscalePolicy,
    s: ScalingPolicy,
    m: GroupMetrics | None,
    state: AutoscaleState,
    now: float,
) -> None:
    d = decide(policy, s, m, state, now)
    _check(d, s)
    assert d.reason
    if d.changed:
        assert d.state.last_scaled_at == now
    elif policy.policy == "threshold" or m is None or m.utilisation() is None:
        assert d.state == state


@given(policies(), scalings(), metrics_st, states, times)
def test_decide_is_deterministic(
    policy: AutoscalePolicy,
    s: ScalingPolicy,
    m: GroupMetrics | None,
    state: AutoscaleState,
    now: float,
) -> None:
    assert decide(policy, s, m, state, now) == decide(policy, s, m, state, now)
    # Equal inputs rebuilt from serialised forms give the same answer too.
    rebuilt = (
        AutoscalePolicy.model_validate(policy.model_dump()),
        ScalingPolicy.model_validate(s.model_dump()),
        m,
        AutoscaleState.model_validate_json(state.model_dump_json()),
        now,
    )
    assert decide(*rebuilt) == decide(policy, s, m, state, now)


@given(policies(), scalings(), metrics_st, states, times)
def test_threshold_moves_at_most_step(
    policy: AutoscalePolicy,
    s: ScalingPolicy,
    m: GroupMetrics | None,
    state: AutoscaleState,
    now: float,
) -> None:
    policy = policy.model_copy(update={"policy": "threshold"})
    d = decide(policy, s, m, state, now)
    assert abs(d.desired - s.desired) <= policy.step


@given(
    policies(),
    scalings(),
    st.lists(st.tuples(st.floats(0.0, 200.0), metrics_st), max_size=60),
)
@settings(max_examples=200)
def test_run_stays_bounded_and_respects_cooldown(
    policy: AutoscalePolicy,
    s: ScalingPolicy,
    steps: list[tuple[float, GroupMetrics | None]],
) -> None:
    state, now, scaled_at = EMPTY, 0.0, []
    for dt, m in steps:
        now += dt
        d = decide(policy, s, m, state, now)
        _check(d, s)
        recs = d.state.recommendations
        assert [t for t, _ in recs] == sorted(t for t, _ in recs)
        assert all(a[1] > b[1] for a, b in itertools.pairwise(recs))
        if d.changed:
            scaled_at.append(now)
        state = d.state
        s = s.model_copy(update={"desired": d.desired})
    if policy.policy == "threshold":
        for a, b in itertools.pairwise(scaled_at):
            assert b >= a + policy.cooldown


@given(
    policies(),
    scalings(),
    st.lists(st.tuples(st.floats(0.0, 200.0), st.floats(0.0, 3.0)), max_size=60),
)
@settings(max_examples=200)
def test_hpa_matches_uncompressed_reference(
    policy: AutoscalePolicy, s: ScalingPolicy, steps: list[tuple[float, float]]
) -> None:
    # With counts <= 60 a strictly decreasing run never exceeds the cap, so the
    # compressed window must give exactly the answers of the full history.
    policy = policy.model_copy(update={"policy": "target"})
    state, now = EMPTY, 0.0
    history: list[tuple[float, int]] = []
    for dt, util in steps:
        now += dt
        d = decide(policy, s, cpu(util), state, now)
        assert d.desired == _hpa_reference(policy, s, util, history, now)
        state = d.state
        s = s.model_copy(update={"desired": d.desired})


def _hpa_reference(
    policy: AutoscalePolicy,
    s: ScalingPolicy,
    util: float,
    history: list[tuple[float, int]],
    now: float,
) -> int:
    """HPA over the full, uncompressed history (this evaluation is appended to it)."""
    current = s.desired
    if current == 0:
        rec = 1 if util > 0 else 0
    elif abs(util / policy.target - 1) <= policy.tolerance + 1e-9:
        rec = current
    else:
        raw = current * util / policy.target
        rec = s.max if raw >= s.max else math.ceil(raw - 1e-9)
    rec = max(s.min, min(s.max, rec))
    history.append((now, rec))
    if rec >= current:
        return rec
    window = [v for t, v in history if t > now - policy.stabilization_window]
    return min(current, max([*window, rec]))


@given(states)
def test_state_round_trips(state: AutoscaleState) -> None:
    assert AutoscaleState.model_validate(state.model_dump()) == state
    assert AutoscaleState.model_validate_json(state.model_dump_json()) == state
    # Temporal's JSON converter hands back lists where the model has tuples.
    assert AutoscaleState.model_validate(json.loads(state.model_dump_json())) == state


def test_state_rejects_unbounded_or_unknown_input() -> None:
    with pytest.raises(ValueError):
        AutoscaleState(recommendations=tuple((float(i), 1) for i in range(65)))
    with pytest.raises(ValueError):
        AutoscaleState.model_validate({"last_scaled_at": 1.0, "typo": 2})
    with pytest.raises(ValueError):
        AutoscaleState(last_scaled_at=math.nan)
