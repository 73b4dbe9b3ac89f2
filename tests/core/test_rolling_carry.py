"""A carried pass looks only at the groups that can roll (forge.core.reconcile:
``only``): it must decide exactly what a pass over every group decides.

Two loops run side by side on the same events: one hands each pass the previous
pass's carry (as the workflow does), the other starts every pass from scratch.
Events change a group's spec (a new version), scale it, report replicas running or
failed, promote, let time pass, and restart the carried loop from a carry loaded
binding by binding (a new run). The run starts from bindings made before versions
existed (version ""), with few stamps per pass, so stamping across passes is covered.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.core import rolling
from forge.core.models import AssignmentStatus, Job, Node
from forge.core.placement import Binding
from forge.core.reconcile import (
    Carry,
    FailureHistory,
    PendingEntry,
    Plan,
    ReconcileOptions,
    reconcile,
)
from forge.core.rolling import GroupRollout

NODES = {f"n{i}": Node(id=f"n{i}", cpu=8000, memory=16384) for i in range(4)}
JOBS = 4


def _job(i: int, env: str, cpu: int, desired: int, canary: int) -> Job:
    return Job.model_validate(
        {
            "name": f"j{i}",
            "groups": [
                {
                    "name": "g",
                    "scaling": {"max": 8, "desired": desired},
                    "update": {
                        "max_parallel": 1 + i % 2,
                        "min_healthy_time": 2.0,
                        "healthy_deadline": 30.0,
                        "canary": min(canary, desired),
                        "auto_revert": i % 2 == 0,
                    },
                    "tasks": [
                        {"name": "t", "env": {"V": env}, "resources": {"cpu": cpu, "memory": 64}}
                    ],
                }
            ],
        }
    )


@dataclass
class Loop:
    """The workflow's part of one loop: what it keeps between passes."""

    bindings: dict[str, Binding]
    carried: bool
    carry: Carry | None = None
    pending: dict[str, PendingEntry] = field(default_factory=dict)
    failures: dict[str, FailureHistory] = field(default_factory=dict)
    rollouts: dict[str, GroupRollout] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)

    def pass_(
        self, jobs: dict[str, Job], now: float, failed: list[str], promoted: dict[str, None]
    ) -> Plan:
        plan = reconcile(
            jobs=jobs,
            nodes=NODES,
            bindings=self.bindings,
            pending=self.pending,
            failures=self.failures,
            failed=failed,
            now=now,
            options=ReconcileOptions(rollouts=True),
            carry=self.carry if self.carried else None,
            rollouts=self.rollouts,
            since=self.since,
            promoted=promoted,
        )
        self.bindings, self.pending, self.failures = plan.bindings, plan.pending, plan.failures
        self.carry = plan.carry
        assert plan.rollouts is not None
        self.rollouts = plan.rollouts.rollouts
        for b in plan.placed:
            self.since[b.workload_id] = now
        return plan

    def restart(self, jobs: dict[str, Job]) -> None:
        """A new run: the carry loaded binding by binding, as the workflow loads it."""
        self.carry = Carry.start(jobs, NODES, rolling=True)
        for wid, b in self.bindings.items():
            self.carry.absorb(wid, b)

    def report(self, wid: str, status: AssignmentStatus, now: float) -> None:
        b = self.bindings.get(wid)
        if b is not None and b.status is not status:
            b.status = status
            self.since[wid] = now


def _decided(plan: Plan) -> tuple[Any, ...]:
    def b(x: Binding) -> tuple[Any, ...]:
        return (x.workload_id, x.node, x.cpu, x.version, x.status)

    assert plan.rollouts is not None
    r = plan.rollouts
    return (
        sorted(b(x) for x in plan.bindings.values()),
        [b(x) for x in plan.placed],
        plan.released,
        sorted(plan.pending.items()),
        plan.next_wake,
        r.stop,
        sorted(r.rollouts.items()),
        sorted(r.revert.items()),
        r.stamped,
        sorted((k, s.phase, s.waiting) for k, s in r.steps.items()),
    )


event = st.one_of(
    st.tuples(st.just("change"), st.integers(0, JOBS - 1), st.sampled_from("abc")),
    st.tuples(st.just("resize"), st.integers(0, JOBS - 1), st.sampled_from([250, 500, 750])),
    st.tuples(st.just("scale"), st.integers(0, JOBS - 1), st.integers(0, 6)),
    st.tuples(st.just("run"), st.integers(0, 40)),
    st.tuples(st.just("fail"), st.integers(0, 40)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 2.5, 40.0])),
    st.tuples(st.just("promote"), st.integers(0, JOBS - 1)),
    st.tuples(st.just("restart")),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    desired=st.lists(st.integers(0, 6), min_size=JOBS, max_size=JOBS),
    canary=st.lists(st.integers(0, 2), min_size=JOBS, max_size=JOBS),
    events=st.lists(event, max_size=25),
)
def test_a_carried_pass_rolls_exactly_as_a_pass_over_every_group(
    desired: list[int], canary: list[int], events: list[tuple[Any, ...]]
) -> None:
    spec = {i: ("a", 500, desired[i], canary[i]) for i in range(JOBS)}
    jobs = {f"j{i}": _job(i, *spec[i]) for i in range(JOBS)}
    # bindings made before versions existed: placed without rollouts (version "")
    start = reconcile(
        jobs=jobs, nodes=NODES, bindings={}, pending={}, failures={}, now=0.0,
        options=ReconcileOptions(),
    )  # fmt: skip
    full = Loop(copy.deepcopy(start.bindings), carried=False)
    carried = Loop(copy.deepcopy(start.bindings), carried=True)
    carried.restart(jobs)
    now = 1.0
    with mock.patch.object(rolling, "MAX_STAMPS", 3):  # stamping spans passes
        for ev in [("advance", 0.5), *events]:
            failed: list[str] = []
            promoted: dict[str, None] = {}
            kind = ev[0]
            if kind in ("change", "resize", "scale"):
                env, cpu, n, c = spec[ev[1]]
                env, cpu, n = {"change": (ev[2], cpu, n), "resize": (env, ev[2], n)}.get(
                    kind, (env, cpu, ev[2])
                )
                spec[ev[1]] = (env, cpu, n, c)
                jobs = {**jobs, f"j{ev[1]}": _job(ev[1], env, cpu, n, c)}
            elif kind in ("run", "fail"):
                wids = sorted(full.bindings)
                if wids:
                    wid = wids[ev[1] % len(wids)]
                    status = AssignmentStatus.RUNNING if kind == "run" else AssignmentStatus.FAILED
                    if kind == "run":  # everything pending up to it starts running
                        for w in wids[: ev[1] % len(wids) + 1]:
                            for loop in (full, carried):
                                loop.report(w, status, now)
                    else:
                        for loop in (full, carried):
                            loop.report(wid, status, now)
                        failed.append(wid)
            elif kind == "advance":
                now += ev[1]
            elif kind == "promote":
                promoted[f"j{ev[1]}/g"] = None
            elif kind == "restart":
                carried.restart(jobs)
            a = full.pass_(jobs, now, failed, promoted)
            b = carried.pass_(jobs, now, failed, promoted)
            assert _decided(b) == _decided(a), f"after {ev}: a carried pass rolled differently"
            now += 0.1


def test_a_steady_carried_pass_looks_at_no_group_that_cannot_roll() -> None:
    """The bound the property above does not see: with nothing changed, a carried
    pass looks at the rolling groups only, not at the 2,000 others (a pass over
    every group once made the loop's activations grow with the cluster)."""
    nodes = {f"n{i}": Node(id=f"n{i}", cpu=64_000, memory=262_144) for i in range(40)}
    jobs = {f"j{i}": _job(i, "a", 250, 1, 0) for i in range(2000)}
    loop = Loop({}, carried=True)
    options = ReconcileOptions(rollouts=True)

    def run(jobs: dict[str, Job]) -> None:
        plan = reconcile(
            jobs=jobs, nodes=nodes, bindings=loop.bindings, pending={}, failures={},
            now=1.0, options=options, carry=loop.carry, rollouts=loop.rollouts,
        )  # fmt: skip
        loop.bindings, loop.carry = plan.bindings, plan.carry
        assert plan.rollouts is not None
        loop.rollouts = plan.rollouts.rollouts

    run(jobs)
    assert len(loop.bindings) == 2000
    looked: list[str] = []
    real = rolling._health

    def counting(b: Binding, *args: Any) -> Any:
        looked.append(b.workload_id)
        return real(b, *args)

    with mock.patch.object(rolling, "_health", counting):
        run(jobs)  # nothing changed
        assert looked == []
        jobs = {**jobs, "j7": _job(7, "b", 250, 1, 0)}  # one spec changed: one group
        run(jobs)
        assert looked == ["j7/g/0"]
        assert list(loop.rollouts) == ["j7/g"]
        looked.clear()
        run(jobs)  # the rollout goes on: its group only
        assert set(looked) == {"j7/g/0"}
