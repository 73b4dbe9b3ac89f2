"""Disruption budgets across drains, rolling updates and preemption together
(forge.core.disruption): a group's ``max_unavailable`` bounds all three at once.

A replica is unavailable when desired and unbound; a pass's voluntary releases
(``node draining``, ``rollout``, ``preempted``) may never leave a budgeted group
more than its allowance short, and the carried pass (the workflow's) decides
exactly what a pass over every binding decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.models import AssignmentStatus, Job, Node, NodeState
from forge.core.placement import Binding
from forge.core.reconcile import Carry, Plan, ReconcileOptions, reconcile
from forge.core.rolling import GroupRollout
from forge.core.rollout import BUDGET_WAIT

VOLUNTARY = {"node draining", "rollout", "preempted"}
OPTIONS = ReconcileOptions(rollouts=True)


def group_job(
    name: str,
    replicas: int,
    *,
    cpu: int = 1000,
    budget: int | str | None = 1,
    priority: int = 50,
    env: str = "1",
    max_parallel: int = 1,
) -> Job:
    g: dict[str, Any] = {
        "name": "g",
        "scaling": {"max": 100, "desired": replicas},
        "update": {"max_parallel": max_parallel, "min_healthy_time": 0.0},
        "tasks": [{"name": "t", "env": {"V": env}, "resources": {"cpu": cpu, "memory": 64}}],
    }
    if budget is not None:
        g["disruption"] = {"max_unavailable": budget}
    return Job.model_validate({"name": name, "priority": priority, "groups": [g]})


def nodes_of(n: int, cpu: int = 4000) -> dict[str, Node]:
    return {f"n{i}": Node(id=f"n{i}", cpu=cpu, memory=8192) for i in range(n)}


@dataclass
class Loop:
    """The workflow's part: a carry from pass to pass, rollouts and their clocks,
    agents that report running at once. Each pass is also planned without the
    carry (every binding checked) and must decide the same."""

    nodes: dict[str, Node]
    jobs: dict[str, Job]
    options: ReconcileOptions = OPTIONS
    now: float = 0.0
    bindings: dict[str, Binding] = field(default_factory=dict)
    pending: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, Any] = field(default_factory=dict)
    rollouts: dict[str, GroupRollout] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)
    carry: Carry | None = None

    def pass_(self) -> Plan:
        inputs: dict[str, Any] = {
            "jobs": dict(self.jobs),
            "nodes": dict(self.nodes),
            "pending": self.pending,
            "failures": self.failures,
            "now": self.now,
            "options": self.options,
            "rollouts": self.rollouts,
            "since": self.since,
            "capacity_changed": True,
        }
        before = dict(self.bindings)
        full = reconcile(bindings=before, **inputs)
        if self.carry is None:
            self.carry = Carry.start(inputs["jobs"], inputs["nodes"], rolling=True)
            for wid, b in before.items():
                self.carry.absorb(wid, b)
        plan = reconcile(bindings={}, carry=self.carry, **inputs)
        assert _key(plan) == _key(full), "the carried pass decided differently"
        if self.options.disruption_budgets:
            check_budgets(self.jobs, before, plan)
        self.carry = plan.carry
        self.bindings, self.pending, self.failures = (
            dict(plan.bindings),
            plan.pending,
            plan.failures,
        )
        assert plan.rollouts is not None
        self.rollouts = plan.rollouts.rollouts
        for b in plan.placed:
            self.since[b.workload_id] = self.now
        return plan

    def run_all(self) -> None:
        """Every bound replica reports running (the agents)."""
        for b in self.bindings.values():
            if b.status is AssignmentStatus.PENDING:
                b.status = AssignmentStatus.RUNNING
                self.since[b.workload_id] = self.now

    def set_node(self, node_id: str, state: NodeState) -> None:
        self.nodes[node_id] = self.nodes[node_id].model_copy(update={"state": state})

    def on(self, node_id: str) -> list[str]:
        return sorted(w for w, b in self.bindings.items() if b.node == node_id)


def _key(plan: Plan) -> tuple[object, ...]:
    return (
        sorted(plan.released),
        sorted((b.workload_id, b.node, b.gpu_ids) for b in plan.placed),
        sorted(plan.bindings),
        sorted(plan.drain_held),
        plan.next_wake,
    )


def check_budgets(jobs: dict[str, Job], before: dict[str, Binding], plan: Plan) -> None:
    """No pass's voluntary releases leave a budgeted group more than its allowance
    below desired (placements of the pass have not started: they do not count)."""
    placed = {b.workload_id for b in plan.placed}
    voluntary: dict[tuple[str, str], int] = {}
    for wid, why in plan.released:
        if why in VOLUNTARY:
            b = before[wid]
            voluntary[(b.job, b.group)] = voluntary.get((b.job, b.group), 0) + 1
    for (job_id, group), n in voluntary.items():
        job = jobs.get(job_id)
        g = next((g for g in job.groups if g.name == group), None) if job else None
        if g is None or g.disruption is None:
            continue
        desired = g.scaling.desired
        kept = sum(
            1
            for w, b in plan.bindings.items()
            if (b.job, b.group) == (job_id, group) and w not in placed and b.ordinal < desired
        )
        allowed = g.disruption.allowed(desired)
        assert desired - kept <= allowed, (
            f"{job_id}/{group}: {n} voluntary releases left {desired - kept} of {desired} "
            f"unavailable, budget {allowed}"
        )
    for wid in plan.drain_held:
        assert plan.bindings[wid].node in {b.node for b in plan.bindings.values()}


# -- drains -------------------------------------------------------------------------------
def test_a_drain_releases_a_budgeted_group_one_replica_per_pass() -> None:
    loop = Loop(nodes_of(4), {"web": group_job("web", 4, cpu=2000, budget=1)})
    loop.pass_()
    loop.run_all()
    busy = sorted({b.node for b in loop.bindings.values()})
    assert len(busy) == 2  # binpack: two per node
    loop.set_node(busy[0], NodeState.DRAINING)
    moved: list[list[str]] = []
    for _ in range(4):
        loop.now += 1
        plan = loop.pass_()
        moved.append(sorted(w for w, why in plan.released if why == "node draining"))
        loop.run_all()
        if plan.drain_held:
            assert plan.next_wake == loop.now  # its replacement is bound: go on at once
    assert [len(m) for m in moved] == [1, 1, 0, 0]
    assert loop.on(busy[0]) == []
    assert len(loop.bindings) == 4


def test_without_budgets_a_drain_releases_everything_at_once() -> None:
    loop = Loop(nodes_of(4), {"web": group_job("web", 4, cpu=2000, budget=1)})
    loop.options = OPTIONS.model_copy(update={"disruption_budgets": False})
    loop.pass_()
    node = loop.bindings["web/g/0"].node
    loop.set_node(node, NodeState.DRAINING)
    plan = loop.pass_()
    assert len([w for w, why in plan.released if why == "node draining"]) == 2
    assert not plan.drain_held


def test_a_group_without_a_budget_drains_at_once_beside_one_with_a_budget() -> None:
    jobs = {
        "web": group_job("web", 2, cpu=1000, budget=1),
        "batch": group_job("batch", 2, cpu=1000, budget=None),
    }
    loop = Loop(nodes_of(2), jobs)
    loop.pass_()
    [full] = sorted({b.node for b in loop.bindings.values()})
    loop.nodes["spare"] = Node(id="spare", cpu=4000, memory=8192)
    loop.set_node(full, NodeState.DRAINING)
    plan = loop.pass_()
    released = sorted(w for w, why in plan.released if why == "node draining")
    assert [w for w in released if w.startswith("batch/")] == ["batch/g/0", "batch/g/1"]
    assert len([w for w in released if w.startswith("web/")]) == 1
    assert len(plan.drain_held) == 1


def test_a_drain_waits_while_the_released_replica_has_nowhere_to_go() -> None:
    loop = Loop(nodes_of(1), {"web": group_job("web", 3, cpu=1000, budget=1)})
    loop.pass_()
    loop.set_node("n0", NodeState.DRAINING)
    plan = loop.pass_()
    assert len([w for w, why in plan.released if why == "node draining"]) == 1
    assert len(plan.drain_held) == 2 and len(plan.pending) == 1
    for _ in range(3):  # nothing changes: the budget is spent by the pending one
        loop.now += 5
        plan = loop.pass_()
        assert not plan.released and len(plan.drain_held) == 2
    loop.nodes["m"] = Node(id="m", cpu=4000, memory=8192)  # room: the drain goes on
    loop.now += 400
    seen = 0
    for _ in range(6):
        plan = loop.pass_()
        seen += len([w for w, why in plan.released if why == "node draining"])
        if plan.next_wake != loop.now and not plan.drain_held:
            break
    assert seen == 2 and loop.on("n0") == [] and len(loop.on("m")) == 3


def test_a_failed_replica_on_a_draining_node_is_released_whatever_the_budget() -> None:
    loop = Loop(nodes_of(1), {"web": group_job("web", 2, cpu=1000, budget=0)})
    loop.pass_()
    loop.set_node("n0", NodeState.DRAINING)
    loop.bindings["web/g/1"].status = AssignmentStatus.FAILED
    loop.carry = None  # a failed status is read from the store by a new run
    plan = loop.pass_()
    assert plan.released == [("web/g/1", "failed")]
    assert plan.drain_held == ["web/g/0"]  # budget 0: a drain never takes it


def test_a_percentage_budget_rounds_up() -> None:
    loop = Loop(nodes_of(3), {"web": group_job("web", 4, cpu=1000, budget="30%")})
    loop.pass_()
    loop.set_node("n0", NodeState.DRAINING)  # binpack: all four on n0
    assert len(loop.on("n0")) == 4
    plan = loop.pass_()
    assert len([w for w, why in plan.released if why == "node draining"]) == 2  # ceil(1.2)


# -- rolling updates and preemption share the budget -----------------------------------
def test_a_rollout_wave_is_cut_to_the_budget_and_waits_for_a_drain() -> None:
    loop = Loop(nodes_of(4), {"web": group_job("web", 4, cpu=1000, budget=1, max_parallel=3)})
    loop.pass_()
    loop.run_all()
    loop.now = 10
    loop.jobs["web"] = group_job("web", 4, cpu=1000, budget=1, max_parallel=3, env="2")
    plan = loop.pass_()
    assert len([w for w, why in plan.released if why == "rollout"]) == 1  # not 3
    loop.run_all()
    # a drain and the rollout at once: the drain takes the budget, the wave waits
    loop.jobs["web"] = group_job("web", 4, cpu=1000, budget=1, max_parallel=3, env="3")
    node = next(b.node for w, b in sorted(loop.bindings.items()))
    loop.set_node(node, NodeState.DRAINING)
    loop.now = 20
    plan = loop.pass_()
    reasons = sorted(why for _, why in plan.released)
    assert reasons == ["node draining"]
    assert plan.rollouts is not None and plan.rollouts.steps["web/g"].waiting


def test_a_budget_of_zero_holds_a_rollout_and_says_why() -> None:
    loop = Loop(nodes_of(2), {"web": group_job("web", 2, budget=0, max_parallel=2)})
    loop.pass_()
    loop.run_all()
    loop.now = 10
    loop.jobs["web"] = group_job("web", 2, budget=0, max_parallel=2, env="2")
    plan = loop.pass_()
    assert not plan.released
    assert plan.rollouts is not None and plan.rollouts.steps["web/g"].waiting == BUDGET_WAIT


def test_preemption_counts_a_drain_of_the_same_pass() -> None:
    jobs = {"batch": group_job("batch", 4, cpu=2000, budget=1, priority=10)}
    loop = Loop(nodes_of(2), jobs)
    loop.pass_()
    loop.nodes["n2"] = Node(id="n2", cpu=2000, memory=8192)  # room for one
    loop.set_node("n0", NodeState.DRAINING)
    loop.jobs["urgent"] = group_job("urgent", 1, cpu=4000, budget=None, priority=90)
    plan = loop.pass_()
    assert len([w for w, why in plan.released if why == "node draining"]) == 1
    assert not plan.preemptions  # the drain spent batch's budget of 1
    assert "urgent/g/0" in plan.pending


def test_preemption_takes_a_budget_of_two_in_one_pass_with_a_carry_too() -> None:
    """Without a shared ledger a carried pass counted each eviction twice."""
    jobs = {"batch": group_job("batch", 4, cpu=2000, budget=2, priority=10)}
    loop = Loop(nodes_of(2), jobs)
    loop.pass_()
    loop.pass_()  # the carry is the workflow's from here
    loop.jobs["urgent"] = group_job("urgent", 2, cpu=2000, budget=None, priority=90)
    plan = loop.pass_()
    assert sum(len(p.victims) for p in plan.preemptions) == 2


# -- the property -------------------------------------------------------------------------
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("drain"), st.integers(0, 5)),
        st.tuples(st.just("lose"), st.integers(0, 5)),
        st.tuples(st.just("ready"), st.integers(0, 5)),
        st.tuples(st.just("roll"), st.integers(0, 2)),
        st.tuples(st.just("urgent"), st.integers(1, 3)),
        st.tuples(st.just("add"), st.just(0)),
        st.tuples(st.just("run"), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    budgets=st.lists(
        st.one_of(st.none(), st.integers(0, 3), st.sampled_from(["25%", "50%"])),
        min_size=3,
        max_size=3,
    ),
    sizes=st.lists(st.integers(1, 6), min_size=3, max_size=3),
    parallel=st.integers(1, 4),
    events=EVENTS,
)
def test_drains_rollouts_and_preemption_never_exceed_a_budget_together(
    budgets: list[int | str | None], sizes: list[int], parallel: int, events: list[Any]
) -> None:
    """Random drains, node losses and returns, rollouts, high-priority arrivals:
    every pass (carried and not, compared) keeps each budgeted group within its
    allowance when it disrupts voluntarily (check_budgets), and capacity holds."""
    jobs = {
        f"j{i}": group_job(
            f"j{i}", n, cpu=1000, budget=b, priority=10 + 10 * i, max_parallel=parallel
        )
        for i, (b, n) in enumerate(zip(budgets, sizes, strict=True))
    }
    loop = Loop(nodes_of(6), jobs)
    loop.pass_()
    loop.run_all()
    version = 1
    for kind, arg in events:
        ids = sorted(loop.nodes)
        if kind in ("drain", "lose", "ready"):
            state = {"drain": NodeState.DRAINING, "lose": NodeState.LOST}.get(kind, NodeState.READY)
            loop.set_node(ids[arg % len(ids)], state)
        elif kind == "roll":
            version += 1
            old = loop.jobs[f"j{arg}"]
            g = old.groups[0]
            b = g.disruption.max_unavailable if g.disruption else None
            loop.jobs[old.id] = group_job(
                old.id,
                g.scaling.desired,
                cpu=1000,
                budget=b,
                priority=old.priority,
                env=str(version),
                max_parallel=parallel,
            )
        elif kind == "urgent":
            loop.jobs[f"u{len(loop.jobs)}"] = group_job(
                f"u{len(loop.jobs)}", arg, cpu=2000, budget=None, priority=95
            )
        elif kind == "add":
            loop.nodes[f"x{len(loop.nodes)}"] = Node(
                id=f"x{len(loop.nodes)}", cpu=4000, memory=8192
            )
        else:
            loop.run_all()
        loop.now += 7
        for _ in range(3):
            plan = loop.pass_()
            for node_id, n in loop.nodes.items():
                used = sum(b.cpu for b in plan.bindings.values() if b.node == node_id)
                assert used <= n.cpu
            if plan.next_wake != loop.now:
                break
