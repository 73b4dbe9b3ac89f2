"""Batch jobs in the pure pass: a completed ordinal is released without counting as a
failure, never placed again, and its room goes to the next pending run at once
(forge.core.kinds, forge.core.reconcile's ``done`` and ``completed``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import pytest

from forge.core.groups import Group
from forge.core.kinds import ending
from forge.core.models import DelayFunction, Job, Node, NodeState, ReschedulePolicy
from forge.core.placement import Binding
from forge.core.plan import FailureHistory, Plan, ReconcileOptions
from forge.core.reconcile import Carry, reconcile
from forge.core.visiting import Done
from forge.core.waiting import past_cap
from tests.builders import group, job, node


def batch(jid: str, desired: int, *, gang: bool = False, parallelism: int | None = None) -> Job:
    g = group("g", desired, cpu=1000, memory=1024)
    if gang:
        g = g.model_copy(update={"gang": True})
    capped = g.model_copy(
        update={"scaling": g.scaling.model_copy(update={"parallelism": parallelism})}
    )
    return job(jid, g).model_copy(update={"type": "batch", "groups": (capped,)})


class Loop:
    """Passes as the workflow runs them: the plan's bindings, pending and failures
    carried to the next, with or without the incremental carry."""

    def __init__(
        self,
        jobs: Mapping[str, Job],
        nodes: Mapping[str, Node],
        carried: bool,
        options: ReconcileOptions | None = None,
    ) -> None:
        self.jobs, self.nodes, self.carried = dict(jobs), dict(nodes), carried
        self.options = options
        self.bindings: dict[str, Binding] = {}
        self.plan: Plan | None = None
        self.carry: Carry | None = None
        self.done: dict[tuple[str, str], set[int]] = {}
        self.now = 1000.0

    def run(self, *, completed: Collection[str] = (), failed: Collection[str] = ()) -> Plan:
        for wid in completed:  # as the workflow does: done before the pass
            j, g, o = wid.rsplit("/", 2)
            self.done.setdefault((j, g), set()).add(int(o))
        prev = self.plan
        done: Done = {k: frozenset(v) for k, v in self.done.items()}
        plan = reconcile(
            jobs=self.jobs,
            nodes=self.nodes,
            bindings=self.bindings,
            pending=prev.pending if prev else {},
            failures=prev.failures if prev else {},
            failed=failed,
            now=self.now,
            carry=self.carry if self.carried else None,
            done=done,
            completed=completed,
            jobs_changed=None,
            options=self.options or ReconcileOptions(),
        )
        self.plan, self.carry = plan, plan.carry
        self.bindings = dict(plan.bindings)
        self.now += 1
        return plan


@pytest.mark.parametrize("carried", [False, True], ids=["full", "carried"])
def test_a_completed_run_frees_its_room_for_the_next_in_the_same_pass(carried: bool) -> None:
    loop = Loop({"b": batch("b", 3)}, {"n1": node("n1", cpu=2000, memory=4096)}, carried)
    first = loop.run()
    assert sorted(first.bindings) == ["b/g/0", "b/g/1"]
    assert list(first.pending) == ["b/g/2"]

    second = loop.run(completed=["b/g/0"])
    assert ("b/g/0", "complete") in second.released
    assert sorted(second.bindings) == ["b/g/1", "b/g/2"]  # placed in the room freed
    assert "b/g/0" not in second.failures  # not a failure: no backoff, no attempt
    assert "b/g/0" not in second.pending

    third = loop.run(completed=["b/g/1", "b/g/2"])
    assert third.bindings == {} and third.pending == {} and not third.placed
    assert loop.run().placed == []  # and it stays done


@pytest.mark.parametrize("carried", [False, True], ids=["full", "carried"])
def test_a_done_ordinal_is_not_placed_again_when_its_node_is_lost(carried: bool) -> None:
    nodes = {"n1": node("n1"), "n2": node("n2")}
    loop = Loop({"b": batch("b", 2)}, nodes, carried)
    loop.run()
    loop.run(completed=["b/g/0"])
    where = loop.bindings["b/g/1"].node
    loop.nodes = {**nodes, where: node(where, state=NodeState.LOST)}
    plan = loop.run()
    assert [w for w, _ in plan.released] == ["b/g/1"]
    assert sorted(plan.bindings) == ["b/g/1"]  # the lost run again, the done one not
    assert plan.bindings["b/g/1"].node != where


def test_a_failure_is_still_a_failure() -> None:
    loop = Loop({"b": batch("b", 1)}, {"n1": node("n1")}, carried=False)
    loop.run()
    plan = loop.run(failed=["b/g/0"])
    assert ("b/g/0", "failed") in plan.released
    assert "b/g/0" in plan.failures


def test_a_gang_completing_whole_is_not_a_member_lost() -> None:
    loop = Loop({"b": batch("b", 2, gang=True)}, {"n1": node("n1")}, carried=False)
    assert len(loop.run().bindings) == 2
    plan = loop.run(completed=["b/g/0", "b/g/1"])
    assert sorted(plan.released) == [("b/g/0", "complete"), ("b/g/1", "complete")]
    assert plan.bindings == {} and plan.pending == {}


def _retrying_gang(attempts: int) -> Job:
    b = batch("b", 2, gang=True)
    policy = ReschedulePolicy(attempts=attempts, interval=3600, delay=0)
    return b.model_copy(update={"groups": (b.groups[0].model_copy(update={"reschedule": policy}),)})


@pytest.mark.parametrize("carried", [False, True], ids=["full", "carried"])
def test_a_batch_gang_restarted_for_a_failed_member_spends_one_attempt_of_the_gang(
    carried: bool,
) -> None:
    """attempts: 1 is one restart of the gang, whichever member fails: member 0 fails
    (the gang restarts), then member 1 fails, and the gang is out of attempts."""
    nodes = {"n1": node("n1"), "n2": node("n2")}
    loop = Loop({"b": _retrying_gang(1)}, nodes, carried)
    assert sorted(loop.run().bindings) == ["b/g/0", "b/g/1"]
    first = loop.run(failed=["b/g/0"])
    assert sorted(first.released) == [("b/g/0", "failed"), ("b/g/1", "gang member lost")]
    assert sorted(first.bindings) == ["b/g/0", "b/g/1"]  # together again, no delay
    assert first.failures["b/g/0"].times == first.failures["b/g/1"].times  # the gang's
    second = loop.run(failed=["b/g/1"])
    assert second.pending["b/g/1"].kind == "exhausted"
    assert second.pending["b/g/1"].attempts == 2
    assert "b/g/0" not in second.bindings  # the gang is not placed half


def test_each_member_counted_alone_without_the_option() -> None:
    """The behaviour histories recorded before the patch replay with: member 1's
    first failure is its own first attempt."""
    nodes = {"n1": node("n1"), "n2": node("n2")}
    old = ReconcileOptions(gang_attempts=False)
    loop = Loop({"b": _retrying_gang(1)}, nodes, carried=False, options=old)
    loop.run()
    loop.run(failed=["b/g/0"])
    second = loop.run(failed=["b/g/1"])
    assert "b/g/1" not in second.pending or second.pending["b/g/1"].kind != "exhausted"


def test_a_gang_restarted_for_a_lost_node_spends_no_attempt() -> None:
    nodes = {n: node(n, cpu=1000) for n in ("n1", "n2", "n3")}  # one member a node
    loop = Loop({"b": _retrying_gang(1)}, nodes, carried=False)
    loop.run()
    where = loop.bindings["b/g/0"].node
    loop.nodes = {**nodes, where: node(where, cpu=1000, state=NodeState.LOST)}
    plan = loop.run()
    assert ("b/g/1", "gang member lost") in plan.released
    assert plan.failures == {} and sorted(plan.bindings) == ["b/g/0", "b/g/1"]


def test_a_service_is_untouched_by_an_empty_done_set() -> None:
    jobs = {"s": job("s", group("g", 3))}
    plain = reconcile(
        jobs=jobs, nodes={"n": node("n")}, bindings={}, pending={}, failures={}, now=1.0
    )
    with_done = reconcile(
        jobs=jobs, nodes={"n": node("n")}, bindings={}, pending={}, failures={}, now=1.0, done={}
    )
    assert sorted(plain.bindings) == sorted(with_done.bindings) == ["s/g/0", "s/g/1", "s/g/2"]


def test_what_an_end_means_by_kind() -> None:
    assert ending("service", "exited") == "failed"
    assert ending("batch", "exited") == "complete"
    assert ending("batch", "failed") == ending("service", "failed") == "failed"
    assert ending("batch", "running") is None


def test_a_batch_job_refuses_autoscale_and_update_naming_the_field() -> None:
    base = batch("b", 1).model_dump(mode="json")
    base["groups"][0]["autoscale"] = {"policy": "target"}
    with pytest.raises(ValueError, match=r"groups\.0\.autoscale \(g\): a batch job"):
        Job.model_validate(base)
    base["groups"][0]["autoscale"] = None
    base["groups"][0]["update"] = {}
    with pytest.raises(ValueError, match=r"groups\.0\.update \(g\): a batch job"):
        Job.model_validate(base)


def test_a_service_job_dumps_as_before() -> None:
    assert "type" not in job("s").model_dump(mode="json")
    assert batch("b", 1).model_dump(mode="json")["type"] == "batch"


def test_a_batch_group_retries_as_nomads_batch_does_unless_it_says_otherwise() -> None:
    """A service's default (3 retries an hour, exponential) would make a run that fails
    for a reason fail four times before the job does; batch takes Nomad's batch
    defaults, and each field the group sets wins over them."""
    grp: dict[str, Any] = {"name": "g", "tasks": [{"name": "t",
            "resources": {"cpu": 100, "memory": 64}}]}  # fmt: skip
    spec = {"name": "b", "type": "batch", "groups": [grp]}
    plain = Job.model_validate(spec).groups[0].reschedule
    assert (plain.attempts, plain.interval, plain.delay) == (1, 86400.0, 5.0)
    assert plain.delay_function == DelayFunction.CONSTANT
    grp["reschedule"] = {"attempts": 4, "delay_function": "exponential"}
    own = Job.model_validate(spec).groups[0].reschedule
    assert (own.attempts, own.delay_function, own.delay) == (4, DelayFunction.EXPONENTIAL, 5.0)
    stored = Job.model_validate_json(Job.model_validate(spec).model_dump_json())
    assert stored.groups[0].reschedule == own  # the stored spec says what applies
    service = Job.model_validate({**spec, "type": "service"}).groups[0].reschedule
    assert service == ReschedulePolicy(attempts=4, delay_function=DelayFunction.EXPONENTIAL)


@pytest.mark.parametrize("carried", [False, True], ids=["full", "carried"])
def test_parallelism_caps_the_runs_bound_at_once_and_each_end_lets_the_next_in(
    carried: bool,
) -> None:
    roomy = {"n1": node("n1", cpu=8000, memory=16384)}  # room for all five at once
    loop = Loop({"b": batch("b", 5, parallelism=2)}, roomy, carried)
    first = loop.run()
    assert sorted(first.bindings) == ["b/g/0", "b/g/1"]
    assert first.pending == {}  # the rest wait for a run to end, not for room
    second = loop.run(completed=["b/g/0"])
    assert sorted(second.bindings) == ["b/g/1", "b/g/2"]
    third = loop.run(failed=["b/g/1"])  # a run waiting out its delay holds no slot
    assert sorted(third.bindings) == ["b/g/2", "b/g/3"]
    assert third.pending["b/g/1"].kind == "reschedule"
    assert len(loop.run().bindings) == 2  # and a quiet pass adds none


def test_a_run_that_failed_past_the_cap_still_gets_its_entry() -> None:
    """The walk stops at the first run over the cap; a later run that failed in this
    very pass must still be given its reschedule entry (``exhausted`` fails the job)."""
    never = ReschedulePolicy(attempts=0)
    g = group("g", 3, reschedule=never)
    b = job("b", g)
    plan = Plan(bindings={})
    hist = {"b/g/2": FailureHistory(times=(999.0,), last_node="n1")}
    past_cap(plan, Group(b, g, g.request()), 1, {0}, {}, hist, ["b/g/2", "x/g/2"], 1000.0)
    assert list(plan.pending) == ["b/g/2"] and plan.pending["b/g/2"].kind == "exhausted"
    nothing = Plan(bindings={})
    past_cap(nothing, Group(b, g, g.request()), 3, set(), {}, hist, ["b/g/2"], 1000.0)
    assert nothing.pending == {}  # before the stop: the walk gave it its entry


def test_parallelism_is_for_batch_runs_and_a_scale_keeps_it() -> None:
    spec = batch("b", 4, parallelism=2).model_dump(mode="json")
    assert spec["groups"][0]["scaling"]["parallelism"] == 2
    assert Job.model_validate(spec).with_desired("g", 9).groups[0].scaling.parallelism == 2
    with pytest.raises(ValueError, match=r"groups\.0\.scaling\.parallelism \(g\): only a batch"):
        Job.model_validate({**spec, "type": "service"})
    spec["groups"][0]["gang"] = True
    with pytest.raises(ValueError, match=r"groups\.0\.scaling\.parallelism \(g\): a gang"):
        Job.model_validate(spec)
    assert "parallelism" not in job("s").model_dump_json()  # older specs dump as before
