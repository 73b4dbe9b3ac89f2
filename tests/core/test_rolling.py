"""Rolling updates through reconcile: a changed spec replaces replicas in waves."""

from __future__ import annotations

from typing import Any

from forge.core.models import AssignmentStatus, Job, Node
from forge.core.placement import Binding
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from forge.core.rolling import GroupRollout

ROLLING = ReconcileOptions(rollouts=True)
NODES = {f"n{i}": Node(id=f"n{i}", cpu=4000, memory=8192) for i in range(3)}


def web(env: str = "1", cpu: int = 500, **update: Any) -> Job:
    return Job.model_validate(
        {
            "name": "web",
            "groups": [
                {
                    "name": "api",
                    "scaling": {"max": 10, "desired": 6},
                    "update": {"min_healthy_time": 5.0, "healthy_deadline": 60.0, **update},
                    "tasks": [
                        {"name": "t", "env": {"V": env}, "resources": {"cpu": cpu, "memory": 64}}
                    ],
                }
            ],
        }
    )


class Sim:
    """The loop's part: bindings, rollouts, since; agents report running at once."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.bindings: dict[str, Binding] = {}
        self.rollouts: dict[str, GroupRollout] = {}
        self.since: dict[str, float] = {}
        self.now = 0.0

    def pass_(self, **kw: Any) -> Plan:
        plan = reconcile(
            jobs={"web": self.job},
            nodes=NODES,
            bindings=self.bindings,
            pending={},
            failures={},
            now=self.now,
            options=ROLLING,
            rollouts=self.rollouts,
            since=self.since,
            **kw,
        )
        self.bindings = plan.bindings
        assert plan.rollouts is not None
        self.rollouts = plan.rollouts.rollouts
        for b in plan.placed:
            self.since[b.workload_id] = self.now
        return plan

    def run_all(self) -> None:
        for b in self.bindings.values():
            if b.status is AssignmentStatus.PENDING:
                b.status = AssignmentStatus.RUNNING
                self.since[b.workload_id] = self.now

    def versions(self) -> list[str]:
        return [self.bindings[f"web/api/{i}"].version for i in range(6)]


def test_a_changed_env_replaces_replicas_in_waves_of_max_parallel() -> None:
    sim = Sim(web(max_parallel=2))
    sim.pass_()
    sim.run_all()
    old = sim.job.groups[0].version
    assert sim.versions() == [old] * 6
    sim.now = 100.0
    sim.pass_()  # settles the first placements' health clock
    sim.job = web(env="2", max_parallel=2)
    new = sim.job.groups[0].version
    waves = []
    for _ in range(30):
        plan = sim.pass_()
        stopped = sorted(w for w, why in plan.released if why == "rollout")
        if stopped:
            waves.append(stopped)
        healthy = sum(b.status is AssignmentStatus.RUNNING for b in sim.bindings.values())
        assert healthy >= 6 - 2
        sim.run_all()  # the agents' reports: they wake the loop (a pass at once)
        if not sim.rollouts:
            break
        if not stopped:  # nothing new to report: the loop sleeps until its wake time
            assert plan.next_wake is not None
            sim.now = plan.next_wake
    assert sim.versions() == [new] * 6
    assert waves == [
        ["web/api/4", "web/api/5"],
        ["web/api/2", "web/api/3"],
        ["web/api/0", "web/api/1"],
    ]


def test_a_resource_change_rolls_instead_of_releasing_every_replica() -> None:
    sim = Sim(web())
    sim.pass_()
    sim.run_all()
    sim.now = 100.0
    sim.job = web(cpu=600)
    plan = sim.pass_()
    assert sorted(why for _, why in plan.released) == ["rollout"]
    assert len(sim.bindings) == 6


def test_a_new_replica_that_fails_stops_the_rollout_after_its_first_wave() -> None:
    sim = Sim(web())
    sim.pass_()
    sim.run_all()
    sim.now = 100.0
    sim.job = web(env="bad")
    plan = sim.pass_()
    (stopped,) = [w for w, why in plan.released if why == "rollout"]
    sim.now = 101.0
    plan = sim.pass_(failed=[stopped])
    assert sim.rollouts["web/api"].failed
    for _ in range(3):
        sim.now += 100
        plan = sim.pass_()
        assert not [w for w, why in plan.released if why == "rollout"]
    old = web().groups[0].version
    assert sorted(sim.versions()).count(old) == 5


def test_auto_revert_asks_for_the_last_healthy_version() -> None:
    sim = Sim(web(auto_revert=True))
    sim.pass_()
    sim.run_all()
    sim.now = 100.0
    sim.job = web(env="bad", auto_revert=True)
    plan = sim.pass_()
    (stopped,) = [w for w, why in plan.released if why == "rollout"]
    sim.now = 101.0
    plan = sim.pass_(failed=[stopped])
    assert plan.rollouts is not None
    assert plan.rollouts.revert == {"web/api": web().groups[0].version}


def test_a_canary_waits_for_promotion() -> None:
    sim = Sim(web(canary=1))
    sim.pass_()
    sim.run_all()
    sim.now = 100.0
    sim.job = web(env="2", canary=1)
    sim.pass_()
    sim.run_all()
    sim.now = 200.0
    plan = sim.pass_()
    assert plan.rollouts is not None
    assert plan.rollouts.steps["web/api"].phase == "awaiting-promotion"
    assert not [w for w, why in plan.released if why == "rollout"]
    plan = sim.pass_(promoted={"web/api": None})
    assert [w for w, why in plan.released if why == "rollout"]
