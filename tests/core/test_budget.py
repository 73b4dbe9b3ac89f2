"""The next pass's budget from the last pass's recorded time (forge.core.budget)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from forge.core.budget import MIN_PASS_BUDGET, TARGET_SECONDS, next_budget

CEILING = 300_000


def test_a_slow_pass_shrinks_the_next_in_proportion_and_a_quick_one_with_work_left_grows() -> None:
    assert next_budget(300_000, 1.2, deferred=True, ceiling=CEILING) == 75_000
    assert next_budget(75_000, 0.05, deferred=True, ceiling=CEILING) == 150_000  # at most x2
    assert next_budget(150_000, 0.1, deferred=True, ceiling=CEILING) == 300_000
    assert next_budget(300_000, 0.01, deferred=True, ceiling=CEILING) == CEILING
    assert next_budget(75_000, 0.01, deferred=False, ceiling=CEILING) == 75_000  # nothing left
    assert next_budget(30_000, 60.0, deferred=True, ceiling=CEILING) == MIN_PASS_BUDGET


@given(
    st.integers(MIN_PASS_BUDGET, 10 * CEILING),
    st.floats(0, 100, allow_nan=False),
    st.booleans(),
)
def test_the_budget_stays_in_bounds_and_never_grows_after_a_slow_pass(
    current: int, seconds: float, deferred: bool
) -> None:
    nxt = next_budget(current, seconds, deferred=deferred, ceiling=CEILING)
    assert MIN_PASS_BUDGET <= nxt <= max(CEILING, MIN_PASS_BUDGET)
    if seconds > TARGET_SECONDS:
        assert nxt <= current
        # the same work at the new budget would take about the target (or the floor)
        assert nxt == MIN_PASS_BUDGET or nxt * seconds / current <= TARGET_SECONDS + 1e-9


def test_to_target_grows_a_budget_that_left_work_from_anywhere_under_the_target() -> None:
    """Between half the target and the target, the plain rule keeps the budget: a
    backlog whose head costs more than it to walk then never gets placed."""
    slow_enough = TARGET_SECONDS * 0.6
    assert next_budget(77_000, slow_enough, deferred=True, ceiling=CEILING) == 77_000
    grown = next_budget(77_000, slow_enough, deferred=True, ceiling=CEILING, to_target=True)
    assert grown == int(77_000 / 0.6)  # in proportion to the time left
    # nothing left, or already near the target: kept
    done = next_budget(77_000, slow_enough, deferred=False, ceiling=CEILING, to_target=True)
    assert done == 77_000
    near = TARGET_SECONDS * 0.95
    assert next_budget(77_000, near, deferred=True, ceiling=CEILING, to_target=True) == 77_000
