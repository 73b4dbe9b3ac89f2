"""A failed batch job's end, at the edges the loop has (found in review): the pass
that fails it may be its run's last (continue-as-new before the stop), a changed
spec may come through a full reload, the job's id may come back as a service. The
runs are stopped and never placed again whatever falls between; a change starts it
over. Each history replays."""

from __future__ import annotations

import time

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge.client import reads
from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.wire.codec import data_converter
from tests.workflow.harness import cluster, default_options, job, node
from tests.workflow.test_batch_loop import batch, bound, ended, until
from workflows.cluster import ClusterWorkflow

NEVER = {"attempts": 0, "interval": 3600.0, "delay": 0.0}


async def _replays(fc: object) -> None:
    history = await fc.handle().fetch_history()  # type: ignore[attr-defined]
    replayed = await Replayer(
        workflows=[ClusterWorkflow], data_converter=data_converter()
    ).replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


@pytest.mark.parametrize("limit", [2, 3, 4])
async def test_the_stop_outlives_a_continue_as_new_right_after_the_failure(
    skipping_env: WorkflowEnvironment, limit: int
) -> None:
    """``limit`` passes a run: the failing pass falls on a run's last pass for one of
    them, and the pass that stops the rest is then the next run's."""
    options = default_options(
        watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0, max_passes_per_run=limit
    )
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=3000, memory=8192)])
        await fc.submit_job(batch("e", 3, reschedule=NEVER))
        three = ["e/main/0", "e/main/1", "e/main/2"]
        await until("three bound", lambda: bound(store, fc, "e") == three)
        store.report(fc.cluster, [ended("e/main/1", "failed", message="boom", code=1)])
        await until("the others stopped", lambda: bound(store, fc, "e") == [])
        await fc.register_nodes([node("n2", cpu=3000, memory=8192)])  # later passes
        await fc.submit_job(batch("poke", 1))
        await until("a later pass ran", lambda: bound(store, fc, "poke") == ["poke/main/0"])
        assert bound(store, fc, "e") == []
        assert (reads.batch_state(store, fc.cluster, "e") or ("",))[0] == "failed"


async def test_a_changed_spec_found_by_a_full_reload_tries_the_job_again(
    skipping_env: WorkflowEnvironment,
) -> None:
    """A resync every pass: every job change arrives by a full reload of the jobs."""
    options = default_options(
        watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0, resync_seconds=0.001
    )
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=3000, memory=8192)])
        await fc.submit_job(batch("e", 2, reschedule=NEVER))
        await until("bound", lambda: bound(store, fc, "e") == ["e/main/0", "e/main/1"])
        store.report(fc.cluster, [ended("e/main/1", "failed", message="boom", code=1)])
        await until("stopped", lambda: bound(store, fc, "e") == [])
        await fc.submit_job(batch("e", 2, reschedule={**NEVER, "attempts": 1}))
        await until("tried again", lambda: bound(store, fc, "e") == ["e/main/0", "e/main/1"])
        assert (reads.batch_state(store, fc.cluster, "e") or ("",))[0] == "running"


async def test_the_id_of_a_failed_job_back_as_a_service_runs(
    skipping_env: WorkflowEnvironment,
) -> None:
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=3000, memory=8192)])
        await fc.submit_job(batch("e", 2, reschedule=NEVER))
        await until("bound", lambda: bound(store, fc, "e") == ["e/main/0", "e/main/1"])
        store.report(fc.cluster, [ended("e/main/1", "failed", message="boom", code=1)])
        await until("stopped", lambda: bound(store, fc, "e") == [])
        await fc.submit_job(job("e", 2, 1000, 1024))  # the same id, now a service
        await until("the service runs", lambda: bound(store, fc, "e") == ["e/main/0", "e/main/1"])
        await _replays(fc)


@pytest.mark.parametrize("limit", [3, 1000])
async def test_max_failed_runs_fail_alone_and_the_job_completes_without_them(
    skipping_env: WorkflowEnvironment, limit: int
) -> None:
    """A group's ``scaling.max_failed`` tolerates that many runs out of attempts (a
    Kubernetes Job's failed index): each is never placed again, through a
    continue-as-new too (``limit`` 3), the others go on and the job completes
    without them; one more failure fails the job. Store and query agree."""
    options = default_options(
        watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0, max_passes_per_run=limit
    )
    spec = batch("m", 4, reschedule=NEVER).model_dump(mode="json")
    spec["groups"][0]["scaling"]["max_failed"] = 1
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000, memory=8192)])
        await fc.submit_job(Job.model_validate(spec))
        runs = [f"m/main/{i}" for i in range(4)]
        await until("all bound", lambda: bound(store, fc, "m") == runs)
        store.report(fc.cluster, [ended("m/main/0", "failed", message="boom", code=1)])
        await until("the failed run released", lambda: bound(store, fc, "m") == runs[1:])
        store.report(fc.cluster, [ended("m/main/1", "exited", code=0)])
        await until("a pass after", lambda: bound(store, fc, "m") == runs[2:])
        state = reads.job_state(store, fc.cluster, "m")
        assert state is not None and state.state == "running"  # not failed: tolerated
        assert "1/4 runs complete, 1 failed within scaling.max_failed" in state.what
        for i in range(5):  # passes of other jobs: the run failed alone is not placed again
            await fc.submit_job(job(f"p{i}", replicas=1, cpu=100, memory=64))
        assert bound(store, fc, "m") == runs[2:]
        explained = await fc.explain("m/main/0")
        assert any("1 of scaling.max_failed 1: not run again" in r for r in explained.reasons)

        store.report(fc.cluster, [ended("m/main/2", "exited", code=0)])
        store.report(fc.cluster, [ended("m/main/3", "exited", code=0)])
        await until(
            "complete without it",
            lambda: (reads.batch_state(store, fc.cluster, "m") or ("",))[0] == "complete",
        )
        state = reads.job_state(store, fc.cluster, "m")
        assert state is not None
        assert state.what == "3/4 runs complete, 1 failed within scaling.max_failed"
        asked = await ForgeClient(skipping_env.client, cluster=fc.cluster).wait_finished(["m"])
        assert asked["m"] == state

        # a second job: one failure more than max_failed fails it
        other = {**spec, "name": "n", "id": "n"}
        await fc.submit_job(Job.model_validate(other))
        await until("n bound", lambda: len(bound(store, fc, "n")) == 4)
        store.report(fc.cluster, [ended("n/main/0", "failed", message="boom", code=1)])
        await until("n/main/0 released", lambda: "n/main/0" not in bound(store, fc, "n"))
        store.report(fc.cluster, [ended("n/main/2", "failed", message="bang", code=2)])
        await until(
            "n failed",
            lambda: (reads.batch_state(store, fc.cluster, "n") or ("",))[0] == "failed",
        )
        await until("n's runs stopped", lambda: bound(store, fc, "n") == [])
        state = reads.job_state(store, fc.cluster, "n")
        assert state is not None and "n/main/2:" in state.what and "(last: bang)" in state.what
        await _replays(fc)


async def test_an_active_deadline_fails_a_running_job_and_spares_a_complete_one(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Kubernetes' ``activeDeadlineSeconds``: a job still running when its deadline
    passes fails, its runs stopped in that pass and none placed again, with no
    report or submission to wake the loop (its own timer does); one that completed
    before its deadline stays complete. The history replays."""
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    slow = batch("slow", 3, reschedule=NEVER).model_dump(mode="json")
    slow["active_deadline"] = 1.0
    quick = {**batch("quick", 1, reschedule=NEVER).model_dump(mode="json"), "active_deadline": 1.0}
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=3000, memory=8192)])  # room for three
        await fc.submit_job(Job.model_validate(quick))
        await until("quick bound", lambda: bound(store, fc, "quick") == ["quick/main/0"])
        store.report(fc.cluster, [ended("quick/main/0", "exited", code=0)])
        await until(
            "quick complete",
            lambda: (reads.batch_state(store, fc.cluster, "quick") or ("",))[0] == "complete",
        )
        began = time.monotonic()
        await fc.submit_job(Job.model_validate(slow))
        await until("slow bound", lambda: len(bound(store, fc, "slow")) == 3)
        await until(
            "slow failed by its deadline",
            lambda: (reads.batch_state(store, fc.cluster, "slow") or ("",))[0] == "failed",
        )
        assert time.monotonic() - began >= 1.0  # not before its deadline
        await until("its runs stopped", lambda: bound(store, fc, "slow") == [])
        state = reads.job_state(store, fc.cluster, "slow")
        assert state is not None
        assert state.what == "0/3 runs complete; active_deadline 1 s passed: its runs were stopped"
        explained = await fc.explain("slow/main/0")
        assert any("its job failed (active_deadline 1 s passed)" in r for r in explained.reasons)
        # quick's deadline passed too (a pass after it): still complete
        await fc.submit_job(batch("poke", 1))
        await until("a later pass", lambda: bound(store, fc, "poke") == ["poke/main/0"])
        quick_state = reads.job_state(store, fc.cluster, "quick")
        assert quick_state is not None and quick_state.state == "complete"
        await _replays(fc)


def test_a_deadline_is_for_batch_jobs_only() -> None:
    spec = batch("s", 1).model_dump(mode="json")
    with pytest.raises(ValueError, match="active_deadline: only a batch job ends"):
        Job.model_validate({**spec, "type": "service", "active_deadline": 5.0})
