"""``ttl_after_finished``: a finished batch job removed by the loop's own timer (a
Kubernetes Job's ``ttlSecondsAfterFinished``), and ``forge job scale`` keeping a
batch group's ``scaling.max_failed`` (patch ``scale-keeps-max-failed``), and
``forge explain`` of a run that completed.

Time-skipping server: the removal has no report or submission to wake the loop,
only the timer the loop set from the finish time. Each history replays; the scale
history recorded with the old branch (no marker) replays to the old result."""

from __future__ import annotations

import time

import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from forge.client import reads
from forge.client.client import ForgeClient
from forge.client.finish import QUERY_TIMEOUT
from forge.core.models import Job
from forge.wire import contract as c
from tests.workflow.harness import cluster, default_options, node
from tests.workflow.test_batch_end import NEVER, _replays
from tests.workflow.test_batch_loop import batch, bound, ended, until
from workflows import batch as batch_loop
from workflows import handlers

OPTIONS = {"watch": True, "watch_poll": 0.02, "heartbeat_ttl": 10_000_000.0}


def _with(name: str, runs: int, **fields: object) -> Job:
    return Job.model_validate(
        {**batch(name, runs, reschedule=NEVER).model_dump(mode="json"), **fields}
    )


async def _query_state(fc: ForgeClient, job_id: str) -> c.JobState:
    """The ``job_state`` query. One sent while a workflow task ends the run (a
    continue-as-new, every other pass here) is never answered: after its timeout the
    next goes to the new run, as ``forge job wait`` does without a store."""
    for _ in range(3):
        try:
            got: c.JobState = await fc.handle().query(
                c.QUERY_JOB_STATE, job_id, result_type=c.JobState, rpc_timeout=QUERY_TIMEOUT
            )
            return got
        except RPCError as err:
            if err.status not in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
                raise
    raise AssertionError(f"three job_state queries for {job_id!r} timed out")


def _state(store: object, fc: object, job_id: str) -> str | None:
    found = reads.batch_state(store, fc.cluster, job_id)  # type: ignore[arg-type, attr-defined]
    return None if found is None else found[0]


@pytest.mark.parametrize("limit", [2, 1000])
async def test_finished_jobs_are_removed_after_their_ttl_with_their_records(
    skipping_env: WorkflowEnvironment, limit: int
) -> None:
    """A complete job and a failed one with a 1 s ttl are removed (spec and
    completions) no sooner than 1 s after they finished, through continue-as-new
    (``limit`` 2) too; a complete one with an hour to live and one with none stay.
    Their last state is kept (a ``forge job wait`` polling late reads it)."""
    options = default_options(**OPTIONS, max_passes_per_run=limit)
    async with cluster(skipping_env.client, options=options) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000, memory=8192)])
        ttls = {"done": 1.0, "bad": 1.0, "hour": 3600.0}
        for name, runs in (("done", 2), ("bad", 1), ("hour", 1), ("kept", 1)):
            ttl = {"ttl_after_finished": ttls[name]} if name in ttls else {}
            await fc.submit_job(_with(name, runs, **ttl))
        await until("all bound", lambda: len(store.assignments(fc.cluster)) == 5)
        store.report(fc.cluster, [ended(f"{j}/main/0", "exited", code=0) for j in ("hour", "kept")])
        await until("complete", lambda: _state(store, fc, "kept") == "complete")
        began = time.monotonic()
        store.report(
            fc.cluster,
            [ended("done/main/0", "exited", code=0), ended("done/main/1", "exited", code=0),
             ended("bad/main/0", "failed", message="boom", code=1)],
        )  # fmt: skip
        await until("done finished", lambda: _state(store, fc, "done") in ("complete", None))
        await until("done removed", lambda: store.get_job(fc.cluster, "done") is None)
        await until("bad removed", lambda: store.get_job(fc.cluster, "bad") is None)
        assert time.monotonic() - began >= 1.0  # not before its time
        assert not [w for w in store.completions(fc.cluster) if w.startswith("done/")]
        assert _state(store, fc, "hour") == "complete" and _state(store, fc, "kept") == "complete"
        assert sorted(store.completions(fc.cluster)) == ["hour/main/0", "kept/main/0"]
        # how they ended is still read after they are gone: a waiter that polls late
        gone = "removed 1 s after it finished (ttl_after_finished)"
        queried = await _query_state(fc, "bad")
        for got, state in ((await fc.job_state("done"), "complete"), (queried, "failed")):
            assert got.state == state and got.what.endswith(gone) and got.bound == 0
        assert (await fc.job_state("done")).what.startswith("2/2 runs complete")
        await fc.submit_job(_with("done", 1))  # the id is a job again: its own state
        await until("running", lambda: _state(store, fc, "done") == "running")
        await _replays(fc)


async def test_a_finished_job_scaled_up_runs_again_and_is_removed_only_when_it_finishes(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Its clock stops while it runs again, and starts over when it finishes."""
    async with cluster(skipping_env.client, options=default_options(**OPTIONS)) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000, memory=8192)])
        await fc.submit_job(_with("u", 1, ttl_after_finished=1.0))
        await until("bound", lambda: bound(store, fc, "u") == ["u/main/0"])
        store.report(fc.cluster, [ended("u/main/0", "exited", code=0)])
        await until("complete", lambda: _state(store, fc, "u") == "complete")
        await fc.scale("u", "main", 2)
        await until("runs again", lambda: bound(store, fc, "u") == ["u/main/1"])
        began = time.monotonic()
        while time.monotonic() - began < 1.5:  # past its first ttl, with passes to wake
            await fc.submit_job(batch(f"poke{int((time.monotonic() - began) * 10)}", 1))
        assert store.get_job(fc.cluster, "u") is not None and bound(store, fc, "u") == ["u/main/1"]
        store.report(fc.cluster, [ended("u/main/1", "exited", code=0)])
        await until("removed once finished", lambda: store.get_job(fc.cluster, "u") is None)
        await _replays(fc)


def test_a_ttl_is_for_batch_jobs_only() -> None:
    spec = batch("s", 1).model_dump(mode="json")
    with pytest.raises(ValueError, match="ttl_after_finished: only a batch job ends"):
        Job.model_validate({**spec, "type": "service", "ttl_after_finished": 5.0})
    with pytest.raises(ValueError, match="ttl_after_finished"):
        Job.model_validate({**spec, "ttl_after_finished": -1.0})


def test_scaling_keeps_the_rest_of_the_policy() -> None:
    spec = batch("m", 4).model_dump(mode="json")
    spec["groups"][0]["scaling"].update(max_failed=2, parallelism=3)
    job = Job.model_validate(spec)
    kept = job.with_desired("main", 6).groups[0].scaling
    assert (kept.desired, kept.max_failed, kept.parallelism) == (6, 2, 3)
    assert job.with_desired("main", 6, keep=False).groups[0].scaling.max_failed == 0


@pytest.mark.parametrize("recorded_before", [False, True])
async def test_forge_job_scale_keeps_max_failed_and_old_histories_replay(
    skipping_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, recorded_before: bool
) -> None:
    """Scaled, a group with ``max_failed: 1`` still tolerates a run failed for good
    (it did not: the scale reset it to 0 and that failure failed the job). A history
    recorded by the old branch (no marker) replays with today's code."""
    if recorded_before:
        old = lambda job, group, count: job.with_desired(group, count, keep=False)  # noqa: E731
        monkeypatch.setattr(handlers, "scale_group", old)
    spec = _with("m", 2).model_dump(mode="json")
    spec["groups"][0]["scaling"]["max_failed"] = 1
    async with cluster(
        skipping_env.client, options=default_options(**OPTIONS), sandboxed=not recorded_before
    ) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000, memory=8192)])
        await fc.submit_job(Job.model_validate(spec))
        await until("bound", lambda: len(bound(store, fc, "m")) == 2)
        await fc.scale("m", "main", 3)
        await until("three bound", lambda: len(bound(store, fc, "m")) == 3)
        store.report(fc.cluster, [ended("m/main/0", "failed", message="boom", code=1)])
        await until("m/main/0 released", lambda: "m/main/0" not in bound(store, fc, "m"))
        await until("settled", lambda: _state(store, fc, "m") in ("running", "failed"))
        expected = "failed" if recorded_before else "running"
        await until(expected, lambda: _state(store, fc, "m") == expected)
        monkeypatch.undo()
        assert batch_loop.SCALE_KEEPS_MAX_FAILED  # the id today's code asks
        await _replays(fc)


async def test_forge_explain_says_a_complete_run_is_complete(
    skipping_env: WorkflowEnvironment,
) -> None:
    """From the store (``forge explain``) and from the ``explain`` query: a run that
    completed is ``complete``, not pending "waiting for the next pass" with the
    nodes' verdicts (what both said before); its sibling still runs."""
    async with cluster(skipping_env.client, options=default_options(**OPTIONS)) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000, memory=8192)])
        await fc.submit_job(_with("x", 2))
        await until("bound", lambda: len(bound(store, fc, "x")) == 2)
        store.report(fc.cluster, [ended("x/main/0", "exited", code=0)])
        await until("released", lambda: bound(store, fc, "x") == ["x/main/1"])
        queried = await fc.handle().query(c.QUERY_EXPLAIN, "x/main/0", result_type=c.Explanation)
        for e in (await fc.explain("x/main/0"), queried):
            assert (e.state, e.nodes) == ("complete", [])
            assert e.reasons == ["complete: its tasks exited 0; a batch run is not run again"]
        assert (await fc.explain("x/main/1")).state == "bound"
        assert (await fc.explain("x/main/2")).state == "unknown"
