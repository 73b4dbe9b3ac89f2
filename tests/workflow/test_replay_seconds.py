"""A run continues as new once the recorded time of its workflow work reaches
``max_replay_seconds`` (workflows.patches.REPLAY_SECONDS): a slow worker ends its
runs sooner, so a worker taking one over replays about that much; and since the
figures come back through the persist activity, any worker replays every run the same.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge import clocks
from forge.client.client import ForgeClient
from forge.wire import activity_contract as ac
from forge.wire.codec import data_converter
from tests.workflow.harness import cluster, default_options, job, node
from workflows import patches
from workflows.cluster import ClusterWorkflow


@contextmanager
def _clock(step: float) -> Iterator[None]:
    """The worker's measuring clock advancing ``step`` seconds a reading."""
    ticks = itertools.count()
    real = clocks.plan_clock
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(clocks, "plan_clock", lambda: real() + step * next(ticks))
        yield


async def _histories(fc: ForgeClient) -> list[WorkflowHistory]:
    """Every run of the cluster's workflow, first to last."""
    out: list[WorkflowHistory] = []
    run_id: str | None = (await fc.handle().describe()).run_id
    while run_id:
        history = await fc.client.get_workflow_handle(fc.workflow_id, run_id=run_id).fetch_history()
        out.insert(0, history)
        attrs = history.events[0].workflow_execution_started_event_attributes
        run_id = attrs.continued_execution_run_id or None
    return out


async def _run(env: WorkflowEnvironment, *, step: float) -> list[WorkflowHistory]:
    """25,000 replicas on 200 nodes (several passes), runs ending at 8 recorded s."""
    options = default_options(max_replay_seconds=8.0)
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
        return await _histories(fc)


def _patches(history: WorkflowHistory) -> set[str]:
    """The patch ids the run recorded (its markers' payloads)."""
    found: set[str] = set()
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            for payloads in ev.marker_recorded_event_attributes.details.values():
                found.update(p.data.decode(errors="replace") for p in payloads.payloads)
    return {
        pid
        for pid in vars(patches).values()
        if isinstance(pid, str) and any(pid in f for f in found)
    }


def _persists(history: WorkflowHistory) -> int:
    return sum(
        1
        for ev in history.events
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and ev.activity_task_scheduled_event_attributes.activity_type.name == ac.ACT_PERSIST
    )


def _ended_by_continue_as_new(history: WorkflowHistory) -> bool:
    return history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW


async def test_a_slow_worker_ends_its_runs_sooner_and_any_worker_replays_them(
    skipping_env: WorkflowEnvironment,
) -> None:
    quick = await _run(skipping_env, step=0.0)
    slow = await _run(skipping_env, step=1.0)
    assert len(quick) == 1  # a few real seconds of work at most: one run
    assert len(slow) >= 3  # ~1 s recorded a pass: a run every eight or so
    assert all(_ended_by_continue_as_new(h) for h in slow[:-1])
    # the bootstrap (a run replays it whatever it does next) is not counted: each run
    # gets passes of its own, never one pass and out
    assert all(_persists(h) >= 2 for h in slow[:-1]), [_persists(h) for h in slow]
    assert all(patches.REPLAY_SECONDS in _patches(h) for h in slow)
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    for history in [*quick, *slow]:
        for step in (0.0, 5.0):  # a quick worker and a very slow one replay alike
            with _clock(step):
                result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            assert result.replay_failure is None, (step, result.replay_failure)
