"""The reconcile pass: the invariants (docs/invariants.md) as properties, plus the
scenarios.

``Sim`` plays the cluster workflow: it applies events to its inputs, calls
``reconcile`` and replaces its state with the plan's. Every pass it runs is
checked against invariants 1-5 and 7 (6 is the store's, tested with the stores),
so the example tests below get the invariant checks for free as well.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from forge.core.models import (
    Assignment,
    AssignmentStatus,
    Constraint,
    DelayFunction,
    GpuDevice,
    Node,
    NodeState,
    ReschedulePolicy,
)
from forge.core.placement import Binding
from forge.core.reconcile import (
    ReconcileOptions,
    backoff_delay,
    reconcile,
    reschedule_delay,
)
from tests import strategies as fs
from tests.builders import group, job, node
from tests.core.sim import Sim, btuple, on, sim


class ReconcileMachine(RuleBasedStateMachine):
    """Random events and passes; every pass is checked (see ``Sim.run_pass``)."""

    sim: Sim

    @initialize(world=fs.worlds(), options=fs.options())
    def start(self, world: fs.World, options: ReconcileOptions) -> None:
        self.sim = Sim(nodes=dict(world.nodes), jobs=dict(world.jobs), options=options)
        self.sim.run_pass()

    @rule(event=fs.events())
    def event(self, event: fs.Event) -> None:
        self.sim.apply(event)

    @rule(rnd=st.randoms(use_true_random=False))
    def reconcile_pass(self, rnd: random.Random) -> None:
        self.sim.run_pass(rnd)

    @rule(event=fs.events(), rnd=st.randoms(use_true_random=False))
    def event_then_pass(self, event: fs.Event, rnd: random.Random) -> None:
        self.sim.apply(event)
        self.sim.run_pass(rnd)


ReconcileMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestReconcileMachine = ReconcileMachine.TestCase


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=fs.worlds(), options=fs.options(), rnd=st.randoms(use_true_random=False))
def test_first_pass_invariants_and_order_independence(
    world: fs.World, options: ReconcileOptions, rnd: random.Random
) -> None:
    Sim(nodes=world.nodes, jobs=world.jobs, options=options).run_pass(rnd)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=fs.worlds(),
    options=fs.options(),
    events=st.lists(fs.events(), max_size=12),
)
def test_event_sequences_keep_invariants(
    world: fs.World, options: ReconcileOptions, events: list[fs.Event]
) -> None:
    sim = Sim(nodes=world.nodes, jobs=world.jobs, options=options)
    sim.run_pass()
    for e in events:
        sim.apply(e)
        sim.run_pass()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=fs.worlds())
def test_restored_bindings_give_the_same_plan(world: fs.World) -> None:
    """State rebuilt from persisted assignments plans like the live state."""
    sim = Sim(nodes=world.nodes, jobs=world.jobs)
    sim.run_pass()
    restored = {
        w: Binding.from_assignment(Assignment.model_validate(b.to_assignment().model_dump()))
        for w, b in sim.bindings.items()
    }
    assert {w: btuple(b) for w, b in restored.items()} == {
        w: btuple(b) for w, b in sim.bindings.items()
    }
    sim.bindings = restored
    plan = sim.run_pass()
    assert not plan.changed


# -- scenarios -----------------------------------------------------------------------------
def test_all_desired_scheduled_and_a_second_pass_changes_nothing() -> None:
    s = sim([node("a"), node("b")], [job("web", group("api", 4)), job("db", group("pg", 2))])
    first = s.run_pass()
    assert len(first.placed) == 6 and not first.pending and first.next_wake is None
    second = s.run_pass()
    assert not second.placed and not second.released and not second.changed
    assert second.bindings == first.bindings


def test_scale_down_releases_and_restores_capacity() -> None:
    s = sim([node("a", cpu=4000, memory=4096)], [job("web", group("api", 4))])
    s.run_pass()
    assert s.used("a").cpu == 4000
    s.jobs["web"] = s.jobs["web"].with_desired("api", 1)
    plan = s.run_pass()
    assert sorted(plan.released) == [
        ("web/api/1", "scaled down"),
        ("web/api/2", "scaled down"),
        ("web/api/3", "scaled down"),
    ]
    assert set(s.bindings) == {"web/api/0"}
    assert (s.used("a").cpu, s.used("a").memory) == (1000, 1024)


def test_job_stop_releases_everything() -> None:
    s = sim([node("a")], [job("web", group("api", 3))])
    s.run_pass()
    del s.jobs["web"]
    plan = s.run_pass()
    assert {r for _, r in plan.released} == {"job stopped"} and len(plan.released) == 3
    assert not s.bindings and not s.pending


@pytest.mark.parametrize("state", [NodeState.LOST, NodeState.DRAINING])
def test_node_loss_reschedules_onto_a_survivor_in_the_same_pass(state: NodeState) -> None:
    s = sim([node("a"), node("b")], [job("web", group("api", 2))], algorithm="binpack")
    s.run_pass()
    (victim,) = set(on(s).values())  # binpack fills one node first
    (survivor,) = {"a", "b"} - {victim}
    s.nodes[victim] = s.nodes[victim].model_copy(update={"state": state})
    plan = s.run_pass()
    reason = "node lost" if state is NodeState.LOST else "node draining"
    assert plan.released == [("web/api/0", reason), ("web/api/1", reason)]
    assert on(s) == {"web/api/0": survivor, "web/api/1": survivor}
    assert not plan.pending


def test_removed_node_reschedules_onto_a_survivor() -> None:
    s = sim([node("a", cpu=2000), node("b", cpu=2000)], [job("web", group("api", 2))])
    s.run_pass()
    (victim,) = set(on(s).values())
    (survivor,) = {"a", "b"} - {victim}
    del s.nodes[victim]
    plan = s.run_pass()
    assert {r for _, r in plan.released} == {"node removed"}
    assert on(s) == {"web/api/0": survivor, "web/api/1": survivor}


def test_insufficient_capacity_backs_off_without_over_allocating() -> None:
    s = sim([node("a", cpu=4000, memory=8192)], [job("web", group("api", 3, cpu=1500))])
    plan = s.run_pass()
    assert len(plan.placed) == 2 and s.used("a").cpu == 3000
    entry = plan.pending["web/api/2"]
    assert entry.kind == "backoff" and entry.attempts == 1 and entry.not_before == 1.0
    assert entry.reasons == ("0/1 nodes available: 1 insufficient cpu",)


def test_backoff_doubles_up_to_the_cap_across_passes() -> None:
    s = sim([node("a", cpu=1000)], [job("big", group("g", 1, cpu=2000))])
    delays = []
    for _ in range(12):
        plan = s.run_pass()
        entry = plan.pending["big/g/0"]
        delays.append(entry.not_before - s.now)
        assert plan.next_wake == entry.not_before
        s.now = entry.not_before
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert [backoff_delay(n, ReconcileOptions()) for n in range(5)] == [0, 1, 2, 4, 8]


def test_backed_off_replica_waits_while_nothing_changes() -> None:
    s = sim([node("a", cpu=1000)], [job("big", group("g", 1, cpu=2000))])
    s.run_pass()
    s.now = 0.5
    plan = s.run_pass()
    assert not plan.placed and plan.pending["big/g/0"].attempts == 1  # not retried


def test_a_node_joining_makes_backed_off_replicas_eligible_at_once() -> None:
    s = sim([node("a", cpu=1000)], [job("big", group("g", 2, cpu=2000))])
    s.run_pass()
    s.run_pass()
    s.now = 0.5  # well before not_before
    s.nodes["b"] = node("b", cpu=8000)
    plan = s.run_pass(capacity_changed=True)
    assert on(s) == {"big/g/0": "b", "big/g/1": "b"}
    assert not plan.pending and plan.next_wake is None


def test_a_release_makes_backed_off_replicas_eligible_at_once() -> None:
    s = sim(
        [node("a", cpu=2000)],
        [job("web", group("api", 2), priority=90), job("big", group("g", 1, 2000))],
    )
    s.run_pass()
    assert s.pending["big/g/0"].kind == "backoff"
    s.now = 0.25
    s.jobs["web"] = s.jobs["web"].with_desired("api", 0)
    plan = s.run_pass()
    assert len(plan.released) == 2 and on(s) == {"big/g/0": "a"}


def test_gpu_ids_are_exact_and_freed_exactly_on_stop() -> None:
    s = sim(
        [node("a", cpu=8000, memory=8192, gpus=4)],
        [job("x", group("g", 1, gpu=2)), job("y", group("g", 1, gpu=1))],
    )
    s.run_pass()
    gpus = {w: b.gpu_ids for w, b in s.bindings.items()}
    assert gpus == {"x/g/0": ("gpu0", "gpu1"), "y/g/0": ("gpu2",)}
    del s.jobs["x"]
    s.jobs["z"] = job("z", group("g", 1, gpu=3))
    plan = s.run_pass()
    assert plan.released == [("x/g/0", "job stopped")]
    assert s.bindings["y/g/0"].gpu_ids == ("gpu2",)
    assert s.bindings["z/g/0"].gpu_ids == ("gpu0", "gpu1", "gpu3")


def test_gpu_model_and_memory_pick_matching_devices() -> None:
    a = Node(
        id="a",
        cpu=8000,
        memory=8192,
        gpus=(
            GpuDevice(id="t4", model="T4", memory=16000),
            GpuDevice(id="small", model="A100", memory=16000),
            GpuDevice(id="big", model="A100", memory=81920),
        ),
    )
    s = sim([a], [job("x", group("g", 1, gpu=1, gpu_memory=40000, models=("A100",)))])
    s.run_pass()
    assert s.bindings["x/g/0"].gpu_ids == ("big",)


def test_state_rebuilt_from_persisted_assignments_changes_nothing() -> None:
    s = sim([node("a", gpus=2), node("b")], [job("x", group("g", 2, gpu=1)), job("y")])
    s.run_pass()
    rows = [b.to_assignment().model_dump(mode="json") for b in s.bindings.values()]
    restored = {
        a.workload_id: Binding.from_assignment(a)
        for a in (Assignment.model_validate(r) for r in rows)
    }
    assert {w: btuple(b) for w, b in restored.items()} == {
        w: btuple(b) for w, b in s.bindings.items()
    }
    fresh = sim(s.nodes.values(), s.jobs.values())
    fresh.bindings = restored
    plan = fresh.run_pass()
    assert not plan.changed and not plan.pending


def test_assignment_rejects_a_mismatched_workload_id() -> None:
    b = Binding("x", "g", 0, "a", (), 1, 1)
    row = {**b.to_assignment().model_dump(), "ordinal": 1}
    with pytest.raises(ValueError, match="workload_id"):
        Assignment.model_validate(row)


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (DelayFunction.CONSTANT, [10, 10, 10, 10, 10, 10]),
        (DelayFunction.EXPONENTIAL, [10, 20, 40, 80, 100, 100]),
        (DelayFunction.FIBONACCI, [10, 10, 20, 30, 50, 80]),
    ],
)
def test_reschedule_delay_functions(function: DelayFunction, expected: list[float]) -> None:
    policy = ReschedulePolicy(delay=10, max_delay=100, delay_function=function, unlimited=True)
    assert [reschedule_delay(policy, n) for n in range(1, 7)] == expected


@pytest.mark.parametrize("function", list(DelayFunction))
def test_failed_replicas_wait_the_policy_delay(function: DelayFunction) -> None:
    policy = ReschedulePolicy(delay=10, max_delay=100, delay_function=function, unlimited=True)
    s = sim([node("a")], [job("x", group("g", 1, reschedule=policy))])
    s.run_pass()
    waits = []
    for n in range(1, 7):
        plan = s.run_pass(failed=["x/g/0"])
        entry = plan.pending["x/g/0"]
        assert entry.kind == "reschedule" and entry.attempts == n
        waits.append(entry.not_before - s.now)
        assert plan.next_wake == entry.not_before
        s.now = entry.not_before - 0.5
        assert "x/g/0" in s.run_pass().pending  # not before its time
        s.now = entry.not_before
        assert [b.workload_id for b in s.run_pass().placed] == ["x/g/0"]
        s.now += 1
    assert waits == [reschedule_delay(policy, n) for n in range(1, 7)]


def test_failed_status_on_a_binding_counts_as_a_failure() -> None:
    s = sim([node("a")], [job("x")])
    s.run_pass()
    s.bindings["x/g/0"] = Binding("x", "g", 0, "a", (), 1000, 1024, AssignmentStatus.FAILED)
    plan = s.run_pass()
    assert plan.released == [("x/g/0", "failed")]
    assert plan.pending["x/g/0"].kind == "reschedule"
    assert plan.failures["x/g/0"].last_node == "a"


def test_attempts_exhausted_within_the_interval_then_eligible_after_it() -> None:
    policy = ReschedulePolicy(
        attempts=2, interval=100, delay=1, max_delay=1, delay_function=DelayFunction.CONSTANT
    )
    s = sim([node("a")], [job("x", group("g", 1, reschedule=policy))])
    s.run_pass()
    first_failure = s.now
    for _ in range(2):
        assert s.run_pass(failed=["x/g/0"]).pending["x/g/0"].kind == "reschedule"
        s.now += 1
        assert s.run_pass().placed
    plan = s.run_pass(failed=["x/g/0"])
    entry = plan.pending["x/g/0"]
    assert entry.kind == "exhausted" and entry.attempts == 3
    assert entry.not_before == first_failure + 100 == plan.next_wake
    assert "exhausted" in entry.reasons[0]
    s.now = 99.0
    assert not s.run_pass(capacity_changed=True).placed  # capacity does not unblock it
    s.now = entry.not_before
    assert [b.workload_id for b in s.run_pass().placed] == ["x/g/0"]


def test_zero_attempts_means_no_reschedule() -> None:
    policy = ReschedulePolicy(attempts=0, interval=60)
    s = sim([node("a")], [job("x", group("g", 1, reschedule=policy))])
    s.run_pass()
    assert s.run_pass(failed=["x/g/0"]).pending["x/g/0"].kind == "exhausted"


def test_unlimited_policy_never_exhausts() -> None:
    policy = ReschedulePolicy(attempts=0, unlimited=True, delay=1, max_delay=1)
    s = sim([node("a")], [job("x", group("g", 1, reschedule=policy))])
    s.run_pass()
    for _ in range(5):
        assert s.run_pass(failed=["x/g/0"]).pending["x/g/0"].kind == "reschedule"
        s.now += 1
        s.run_pass()


def test_zero_delay_reschedules_in_the_same_pass() -> None:
    """Regression: a 0 s delay left a "reschedule" entry with not_before == now
    that no wake-up (always > now) would ever retry."""
    policy = ReschedulePolicy(delay=0, max_delay=0)
    s = sim([node("a"), node("b")], [job("x", group("g", 1, reschedule=policy))])
    s.run_pass()
    was = on(s)["x/g/0"]
    plan = s.run_pass(failed=["x/g/0"])
    assert plan.released == [("x/g/0", "failed")]
    assert on(s)["x/g/0"] != was and not plan.pending


def test_a_failed_replica_avoids_its_node_when_another_fits() -> None:
    # binpack opens the larger node "a" and would put it back there; it failed there
    policy = ReschedulePolicy(delay=5, max_delay=5)
    s = sim(
        [node("a", cpu=8000), node("b", cpu=4000)],
        [
            job("filler", group("f", 2, cpu=1000), priority=90),
            job("x", group("g", 1, reschedule=policy)),
        ],
    )
    s.run_pass()
    assert set(on(s).values()) == {"a"}
    s.run_pass(failed=["x/g/0"])
    s.now = 5
    plan = s.run_pass()
    assert [(b.workload_id, b.node) for b in plan.placed] == [("x/g/0", "b")]


def test_a_failed_replica_returns_to_its_node_when_nothing_else_fits() -> None:
    policy = ReschedulePolicy(delay=5, max_delay=5)
    s = sim([node("a"), node("b", cpu=500)], [job("x", group("g", 1, reschedule=policy))])
    s.run_pass()
    s.run_pass(failed=["x/g/0"])
    s.now = 5
    assert on(s) == {} and s.run_pass().placed[0].node == "a"


def test_higher_priority_is_placed_first_when_capacity_is_short() -> None:
    s = sim(
        [node("a", cpu=2000)],
        [job("aaa-low", group("g", 2), priority=10), job("zzz-high", group("g", 1), priority=90)],
    )
    plan = s.run_pass()
    assert [b.workload_id for b in plan.placed] == ["zzz-high/g/0", "aaa-low/g/0"]
    assert plan.pending["aaa-low/g/1"].kind == "backoff"


def test_max_placements_defers_the_rest_to_the_next_pass() -> None:
    s = sim([node("a", cpu=8000, memory=8192)], [job("web", group("api", 5))], max_placements=2)
    plan = s.run_pass()
    assert len(plan.placed) == 2 and plan.deferred == 3
    assert {w: e.kind for w, e in plan.pending.items()} == {
        "web/api/2": "deferred",
        "web/api/3": "deferred",
        "web/api/4": "deferred",
    }
    assert plan.next_wake == s.now
    assert len(s.run_pass().placed) == 2
    last = s.run_pass()
    assert len(last.placed) == 1 and not last.pending and last.next_wake is None


def test_next_wake_is_the_earliest_future_not_before() -> None:
    policy = ReschedulePolicy(delay=7, max_delay=7)
    s = sim(
        [node("a", cpu=2000)],
        [job("x", group("g", 1, reschedule=policy)), job("big", group("g", 1, cpu=4000))],
    )
    s.run_pass()
    s.now = 0.5
    plan = s.run_pass(failed=["x/g/0"])
    # big: backoff retried (release) -> attempts 2 at 0.5 + 2; x: reschedule at 7.5
    assert plan.pending["big/g/0"].not_before == 2.5
    assert plan.pending["x/g/0"].not_before == 7.5
    assert plan.next_wake == 2.5


def test_constraints_and_reasons() -> None:
    s = sim(
        [
            node("a", labels={"zone": "a"}),
            node("b", labels={"zone": "b"}),
            node("c", state=NodeState.DRAINING),
        ],
        [
            job(
                "x",
                group(
                    "g", 2, cpu=3000, constraints=(Constraint(label="zone", op="=", values=("b",)),)
                ),
            )
        ],
    )
    plan = s.run_pass()
    assert on(s) == {"x/g/0": "b"}
    assert plan.pending["x/g/1"].reasons == (
        "0/3 nodes available: 1 constraint zone = b, 1 draining, 1 insufficient cpu",
    )


def test_empty_world() -> None:
    s = sim([], [job("x")])
    plan = s.run_pass()
    assert plan.pending["x/g/0"].reasons == ("0/0 nodes available",)
    assert sim([node("a")], []).run_pass().bindings == {}


def test_reconcile_does_not_mutate_its_inputs() -> None:
    s = sim([node("a")], [job("x", group("g", 2))])
    s.run_pass()
    bindings, pending = dict(s.bindings), dict(s.pending)
    reconcile(jobs={}, nodes=s.nodes, bindings=bindings, pending=pending, failures={}, now=1.0)
    assert bindings == s.bindings and pending == s.pending


# -- bounded passes -------------------------------------------------------------------
def test_a_pass_past_its_work_budget_splits_and_converges() -> None:
    """A small budget spreads the placements over several passes; each stops near
    its budget, the rest are counted as deferred, and the end state is what one
    unbounded pass reaches."""
    nodes = [node(f"n{i:03d}", cpu=4000, memory=8192) for i in range(60)]
    jobs = [job(f"j{i:02d}", group("g", 20, cpu=250 + 50 * (i % 7))) for i in range(12)]
    jobs.append(job("huge", group("g", 5, cpu=64_000)))  # never fits: pending, backoff
    unbounded = sim(nodes, jobs).run_pass()

    s = sim(nodes, jobs, max_work=2000)
    passes = 0
    while True:
        plan = s.run_pass()
        passes += 1
        # one placement may overshoot by a scan of the nodes, never more
        assert plan.work <= 2000 + 3 * len(nodes) + 2 * len(s.bindings) + 64
        assert plan.placed or not plan.deferred, "a pass made no progress"
        if not plan.deferred:
            break
        assert plan.next_wake == s.now
        assert passes < 100
    assert passes > 2
    assert len(s.bindings) == len(unbounded.bindings)
    assert {e.kind for e in plan.pending.values()} == {"backoff"}
    assert set(plan.pending) == {f"huge/g/{i}" for i in range(5)}


def test_deferred_groups_keep_the_entries_of_replicas_not_yet_due() -> None:
    """A group the budget did not reach keeps its replicas' backoff entries (their
    attempts and wake times) when they are not due, as a one-by-one pass would."""
    s = sim([node("a", cpu=1000)], [job("big", group("g", 1, cpu=8000))])
    s.run_pass()
    s.now += 1.5  # backoff (1 s) over: due again
    s.run_pass()
    before = s.pending["big/g/0"]
    assert (before.kind, before.attempts) == ("backoff", 2)
    s.options = s.options.model_copy(update={"max_work": 1})
    s.jobs["aaa"] = job("aaa", group("g", 30, cpu=10), priority=90)
    s.now += 0.5  # not due yet
    plan = s.run_pass()
    assert plan.deferred >= 1 and "aaa/g/29" not in plan.pending
    assert plan.pending["big/g/0"] == before


def test_an_exhausted_class_is_diagnosed_without_a_second_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thirty shapes that fit nowhere on 2,000 nodes cost a few node checks each,
    not a sweep of every node per shape (what once deadlocked the workflow)."""
    import forge.core.placement.select as select

    def no_sweep(*args: object, **kwargs: object) -> None:
        raise AssertionError("a full diagnosis sweep ran")

    monkeypatch.setattr(select, "diagnose", no_sweep)
    nodes = [node(f"n{i:04d}", cpu=8000, memory=16384, gpus=i % 5) for i in range(2000)]
    jobs = [job(f"gpu{k:02d}", group("g", 2, cpu=100, gpu=9 + k)) for k in range(30)]
    jobs += [job(f"cpu{k:02d}", group("g", 2, cpu=9000 + k)) for k in range(30)]
    plan = sim(nodes, jobs).run_pass()
    assert len(plan.pending) == 120 and not plan.placed
    why = plan.pending["gpu00/g/0"].reasons[0]
    assert why == "0/2000 nodes available: 2000 insufficient gpu"
    assert plan.pending["cpu00/g/0"].reasons[0] == "0/2000 nodes available: 2000 insufficient cpu"
    # the cpu-only shapes learn from each other (a bigger request skips what a smaller
    # one found full), so 60 exhausted shapes cost a few sweeps, not 60
    assert plan.work < 8 * len(nodes)
