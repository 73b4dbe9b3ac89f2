"""The pass budget follows the recorded planning times (forge.core.budget, under the
adaptive-budget patch): a slow worker plans smaller passes, and a replay on a worker
of any speed plans exactly those passes, because the times come from history."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge import clocks
from forge.wire.codec import data_converter
from tests.workflow.harness import cluster, default_options, job, node
from workflows.cluster import ClusterWorkflow


@contextmanager
def _clock(step: float) -> Iterator[None]:
    """The loop's planning clock advancing ``step`` seconds a reading: a worker
    that slow (the SDK's own clocks untouched)."""
    ticks = itertools.count()
    real = clocks.plan_clock
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(clocks, "plan_clock", lambda: real() + step * next(ticks))
        yield


async def _run(env: WorkflowEnvironment, *, step: float) -> tuple[Any, int]:
    """25,000 replicas on 200 nodes: ~425,000 units of placement, more than one pass
    at the default budget. Returns the history and the passes it took."""
    # one run (the replay-seconds rule would end a slow worker's runs: its own test)
    options = default_options(max_replay_seconds=1e6)
    async with cluster(env.client, options=options) as (fc, _store):
        with _clock(step):
            await fc.register_nodes([node(f"n{i:03d}", cpu=64_000) for i in range(200)])
            await fc.submit_jobs(
                [job(f"j{i}", replicas=500, cpu=500, memory=64) for i in range(50)]
            )
            status = await fc.published()
            while status is None or status.deferred or status.summary.bound < 25_000:
                await asyncio.sleep(0.05)  # a poll's interval, not synchronisation
                status = await fc.published()
        history = await fc.handle().fetch_history()
    return history, status.summary.passes


async def test_a_slow_worker_plans_smaller_passes_and_any_worker_replays_them(
    skipping_env: WorkflowEnvironment,
) -> None:
    quick_history, quick_passes = await _run(skipping_env, step=0.0)
    slow_history, slow_passes = await _run(skipping_env, step=1.0)
    assert quick_passes >= 2  # the default budget left work for a second pass
    assert slow_passes > quick_passes + 2  # the measured seconds shrank the budget
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    for history in (quick_history, slow_history):
        for step in (0.0, 5.0):  # replayed by a quick worker and by a very slow one
            with _clock(step):
                result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            assert result.replay_failure is None, (step, result.replay_failure)
