"""Batch jobs through the loop (issue 32): a run that exits 0 is complete, its room
goes to the next run at once, it is recorded in the store with its release and never
placed again, across continue-as-new; a non-zero exit is a failure, restarted. The
history replays."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge.client import reads
from forge.client.client import ForgeClient
from forge.core.models import AssignmentStatus, Job
from forge.core.plan import PendingEntry
from forge.errors import ForgeError
from forge.stores import Store, TaskReport
from forge.wire import contract as c
from forge.wire.codec import data_converter
from tests.e2e.procs import assert_store_is_the_workflows
from tests.workflow.harness import cluster, default_options, job, node
from workflows.cluster import ClusterWorkflow
from workflows.state import LoopState


def batch(name: str, replicas: int, **group: Any) -> Job:
    return job(name, replicas, 1000, 1024, kind="batch", **group)


def ended(
    wid: str, status: str, node_id: str = "n1", message: str = "", code: int | None = None
) -> TaskReport:
    return TaskReport(
        workload_id=wid, status=status, at=time.time(), node=node_id, message=message,
        exit_code=code,
    )  # fmt: skip


def bound(store: Store, fc: ForgeClient, job_id: str) -> list[str]:
    return sorted(a.workload_id for a in store.assignments(fc.cluster) if a.job == job_id)


async def until(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never {what}")
        await asyncio.sleep(0.02)  # poll interval, not synchronisation


def status_of(store: Store, fc: ForgeClient, wid: str) -> AssignmentStatus | None:
    return next((a.status for a in store.assignments(fc.cluster) if a.workload_id == wid), None)


async def test_a_batch_job_runs_each_ordinal_to_completion_once(
    skipping_env: WorkflowEnvironment,
) -> None:
    options = default_options(
        watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0, max_passes_per_run=4
    )
    quick = {"attempts": 5, "interval": 3600.0, "delay": 0.2, "delay_function": "constant"}
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=2000, memory=8192)])
        first = await fc.submit_job(batch("b", 3, reschedule=quick))
        assert (first.bound, first.pending) == (2, 1)
        assert bound(store, fc, "b") == ["b/main/0", "b/main/1"]
        run = (await fc.handle().describe()).run_id

        store.report(fc.cluster, [ended("b/main/0", "exited")])
        await until(
            "b/main/2 placed in the room b/main/0 left",
            lambda: "b/main/2" in bound(store, fc, "b"),
        )
        assert store.completions(fc.cluster) == ["b/main/0"]
        assert bound(store, fc, "b") == ["b/main/1", "b/main/2"]

        # a failure is still one: released and placed again, not recorded as done
        store.report(fc.cluster, [ended("b/main/1", "running")])
        await until("running", lambda: status_of(store, fc, "b/main/1") is AssignmentStatus.RUNNING)
        store.report(fc.cluster, [ended("b/main/1", "failed")])
        await until(
            "the failed run placed again",
            lambda: status_of(store, fc, "b/main/1") is AssignmentStatus.PENDING,
        )
        assert store.completions(fc.cluster) == ["b/main/0"]

        store.report(fc.cluster, [ended("b/main/1", "exited"), ended("b/main/2", "exited")])
        await until("every run complete", lambda: len(store.completions(fc.cluster)) == 3)
        await until("nothing of b bound", lambda: bound(store, fc, "b") == [])
        # the job_state query (a client without the store) says what the store says,
        # asked again while a new run loads its state (Busy), as wait_finished does
        plain = ForgeClient(skipping_env.client, cluster=fc.cluster)
        asked = (await plain.wait_finished(["b"], timeout=60))["b"]
        assert asked == reads.job_state(store, fc.cluster, "b")
        assert (asked.state, asked.complete, asked.bound, asked.desired) == ("complete", 3, 0, 3)

        # new runs (continue-as-new every 4 passes) reload the completions: other
        # jobs' passes come and go, and b never runs again
        for i in range(4):
            await fc.submit_job(job(f"svc{i}", replicas=1, cpu=100, memory=64))
        assert (await fc.handle().describe()).run_id != run
        await fc.submit_job(job("last", replicas=1, cpu=100, memory=64))
        assert bound(store, fc, "b") == []
        assert (await fc.status()).summary.bound == 5  # the services only
        asked = (await plain.wait_finished(["svc0"], timeout=60))["svc0"]  # (Busy: asked again)
        assert (asked.state, asked.type, asked.bound) == ("service", "service", 1)
        assert_store_is_the_workflows(store, fc.cluster)

        # a stopped batch job's record goes with it
        await fc.stop_job("b")
        assert store.completions(fc.cluster) == []

        history = await fc.handle().fetch_history()
        replayed = await Replayer(
            workflows=[ClusterWorkflow], data_converter=data_converter()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_run_out_of_attempts_fails_the_job_in_the_status_that_pass_publishes(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Nothing changes after a job failed for good (its run waits out a long
    interval), so no later pass publishes: the failing pass's own status must say it,
    or ``forge job wait`` waits for ever."""
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    once = {"attempts": 1, "interval": 3600.0, "delay": 0.2, "delay_function": "constant"}
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=2000, memory=8192)])
        await fc.submit_job(batch("f", 1, reschedule=once))
        for attempt in (1, 2):
            await until(f"run {attempt} bound", lambda: bound(store, fc, "f") == ["f/main/0"])
            why = f"task t exited with status {attempt + 2}"
            store.report(fc.cluster, [ended("f/main/0", "failed", message=why)])
            await until(f"run {attempt} released", lambda: bound(store, fc, "f") == [])
        await until(
            "the job published failed",
            lambda: (reads.batch_state(store, fc.cluster, "f") or ("",))[0] == "failed",
        )
        state = reads.batch_state(store, fc.cluster, "f")
        assert state is not None and "f/main/0:" in state[1] and "exhausted" in state[1]
        assert state[1].endswith("(last: task t exited with status 4)")  # the last run's
        assert store.completions(fc.cluster) == []


async def test_an_exit_status_in_fail_on_exit_fails_the_job_without_a_retry(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Attempts left and no delay, yet the run is not placed again: its exit status
    says no retry can fix it. Another status of the same group is retried."""
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    policy = {"attempts": 5, "delay": 0.0, "fail_on_exit": [42]}
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=4000, memory=8192)])
        await fc.submit_job(batch("x", 2, reschedule=policy))
        await until("both bound", lambda: bound(store, fc, "x") == ["x/main/0", "x/main/1"])
        store.report(fc.cluster, [ended("x/main/1", "failed", message="status 1", code=1)])
        await until("the other run retried", lambda: status_of(store, fc, "x/main/1") is not None)
        why = "task t exited with status 42"
        store.report(fc.cluster, [ended("x/main/0", "failed", message=why, code=42)])
        await until(
            "the job published failed",
            lambda: (reads.batch_state(store, fc.cluster, "x") or ("",))[0] == "failed",
        )
        state = reads.batch_state(store, fc.cluster, "x")
        assert state is not None
        assert "x/main/0: exit status 42 is in reschedule.fail_on_exit: not retried" in state[1]
        assert state[1].endswith(f"(last: {why})")
        # the job ended: its other run is stopped, and neither is placed again
        await until("the other run stopped", lambda: bound(store, fc, "x") == [])
        await fc.submit_job(batch("poke", 1))  # a later pass
        await until("a later pass ran", lambda: bound(store, fc, "poke") == ["poke/main/0"])
        assert bound(store, fc, "x") == []
        history = await fc.handle().fetch_history()
        replayed = await Replayer(
            workflows=[ClusterWorkflow], data_converter=data_converter()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_failed_job_ends_its_other_runs_stop_and_none_runs_again(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Kubernetes' Job at its backoffLimit: the runs still going are stopped and no
    run starts again (not the one that failed once its interval passed, not one that
    never started), so a failed job holds no room. A run complete stays complete."""
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    never = {"attempts": 0, "interval": 1.0, "delay": 0.0}
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=3000, memory=8192)])
        await fc.submit_job(batch("e", 5, reschedule=never))  # room for three at once
        three = ["e/main/0", "e/main/1", "e/main/2"]
        await until("three bound", lambda: bound(store, fc, "e") == three)
        store.report(fc.cluster, [ended("e/main/0", "exited", code=0)])
        await until("run 3 bound", lambda: bound(store, fc, "e") == [*three[1:], "e/main/3"])
        store.report(fc.cluster, [ended("e/main/1", "failed", message="boom", code=1)])
        await until("the others stopped", lambda: bound(store, fc, "e") == [])
        state = reads.batch_state(store, fc.cluster, "e")
        assert state is not None and state[0] == "failed" and "e/main/1:" in state[1]
        assert store.completions(fc.cluster) == ["e/main/0"]
        asked = await ForgeClient(skipping_env.client, cluster=fc.cluster).job_state("e")
        assert (asked.state, asked.complete, asked.bound, asked.what) == ("failed", 1, 0, state[1])
        with pytest.raises(ForgeError, match="unknown job 'nope'"):
            await ForgeClient(skipping_env.client, cluster=fc.cluster).job_state("nope")
        # past the failed run's reschedule interval (the clock cannot skip while the
        # store watch runs): an input of the test, not a synchronisation
        await asyncio.sleep(1.5)
        await fc.submit_job(batch("poke", 1))  # a later pass
        await until("a later pass ran", lambda: bound(store, fc, "poke") == ["poke/main/0"])
        assert bound(store, fc, "e") == []
        explained = await fc.explain("e/main/4")
        assert any("its job failed (e/main/1): not run again" in r for r in explained.reasons)
        # the same spec again changes nothing; a changed one is tried again, its
        # complete run kept
        await fc.submit_job(batch("e", 5, reschedule=never))
        await fc.submit_job(batch("poke2", 1))
        await until("a pass after it", lambda: bound(store, fc, "poke2") == ["poke2/main/0"])
        assert bound(store, fc, "e") == []
        await fc.stop_job("poke")
        await fc.stop_job("poke2")
        await fc.submit_job(batch("e", 5, reschedule={**never, "attempts": 1}))
        again = ["e/main/1", "e/main/2", "e/main/3"]  # room for three
        await until("tried again", lambda: bound(store, fc, "e") == again)
        state = reads.batch_state(store, fc.cluster, "e")
        assert state is not None and state[0] == "running"
        history = await fc.handle().fetch_history()
        replayed = await Replayer(
            workflows=[ClusterWorkflow], data_converter=data_converter()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


def test_a_run_failed_for_good_sets_no_deadline() -> None:
    """A ``failed`` entry is never tried again: were its time a deadline, a passed one
    would make the loop run pass after pass (next_wake <= now) for ever."""
    st = LoopState.start(c.ClusterInput(cluster="c", options=default_options()))
    st.pending = {"x/main/0": PendingEntry(kind="failed", reasons=("fatal",))}
    wake, why = st.next_wake(1000.0)
    assert (wake, why) == (st.last_resync + st.opts.resync_seconds, "job resync")
    st.pending["x/main/1"] = PendingEntry(kind="exhausted", not_before=2000.0)
    assert st.next_wake(1000.0) == (2000.0, "exhausted expiry")


async def test_a_gang_completes_whole_when_its_last_member_exits_0(
    skipping_env: WorkflowEnvironment,
) -> None:
    """A member that exited 0 keeps its place (its gang's room stays held) until every
    member has; then all complete in one pass, and none runs again."""
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=3000, memory=8192)])
        await fc.submit_job(batch("g", 2, gang=True))
        assert bound(store, fc, "g") == ["g/main/0", "g/main/1"]
        await fc.submit_job(job("probe", replicas=1, cpu=100, memory=64))
        # one report batch: once the probe shows running, the pass that read the
        # member's exit has persisted
        store.report(fc.cluster, [ended("g/main/0", "exited"), ended("probe/main/0", "running")])
        await until(
            "the report read",
            lambda: status_of(store, fc, "probe/main/0") is AssignmentStatus.RUNNING,
        )
        assert bound(store, fc, "g") == ["g/main/0", "g/main/1"]
        assert store.completions(fc.cluster) == []
        store.report(fc.cluster, [ended("g/main/1", "exited")])
        await until("the gang complete", lambda: len(store.completions(fc.cluster)) == 2)
        assert store.completions(fc.cluster) == ["g/main/0", "g/main/1"]
        assert bound(store, fc, "g") == []
        await fc.submit_job(job("probe2", replicas=1, cpu=100, memory=64))
        assert bound(store, fc, "g") == []


async def test_parallelism_lets_one_run_in_as_the_last_ends(
    skipping_env: WorkflowEnvironment,
) -> None:
    """A node with room for all three, a job that asks one at a time: each run is
    bound only once the one before it completed."""
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    spec = batch("p", 3).model_dump(mode="json")
    spec["groups"][0]["scaling"]["parallelism"] = 1
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000, memory=8192)])
        first = await fc.submit_job(Job.model_validate(spec))
        assert first.bound == 1 and bound(store, fc, "p") == ["p/main/0"]
        for i in (1, 2):
            store.report(fc.cluster, [ended(f"p/main/{i - 1}", "exited")])
            want = [f"p/main/{i}"]

            def alone(want: list[str] = want) -> bool:
                return bound(store, fc, "p") == want

            await until(f"p/main/{i} alone bound", alone)
        store.report(fc.cluster, [ended("p/main/2", "exited")])
        await until(
            "the job complete",
            lambda: (reads.batch_state(store, fc.cluster, "p") or ("",))[0] == "complete",
        )
        assert store.completions(fc.cluster) == ["p/main/0", "p/main/1", "p/main/2"]


async def test_a_batch_gang_fails_after_attempts_restarts_of_the_gang_not_of_each_member(
    skipping_env: WorkflowEnvironment,
) -> None:
    """``attempts: 1``: member 0 fails and the gang restarts whole (its one retry);
    then member 1 fails and the job has failed, though member 1 failed only once
    (patch batch-gang-one-attempt; before it, each member counted alone)."""
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    once = {"attempts": 1, "interval": 3600.0, "delay": 0.2, "delay_function": "constant"}
    members = ["t/main/0", "t/main/1"]

    def running(want: bool) -> Callable[[], bool]:
        def check() -> bool:
            got = [status_of(store, fc, w) for w in members]
            if want:
                return all(s is AssignmentStatus.RUNNING for s in got)
            return None not in got and AssignmentStatus.RUNNING not in got

        return check

    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=1000, memory=8192), node("n2", cpu=1000)])
        await fc.submit_job(batch("t", 2, gang=True, reschedule=once))
        await until("the gang bound", lambda: bound(store, fc, "t") == members)
        on = {a.workload_id: a.node for a in store.assignments(fc.cluster)}
        store.report(fc.cluster, [ended(w, "running", on[w]) for w in members])
        await until("the gang running", running(True))
        store.report(fc.cluster, [ended("t/main/0", "failed", on["t/main/0"], "exited 1")])
        await until("the gang placed again, whole", running(False))  # fresh bindings
        on = {a.workload_id: a.node for a in store.assignments(fc.cluster)}
        store.report(fc.cluster, [ended("t/main/1", "failed", on["t/main/1"], "exited 2")])
        await until(
            "the job published failed",
            lambda: (reads.batch_state(store, fc.cluster, "t") or ("",))[0] == "failed",
        )
        state = reads.batch_state(store, fc.cluster, "t")
        assert state is not None and "t/main/1:" in state[1] and "exhausted" in state[1]
