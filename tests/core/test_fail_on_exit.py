"""``reschedule.fail_on_exit``: a batch run whose exit status the group lists is never
retried (forge.core.kinds.fatal decides; the failure history carries it into the
pass, forge.core.waiting keeps it exhausted for good)."""

from __future__ import annotations

import pytest

from forge.core.kinds import fatal
from forge.core.models import Job, ReschedulePolicy
from forge.core.plan import FailureHistory
from tests.builders import group, job, node
from tests.core.test_batch import Loop, batch


def listing(codes: tuple[int, ...], desired: int = 1) -> Job:
    b = batch("b", desired)
    g = b.groups[0]
    policy = g.reschedule.model_copy(update={"attempts": 5, "delay": 0.0, "fail_on_exit": codes})
    return b.model_copy(update={"groups": (g.model_copy(update={"reschedule": policy}),)})


def test_only_a_listed_status_of_a_batch_run_is_fatal() -> None:
    why = "exit status 42 is in reschedule.fail_on_exit: not retried"
    assert fatal("batch", (42, 3), 42) == why
    assert fatal("batch", (42,), 1) == ""
    assert fatal("batch", (42,), None) == ""  # killed, lost, a failed start: not its verdict
    assert fatal("service", (42,), 42) == ""


@pytest.mark.parametrize("carried", [False, True], ids=["full", "carried"])
def test_a_fatal_end_is_exhausted_at_once_and_stays_so(carried: bool) -> None:
    loop = Loop({"b": listing((42,), desired=2)}, {"n1": node("n1")}, carried)
    loop.run()
    assert loop.plan is not None
    loop.plan.failures["b/g/0"] = FailureHistory(fatal=fatal("batch", (42,), 42))
    plan = loop.run(failed=["b/g/0"])
    assert ("b/g/0", "failed") in plan.released
    entry = plan.pending["b/g/0"]
    assert entry.kind == "failed"  # five attempts left, none used
    assert entry.reasons == ("exit status 42 is in reschedule.fail_on_exit: not retried",)
    assert plan.next_wake is None  # nothing to wake for
    loop.now += 10 * 86400.0  # far past the reschedule window
    for _ in range(3):
        later = loop.run()
        assert "b/g/0" not in later.bindings and later.pending["b/g/0"].kind == "failed"
        assert "b/g/1" in later.bindings  # the other run is no concern of it


def test_an_unlisted_status_is_retried_as_before() -> None:
    loop = Loop({"b": listing((42,))}, {"n1": node("n1")}, carried=False)
    loop.run()
    plan = loop.run(failed=["b/g/0"])  # no fatal mark: its status was not listed
    assert "b/g/0" in plan.bindings  # no delay: placed again in the same pass


def test_fail_on_exit_is_a_batch_rule_with_codes_1_to_255() -> None:
    spec = listing((42,)).model_dump(mode="json")
    assert spec["groups"][0]["reschedule"]["fail_on_exit"] == [42]
    with pytest.raises(ValueError, match=r"groups\.0\.reschedule\.fail_on_exit \(g\): only"):
        Job.model_validate({**spec, "type": "service"})
    for bad in (0, 256, "42"):
        spec["groups"][0]["reschedule"]["fail_on_exit"] = [bad]
        with pytest.raises(ValueError, match="fail_on_exit"):
            Job.model_validate(spec)
    # a policy that does not use it dumps as before (the spec's version is unchanged)
    assert "fail_on_exit" not in ReschedulePolicy().model_dump_json()
    assert "fail_on_exit" not in job("s", group("g")).model_dump_json()


def test_a_group_whose_runs_all_failed_for_good_is_parked_not_walked() -> None:
    """Its entries have no delay to end: walking 50,000 of them every pass would be
    the pass's cost for as long as the failed job is kept (found in review)."""
    loop = Loop({"b": listing((42,), desired=500)}, {}, carried=True)  # no node: none bound
    loop.run()
    assert loop.plan is not None
    for o in range(500):
        loop.plan.failures[f"b/g/{o}"] = FailureHistory(fatal="its job failed")
    loop.jobs = {"b": loop.jobs["b"], "s": job("s", group("g"))}  # a change: b walked
    walked = loop.run()
    assert {e.kind for w, e in walked.pending.items() if w.startswith("b/")} == {"failed"}
    last = walked
    for _ in range(3):
        plan = loop.run()
        # taken whole: the very entries of the pass before (a walk makes new ones)
        assert all(plan.pending[w] is last.pending[w] for w in ("b/g/0", "b/g/499"))
        last = plan
