"""Rolling updates in the loop, on the time-skipping server: waves wait on durable
timers, and a wave whose replicas never become healthy fails at its deadline."""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient, ForgeError
from forge.core.models import HealthCheck, Job
from forge.errors import NotFound
from forge.stores import Store, TaskReport
from tests.workflow.harness import cluster, default_options, job, node

UPDATE = {"max_parallel": 1, "min_healthy_time": 10.0, "healthy_deadline": 60.0}


def web(env: str) -> Job:
    j = job("web", replicas=3, cpu=500, memory=256, update=UPDATE)
    g = j.groups[0]
    task = g.tasks[0].model_copy(update={"env": {"V": env}})
    return j.model_copy(update={"groups": (g.model_copy(update={"tasks": (task,)}),)})


def versions(store: Store, fc: ForgeClient) -> list[str]:
    return [a.version for a in store.assignments(fc.cluster)]


async def details(fc: ForgeClient) -> str:
    meta = await fc.handle().query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


async def details_once(
    fc: ForgeClient, text: str, timeout: float = 20.0, *, absent: bool = False
) -> str:
    """The details once they say ``text``: the timer has fired by the time the
    environment's sleep returns, but the pass it wakes may still be running."""
    deadline = time.monotonic() + timeout
    while True:
        got = await details(fc)
        if (text in got) != absent:
            return got
        if time.monotonic() > deadline:
            never = "stopped saying" if absent else "said"
            raise AssertionError(f"details never {never} {text!r}; last: {got}")
        await asyncio.sleep(0.05)  # poll interval, not synchronisation


async def test_a_wave_without_healthy_replicas_fails_at_its_deadline_on_a_timer(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000)])
        old, new = web("1"), web("2")
        await fc.submit_job(old)
        assert versions(store, fc) == [old.groups[0].version] * 3
        await fc.submit_job(new)
        # the first wave: one replica (the highest ordinal) replaced, the others wait
        assert versions(store, fc) == [old.groups[0].version] * 2 + [new.groups[0].version]
        assert "to version " + new.groups[0].version in await details(fc)
        assert "failed" not in await details(fc)
        # nobody reports it running: its deadline timer fires and fails the rollout
        await skipping_env.sleep(61)
        await details_once(fc, "failed: replica 2")
        await skipping_env.sleep(600)
        assert versions(store, fc) == [old.groups[0].version] * 2 + [new.groups[0].version]
        assert [v.number for v in store.group_versions(fc.cluster, "web")] == [1, 2]


def canary_web(env: str) -> Job:
    j = web(env)
    g = j.groups[0]
    assert g.update is not None
    policy = g.update.model_copy(
        update={"canary": 1, "healthy_deadline": 600.0, "min_healthy_time": 1.0}
    )
    return j.model_copy(update={"groups": (g.model_copy(update={"update": policy}),)})


async def versions_once(
    store: Store, fc: ForgeClient, want: list[str], timeout: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout
    while versions(store, fc) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"versions never became {want}; last {versions(store, fc)}")
        await asyncio.sleep(0.05)  # poll interval, not synchronisation


async def test_a_canary_waits_for_promote_then_the_rest_rolls(
    skipping_env: WorkflowEnvironment,
) -> None:
    # The store watch brings the task reports (running) to the loop. While an
    # activity runs the test server does not skip time: the health clock (1 s)
    # runs in real time, and the test polls for its effects.
    options = default_options(watch=True, watch_poll=0.05, heartbeat_ttl=10_000_000.0)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000)])
        old, new = canary_web("1"), canary_web("2")
        v1, v2 = old.groups[0].version, new.groups[0].version
        await fc.submit_job(old)
        report(store, fc, [0, 1, 2], "running")
        # nothing waits for a promotion yet: refused, naming the job
        with pytest.raises(ForgeError, match="no rollout of job 'web' waits"):
            await fc.promote("web")
        with pytest.raises(ForgeError, match="has no group 'nope'"):
            await fc.promote("web", "nope")
        with pytest.raises(NotFound, match="unknown job 'nope'"):
            await fc.promote("nope")
        await fc.submit_job(new)
        await versions_once(store, fc, [v1, v1, v2])  # the canary: the highest ordinal
        report(store, fc, [2], "running")
        text = await details_once(fc, "waiting for `forge job promote`")
        assert "canary of 1 healthy" in text
        doc = await fc.published()
        assert doc is not None and [r.phase for r in doc.rollouts] == ["awaiting-promotion"]
        assert doc.rollouts[0].version == v2 and doc.rollouts[0].previous == v1
        # a later pass (a node registers) keeps the hold
        passes = (await fc.summary()).passes
        await fc.register_nodes([node("n2", cpu=100)])
        deadline = time.monotonic() + 20
        while True:
            if (await fc.summary()).passes > passes:
                break
            assert time.monotonic() < deadline, "no pass after the node registered"
            await asyncio.sleep(0.05)  # poll interval, not synchronisation
        assert versions(store, fc) == [v1, v1, v2]
        assert "waiting for `forge job promote`" in await details(fc)
        assert await fc.promote("web", "main") == ["web/main"]
        # the rest rolls, one at a time, each once the previous is healthy
        await versions_once(store, fc, [v1, v2, v2])
        report(store, fc, [1], "running")
        await versions_once(store, fc, [v2, v2, v2])
        report(store, fc, [0], "running")
        await details_once(fc, "Rollouts:", absent=True)
        with pytest.raises(ForgeError, match="no rollout of web/main waits"):
            await fc.promote("web", "main")


def reverting_web(env: str) -> Job:
    j = web(env)
    g = j.groups[0]
    assert g.update is not None
    policy = g.update.model_copy(
        update={"auto_revert": True, "healthy_deadline": 60.0, "min_healthy_time": 1.0}
    )
    return j.model_copy(update={"groups": (g.model_copy(update={"update": policy}),)})


def report(store: Store, fc: ForgeClient, ordinals: list[int], status: str) -> None:
    store.report(
        fc.cluster,
        [
            TaskReport(workload_id=f"web/main/{o}", status=status, at=time.time(), node="n1")
            for o in ordinals
        ],
    )


async def test_a_failed_rollout_with_auto_revert_goes_back_to_the_previous_spec(
    skipping_env: WorkflowEnvironment,
) -> None:
    options = default_options(watch=True, watch_poll=0.05, heartbeat_ttl=10_000_000.0)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000)])
        old, new = reverting_web("1"), reverting_web("2")
        v1, v2 = old.groups[0].version, new.groups[0].version
        await fc.submit_job(old)
        report(store, fc, [0, 1, 2], "running")
        await fc.submit_job(new)
        await versions_once(store, fc, [v1, v1, v2])
        report(store, fc, [2], "failed")  # the new version's first replica crashes
        # the loop submits the previous spec (a new version number, the old digest)
        await versions_once(store, fc, [v1, v1, v1])
        got = store.get_job(fc.cluster, "web")
        assert got is not None and got.groups[0].version == v1
        assert got.groups[0].update == old.groups[0].update  # policies stay
        assert [v.version for v in store.group_versions(fc.cluster, "web")] == [v1, v2, v1]
        report(store, fc, [2], "running")
        await details_once(fc, "Rollouts:", absent=True)


async def test_revert_submits_an_earlier_version_from_the_store(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000)])
        old, new = web("1"), web("2")
        await fc.submit_job(old)
        await fc.submit_job(new)
        with pytest.raises(NotFound, match="has no version '9'"):
            await fc.revert("web", "9")
        with pytest.raises(NotFound, match="no group 'x'"):
            await fc.revert("web", "v1", "x")
        with pytest.raises(NotFound, match="unknown job 'nope'"):
            await fc.revert("nope", "1")
        await fc.revert("web", "v1")
        got = store.get_job(fc.cluster, "web")
        assert got is not None and got.groups[0].version == old.groups[0].version
        await fc.revert("web", new.groups[0].version)  # by digest
        got = store.get_job(fc.cluster, "web")
        assert got is not None and got.groups[0].version == new.groups[0].version
        assert [v.number for v in store.group_versions(fc.cluster, "web")] == [1, 2, 3, 4]


def checked_web(env: str) -> Job:
    j = web(env)
    g = j.groups[0]
    assert g.update is not None
    policy = g.update.model_copy(update={"healthy_deadline": 3.0, "min_healthy_time": 0.5})
    task = g.tasks[0].model_copy(update={"check": HealthCheck(command=("true",))})
    group = g.model_copy(update={"update": policy, "tasks": (task,)})
    return j.model_copy(update={"groups": (group,)})


def report_health(store: Store, fc: ForgeClient, ordinal: int, healthy: bool | None) -> None:
    wid = f"web/main/{ordinal}"
    store.report(
        fc.cluster,
        [TaskReport(workload_id=wid, status="running", at=time.time(), node="n1", healthy=healthy)],
    )


async def test_a_checked_group_rolls_on_passed_checks_and_fails_on_a_failing_one(
    skipping_env: WorkflowEnvironment,
) -> None:
    # Real time (the watch activity runs): a short deadline and health clock.
    options = default_options(watch=True, watch_poll=0.05, heartbeat_ttl=10_000_000.0)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000)])
        old, new = checked_web("1"), checked_web("2")
        v1, v2 = old.groups[0].version, new.groups[0].version
        await fc.submit_job(old)
        report(store, fc, [0, 1, 2], "running")
        await fc.submit_job(new)
        await versions_once(store, fc, [v1, v1, v2])
        report_health(store, fc, 2, None)  # running, its check not yet passed
        report_health(store, fc, 2, True)  # passed: the next wave
        await versions_once(store, fc, [v1, v2, v2])
        # running, but its check fails: starting, then unhealthy at its deadline,
        # though without checks it would have counted healthy after 0.5 s
        report_health(store, fc, 1, None)
        report_health(store, fc, 1, False)
        await details_once(fc, "failed: replica 1")
        assert versions(store, fc) == [v1, v2, v2]
