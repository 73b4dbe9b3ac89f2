"""Rolling updates through reconcile: a changed spec replaces replicas in waves."""

from __future__ import annotations

from typing import Any

from forge.core.models import AssignmentStatus, Job, Node
from forge.core.placement import Binding
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from forge.core.rolling import GroupRollout, _health
from forge.core.rollout import Health

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

    def __init__(self, job: Job, options: ReconcileOptions = ROLLING) -> None:
        self.job = job
        self.options = options
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
            options=self.options,
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


def unchecked(env: str) -> Job:
    """The reported group: no health check, one at a time, 2 s healthy, auto_revert."""
    return web(env, max_parallel=1, min_healthy_time=2.0, auto_revert=True)


def _v2_last_wave_running(sim: Sim) -> None:
    """v1 settled, then v2 rolled until its last replica runs (all six answer "2")
    but has not yet run min_healthy_time."""
    sim.pass_()
    sim.run_all()
    sim.now = 100.0
    sim.pass_()
    sim.job = unchecked("2")
    v2 = sim.job.groups[0].version
    for _ in range(60):
        plan = sim.pass_()
        stopped = [w for w, why in plan.released if why == "rollout"]
        sim.run_all()
        if sim.versions() == [v2] * 6 and not stopped:
            break
        if not stopped:
            assert plan.next_wake is not None
            sim.now = plan.next_wake
    assert sim.versions() == [v2] * 6
    assert all(b.status is AssignmentStatus.RUNNING for b in sim.bindings.values())
    assert "web/api" in sim.rollouts  # the last replica's health clock still runs


def _rollout_stops(plan: Plan) -> list[str]:
    return [w for w, why in plan.released if why == "rollout"]


def test_a_revert_without_a_check_goes_to_the_version_whose_rollout_completed() -> None:
    # v1 -> v2 (six replicas running) -> v3 exits at once: auto_revert goes to v2,
    # though v3 came before v2's last replica had run min_healthy_time
    sim = Sim(unchecked("1"))
    _v2_last_wave_running(sim)
    sim.now += 0.5
    sim.job = unchecked("3")
    plan = sim.pass_()
    assert not _rollout_stops(plan)  # v2's last wave settles first
    step = plan.rollouts.steps["web/api"]  # type: ignore[union-attr]
    assert "waits for the last wave" in step.waiting
    assert plan.next_wake is not None and plan.next_wake <= sim.now + 1.5
    sim.now = plan.next_wake
    plan = sim.pass_()  # v2 completed: v3's first wave
    (bad,) = _rollout_stops(plan)
    assert sim.rollouts["web/api"].rollout.previous == unchecked("2").groups[0].version
    sim.now += 0.5
    plan = sim.pass_(failed=[bad])  # it exits 3
    assert plan.rollouts is not None
    assert plan.rollouts.revert == {"web/api": unchecked("2").groups[0].version}


def test_a_superseded_last_wave_that_fails_leaves_the_revert_target_before_it() -> None:
    sim = Sim(unchecked("1"))
    _v2_last_wave_running(sim)
    sim.now += 0.5
    sim.job = unchecked("3")
    assert not _rollout_stops(sim.pass_())  # waiting for v2's last wave
    last = min(sim.bindings.values(), key=lambda b: b.ordinal).workload_id
    sim.now += 0.5
    plan = sim.pass_(failed=[last])  # v2's last replica fails: v2 never completed
    assert sim.rollouts["web/api"].rollout.version == unchecked("3").groups[0].version
    assert sim.rollouts["web/api"].rollout.previous == unchecked("1").groups[0].version
    assert plan.rollouts is not None and not plan.rollouts.revert


def test_runs_recorded_before_superseded_wave_settles_revert_past_a_settling_version() -> None:
    sim = Sim(unchecked("1"), ReconcileOptions(rollouts=True, settle_superseded=False))
    _v2_last_wave_running(sim)
    sim.now += 0.5
    sim.job = unchecked("3")
    (bad,) = _rollout_stops(sim.pass_())  # the new spec takes over at once
    sim.now += 0.5
    plan = sim.pass_(failed=[bad])
    assert plan.rollouts is not None
    assert plan.rollouts.revert == {"web/api": unchecked("1").groups[0].version}


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


CHECKS = ReconcileOptions(rollouts=True, health_checks=True)


def checked(env: str = "1", **update: Any) -> Job:
    job = web(env, **update).model_dump(mode="json", exclude_defaults=True)
    job["groups"][0]["tasks"][0]["check"] = {"command": ["true"]}
    return Job.model_validate(job)


def test_health_a_running_replica_needs_its_check_to_have_passed() -> None:
    b = Binding("web", "api", 0, "n0", (), 500, 64, AssignmentStatus.RUNNING)
    since = {"web/api/0": 7.0}
    assert _health(b, since, "web/api/0") == (Health.HEALTHY, 7.0)  # no check / no entry
    assert _health(b, since, "web/api/0", True) == (Health.HEALTHY, 7.0)
    assert _health(b, since, "web/api/0", False) == (Health.STARTING, 7.0)
    pending = Binding("web", "api", 0, "n0", (), 500, 64, AssignmentStatus.PENDING)
    assert _health(pending, since, "web/api/0", True)[0] is Health.STARTING
    failed = Binding("web", "api", 0, "n0", (), 500, 64, AssignmentStatus.FAILED)
    assert _health(failed, since, "web/api/0", True)[0] is Health.UNHEALTHY


def _checked_pass(sim: Sim, health: dict[str, bool]) -> Plan:
    plan = reconcile(
        jobs={"web": sim.job},
        nodes=NODES,
        bindings=sim.bindings,
        pending={},
        failures={},
        now=sim.now,
        options=CHECKS,
        rollouts=sim.rollouts,
        since=sim.since,
        health=health,
    )
    sim.bindings = plan.bindings
    assert plan.rollouts is not None
    sim.rollouts = plan.rollouts.rollouts
    for b in plan.placed:
        sim.since[b.workload_id] = sim.now
        health[b.workload_id] = False  # as the loop records a placement
    return plan


def test_a_checked_group_waits_for_the_check_and_fails_past_the_deadline() -> None:
    sim = Sim(checked())
    health: dict[str, bool] = {}
    _checked_pass(sim, health)
    sim.run_all()
    health.clear()  # placed before the rollout: the loop kept no verdicts
    sim.now = 100.0
    sim.job = checked(env="2")
    plan = _checked_pass(sim, health)
    (first,) = [w for w, why in plan.released if why == "rollout"]
    sim.run_all()  # running, its check not yet passed
    sim.now = 150.0
    plan = _checked_pass(sim, health)
    assert not plan.released  # running is not enough: the wave waits
    assert "not yet healthy" in plan.rollouts.steps["web/api"].waiting  # type: ignore[union-attr]
    health[first] = True  # the agent says it passed (the loop's health clock starts)
    sim.since[first] = 150.0
    sim.now = 155.0  # min_healthy_time later: the next wave
    plan = _checked_pass(sim, health)
    (second,) = [w for w, why in plan.released if why == "rollout"]
    sim.run_all()  # running, but its check keeps failing
    assert health[second] is False
    sim.now = 155.0 + 60.0  # the deadline
    _checked_pass(sim, health)
    assert "not healthy within 60s" in sim.rollouts["web/api"].failed


def test_without_the_health_option_checks_are_not_counted() -> None:
    sim = Sim(checked())
    sim.pass_()
    sim.run_all()
    sim.now = 100.0
    sim.job = checked(env="2")
    sim.pass_()
    sim.run_all()
    sim.now = 105.0  # min_healthy_time: running counts, the next wave goes
    plan = sim.pass_()
    assert [why for _, why in plan.released] == ["rollout"]
